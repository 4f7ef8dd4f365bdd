"""Makespan model of the pre-training schemes: which layout is fastest on these ranks?

Pure arithmetic (Python + NumPy, no MPI, no clocks): given each layer's costs measured on
ONE rank (:class:`LayerCosts`) it predicts the pre-training time of every scheme of
``python -m aepar.pretrain --scheme ...`` on ``ranks`` processes. The engine's ``auto``
measures the costs for a few batches, calls :func:`predict`, prints :func:`format_table`
and runs :func:`choose`'s scheme; ``bench/makespan.py`` prints the same figures for a
stage-times file. Every figure is a simulation from per-layer times, never a measurement
of the scheme itself.

Schemes (L layers, P ranks, layer l trains ``epochs[l]`` epochs of ``steps[l]`` steps):

- ``greedy`` (aepar.greedy): layer after layer, every batch over the P ranks, the blocks'
  gradients summed in the fixed tree (:func:`tree_sum_s`), transforms between layers
  split P ways.
- ``data`` (15-618): the same, with one MPI Allreduce of the packed gradient per step
  (:func:`allreduce_s`): :func:`data_parallel_s`.
- ``model`` (15-618): one layer per rank in groups of G = min(P, L) consecutive layers;
  layer n starts one slot after n-1 and recomputes its input through frozen copies of the
  group's layers below it whenever they changed; a slot lasts as long as the slowest
  active rank's epoch + refresh, then the ranks exchange the new weights:
  :func:`model_parallel_s`.
- ``sync`` (Santara et al.): the plan of :mod:`aepar.parallel.pipeline` replayed with the
  measured costs, one rank per layer (fewer ranks: consecutive layers share one; more
  ranks: the extra ones idle): :func:`pipeline_s`.
- ``hybrid``: the same pipeline with the extra ranks as data-parallel replicas allotted by
  cost (:func:`aepar.parallel.pipeline.make_layout`), P > L only.

Assumptions (each one a place where the prediction can be wrong):

1. Compute scales perfectly: an epoch on P data-parallel ranks takes epoch_s / P (no
   load imbalance, no smaller-GEMM slowdown), a transform of all rows split P ways
   transform_s / P. Not for greedy and data where their epochs were measured on the P
   ranks (``dp_epoch_s``: ``--scheme auto`` on several ranks), which are taken as they are.
2. Communication follows the alpha-beta model (latency ``alpha`` s, bandwidth ``beta``
   bytes/s; defaults 5 us and 5 GB/s, shared memory), is not overlapped with compute and
   is not slowed by the ranks' compute. Allreduce: 2 log2(P) alpha + 2 (P-1)/P m / beta
   (reduce-scatter + allgather); the fixed tree: ceil(log2 P) levels of one m-byte
   message each, then a Bcast of the sum (ceil(log2 P) alpha + 2 (P-1)/P m / beta), or an
   Allreduce where P ranks hold one node each of the blocks and m >= 64 KB (the tree's
   halving, :func:`aepar.parallel.blocks.halving_pairs`);
   allgather: ceil(log2 P) alpha + (P-1)/P m / beta. m = the packed gradient = the
   parameters' bytes (the few extra sums are ignored).
3. One core per rank unless ``cores`` says fewer: then compute (not communication) is
   slowed by active ranks / cores, active ranks being those that compute (model and sync
   leave ranks beyond L idle). model's slots share the cores by their work: a slot lasts
   its slowest rank's work, or all its ranks' work over the cores if longer (its ranks
   that finish early wait asleep, leaving their core to the others). sync: the plan is
   replayed with the ranks running at a moment sharing the cores equally and the waiting
   ones asleep (:func:`aepar.parallel.pipeline.replay_plan` with ``cores``). hybrid: every
   rank slowed by ranks / cores, as its replicas sum every step and wait for each other's
   turns on the cores.
4. Per-step overheads other than the reduction (sampling a batch, Python) are inside
   epoch_s and split P ways like the rest: small batches per rank make this optimistic.
5. Test-set evaluation, checkpoints and start-up are not counted; the transform of the
   last layer (the code) is not needed by pre-training and not counted. sync's and
   hybrid's validation is: their stages train on the rows not held out and reconstruct
   the held-out ones every epoch (``held_out``, ``validation_s``; ``--scheme auto`` times
   that reconstruction on its probes).
6. model: refreshes are charged only when a layer below in its group changed since the
   last refresh (the implementation's cache); at a group's end every rank computes the
   group's output once, only if a next group needs it.
7. sync/hybrid: the hand-over mode is the one ``--handover-mode auto`` picks from the
   plan's own (FLOP-clock) costs; replicas sum their gradients in the fixed tree.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepar import schemes
from aepar.parallel.blocks import HALVING_BYTES, halving_pairs
from aepar.parallel.pipeline import choose_mode, make_layout, mode_costs, plan_schedule, replay_plan

__all__ = ["SCHEMES", "SPLIT", "LayerCosts", "allreduce_s", "tree_sum_s", "allgather_s", "greedy_s", "greedy_dp_s",
           "data_parallel_s", "model_parallel_s", "pipeline_s", "newest_s", "predict", "choose",
           "format_table"]

SCHEMES = tuple(schemes.names())  # the registry's, in its order


# ==== the input record ======================================================================
def _floats(values, name):
    out = tuple(float(v) for v in values)
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite: {out}")
    return out


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs on ONE rank, the input of every prediction.

    Attributes
    ----------
    epoch_s : tuple of float
        Seconds of one training epoch of layer l over all ``n_train`` rows, one rank (> 0).
    transform_s : tuple of float
        Seconds to pass all rows through layer l (its hand-over to layer l+1), one rank.
    param_bytes : tuple of float
        Bytes of layer l's parameters (= its packed gradient and its weights message).
    steps_per_epoch : tuple of int
        Optimiser steps (reductions) per epoch of layer l: ceil(n_train / batch).
    epochs, extras : tuple of int
        Epochs each layer trains; extra epochs the synchronized schedule may add.
    n_train : int
        Training rows.
    batch : int, optional
        Global minibatch: data-parallel ranks (and a stage's replicas) need a row of each.
    blocks : int, optional
        ``--reduce-blocks``: every data-parallel rank needs a whole block.
    plan_epoch, plan_handover : tuple of float, optional
        The logical costs the synchronized executor plans with (its FLOP clock,
        :func:`aepar.parallel.pipeline.stage_costs`); None: plan with ``epoch_s`` and
        ``transform_s``.
    dp_ranks : int, optional
        The rank count ``dp_epoch_s`` was measured on.
    dp_epoch_s, dp_reduction_s : dict, optional
        scheme ("greedy", "data") -> seconds of one epoch of each layer, data-parallel on
        ``dp_ranks`` ranks (the sums over the ranks included), and of those the sums'
        (:func:`aepar.pretrain.measure_on_ranks`); None: simulated from ``epoch_s``.
    held_out : int, optional
        Of the ``n_train`` rows ``epoch_s`` covers, those sync and hybrid hold out for
        validation (``--val-fraction``): their epochs train on the rest (``--scheme auto``
        times the epochs on every row; 0 where the rows are already sync's, as in a
        stage-times file).
    validation_s : tuple of float, optional
        Seconds to reconstruct the held-out rows through layer l once, one rank: what
        sync's and hybrid's stages add to every epoch; None: not counted.
    blocked_epoch_s : tuple of float, optional
        ``epoch_s`` with the rows in the ``blocks`` fixed blocks (each block's sums apart,
        then the fixed tree), as greedy on one rank and sync's and hybrid's stages train:
        on a narrow layer each block's share of a step costs more than its rows (the
        calls per block); None: ``epoch_s``. ``epoch_s`` is the epoch as one block, as
        model and data on one rank train.
    """

    epoch_s: tuple
    transform_s: tuple
    param_bytes: tuple
    steps_per_epoch: tuple
    epochs: tuple
    extras: tuple
    n_train: int
    batch: int | None = None
    blocks: int | None = None
    plan_epoch: tuple | None = None
    plan_handover: tuple | None = None
    dp_ranks: int | None = None
    dp_epoch_s: dict | None = None
    dp_reduction_s: dict | None = None
    held_out: int = 0
    validation_s: tuple | None = None
    blocked_epoch_s: tuple | None = None

    def __post_init__(self):
        fix = object.__setattr__
        fix(self, "epoch_s", _floats(self.epoch_s, "epoch_s"))
        fix(self, "transform_s", _floats(self.transform_s, "transform_s"))
        fix(self, "param_bytes", _floats(self.param_bytes, "param_bytes"))
        fix(self, "steps_per_epoch", tuple(int(s) for s in self.steps_per_epoch))
        fix(self, "epochs", tuple(int(e) for e in self.epochs))
        fix(self, "extras", tuple(int(x) for x in self.extras))
        n = len(self.epoch_s)
        for name in ("transform_s", "param_bytes", "steps_per_epoch", "epochs", "extras"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} layers")
        if n == 0:
            raise ValueError("no layers")
        if min(self.epoch_s) <= 0:
            raise ValueError(f"epoch times must be positive: {self.epoch_s}")
        if min(self.transform_s) < 0 or min(self.param_bytes) < 0:
            raise ValueError("transform times and parameter bytes cannot be negative")
        if min(self.steps_per_epoch) < 1 or min(self.epochs) < 1 or min(self.extras) < 0:
            raise ValueError("every layer needs at least one step and one epoch; extras cannot be negative")
        if int(self.n_train) < 1:
            raise ValueError(f"n_train must be positive, not {self.n_train}")
        fix(self, "n_train", int(self.n_train))
        for name in ("batch", "blocks"):
            v = getattr(self, name)
            if v is not None:
                if int(v) < 1:
                    raise ValueError(f"{name} must be positive, not {v}")
                fix(self, name, int(v))
        for name in ("plan_epoch", "plan_handover"):
            v = getattr(self, name)
            if v is not None:
                v = _floats(v, name)
                if len(v) != n:
                    raise ValueError(f"{name} has {len(v)} entries for {n} layers")
                fix(self, name, v)
        if (self.plan_epoch is None) != (self.plan_handover is None):
            raise ValueError("give both plan_epoch and plan_handover, or neither")
        if (self.dp_epoch_s is None) != (self.dp_reduction_s is None) or \
                (self.dp_epoch_s is not None) != (self.dp_ranks is not None):
            raise ValueError("give dp_ranks, dp_epoch_s and dp_reduction_s together, or none of them")
        if self.dp_epoch_s is not None:
            if int(self.dp_ranks) < 2 or set(self.dp_epoch_s) != set(self.dp_reduction_s):
                raise ValueError("dp_ranks must be 2 or more, and dp_epoch_s and dp_reduction_s name the same schemes")
            fix(self, "dp_ranks", int(self.dp_ranks))
            for name in ("dp_epoch_s", "dp_reduction_s"):
                table = {k: _floats(v, f"{name}[{k}]") for k, v in getattr(self, name).items()}
                if any(len(v) != n for v in table.values()):
                    raise ValueError(f"{name} needs a value per layer ({n})")
                fix(self, name, table)
            if any(min(v) <= 0 for v in self.dp_epoch_s.values()) or \
                    any(r < 0 or r > e for k in self.dp_epoch_s for e, r in zip(self.dp_epoch_s[k],
                                                                           self.dp_reduction_s[k])):
                raise ValueError("measured epochs must be positive, their sums between 0 and the epoch")
        if not 0 <= int(self.held_out) < self.n_train:
            raise ValueError(f"held_out must be between 0 and n_train - 1, not {self.held_out}")
        fix(self, "held_out", int(self.held_out))
        if self.validation_s is not None:
            v = _floats(self.validation_s, "validation_s")
            if len(v) != n or min(v) < 0:
                raise ValueError(f"validation_s needs a non-negative value per layer ({n}): {v}")
            fix(self, "validation_s", v)
        if self.blocked_epoch_s is not None:
            v = _floats(self.blocked_epoch_s, "blocked_epoch_s")
            if len(v) != n or min(v) <= 0:
                raise ValueError(f"blocked_epoch_s needs a positive value per layer ({n}): {v}")
            fix(self, "blocked_epoch_s", v)

    @property
    def n_layers(self) -> int:
        return len(self.epoch_s)

    @property
    def blocked(self) -> tuple:
        """Each layer's epoch in the fixed blocks (``blocked_epoch_s``, else ``epoch_s``)."""
        return self.blocked_epoch_s or self.epoch_s

    def with_epochs(self, epochs) -> "LayerCosts":
        """The same costs, every layer training ``epochs`` (an int or one per layer)."""
        e = [int(epochs)] * self.n_layers if np.isscalar(epochs) else list(epochs)
        return LayerCosts(**{**self.__dict__, "epochs": tuple(e)})

    @classmethod
    def measured(cls, layers, epoch_s, transform_s, n_train, batch, extras=None, *, dtype=np.float32,
                 n_val=0, blocks=None, held_out=0, validation_s=None, blocked_epoch_s=None) -> "LayerCosts":
        """From in-run measurements.

        Parameters
        ----------
        layers : sequence
            Objects with ``n_in``, ``n_out`` and ``epochs`` (the RBM/AELayer models); with a
            ``flops_per_sample()`` method the sync plan uses the executor's FLOP clock.
        epoch_s, transform_s : sequence of float
            One rank, all ``n_train`` rows (scale a few timed batches up before calling).
        n_train, batch : int
        extras : sequence of int, optional
            The synchronized schedule's extra epochs (default none).
        dtype : numpy dtype
            Of the parameters: param bytes = itemsize x (n_in n_out + n_in + n_out).
        n_val : int
            Validation rows the executor's FLOP clock charges each epoch.
        held_out, validation_s
            As the attributes: sync's plan is then made for the ``n_train - held_out``
            rows it trains on.
        blocked_epoch_s
            As the attribute (one rank, all ``n_train`` rows in ``blocks`` blocks).
        """
        itemsize = np.dtype(dtype).itemsize
        n = len(layers)
        plan_e = plan_h = None
        if all(callable(getattr(l, "flops_per_sample", None)) for l in layers):
            plan_e, plan_h = _flop_clock([(l.n_in, l.n_out, l.flops_per_sample()) for l in layers],
                                         int(n_train) - int(held_out), n_val)
        return cls(epoch_s=tuple(epoch_s), transform_s=tuple(transform_s),
                   param_bytes=tuple(itemsize * (l.n_in * l.n_out + l.n_in + l.n_out) for l in layers),
                   steps_per_epoch=(-(-int(n_train) // int(batch)),) * n, epochs=tuple(l.epochs for l in layers),
                   extras=tuple(extras) if extras is not None else (0,) * n, n_train=n_train, batch=batch,
                   blocks=blocks, plan_epoch=plan_e, plan_handover=plan_h,
                   held_out=held_out, validation_s=validation_s, blocked_epoch_s=blocked_epoch_s)

    @classmethod
    def from_stage_times(cls, st) -> "LayerCosts":
        """From a stage-times JSON (a path or its dict, as ``bench.stacked`` writes it:
        ``layers`` with ``epoch_s, transform_s, steps, param_bytes`` and optionally
        ``n_in, n_out, flops_per_sample``; ``epochs``, ``extras``, ``n_train``, ``n_val``,
        ``batch``, ``blocks``)."""
        if not isinstance(st, dict):
            st = json.loads(Path(st).read_text())
        layers = st["layers"]
        n = len(layers)
        n_train = int(st.get("n_train", 1))
        plan_e = plan_h = None
        if all(k in l for l in layers for k in ("n_in", "n_out", "flops_per_sample")):
            plan_e, plan_h = _flop_clock([(l["n_in"], l["n_out"], l["flops_per_sample"]) for l in layers],
                                         n_train, int(st.get("n_val", 0)))
        return cls(epoch_s=tuple(l["epoch_s"] for l in layers), transform_s=tuple(l["transform_s"] for l in layers),
                   param_bytes=tuple(l["param_bytes"] for l in layers),
                   steps_per_epoch=tuple(l["steps"] for l in layers), epochs=tuple(st["epochs"]),
                   extras=tuple(st.get("extras") or (0,) * n), n_train=n_train, batch=st.get("batch"),
                   blocks=st.get("blocks"), plan_epoch=plan_e, plan_handover=plan_h)


def _flop_clock(shapes, n_train, n_val):
    """The executor's plan costs (:func:`aepar.parallel.pipeline.stage_costs`) from
    (n_in, n_out, flops per sample) per layer."""
    epoch = tuple(float(f) * n_train + 4.0 * float(a) * float(b) * n_val for a, b, f in shapes)
    hand = tuple(2.0 * float(a) * float(b) * (n_train + n_val) for a, b, _ in shapes)
    return epoch, hand


# ==== communication (alpha-beta) ============================================================
def _depth(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def allreduce_s(nbytes: float, n: int, alpha=5e-6, beta=5e9) -> float:
    """One Allreduce of ``nbytes`` over ``n`` ranks: 2 log2(n) alpha + 2 (n-1)/n nbytes / beta."""
    if n <= 1:
        return 0.0
    return 2 * math.log2(n) * alpha + 2.0 * (n - 1) / n * nbytes / beta


def tree_sum_s(nbytes: float, n: int, alpha=5e-6, beta=5e9, blocks=None) -> float:
    """aepar's fixed-tree sum over ``n`` ranks: n-1 messages of ``nbytes`` up a tree
    ceil(log2 n) deep (one message per level on the critical path), then a Bcast of the
    sum (scatter + allgather: ceil(log2 n) alpha + 2 (n-1)/n nbytes / beta). Where the
    ranks hold one node each of ``blocks`` (:func:`aepar.parallel.blocks.halving_pairs`)
    and the vector is long, it halves and doubles instead: :func:`allreduce_s`."""
    if n <= 1:
        return 0.0
    if blocks is not None and halving_pairs(int(blocks), n) and nbytes >= HALVING_BYTES:
        return allreduce_s(nbytes, n, alpha, beta)
    d = _depth(n)
    return d * (alpha + nbytes / beta) + d * alpha + 2.0 * (n - 1) / n * nbytes / beta


def allgather_s(nbytes: float, n: int, alpha=5e-6, beta=5e9) -> float:
    """Every rank ends with ``nbytes`` gathered from all ``n``: ceil(log2 n) alpha + (n-1)/n nbytes / beta."""
    if n <= 1:
        return 0.0
    return _depth(n) * alpha + (n - 1) / n * nbytes / beta


def _slowdown(active: int, cores) -> float:
    return max(1.0, active / cores) if cores else 1.0


def _shared(busy, cores) -> float:
    """Seconds for ranks with ``busy`` seconds of work each, all started at once, on
    ``cores`` cores shared by their work (None: a core each): the longest, or all of the
    work spread over the cores if that takes longer."""
    busy = list(busy)
    return max(max(busy), sum(busy) / cores) if cores else max(busy)


# ==== the schemes ===========================================================================
def greedy_s(costs: LayerCosts) -> float:
    """Greedy on one rank: every layer's epochs in the fixed blocks, then its transform
    (not the code layer's)."""
    return sum(e * t for e, t in zip(costs.epochs, costs.blocked)) + sum(costs.transform_s[:-1])


SPLIT = ("training", "reduction", "handover", "wait")  # a prediction's parts, as the profile's phases


def _split(training=0.0, reduction=0.0, handover=0.0, wait=0.0) -> dict:
    """A rank's predicted seconds by operation (the mean over the ranks), in :data:`SPLIT` order."""
    parts = {"training": training, "reduction": reduction, "handover": handover, "wait": wait}
    return {k: max(0.0, v) for k, v in parts.items()}  # a difference of sums may round below 0


def _measured_on(costs, ranks, scheme):
    """(epoch seconds, of them the sums') per layer of ``scheme`` as measured on these
    ``ranks``, or None where not measured (or on another rank count)."""
    if costs.dp_epoch_s is None or costs.dp_ranks != int(ranks) or scheme not in costs.dp_epoch_s:
        return None
    return costs.dp_epoch_s[scheme], costs.dp_reduction_s[scheme]


def _layerwise_dp_split(costs, ranks, reduce_s, cores, scheme=None) -> dict:
    """Every rank alike: its share of each epoch, the sums per step, and its share of the
    transforms that make the next layer's input (the greedy schemes' hand-over). Where the
    epochs of ``scheme`` were measured on these ranks, those epochs and their sums."""
    f = _slowdown(ranks, cores)
    measured = _measured_on(costs, ranks, scheme)
    if measured is not None:
        epochs, sums = measured
        return _split(training=sum(e * (t - r) for e, t, r in zip(costs.epochs, epochs, sums)),
                      reduction=sum(e * r for e, r in zip(costs.epochs, sums)),
                      handover=sum(costs.transform_s[:-1]) / ranks * f)
    # greedy's rows are the fixed blocks; data's a block per rank, one block on one rank
    one_rank = costs.blocked if scheme == "greedy" else costs.epoch_s
    return _split(training=sum(e * t / ranks * f for e, t in zip(costs.epochs, one_rank)),
                  reduction=sum(e * s * reduce_s(b) for e, s, b in
                                zip(costs.epochs, costs.steps_per_epoch, costs.param_bytes)),
                  handover=sum(costs.transform_s[:-1]) / ranks * f)


def _layerwise_dp(costs, ranks, reduce_s, cores, scheme):
    return sum(_layerwise_dp_split(costs, ranks, reduce_s, cores, scheme).values())


def greedy_dp_s(costs: LayerCosts, ranks: int, alpha=5e-6, beta=5e9, cores=None) -> float:
    """aepar.greedy on ``ranks``: blocked_epoch_s / P + steps x the fixed-tree sum of the
    parameters per epoch, the transforms between layers split P ways (the epochs as
    measured on these ranks where ``costs`` has them)."""
    return _layerwise_dp(costs, ranks, lambda b: tree_sum_s(b, ranks, alpha, beta, costs.blocks), cores, "greedy")


def data_parallel_s(costs: LayerCosts, ranks: int, alpha=5e-6, beta=5e9, cores=None) -> float:
    """The 15-618 data-parallel scheme on ``ranks``: greedy's order, one Allreduce of the
    packed gradient per step (the epochs as measured on these ranks where ``costs`` has them)."""
    return _layerwise_dp(costs, ranks, lambda b: allreduce_s(b, ranks, alpha, beta), cores, "data")


def model_parallel_s(costs: LayerCosts, ranks: int, alpha=5e-6, beta=5e9, cores=None) -> dict:
    """The 15-618 model-parallel scheme: groups of G = min(P, L) layers, one per rank.

    In slot t of a group layer ``first + k`` trains its epoch t - k. Its rank first
    recomputes the layer's input from the group's input through the copies of layers
    first..first+k-1 if any of them changed since it last did (sum of their
    ``transform_s``), then trains (``epoch_s``). The slot ends with the slowest rank, and
    the weights the slot changed are allgathered over all P ranks. A group takes
    G - 1 + max(epochs) slots; the next group starts on the group's output, computed once
    by every rank (sum of the group's ``transform_s``).

    Returns
    -------
    dict
        ``seconds``, ``group`` (G), ``slots`` (per group), ``comm_s`` (total exchange time).
    """
    n, p = costs.n_layers, int(ranks)
    g_size = min(p, n)
    f = _slowdown(g_size, cores)  # the group's output, computed by all of them at once
    total, comm, slots_per_group = 0.0, 0.0, []
    trained, refreshed, passed_on = 0.0, 0.0, 0.0  # summed over the ranks, for the split
    for first in range(0, n, g_size):
        members = range(first, min(first + g_size, n))
        n_slots = max(j - first + costs.epochs[j] for j in members)
        done = {j: 0 for j in members}
        seen = {}  # layer -> versions of the group's layers below it its input was computed from
        for t in range(n_slots):
            active = [(j, t - (j - first)) for j in members if 0 <= t - (j - first) < costs.epochs[j]]
            busy, work, refreshes = {}, 0.0, 0.0
            for j, _ in active:
                versions = tuple(done[i] for i in range(first, j))
                refresh = sum(costs.transform_s[first:j]) if seen.get(j) != versions else 0.0
                seen[j] = versions
                rank = (j - first) % p
                busy[rank] = busy.get(rank, 0.0) + costs.epoch_s[j] + refresh
                work, refreshes = work + costs.epoch_s[j], refreshes + refresh
            slot = _shared(busy.values(), cores)
            stretch = slot / max(busy.values()) if max(busy.values()) > 0 else 1.0
            trained, refreshed = trained + work * stretch, refreshed + refreshes * stretch
            exchange = allgather_s(sum(costs.param_bytes[j] for j, _ in active), p, alpha, beta)
            total += slot + exchange
            comm += exchange
            for j, e in active:
                done[j] = e + 1
        slots_per_group.append(n_slots)
        if members[-1] + 1 < n:  # the next group trains on this group's output
            total += sum(costs.transform_s[j] for j in members) * f
            passed_on += sum(costs.transform_s[j] for j in members) * f
    # every rank spends the exchanges and the group transforms; the epochs and refreshes are
    # spread over the ranks; the rest of the slots, waiting for the slot's slowest rank
    handover = comm + passed_on + refreshed / p
    split = _split(training=trained / p, handover=handover, wait=total - trained / p - handover)
    return {"seconds": total, "group": g_size, "slots": slots_per_group, "comm_s": comm, "split": split}


def pipeline_s(costs: LayerCosts, ranks: int, *, replicas: bool, mode=None, end_with_first=False,
               alpha=5e-6, beta=5e9, cores=None) -> dict:
    """The synchronized pipeline's plan replayed with the measured costs.

    ``replicas`` False (``sync``): at most one rank per layer, ranks beyond L idle; True
    (``hybrid``): :func:`aepar.parallel.pipeline.make_layout` gives the costly layers
    data-parallel replicas (capped by the batch and blocks), each replica epoch
    blocked_epoch_s / n + steps x :func:`tree_sum_s`. A stage's epoch (in the fixed
    blocks) trains the rows not ``held_out`` and reconstructs the held-out ones
    (``validation_s``). ``mode`` None: the hand-over mode ``--handover-mode auto`` picks.

    Returns
    -------
    dict
        ``seconds``, ``layout`` (text), ``replicas``, ``mode``, ``epochs`` (planned,
        extras included), ``busy`` (per stage), ``ranks_used``.
    """
    n = costs.n_layers
    # the stages train on the rows not held out, and reconstruct the held-out ones every epoch
    kept = costs.n_train - costs.held_out
    epoch_s = [t * kept / costs.n_train + v for t, v in zip(costs.blocked, costs.validation_s or (0.0,) * n)]
    steps = (-(-kept // costs.batch),) * n if costs.held_out and costs.batch else costs.steps_per_epoch
    plan_e = costs.plan_epoch or epoch_s
    plan_h = costs.plan_handover or costs.transform_s
    plan = plan_schedule(plan_e, plan_h, costs.epochs, costs.extras, end_with_first)
    totals = [plan_e[l] * plan.epochs(l) for l in range(n)]
    used = int(ranks) if replicas else min(int(ranks), n)
    caps = [c for c in (costs.batch, costs.blocks) if c is not None]
    layout = make_layout(totals, used, max_per_stage=min(caps) if caps else None)
    f = _slowdown(used, cores)
    if mode is None:
        mode = choose_mode(plan, layout, plan_e, plan_h, oversubscribed=f > 1)[0]
    reps = [layout.replicas(l) for l in range(n)]
    # oversubscribed: the stages running at a moment share the cores and the waiting ones
    # sleep; but replicas sum every step, each waiting (polling) for the others' turns on
    # the cores, so with replicas every rank counts as busy: compute slowed by ranks / cores
    replicated = max(reps) > 1
    slow = f if replicated else 1.0
    _, hand, receive = mode_costs(plan, layout, [t * slow for t in epoch_s],
                                  [t * slow for t in costs.transform_s], mode)
    epoch = [epoch_s[l] * slow / reps[l]
             + steps[l] * tree_sum_s(costs.param_bytes[l], reps[l], alpha, beta, costs.blocks)
             for l in range(n)]
    replay = replay_plan(plan, epoch, hand, layout, receive, cores=None if replicated else cores)
    stretch = [b / w if w > 0 else 1.0 for b, w in zip(replay["busy"], replay["work"])]
    # the split, per group of ranks (stages on one group run in turn), then the mean over ranks
    parts = dict.fromkeys(SPLIT, 0.0)
    for stages, ranks_g in zip(layout.groups, layout.ranks):
        reduction = sum(stretch[l] * plan.epochs(l) * steps[l]
                        * tree_sum_s(costs.param_bytes[l], reps[l], alpha, beta, costs.blocks) for l in stages)
        training = sum(stretch[l] * plan.epochs(l) * epoch[l] for l in stages) - reduction
        handover = sum(replay["busy"][l] for l in stages) - training - reduction
        for k, v in zip(SPLIT, (training, reduction, handover,
                                replay["makespan"] - training - reduction - handover)):
            parts[k] += len(ranks_g) * v
    split = _split(**{k: v / used for k, v in parts.items()})
    return {"seconds": replay["makespan"], "layout": layout.describe(), "replicas": reps, "mode": mode,
            "epochs": [plan.epochs(l) for l in range(n)], "busy": replay["busy"], "ranks_used": used,
            "split": split}


def newest_s(costs: LayerCosts, mode="data", end_with_first=False) -> float:
    """Real-time newest-wins (``--schedule newest``), one rank per layer: the schedule
    itself run on the measured costs; ``weights`` charges every epoch the recompute of the
    whole chain below (an upper bound)."""
    n = costs.n_layers
    epoch = list(costs.blocked)
    hand = list(costs.transform_s) if mode == "data" else [0.0] * n
    if mode == "weights":
        epoch = [epoch[l] + sum(costs.transform_s[:l]) for l in range(n)]
    return plan_schedule(epoch, hand, costs.epochs, costs.extras, end_with_first).makespan


# ==== prediction, choice, table =============================================================
def _cannot_run_dp(costs, ranks, blocks=True):
    """Why data-parallel layer-wise training cannot use ``ranks`` (None if it can);
    ``blocks``: the fixed blocks limit the ranks (greedy; data cuts one block per rank)."""
    if blocks and costs.blocks is not None and ranks > costs.blocks:
        return f"{ranks} ranks > {costs.blocks} blocks: each rank needs a whole block"
    if costs.batch is not None and ranks > costs.batch:
        return f"{ranks} ranks > batch {costs.batch}: each rank needs a row of every batch"
    if ranks > costs.n_train:
        return f"{ranks} ranks > {costs.n_train} training rows"
    return None


def predict(costs: LayerCosts, ranks: int, *, cores=None, alpha=5e-6, beta=5e9, end_with_first=False) -> dict:
    """Predicted pre-training seconds of every scheme on ``ranks`` processes.

    Parameters
    ----------
    costs : LayerCosts
        One-rank costs.
    ranks : int
    cores : int, optional
        Cores the ranks share; fewer than the ranks that compute slows compute by
        ranks / cores (see the module's assumptions). None: one core per rank.
    alpha, beta : float
        Latency (s) and bandwidth (bytes/s) of the communication model.

    Returns
    -------
    dict
        scheme -> {``seconds`` (None where the scheme cannot run on ``ranks``), ``note``,
        ``ratio`` (seconds / greedy on one rank), ``ranks``, ``cores``, and where it can run
        ``split``: a rank's seconds by operation, the mean over the ranks (:data:`SPLIT`:
        training, reduction, hand-over, wait; they add up to ``seconds``)}, in
        :data:`SCHEMES` order.
    """
    p = int(ranks)
    if p < 1:
        raise ValueError(f"ranks must be positive, not {ranks}")
    if cores is not None and int(cores) < 1:
        raise ValueError(f"cores must be positive, not {cores}")
    n = costs.n_layers
    kw = dict(alpha=alpha, beta=beta, cores=cores)
    comm = f"alpha {alpha:g} s, beta {beta:g} B/s"

    def over(active):
        return f"; oversubscribed: {active} ranks on {cores} cores, compute x{active / cores:.2g}" \
            if cores and active > cores else ""

    def how(scheme, summed):  # measured epochs need no communication model
        if _measured_on(costs, p, scheme) is not None:
            return f"layer by layer, {summed}; epochs measured on these ranks"
        return f"layer by layer, {summed} ({comm})" + over(p)

    out = {}
    why = _cannot_run_dp(costs, p)
    out["greedy"] = {"seconds": None, "note": why} if why else {
        "seconds": greedy_dp_s(costs, p, **kw),
        "split": _layerwise_dp_split(costs, p, lambda b: tree_sum_s(b, p, alpha, beta, costs.blocks), cores,
                                     "greedy"),
        "note": "one rank" if p == 1 else how("greedy", "fixed-tree gradient sum")}
    why = _cannot_run_dp(costs, p, blocks=False)
    out["data"] = {"seconds": None, "note": why} if why else {
        "seconds": data_parallel_s(costs, p, **kw),
        "split": _layerwise_dp_split(costs, p, lambda b: allreduce_s(b, p, alpha, beta), cores, "data"),
        "note": "one rank: greedy's order, the rows as one block" if p == 1 else how("data", "Allreduce per step")}
    if min(p, n) < 2:
        out["model"] = {"seconds": None, "note": "needs 2+ ranks and 2+ layers (a group of 1 is greedy)"}
    else:
        m = model_parallel_s(costs, p, **kw)
        g = m["group"]
        idle = f"; {p - n} ranks idle" if p > n else ""
        out["model"] = {"seconds": m["seconds"], "split": m["split"],
                        "note": f"groups of {g} layers, {'+'.join(map(str, m['slots']))} epoch slots, "
                                f"weights allgathered each slot ({m['comm_s']:.3g} s){idle}" + over(g)}
    s = pipeline_s(costs, p, replicas=False, end_with_first=end_with_first, **kw)
    idle = f"; {p - n} ranks idle" if p > n else ""
    out["sync"] = {"seconds": s["seconds"], "split": s["split"],
                   "note": f"{s['layout']}; hand-over {s['mode']}; epochs {s['epochs']}{idle}" + over(s["ranks_used"])}
    if p <= n:
        out["hybrid"] = {"seconds": None, "note": f"needs more ranks than layers ({n})"}
    else:
        try:
            h = pipeline_s(costs, p, replicas=True, end_with_first=end_with_first, **kw)
            out["hybrid"] = {"seconds": h["seconds"], "split": h["split"],
                             "note": f"{h['layout']}; hand-over {h['mode']}; replicas sum in the fixed tree"
                                     + over(p)}
        except ValueError as exc:  # more ranks than the per-stage caps allow
            out["hybrid"] = {"seconds": None, "note": str(exc)}
    for name in schemes.names():  # a scheme registered without a cost model here cannot be chosen
        out.setdefault(name, {"seconds": None, "note": "no cost model in aepar.parallel.planner"})
    base = greedy_s(costs)
    for entry in out.values():
        entry["ratio"] = entry["seconds"] / base if entry["seconds"] is not None else None
        entry["ranks"], entry["cores"] = p, cores
    return {k: out[k] for k in schemes.names()}


def choose(predictions: dict, margin: float = 0.0) -> str:
    """The scheme ``auto`` runs: the fastest, except that nothing replaces ``data`` (when
    data can run) unless it is predicted strictly faster than ``data x (1 - margin)``;
    ties among the others go to the first in :data:`SCHEMES` order.

    Raises
    ------
    ValueError
        If no scheme can run.
    """
    runnable = [(v["seconds"], SCHEMES.index(k) if k in SCHEMES else len(SCHEMES), k)
                for k, v in predictions.items() if v.get("seconds") is not None]
    if not runnable:
        raise ValueError("no scheme can run on these ranks: " +
                         "; ".join(f"{k}: {v.get('note', '')}" for k, v in predictions.items()))
    seconds, _, best = min(runnable)
    data = predictions.get("data", {}).get("seconds")
    if data is not None and not seconds < data * (1.0 - margin):
        return "data"
    return best


def format_table(predictions: dict) -> str:
    """A markdown table of :func:`predict`'s figures, the chosen scheme marked."""
    first = next(iter(predictions.values()), {})
    ranks, cores = first.get("ranks"), first.get("cores")
    try:
        chosen = choose(predictions)
    except ValueError:
        chosen = None
    where = f"{ranks} rank(s)" + (f" on {cores} core(s)" if cores else ", one core each")
    measured = any("measured on these ranks" in str(v.get("note", "")) for v in predictions.values())
    how = ("greedy's and data's layer epochs measured on these ranks, the rest simulated from one-rank layer "
           "times" if measured else "simulated from one-rank layer times, not measured")
    lines = [f"Predicted pre-training time on {where} - {how}; lower is better.", "",
             "| scheme | predicted s | x greedy on 1 rank | note |", "| --- | ---: | ---: | --- |"]
    for k, v in predictions.items():
        name = f"**{k}** (auto)" if k == chosen else k
        sec = f"{v['seconds']:.3f}" if v.get("seconds") is not None else "–"
        ratio = f"{v['ratio']:.3f}" if v.get("ratio") is not None else "–"
        note = str(v.get("note", "")).replace(" | ", "; ").replace("|", "/")  # a bar would split the cell
        lines.append(f"| {name} | {sec} | {ratio} | {note} |")
    return "\n".join(lines)
