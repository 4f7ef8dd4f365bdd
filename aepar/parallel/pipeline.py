"""Layer pipeline: stages (layers) on groups of ranks, inputs handed over between them.

Used by the synchronized layer-wise pre-training (Santara et al. 2016, §3.1; ``aepar.sync``).
Stage ``l`` trains layer ``l``; after each of its epochs it hands a new version of the next
stage's input over. This module holds

- the **rank layout** (pure functions): :func:`allot_ranks` gives a stage several
  data-parallel replicas when there are more ranks than layers (the heavy 784x1000
  layer gets the most); :func:`group_stages` puts consecutive layers on one rank when
  there are fewer ranks than layers; :func:`make_layout` picks between the two;
- the **plan** (pure): :func:`plan_schedule` runs the paper's schedule on a logical clock
  (each epoch of stage l takes its estimated cost) and records which input version every
  epoch of every stage trains on. The plan depends on the configuration only, never on
  the number of ranks or on timing, so executing it gives the same weights on 1 process,
  on fewer ranks than layers, one rank per layer or more ranks than layers;
  :func:`replay_plan` times a plan under other (measured) per-stage costs;
- the **cost model** of the hand-over modes (:func:`mode_costs`, :func:`choose_mode`).

The executor that runs a plan on ranks (transport, safe points, resume) is
:mod:`aepar.parallel.executor`.

Hand-over modes (``mode``): ``"data"`` sends the transformed rows h = transform(x) from
the producer's replicas to the overlapping rows of the consumer's replicas; ``"weights"``
sends the parameters (W, b_h) of every layer below (the chain that made the version) and
the consumer recomputes its input from its own copy of x, reusing the activations of the
unchanged bottom of the chain. Both give identical inputs (the same transforms in the same
order); they differ in where the work and the bytes are. See :mod:`aepar.sync` for the
trade-off and the default, docs/performance-notes.md for the measurements.
"""
from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["allot_ranks", "group_stages", "Layout", "make_layout", "PlannedEpoch", "Plan",
           "plan_schedule", "replay_plan", "mode_costs", "choose_mode", "stage_costs", "MODES", "HANDOVERS"]

MODES = ("data", "weights")
HANDOVERS = ("plan", "newest")


# ==== rank layout (pure) ====================================================================
def allot_ranks(costs, n_ranks: int, max_per_stage=None) -> list[int]:
    """Replicas per stage for ``n_ranks >= len(costs)`` ranks.

    Every stage gets one rank; each further rank goes to the stage with the largest cost
    per replica (ties: the lower stage), which minimises max(cost_l / n_l) - the pipeline's
    bottleneck under perfect data-parallel scaling.

    Parameters
    ----------
    costs : sequence of float
        Estimated work of each stage (e.g. flops x samples x planned epochs).
    n_ranks : int
    max_per_stage : int or sequence of int, optional
        Cap on replicas per stage (e.g. the batch size: every replica needs rows of each
        batch). Ranks no stage can take are an error.

    Returns
    -------
    list of int, sum = n_ranks
    """
    n = len(costs)
    if n < 1:
        raise ValueError("no stages")
    if n_ranks < n:
        raise ValueError(f"{n_ranks} ranks for {n} stages: use group_stages")
    caps = [max_per_stage] * n if max_per_stage is None or np.isscalar(max_per_stage) else list(max_per_stage)
    counts = [1] * n
    for _ in range(n_ranks - n):
        best = None
        for i, c in enumerate(costs):
            if caps[i] is not None and counts[i] >= caps[i]:
                continue
            key = float(c) / counts[i]
            if best is None or key > best[0]:
                best = (key, i)
        if best is None:
            raise ValueError(f"{n_ranks} ranks exceed the per-stage caps {caps}")
        counts[best[1]] += 1
    return counts


