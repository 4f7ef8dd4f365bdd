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
- the **hand-over transport** over :mod:`aepar.comm` (non-blocking Isend/Irecv, a small
  header then the payload, receivers that poll with sleeps backing off so that a waiting
  rank does not spin a core: MPI_Wait busy-polls in Open MPI);
- :class:`Pipeline`, the executor: ``handover="plan"`` executes a plan (a stage ahead of
  the plan waits for the planned version; arrivals are kept until used),
  ``handover="newest"`` is the literal real-time newest-wins of the paper (not
  reproducible: which version an epoch sees depends on timing).

Hand-over modes (``mode``): ``"data"`` sends the transformed rows h = transform(x) from
the producer's replicas to the overlapping rows of the consumer's replicas; ``"weights"``
sends the parameters (W, b_h) of every layer below (the chain that made the version) and
the consumer recomputes its input from its own copy of x, reusing the activations of the
unchanged bottom of the chain. Both give identical inputs (the same transforms in the same
order); they differ in where the work and the bytes are. See :mod:`aepar.sync` for the
measurements and the default.
"""
from __future__ import annotations

import bisect
import copy
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from aepar.parallel.data_parallel import shard

__all__ = ["allot_ranks", "group_stages", "Layout", "make_layout", "PlannedEpoch", "Plan",
           "plan_schedule", "replay_plan", "mode_costs", "choose_mode", "stage_costs", "Pipeline", "PipelineResult",
           "InputRecord", "wait_until", "MODES", "HANDOVERS"]

MODES = ("data", "weights")
HANDOVERS = ("plan", "newest")

# message tags on the world communicator; one (source, destination) pair carries one
# stage boundary only, so these do not collide
TAG_HDR, TAG_PAY, TAG_PROGRESS, TAG_DECIDE = 4101, 4102, 4103, 4104
KIND_VERSION, KIND_FINAL = 0, 1


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
    stage 0 has finished (the seed ended pre-training when layer 1 was done).

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
                receive_cost=None) -> dict:
    """Time the execution of ``plan`` when epochs really take ``epoch_cost`` (per stage).

    What :class:`Pipeline` does with ``handover="plan"``: an epoch starts when its rank
    group is free and its planned input version has arrived; a version is handed over
    (cost ``handover_cost`` to the producer) only if the next stage uses it, and a
    consumer pays ``receive_cost`` (e.g. the recompute of weights hand-over) before the
    first epoch on each new version: per stage, or a callable (stage, old version or
    None, new version) -> seconds. Stages that share a group (``layout``; default one
    group per stage) run one at a time in plan order.

    Returns
    -------
    dict
        ``makespan``, ``stage_end`` (per stage), ``busy`` (per stage: epochs + hand-overs),
        ``wait`` (per stage: time between its first epoch's start and its end not spent busy).
    """
    n = len(plan.stages)
    if receive_cost is None:
        receive_cost = [0.0] * n
    if not callable(receive_cost):
        per_stage = [float(r) for r in receive_cost]

        def receive_cost(stage, old, new):
            return per_stage[stage]
    groups = layout.groups if layout is not None else tuple((i,) for i in range(n))
    group_of = {s: g for g, stages in enumerate(groups) for s in stages}
    free = [0.0] * len(groups)
    ready = [dict() for _ in range(n)]  # ready[l][v]: time stage l's output version v is available
    busy, first, end, last_version = [0.0] * n, [None] * n, [0.0] * n, [None] * n
    for e in plan.order:
        g = group_of[e.stage]
        start = free[g] if e.version == 0 else max(free[g], ready[e.stage - 1][e.version])
        work = float(epoch_cost[e.stage])
        if e.version != last_version[e.stage] and e.stage > 0:
            work += float(receive_cost(e.stage, last_version[e.stage], e.version))
        last_version[e.stage] = e.version
        if e.stage + 1 < n and (e.epoch + 1) in plan.needed(e.stage):
            work += float(handover_cost[e.stage])
        stop = start + work
        busy[e.stage] += work
        ready[e.stage][e.epoch + 1] = stop
        free[g] = stop
        first[e.stage] = start if first[e.stage] is None else first[e.stage]
        end[e.stage] = stop
    wait = [end[l] - first[l] - busy[l] for l in range(n)]
    return {"makespan": max(end), "stage_end": end, "busy": busy, "wait": wait}


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


# ==== waiting without spinning ==============================================================
def wait_until(ready, progress=None, first_sleep=50e-6, max_sleep=2e-3):
    """Call ``progress()`` and ``ready()`` until ``ready()`` is true, sleeping between tries
    with the sleep doubling up to ``max_sleep``: a waiting rank costs ~1% of a core
    (MPI_Wait would spin it at 100%). Returns the seconds waited."""
    t0 = time.perf_counter()
    sleep = first_sleep
    while True:
        if progress is not None:
            progress()
        if ready():
            return time.perf_counter() - t0
        time.sleep(sleep)
        sleep = min(2 * sleep, max_sleep)


# ==== hand-over transport ===================================================================
@dataclass
class InputRecord:
    """One version of a stage's input, as this rank holds it (its rows only).

    ``chain``: ((layer, version), ...) of the layers whose transforms made it from x;
    ``params``: their (W, bh) snapshots, kept only when weights are handed over.
    """

    version: int
    train: object
    val: object
    chain: tuple = ()
    params: tuple | None = None


def _frozen(layer, params):
    """A shallow copy of ``layer`` whose transform uses ``params`` (W, bh)."""
    f = copy.copy(layer)
    f.params = dict(layer.params, **params)
    return f


def _overlap(a: slice, b: slice) -> tuple[slice, slice] | None:
    """(piece in a's local rows, same piece in b's local rows) or None."""
    lo, hi = max(a.start, b.start), min(a.stop, b.stop)
    if hi <= lo:
        return None
    return slice(lo - a.start, hi - a.start), slice(lo - b.start, hi - b.start)


class _Source:
    """Receiving end of one (producer rank -> this rank) link: header, then payload."""

    def __init__(self, comm, xp, dtype, rank: int, size: int, hdr_len: int):
        self.comm, self.xp, self.dtype, self.rank, self.size, self.hdr_len = comm, xp, dtype, rank, size, hdr_len
        self.got = {}          # version -> (header, payload)
        self.final = False
        self.stop = False
        self.pay_req = self.pay_buf = self.pay_hdr = None
        self.hdr_req = None
        self.nbytes = 0
        self._post_header()

    def _post_header(self):
        self.hdr_buf = np.empty(self.hdr_len, dtype=np.int64)
        self.hdr_req = self.comm.irecv(self.hdr_buf, self.rank, TAG_HDR)

    def poll(self):
        while True:
            if self.pay_req is not None:
                if not self.pay_req.test():
                    return
                self.got[int(self.pay_hdr[1])] = (self.pay_hdr, self.pay_buf)
                self.nbytes += int(self.pay_buf.nbytes)
                self.pay_req = self.pay_buf = self.pay_hdr = None
            if self.hdr_req is None or not self.hdr_req.test():
                return
            hdr = self.hdr_buf.copy()
            if hdr[0] == KIND_FINAL:
                self.final, self.stop, self.hdr_req = True, bool(hdr[2]), None
                return
            self.pay_hdr = hdr
            self.pay_buf = self.xp.empty(self.size, dtype=self.dtype)
            self.pay_req = self.comm.irecv(self.pay_buf, self.rank, TAG_PAY)
            self._post_header()


@dataclass
class PipelineResult:
    """What :meth:`Pipeline.run` returns on every rank (records complete on rank 0 only)."""

    time_s: float
    epochs: list          # per epoch (group leaders'): stage, epoch, version, extra, start, end, errors
    handovers: list       # per hand-over (producer leaders'): stage, version, t, seconds, bytes, remote
    receives: list        # per received version (consumer leaders'): stage, version, t, wait_s, recompute_s, bytes
    waits: list           # per rank: wall and CPU seconds spent waiting for input
    layout: dict
    mode: str
    handover: str


class Pipeline:
    """Run the synchronized pre-training of ``layers`` over the ranks of ``comm``.

    Parameters
    ----------
    be : aepar.backend.Backend
    comm : aepar.comm.Comm
        All ranks; every rank holds all layers (the same initial weights) and the whole
        of ``x_train``/``x_val`` (host arrays; each rank takes its rows).
    layers : list of RBM or AELayer
    layout : Layout
    epochs, extras : sequence of int
        Base and extra epochs per stage.
    mode : {"data", "weights"}
        What is handed over between ranks (see the module docstring).
    handover : {"plan", "newest"}
        Execute ``plan`` (reproducible) or the literal real-time newest-wins.
    plan : Plan
        Required for ``handover="plan"``.
    end_with_first : bool
        No extra epoch starts after stage 0 has finished.
    trace : aepar.trace.Trace, optional
    on_epoch : callable(dict), optional
        Called on rank 0 for every finished epoch of every stage (as the records arrive).
    """

    def __init__(self, be, comm, layers, layout: Layout, x_train, x_val, *, epochs, extras,
                 mode="data", handover="plan", plan: Plan | None = None, end_with_first=False,
                 trace=None, on_epoch=None):
        if mode not in MODES or handover not in HANDOVERS:
            raise ValueError(f"mode {mode!r} / handover {handover!r}")
        if handover == "plan" and plan is None:
            raise ValueError("handover='plan' needs a plan")
        if layout.n_ranks != comm.size or layout.n_stages != len(layers):
            raise ValueError(f"layout {layout.describe()} does not fit {comm.size} ranks / {len(layers)} layers")
        from aepar.trace import Trace

        self.be, self.comm, self.layers, self.layout = be, comm, layers, layout
        self.mode, self.handover, self.plan = mode, handover, plan
        self.epochs, self.extras = [int(e) for e in epochs], [int(x) for x in extras]
        self.end_with_first = bool(end_with_first)
        self.trace = trace if trace is not None else Trace(comm, enabled=False)
        self.on_epoch = on_epoch
        self.n = len(layers)
        self.g = layout.group_of_rank(comm.rank)
        self.my_stages = layout.groups[self.g]
        self.my_ranks = layout.ranks[self.g]
        self.stage_comm = comm.split(self.g, comm.rank)
        self.rep, self.n_rep = self.stage_comm.rank, self.stage_comm.size
        self.leader = self.rep == 0
        self.n_train, self.n_val = int(x_train.shape[0]), int(x_val.shape[0])
        self.rows = shard(self.n_train, self.rep, self.n_rep)
        self.vrows = shard(self.n_val, self.rep, self.n_rep)
        self.x_train = be.asarray(x_train[self.rows])
        self.x_val = be.asarray(x_val[self.vrows])
        self.store = {s: {} for s in self.my_stages}   # stage -> version -> InputRecord
        if self.my_stages[0] == 0:
            self.store[0][0] = InputRecord(0, self.x_train, self.x_val, (), ())
        self.trace.label(stages="-".join(str(s + 1) for s in self.my_stages),
                         replica=f"{self.rep + 1}/{self.n_rep}")
        self._sends = []            # pending (Request, keepalive)
        self._chain_cache = []      # weights mode: ((layer, version), train act, val act)
        self.records, self.handover_records, self.receive_records = [], [], []
        self.wait_wall = self.wait_cpu = 0.0
        self._setup_links()
        self._setup_progress()

    # ---- links between groups ------------------------------------------------------------
    def _hdr_len(self):
        return 4 + 2 * self.n

    def _chain_size(self, stage: int) -> int:
        """Payload size (elements) of the weights of layers 0..stage-1 (W and b_h)."""
        return sum(l.n_in * l.n_out + l.n_out for l in self.layers[:stage])

    def _links_between(self, g_from: int):
        """[(sender rank, receiver rank, train pieces, val pieces)] from group g_from to g_from+1.

        Pieces are (sender-local slice, receiver-local slice) or None.
        """
        senders, receivers = self.layout.ranks[g_from], self.layout.ranks[g_from + 1]
        ns, nr = len(senders), len(receivers)
        links = []
        for j, rr in enumerate(receivers):
            if self.mode == "weights":
                links.append((senders[j % ns], rr, None, None))
                continue
            for i, sr in enumerate(senders):
                pt = _overlap(shard(self.n_train, i, ns), shard(self.n_train, j, nr))
                pv = _overlap(shard(self.n_val, i, ns), shard(self.n_val, j, nr))
                if pt is not None or pv is not None:
                    links.append((sr, rr, pt, pv))
        return links

    def _piece_rows(self, piece):
        return 0 if piece is None else piece[0].stop - piece[0].start

    def _setup_links(self):
        be = self.be
        first, last = self.my_stages[0], self.my_stages[-1]
        self.sources, self.out_links = [], []
        if first > 0:
            n_in = self.layers[first].n_in
            for sr, rr, pt, pv in self._links_between(self.g - 1):
                if rr != self.comm.rank:
                    continue
                size = (self._chain_size(first) if self.mode == "weights"
                        else (self._piece_rows(pt) + self._piece_rows(pv)) * n_in)
                src = _Source(self.comm, be.xp, be.dtype, sr, size, self._hdr_len())
                src.pieces = (pt, pv)
                self.sources.append(src)
        if last + 1 < self.n:
            self.out_links = [(rr, pt, pv) for sr, rr, pt, pv in self._links_between(self.g)
                              if sr == self.comm.rank]

    # ---- progress records to rank 0 ------------------------------------------------------
    _REC = 10  # kind, stage, epoch, version, extra, train, val, start, end, rank

    def _setup_progress(self):
        self._progress_in = {}
        self._done_from = set()
        if self.comm.is_root and self.comm.size > 1:
            for r in range(1, self.comm.size):
                self._post_progress(r)

    def _post_progress(self, r):
        buf = np.empty(self._REC)
        self._progress_in[r] = (buf, self.comm.irecv(buf, r, TAG_PROGRESS))

    def _report(self, rec: dict | None):
        """An epoch record (or None: this rank is done) to rank 0."""
        if self.comm.is_root:
            if rec is not None and self.on_epoch is not None:
                self.on_epoch(rec)
            return
        if rec is None:
            arr = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, self.comm.rank], dtype=np.float64)
        else:
            arr = np.array([0, rec["stage"], rec["epoch"], rec["version"], rec["extra"],
                            rec["train_error"], np.nan if rec["val_error"] is None else rec["val_error"],
                            rec["start"], rec["end"], self.comm.rank], dtype=np.float64)
        self._sends.append((self.comm.isend(arr, 0, TAG_PROGRESS), arr))

    def _drain_progress(self):
        for r, (buf, req) in list(self._progress_in.items()):
            while req is not None and req.test():
                if buf[0] == 1:
                    self._done_from.add(r)
                    del self._progress_in[r]
                    req = None
                    break
                rec = {"stage": int(buf[1]), "epoch": int(buf[2]), "version": int(buf[3]),
                       "extra": bool(buf[4]), "train_error": float(buf[5]),
                       "val_error": None if np.isnan(buf[6]) else float(buf[6]),
                       "start": float(buf[7]), "end": float(buf[8]), "rank": int(buf[9])}
                if self.on_epoch is not None:
                    self.on_epoch(rec)
                self._post_progress(r)
                buf, req = self._progress_in[r]

    def _poll(self):
        """Advance every pending transfer once (never blocks)."""
        for src in self.sources:
            src.poll()
        if self._sends:
            self._sends = [(req, keep) for req, keep in self._sends if not req.test()]
        if self._progress_in:
            self._drain_progress()

    def _wait(self, ready, what: str, **args):
        """Wait (sleeping, not spinning) until ``ready()``; recorded as a "wait" span."""
        self._poll()
        if ready():
            return 0.0
        cpu0 = time.process_time()
        with self.trace.span("wait", "wait", what=what, **args):
            waited = wait_until(ready, self._poll)
        self.wait_wall += waited
        self.wait_cpu += time.process_time() - cpu0
        return waited

    # ---- inputs ----------------------------------------------------------------------------
    def _local_producer(self, stage: int) -> bool:
        return stage == 0 or (stage - 1) in self.my_stages

    def _complete_versions(self) -> list:
        """Versions whose pieces have arrived from every source (sorted)."""
        if not self.sources:
            return []
        common = set(self.sources[0].got)
        for src in self.sources[1:]:
            common &= set(src.got)
        return sorted(common)

    def _assemble(self, stage: int, version: int) -> InputRecord:
        """Take version ``version`` out of the sources; older ones are dropped."""
        be, xp = self.be, self.be.xp
        t0 = self.trace.now()
        parts = []
        for src in self.sources:
            parts.append(src.got.pop(version))
            for v in [v for v in src.got if v < version]:
                del src.got[v]
        header = parts[0][0]
        chain = tuple((int(header[4 + 2 * k]), int(header[5 + 2 * k])) for k in range(int(header[3])))
        nbytes = sum(int(p.nbytes) for _, p in parts)
        recompute = 0.0
        if self.mode == "weights":
            payload = parts[0][1]
            params, off = [], 0
            for layer in self.layers[:stage]:
                w = payload[off:off + layer.n_in * layer.n_out].reshape(layer.n_in, layer.n_out)
                off += layer.n_in * layer.n_out
                params.append({"W": w, "bh": payload[off:off + layer.n_out]})
                off += layer.n_out
            r0 = self.trace.now()
            with self.trace.span("recompute", "handover", stage=stage + 1, version=version):
                train, val = self._recompute(chain, params)
            recompute = self.trace.now() - r0
            record = InputRecord(version, train, val, chain, tuple(params))
        else:
            n_in = self.layers[stage].n_in
            train = xp.empty((self.x_train.shape[0], n_in), dtype=be.dtype)
            val = xp.empty((self.x_val.shape[0], n_in), dtype=be.dtype)
            for src, (_, payload) in zip(self.sources, parts):
                pt, pv = src.pieces
                nt = self._piece_rows(pt)
                if pt is not None:
                    train[pt[1]] = payload[:nt * n_in].reshape(nt, n_in)
                if pv is not None:
                    val[pv[1]] = payload[nt * n_in:].reshape(-1, n_in)
            record = InputRecord(version, train, val, chain, None)
        if self.leader:
            self.receive_records.append({"stage": stage, "version": version, "t": t0,
                                         "recompute_s": recompute, "bytes": nbytes})
        return record

    def _recompute(self, chain, params):
        """Weights mode: this rank's input rows through the chain, reusing the cached
        activations of its unchanged bottom."""
        k = 0
        while k < min(len(chain), len(self._chain_cache)) and self._chain_cache[k][0] == chain[k]:
            k += 1
        del self._chain_cache[k:]
        xt, xv = (self._chain_cache[k - 1][1], self._chain_cache[k - 1][2]) if k else (self.x_train, self.x_val)
        for idx in range(k, len(chain)):
            f = _frozen(self.layers[chain[idx][0]], params[idx])
            xt, xv = f.transform(xt), f.transform(xv)
            self._chain_cache.append((chain[idx], xt, xv))
        return xt, xv

    def _input(self, stage: int, version: int) -> InputRecord:
        """The planned input of ``stage`` (waiting for it if it has not arrived)."""
        store = self.store[stage]
        if version not in store:
            if self._local_producer(stage):
                raise RuntimeError(f"stage {stage + 1}: version {version} from the same rank is missing")
            self._wait(lambda: all(version in s.got for s in self.sources),
                       "input", stage=stage + 1, version=version)
            store[version] = self._assemble(stage, version)
        for v in [v for v in store if v < version]:
            del store[v]
        return store[version]

    # ---- one epoch and its hand-over -------------------------------------------------------
    def _epoch(self, stage: int, epoch: int, record: InputRecord, extra: bool) -> dict:
        layer, be = self.layers[stage], self.be
        start = self.trace.now()
        with self.trace.span("epoch", "train", stage=stage + 1, epoch=epoch + 1, version=record.version,
                             extra=extra) as info:
            err = layer.train_epoch(record.train, epoch, comm=self.stage_comm)
            be.synchronize()
            info["train_error"] = err
        end = self.trace.now()
        val_err = None
        if self.n_val:
            with self.trace.span("eval", "eval", stage=stage + 1, epoch=epoch + 1):
                val_err = layer.recon_error(record.val, comm=self.stage_comm)
        rec = {"stage": stage, "epoch": epoch, "version": record.version, "extra": bool(extra),
               "train_error": float(err), "val_error": val_err, "start": start, "end": end,
               "rank": self.comm.rank}
        if self.leader:
            self.records.append(rec)
            self._report(rec)
        return rec

    def _handover(self, stage: int, version: int, record: InputRecord, local_wanted: bool = True):
        """After ``stage``'s epoch ``version``: make input ``version`` of stage+1."""
        layer, be, xp = self.layers[stage], self.be, self.be.xp
        remote = (stage + 1) not in self.my_stages
        if not remote and not local_wanted:
            return
        t0 = self.trace.now()
        nbytes = 0
        with self.trace.span("handover", "handover", stage=stage + 1, version=version,
                             mode=self.mode if remote else "local") as info:
            chain = record.chain + ((stage, version),)
            params = None
            if self.mode == "weights":
                snap = {"W": layer.params["W"].copy(), "bh": layer.params["bh"].copy()}
                params = tuple(record.params or ()) + (snap,)
            if not remote or self.mode == "data":
                ht, hv = layer.transform(record.train), layer.transform(record.val)
            if not remote:
                self.store[stage + 1][version] = InputRecord(version, ht, hv, chain, params)
            else:
                header = np.zeros(self._hdr_len(), dtype=np.int64)
                header[0], header[1], header[3] = KIND_VERSION, version, len(chain)
                for k, (lay, ver) in enumerate(chain):
                    header[4 + 2 * k], header[5 + 2 * k] = lay, ver
                if self.mode == "weights":
                    payload = xp.concatenate([a for p in params for a in (p["W"].reshape(-1), p["bh"])])
                for rr, pt, pv in self.out_links:
                    if self.mode == "data":
                        payload = xp.concatenate([ht[pt[0]].reshape(-1) if pt is not None else xp.empty(0, be.dtype),
                                                  hv[pv[0]].reshape(-1) if pv is not None else xp.empty(0, be.dtype)])
                    be.synchronize()
                    self._sends.append((self.comm.isend(header, rr, TAG_HDR), header))
                    self._sends.append((self.comm.isend(payload, rr, TAG_PAY), payload))
                    nbytes += int(payload.nbytes)
            info["bytes"] = nbytes
        if self.leader:
            self.handover_records.append({"stage": stage, "version": version, "t": t0,
                                          "seconds": self.trace.now() - t0, "bytes": nbytes,
                                          "remote": remote})

    def _send_final(self, stop: bool):
        if self.my_stages[-1] + 1 >= self.n:
            return
        header = np.zeros(self._hdr_len(), dtype=np.int64)
        header[0], header[2] = KIND_FINAL, int(stop)
        for rr, _, _ in self.out_links:
            self._sends.append((self.comm.isend(header, rr, TAG_HDR), header))

    # ---- the schedules ---------------------------------------------------------------------
    def _run_plan(self):
        for e in self.plan.order:
            if e.stage not in self.my_stages:
                continue
            record = self._input(e.stage, e.version)
            self._epoch(e.stage, e.epoch, record, e.extra)
            if e.stage + 1 < self.n and (e.epoch + 1) in self.plan.needed(e.stage):
                self._handover(e.stage, e.epoch + 1, record)
            self._poll()
            if e.epoch + 1 == self.plan.epochs(e.stage):
                if e.stage == self.my_stages[-1]:
                    self._send_final(False)
        for s in self.my_stages:
            self.store[s].clear()

    def _run_newest(self):
        """Real-time newest-wins. The group leader decides which stage runs next on which
        version and tells its replicas (point-to-point, so that waiting replicas sleep);
        stages sharing a rank take turns by least time used, like threads sharing a core."""
        st = {s: {"base": 0, "extra": 0, "last": 0, "done": False, "busy": 0.0} for s in self.my_stages}

        def available(s):
            if s == 0:
                return [0]
            if (s - 1) in self.my_stages:
                return sorted(self.store[s])
            # the version in use (kept in the store) and the complete arrivals
            return sorted(set(self.store[s]) | set(self._complete_versions()))

        def producer_done(s):
            if (s - 1) in self.my_stages:
                return st[s - 1]["done"]
            return all(src.final for src in self.sources)

        def first_done():
            return st[0]["done"] if 0 in st else any(src.stop for src in self.sources)

        def stop(s):
            return self.end_with_first and s > 0 and first_done()

        def finished(s):
            x = st[s]
            if s == 0:
                return x["base"] >= self.epochs[0]
            if x["base"] < self.epochs[s]:
                return False
            if x["extra"] >= self.extras[s] or stop(s):
                return True
            newest = available(s)
            return producer_done(s) and (not newest or newest[-1] <= x["last"])

        def runnable(s):
            x = st[s]
            if x["done"]:
                return None
            if s == 0:
                return 0
            vs = available(s)
            if x["base"] < self.epochs[s]:
                return vs[-1] if vs else None
            return vs[-1] if vs and vs[-1] > x["last"] else None

        def choose():
            for s in self.my_stages:  # in order: a stage's end can end the next one
                if not st[s]["done"] and finished(s):
                    st[s]["done"] = True
            options = [(st[s]["busy"], s, v) for s in self.my_stages if (v := runnable(s)) is not None]
            return min(options) if options else None

        while True:
            if self.leader:
                pick = None

                def ready():
                    nonlocal pick
                    pick = choose()
                    return pick is not None or all(x["done"] for x in st.values())

                self._wait(ready, "input")
                decision = np.array([-1, int(self.end_with_first and first_done())] if pick is None
                                    else [pick[1], pick[2]], dtype=np.int64)
                for r in self.my_ranks[1:]:
                    self._sends.append((self.comm.isend(decision, r, TAG_DECIDE), decision))
            else:
                decision = np.empty(2, dtype=np.int64)
                req = self.comm.irecv(decision, self.my_ranks[0], TAG_DECIDE)
                self._wait(req.test, "decision")
            s, v = int(decision[0]), int(decision[1])
            if s < 0:
                self._send_final(bool(v))
                break
            record = self.store[0][0] if s == 0 else (
                self.store[s][v] if (s - 1) in self.my_stages else self._input(s, v))
            for old in [u for u in self.store[s] if u < v]:
                del self.store[s][old]
            x = st[s]
            extra = x["base"] >= self.epochs[s]
            t0 = self.trace.now()
            self._epoch(s, x["base"] + x["extra"], record, extra)
            x["extra" if extra else "base"] += 1
            x["last"] = v
            if s + 1 < self.n:
                self._handover(s, x["base"] + x["extra"], record,
                               local_wanted=(s + 1) in st and not st[s + 1]["done"])
            x["busy"] += self.trace.now() - t0
        for s in self.my_stages:
            self.store[s].clear()

    # ---- run -------------------------------------------------------------------------------
    def run(self) -> PipelineResult:
        """Pre-train; afterwards every rank holds every layer's final parameters.

        Collective over ``comm``.
        """
        comm = self.comm
        comm.barrier()
        t0 = comm.wtime()
        if self.handover == "plan":
            self._run_plan()
        else:
            self._run_newest()
        elapsed = comm.wtime() - t0
        self._finish()
        time_s = comm.max(elapsed)
        self._share_params()
        waits = comm.gather_obj({"rank": comm.rank, "wait_s": self.wait_wall, "wait_cpu_s": self.wait_cpu,
                                 "group": self.g})
        gathered = comm.gather_obj((self.records, self.handover_records, self.receive_records))
        epochs, handovers, receives = [], [], []
        if comm.is_root:
            for e, h, r in gathered:
                epochs += e
                handovers += h
                receives += r
            epochs.sort(key=lambda r: (r["stage"], r["epoch"]))
            handovers.sort(key=lambda r: (r["stage"], r["version"]))
            receives.sort(key=lambda r: (r["stage"], r["version"]))
        return PipelineResult(time_s, epochs, handovers, receives, waits or [], self.layout.to_dict(),
                              self.mode, self.handover)

    def _finish(self):
        """Let every transfer complete: producers' sends, consumers' drains to the final
        markers, progress records to rank 0."""
        self._wait(lambda: all(src.final for src in self.sources), "drain")
        for src in self.sources:
            src.got.clear()
        self._report(None)
        if self.comm.is_root:
            self._wait(lambda: len(self._done_from) == self.comm.size - 1, "progress")
        self._wait(lambda: not self._sends, "sends")

    def _share_params(self):
        """Every rank gets every layer's parameters from the leader of its group."""
        for s, layer in enumerate(self.layers):
            root = self.layout.ranks[self.layout.group_of_stage(s)][0]
            for k in sorted(layer.params):
                self.comm.bcast(layer.params[k], root=root)