def group_stages(costs, n_groups: int) -> list[tuple[int, ...]]:
    """Split stages 0..L-1 into ``n_groups`` runs of consecutive stages (1 <= n_groups <= L)
    minimising the largest group cost (the linear-partition problem, by dynamic
    programming). Ties prefer putting more stages into later groups (the cheap top of a
    stack of shrinking layers).

    Returns
    -------
    list of tuple of int (stage indices), in order
    """
    costs = [float(c) for c in costs]
    n = len(costs)
    if not 1 <= n_groups <= n:
        raise ValueError(f"cannot split {n} stages into {n_groups} groups")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[g][i]: minimal bottleneck for the first i stages in g groups; cut[g][i]: start of the last group
    best = [[inf] * (n + 1) for _ in range(n_groups + 1)]
    cut = [[0] * (n + 1) for _ in range(n_groups + 1)]
    best[0][0] = 0.0
    for g in range(1, n_groups + 1):
        for i in range(g, n + 1):
            for j in range(g - 1, i):  # last group = stages j..i-1
                value = max(best[g - 1][j], prefix[i] - prefix[j])
                if value < best[g][i] - 1e-12 * max(1.0, value) or (value <= best[g][i] and j < cut[g][i]):
                    best[g][i], cut[g][i] = value, j
    groups, i = [], n
    for g in range(n_groups, 0, -1):
        j = cut[g][i]
        groups.append(tuple(range(j, i)))
        i = j
    return groups[::-1]


@dataclass(frozen=True)
class Layout:
    """Which ranks run which stages.

    ``groups[g]`` are the stages run by group g (one stage, or consecutive stages on one
    rank when ranks < layers); ``ranks[g]`` its world ranks (contiguous), whose first is
    the group's leader; more than one rank means data-parallel replicas.
    """

    groups: tuple
    ranks: tuple

    @property
    def n_stages(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def n_ranks(self) -> int:
        return sum(len(r) for r in self.ranks)

    def group_of_rank(self, rank: int) -> int:
        for g, ranks in enumerate(self.ranks):
            if rank in ranks:
                return g
        raise ValueError(f"rank {rank} not in layout")

    def group_of_stage(self, stage: int) -> int:
        for g, stages in enumerate(self.groups):
            if stage in stages:
                return g
        raise ValueError(f"stage {stage} not in layout")

    def replicas(self, stage: int) -> int:
        return len(self.ranks[self.group_of_stage(stage)])

    def describe(self) -> str:
        """'layer 1: ranks 0-2 | layer 2: rank 3 | layers 3-4: rank 4'."""
        parts = []
        for stages, ranks in zip(self.groups, self.ranks):
            ls = f"layer {stages[0] + 1}" if len(stages) == 1 else f"layers {stages[0] + 1}-{stages[-1] + 1}"
            rs = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
            parts.append(f"{ls}: {rs}")
        return " | ".join(parts)

    def to_dict(self) -> dict:
        return {"groups": [list(g) for g in self.groups], "ranks": [list(r) for r in self.ranks],
                "text": self.describe()}


def make_layout(costs, n_ranks: int, max_per_stage=None) -> Layout:
    """One rank per stage, replicas for the costly stages (ranks > stages), or groups of
    consecutive stages (ranks < stages); see :func:`allot_ranks`, :func:`group_stages`."""
    n = len(costs)
    if n_ranks >= n:
        counts = allot_ranks(costs, n_ranks, max_per_stage)
        groups = tuple((i,) for i in range(n))
    else:
        groups = tuple(group_stages(costs, n_ranks))
        counts = [1] * len(groups)
    ranks, start = [], 0
    for c in counts:
        ranks.append(tuple(range(start, start + c)))
        start += c
    return Layout(groups, tuple(ranks))


# ==== the plan (pure) =======================================================================
@dataclass(frozen=True)
class PlannedEpoch:
    """Epoch ``epoch`` (0-based, extras included) of ``stage`` trains on input ``version``
    (0: the data itself; v >= 1: the producer's output after its v-th epoch)."""

    stage: int
    epoch: int
    version: int
    extra: bool
    start: float
    end: float


@dataclass
class Plan:
    """The schedule on the logical clock: ``stages[l]`` the epochs of stage l in order,
    ``order`` all epochs by (start, stage), ``uses[l]`` the input versions stage l reads."""

    stages: list
    order: list
    uses: list
    makespan: float
    epoch_cost: list
    handover_cost: list
    end_with_first: bool = False
    _last_use: dict = field(default_factory=dict, repr=False)

    def needed(self, stage: int) -> set:
        """Output versions of ``stage`` that stage+1 reads (the ones worth handing over)."""
        return set(self.uses[stage + 1]) if stage + 1 < len(self.stages) else set()

    def epochs(self, stage: int) -> int:
        return len(self.stages[stage])

    def to_dict(self) -> dict:
        return {"makespan": self.makespan, "epoch_cost": self.epoch_cost,
                "handover_cost": self.handover_cost, "end_with_first": self.end_with_first,
                "uses": [list(u) for u in self.uses],
                "stages": [[asdict(e) for e in s] for s in self.stages]}


def plan_schedule(epoch_cost, handover_cost, epochs, extras, end_with_first=False) -> Plan:
    """The synchronized schedule of seed 002 §3.1 on a logical clock.

    Stage 0 trains ``epochs[0]`` epochs back to back on the data. Stage l >= 1 waits for
    stage l-1's first epoch; each of its ``epochs[l]`` epochs trains on the newest version
    available when it starts; then it sleeps and wakes for one extra epoch whenever a
    version newer than its last arrives, at most ``extras[l]`` times. Every epoch of a
    stage with a successor is followed by a hand-over of ``handover_cost[l]``; version v
    becomes available when it ends. With ``end_with_first`` no extra epoch starts once
    stage 0 has finished (the paper ended pre-training when layer 1 was done).

    Parameters
    ----------
    epoch_cost, handover_cost : sequence of float
        Per stage, > 0 and >= 0, in any unit of time.
    epochs, extras : sequence of int

    Returns
    -------
    Plan
    """
    n = len(epoch_cost)
    if not (len(handover_cost) == len(epochs) == len(extras) == n) or n == 0:
        raise ValueError("epoch_cost, handover_cost, epochs and extras need one entry per stage")
    if any(float(c) <= 0 for c in epoch_cost) or any(float(h) < 0 for h in handover_cost):
        raise ValueError("epoch costs must be positive and hand-over costs non-negative")
    if any(int(e) < 1 for e in epochs) or any(int(x) < 0 for x in extras):
        raise ValueError("every stage needs at least one epoch; extras cannot be negative")
    stages, uses = [], []
    avail = []  # avail[v-1]: time version v of the previous stage's output is available
    t0_end = None
    for l in range(n):
        c, h = float(epoch_cost[l]), float(handover_cost[l]) if l + 1 < n else 0.0
        t, mine, produced = 0.0, [], []

        def run(version, extra):
            nonlocal t
            start = max(t, avail[version - 1]) if version else t
            mine.append(PlannedEpoch(l, len(mine), version, extra, start, start + c))
            t = start + c + h
            produced.append(t)

        if l == 0:
            for _ in range(int(epochs[0])):
                run(0, False)
            t0_end = mine[-1].end
        else:
            last = 0
            for _ in range(int(epochs[l])):
                start = max(t, avail[0])
                last = bisect.bisect_right(avail, start)  # newest version available at start
                run(last, False)
            for _ in range(int(extras[l])):
                if last >= len(avail):
                    break  # the producer made no newer version
                start = max(t, avail[last])
                if end_with_first and start >= t0_end:
                    break
                last = bisect.bisect_right(avail, start)
                run(last, True)
        stages.append(mine)
        uses.append(sorted({e.version for e in mine}))
        avail = produced
    order = sorted((e for s in stages for e in s), key=lambda e: (e.start, e.stage, e.epoch))
    makespan = max(s[-1].end for s in stages)
    return Plan(stages, order, uses, makespan, [float(c) for c in epoch_cost],
                [float(h) for h in handover_cost], bool(end_with_first))


def replay_plan(plan: Plan, epoch_cost, handover_cost, layout: Layout | None = None,
                receive_cost=None, cores=None) -> dict:
    """Time the execution of ``plan`` when epochs really take ``epoch_cost`` (per stage).

    What :class:`Pipeline` does with ``handover="plan"``: an epoch starts when its rank
    group is free and its planned input version has arrived; a version is handed over
    (cost ``handover_cost`` to the producer) only if the next stage uses it, and a
    consumer pays ``receive_cost`` (e.g. the recompute of weights hand-over) before the
    first epoch on each new version: per stage, or a callable (stage, old version or
    None, new version) -> seconds. Stages that share a group (``layout``; default one
    group per stage) run one at a time in plan order.

    ``cores`` fewer than the layout's ranks: the ranks whose groups are running an epoch at
    a moment share the cores equally (each runs at min(1, cores / running ranks)), and a
    rank waiting for its input sleeps, leaving its core to the others; the costs are one
    rank's on a core of its own.

    Returns
    -------
    dict
        ``makespan``, ``stage_end`` (per stage), ``busy`` (per stage: the time its epochs and
        hand-overs ran), ``work`` (per stage: what they cost on a core of their own; ``busy``
        where no core is shared), ``wait`` (per stage: time between its first epoch's start
        and its end not spent busy).
    """
    n = len(plan.stages)
    if receive_cost is None:
        receive_cost = [0.0] * n
    if not callable(receive_cost):
        per_stage = [float(r) for r in receive_cost]

        def receive_cost(stage, old, new):
            return per_stage[stage]
    layout = layout if layout is not None else Layout(tuple((i,) for i in range(n)), tuple((i,) for i in range(n)))
    group_of = {s: g for g, stages in enumerate(layout.groups) for s in stages}
    works, last_version = [], [None] * n  # each epoch's cost in plan order
    for e in plan.order:
        work = float(epoch_cost[e.stage])
        if e.version != last_version[e.stage] and e.stage > 0:
            work += float(receive_cost(e.stage, last_version[e.stage], e.version))
        last_version[e.stage] = e.version
        if e.stage + 1 < n and (e.epoch + 1) in plan.needed(e.stage):
            work += float(handover_cost[e.stage])
        works.append(work)
    shared = cores is not None and int(cores) < layout.n_ranks
    spans = _shared_spans(plan, works, layout, group_of, int(cores)) if shared \
        else _dedicated_spans(plan, works, layout, group_of)
    busy, work, first, end = [0.0] * n, [0.0] * n, [None] * n, [0.0] * n
    for e, w, (start, stop) in zip(plan.order, works, spans):
        busy[e.stage] += stop - start if shared else w  # the same sum either way where no core is shared
        work[e.stage] += w
        first[e.stage] = start if first[e.stage] is None else first[e.stage]
        end[e.stage] = stop
    wait = [end[l] - first[l] - busy[l] for l in range(n)]
    return {"makespan": max(end), "stage_end": end, "busy": busy, "work": work, "wait": wait}


def _dedicated_spans(plan: Plan, works, layout: Layout, group_of) -> list:
    """(start, stop) of each epoch of ``plan.order`` with a core per rank: in plan order,
    each as soon as its group is free and its input version has arrived."""
    free = [0.0] * len(layout.groups)
    ready = {}  # (stage, version): when that stage's output version is available
    spans = []
    for e, work in zip(plan.order, works):
        g = group_of[e.stage]
        start = free[g] if e.version == 0 else max(free[g], ready[e.stage - 1, e.version])
        stop = start + work
        ready[e.stage, e.epoch + 1] = free[g] = stop
        spans.append((start, stop))
    return spans


def _shared_spans(plan: Plan, works, layout: Layout, group_of, cores: int) -> list:
    """(start, stop) of each epoch of ``plan.order`` when the running groups' ranks share
    ``cores``: each group runs its epochs in plan order, one starts once the previous is
    done and its input version has arrived, and between two events every running rank
    advances at min(1, cores / running ranks)."""
    queues = [[] for _ in layout.groups]  # each group's epochs, as indices into plan.order
    for i, e in enumerate(plan.order):
        queues[group_of[e.stage]].append(i)
    heads = [0] * len(queues)
    ready, running, left, spans = {}, {}, {}, [None] * len(works)  # running: group -> epoch index
    now = 0.0
    while True:
        for g, q in enumerate(queues):
            if g not in running and heads[g] < len(q):
                e = plan.order[q[heads[g]]]
                if e.version == 0 or (e.stage - 1, e.version) in ready:
                    i = running[g] = q[heads[g]]
                    heads[g] += 1
                    left[i], spans[i] = works[i], (now, None)
        if not running:
            break
        speed = min(1.0, cores / sum(len(layout.ranks[g]) for g in running))
        step = min(left[i] for i in running.values())
        now += step / speed
        for g, i in list(running.items()):
            left[i] -= step
            if left[i] <= 1e-12 * max(works[i], 1e-30):  # the one(s) that set the step
                e = plan.order[i]
                ready[e.stage, e.epoch + 1] = now
                spans[i] = (spans[i][0], now)
                del running[g]
    if any(h < len(q) for h, q in zip(heads, queues)):
        raise RuntimeError("replay_plan: the plan waits on an input version no epoch makes")
    return spans


def mode_costs(plan: Plan, layout: Layout, epoch_cost, transform_cost, mode: str):
    """Per-stage costs of executing ``plan`` on ``layout`` with hand-over ``mode``, for
    :func:`replay_plan`: (epoch, hand-over, receive callable).

    ``epoch_cost`` and ``transform_cost`` (all rows of a layer) are single-rank figures;
    replicas divide them. ``data``: the producer transforms its rows for every version it
    hands over (also between stages sharing a rank, in either mode). ``weights``: across
    ranks the consumer recomputes the top of the chain that changed since its last
    version, as :class:`Pipeline` does with its cache of the unchanged bottom.
    """
    n = len(plan.stages)
    reps = [layout.replicas(l) for l in range(n)]
    group_of = {s: g for g, stages in enumerate(layout.groups) for s in stages}
    epoch = [float(epoch_cost[l]) / reps[l] for l in range(n)]
    hand = [0.0] * n
    for l in range(n - 1):
        if mode == "data" or group_of[l] == group_of[l + 1]:
            hand[l] = float(transform_cost[l]) / reps[l]

    def chain(stage, version):
        out = []
        while stage >= 0 and version > 0:
            out.append((stage, version))
            version = plan.stages[stage][version - 1].version
            stage -= 1
        return out[::-1]

    def receive(stage, old, new):
        if mode != "weights" or group_of[stage - 1] == group_of[stage]:
            return 0.0
        a, b = chain(stage - 1, old) if old else [], chain(stage - 1, new)
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        return sum(float(transform_cost[j]) for j in range(k, len(b))) / reps[stage]

    return epoch, hand, receive


def choose_mode(plan: Plan, layout: Layout, epoch_cost, transform_cost, oversubscribed=False) -> tuple:
    """("data" | "weights", {mode: predicted makespan}) for ``--handover-mode auto``.

    Oversubscribed cores share the work of every rank, so the least total work wins:
    data (weights mode repeats transforms at every consumer). Otherwise the mode whose
    replay of the plan is shorter (ties: data).
    """
    times = {}
    for mode in MODES:
        e, h, r = mode_costs(plan, layout, epoch_cost, transform_cost, mode)
        times[mode] = replay_plan(plan, e, h, layout, r)["makespan"]
    if oversubscribed:
        return "data", times
    return ("weights" if times["weights"] < 0.99 * times["data"] else "data"), times


def stage_costs(layers, n_train: int, n_val: int = 0) -> tuple[list, list]:
    """Logical per-stage costs in floating-point operations: (epoch, hand-over).

    An epoch: the layer's CD/backprop work on ``n_train`` rows (``flops_per_sample``) plus
    the reconstruction of the validation rows; a hand-over: the transform of all rows
    (2 n_in n_out per row). Deterministic, so the plan is the same on every rank and for
    every number of ranks.
    """
    epoch, handover = [], []
    for layer in layers:
        mn = float(layer.n_in) * float(layer.n_out)
        epoch.append(float(layer.flops_per_sample()) * n_train + 4.0 * mn * n_val)
        handover.append(2.0 * mn * (n_train + n_val))
    return epoch, handover
