"""The scaling model itself, pure (no MPI, no clocks): communication over measured links,
the measured compute record, and the schemes composed from them.

The schedules of two schemes are the planner's (:mod:`aepar.parallel.planner`, the model
``--scheme auto`` chooses with): :func:`model_parallel_s` and :func:`pipeline_s` hand it
their measured per-layer costs and keep here only what the planner lacks (the measured
collectives, per-replica epochs, hand-over messages); see each one.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

from aepar.parallel import planner
from aepar.parallel.data_parallel import SHARED_STEP_FLOPS


OPS = ("bcast", "reduce", "allreduce", "sendrecv", "send", "tree_reduce", "tree_allreduce", "tree_halving")
RANKS = tuple(2 ** k for k in range(11))  # 1 .. 1024

# Network profiles for the links *between* nodes: typical MPI figures, not measured here.
# alpha = small-message one-way MPI latency, beta = large-message MPI bandwidth.
PROFILES = {
    "10GbE": dict(alpha=30e-6, beta=1.1e9,
                  source="MPI over TCP on 10 Gb/s Ethernet: 20-50 us small-message latency (kernel "
                         "socket path, interrupt moderation), ~1.1 GB/s of the 1.25 GB/s line rate"),
    "25GbE": dict(alpha=20e-6, beta=2.8e9,
                  source="MPI over TCP on 25 Gb/s Ethernet: ~15-25 us, ~2.8 GB/s of 3.125 GB/s line rate"),
    "100GbE": dict(alpha=10e-6, beta=11e9,
                   source="MPI over TCP on 100 Gb/s Ethernet: ~8-15 us (RoCE would be ~2-3 us), "
                          "~11 GB/s of 12.5 GB/s line rate"),
    "IB-HDR": dict(alpha=1.5e-6, beta=23e9,
                   source="MPI over InfiniBand HDR 200 Gb/s (RDMA): ~1-2 us, ~23 GB/s of 25 GB/s line rate"),
}


# =============================================================================================
# Communication model (pure)
# =============================================================================================

@dataclass(frozen=True)
class Link:
    """Hockney's model of one operation: ``alpha`` seconds + ``nbytes / beta``."""

    alpha: float
    beta: float

    def t(self, nbytes: float) -> float:
        return self.alpha + float(nbytes) / self.beta


@dataclass(frozen=True)
class Curve(Link):
    """An operation measured at np 2: ``alpha`` and ``beta`` its fitted line (the report's
    figures, the bandwidth-optimal form's latency), ``t(n)`` the measured points themselves,
    log-log between the sizes measured (one line misses the switches from eager to
    rendezvous and from cache to memory: a reduce just past the L3 cache took an order of
    magnitude longer than one just inside it), the
    smallest size's time below them and the largest's seconds per byte beyond."""

    sizes: tuple = ()
    times: tuple = ()

    def t(self, nbytes: float) -> float:
        n = float(nbytes)
        if len(self.sizes) < 2:
            return Link.t(self, n)
        if n <= self.sizes[0]:
            return self.times[0]
        if n >= self.sizes[-1]:
            return self.times[-1] * n / self.sizes[-1]
        return float(np.exp(np.interp(np.log(n), np.log(self.sizes), np.log(self.times))))


def fit_alpha_beta(nbytes, seconds) -> tuple[Link, float]:
    """Fit t = alpha + n / beta to measured (n, t), minimising the relative error.

    Rows [1/t, n/t] . [alpha, 1/beta] = 1 solved by non-negative least squares: each point
    counts by its relative error, so the latency is set by the small messages and the
    bandwidth by the large ones, and neither parameter goes negative.

    Returns
    -------
    (Link, float)
        The fit and its largest relative residual over the points.
    """
    from scipy.optimize import nnls

    n = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if n.shape != t.shape or n.size < 2 or np.any(t <= 0):
        raise ValueError("need two or more points with positive times")
    scale = max(n.max(), 1.0)  # conditioning: solve for 1/beta per largest message
    a = np.column_stack([1.0 / t, (n / scale) / t])
    (alpha, inv), _ = nnls(a, np.ones_like(t))
    inv_beta = inv / scale
    beta = 1.0 / inv_beta if inv_beta > 0 else math.inf
    link = Link(float(alpha), float(beta))
    resid = max(abs(link.t(x) - y) / y for x, y in zip(n, t))
    return link, float(resid)


@dataclass(frozen=True)
class Network:
    """Links between ranks: the measured ones inside a node, a profile's between nodes.

    ``intra``: op -> Link measured at np 2 on one node (a :class:`Curve` from measure-mpi;
    ops of :data:`OPS`; ``sendrecv`` is one message). ``inter``: the profile's link between
    nodes, or None (all ranks on one node: every level uses ``intra``). ``gamma``: seconds
    per byte of an add, for the sums across nodes (inside a node it is part of the measured
    times). ``ranks_per_node``.
    ``tree_o``: aepar's own seconds per fixed-tree message beyond the message and the add
    (TreeSum's Python: its plan's loop, the receive buffer, the add's call), the same on
    any network (:func:`fit_tree_overhead`).
    ``step_sums``: op -> {bytes: a training step's sum as measured in a loop of steps over
    the same op timed alone at its fastest}, at np 2 (measure-mpi's ``<op>_step`` rows;
    empty where not measured); ``straggle``: a step's wait for the slower of 2 ranks over
    its compute (measure-mpi's ``straggle`` row; 0 where not measured). See :func:`step_s`.
    ``halving``: the fixed-tree sums on every rank are taken as aepar has since
    :data:`HALVING_FROM`, by halving where TreeSum does (:func:`tree_allreduce_s`); False
    for a record of older code, whose sums all went up the tree and back by Bcast.
    """

    name: str
    intra: dict
    inter: Link | None
    ranks_per_node: int
    gamma: float
    tree_o: float = 0.0
    step_sums: dict = field(default_factory=dict)
    straggle: float = 0.0
    halving: bool = True

    def in_step(self, op: str, nbytes: float) -> float:
        """How much longer ``op`` of ``nbytes`` takes at the end of a training step than alone
        at its fastest: measured at np 2, log-log in the bytes between the measured sizes,
        the nearest beyond them; for ``tree_halving`` where only the tree way was measured,
        the tree's; 1 where not measured."""
        table = self.step_sums.get(op) or (self.step_sums.get("tree_allreduce") if op == "tree_halving" else None)
        if not table:
            return 1.0
        sizes = sorted(table)
        return float(np.interp(math.log(max(nbytes, 1.0)), np.log(sizes), [table[n] for n in sizes]))

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node if self.inter is not None else 0

    def p2p(self, nbytes: float, a: int = 0, b: int = 1) -> float:
        """One message between ranks ``a`` and ``b``."""
        if self.inter is not None and self.node(a) != self.node(b):
            return self.inter.t(nbytes)
        # one-way, as TreeSum and the hand-overs send (half a ping-pong is slower here)
        return self.intra.get("send", self.intra["sendrecv"]).t(nbytes)


def free_network(ranks_per_node: int = 1) -> Network:
    """Communication that costs nothing (for tests and the ideal-speedup check)."""
    zero = Link(0.0, math.inf)
    return Network("free", {op: zero for op in OPS}, zero, ranks_per_node, 0.0)


def level_slowdowns(bandwidth: dict, p: int) -> list:
    """How much slower each level of a binomial tree over ``p`` ranks moves its bytes than
    one process alone, on a machine whose per-process memory bandwidth was measured with
    1..N processes at once (``bandwidth``: processes -> the slowest process's rate): level
    k copies in 2^k processes at once and waits for its slowest pair, at the rate alone over
    the rate then (linear between the counts measured, the last beyond). [] where not
    measured."""
    if p <= 1 or 1 not in bandwidth:
        return []
    n = sorted(bandwidth)
    rates = [bandwidth[k] for k in n]
    return [bandwidth[1] / float(np.interp(min(2 ** k, p), n, rates)) for k in range(1, _log2c(p) + 1)]


def memory_slowdown(bandwidth: dict, p: int) -> float:
    """How much slower the bytes of a tree over ``p`` ranks move than those of two ranks
    alone: the mean of :func:`level_slowdowns` (1 where not measured)."""
    levels = level_slowdowns(bandwidth, p)
    return float(np.mean(levels)) if levels else 1.0


def relinked(net: Network, send_there: Link, slowdown: float = 1.0) -> Network:
    """``net``'s links (each operation measured here at np 2) on another machine whose own
    one-way send was measured (``send_there``, under mpirun there): at each measured size,
    the part of an operation's time beyond its smallest message's (what its bytes take)
    times send_there(n) / send_here(n) (that machine's link against this one's, log-log
    between the sizes) and ``slowdown`` (:func:`memory_slowdown`, the copies of a level
    sharing that machine's memory). The latencies stay this machine's: a call timed there
    includes the ranks' skew leaving the barrier before it, which a tree pays once, not per
    level (the small sends there do not even grow with the size). The fitted lines (the
    forms across nodes) are left as they are."""
    here = net.intra["send"]

    def curve(c: Curve) -> Curve:
        base = c.times[0]
        return replace(c, times=tuple(base + (t - base) * slowdown * send_there.t(n) / here.t(n)
                                      for n, t in zip(c.sizes, c.times)))
    return replace(net, intra={op: curve(c) for op, c in net.intra.items()})


def _log2c(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def _levels(p: int, net: Network) -> tuple[int, int]:
    """(levels inside a node, levels across nodes) of a tree over ``p`` ranks."""
    if net.inter is None:
        return _log2c(p), 0
    local = min(p, net.ranks_per_node)
    return _log2c(local), _log2c(-(-p // net.ranks_per_node))


def collective_s(net: Network, op: str, nbytes: float, p: int) -> float:
    """One MPI collective (``bcast``, ``reduce``, ``allreduce``) of ``nbytes`` over ``p`` ranks:
    the faster of a tree and the bandwidth-optimal form, as MPI libraries switch from one to
    the other with the size (Open MPI's allreduce from recursive doubling to a ring).

    Inside one node, t_i the operation as measured at np 2 (a :class:`Curve`): tree = Li
    t_i(n); bandwidth-optimal (reduce-scatter or scatter, then allgather) = 2 Li a_i +
    2 (P-1)/P (t_i(n) - t_i(0)), what one np 2 call's bytes took (their adds and the
    memory a level's copies share included, :func:`relinked`) for the 2 (P-1)/P of the
    bytes each rank moves. Across nodes: tree = Li t_i(n) + Le (a_e + n/b_e + n g),
    bandwidth-optimal = 2 (Li a_i + Le a_e) + 2 (P-1)/P n / b_e + (P-1)/P n g. Priced
    from the np 2 line's bandwidth instead of the points, the form inside a node came out
    far too fast for the 16-vCPU machine's collectives at 16 ranks; the tree alone, 2-3x
    too slow for its large allreduces (bench/results/scaling_model.md, section 4).
    """
    if p <= 1:
        return 0.0
    li, le = _levels(p, net)
    a = net.intra[op]
    tree = li * a.t(nbytes)
    share = 2.0 * (p - 1) / p
    if not le:  # at two ranks both forms are the one call measured
        return tree if li < 2 else min(tree, 2.0 * li * a.alpha + share * (a.t(nbytes) - a.t(0)))
    e = net.inter
    g = net.gamma if op in ("reduce", "allreduce") else 0.0
    tree += le * (e.t(nbytes) + nbytes * g)
    pipe = 2.0 * (li * a.alpha + le * e.alpha) + share * nbytes * (1.0 / e.beta + 0.5 * g)
    return min(tree, pipe)


class _Shape:
    """What TreeSum's planner reads of a communicator: its size (and a rank)."""

    def __init__(self, size):
        self.rank, self.size = 0, int(size)


@lru_cache(maxsize=4096)
def _tree_ops(count: int, p: int) -> tuple:
    from aepar.parallel.blocks import TreeSum

    return tuple(TreeSum(_Shape(p), count)._ops)


def tree_reduce_s(net: Network, nbytes: float, p: int, count: int) -> float:
    """aepar's fixed-tree sum of ``count`` blocks over ``p`` ranks to rank 0, after every
    rank summed its own blocks: TreeSum's cross-rank nodes in plan order, each a message
    (sender busy until delivered, after aepar's own ``tree_o``) and an add of ``nbytes``
    at the receiver."""
    if p <= 1:
        return 0.0
    if count < p:
        raise ValueError(f"{count} blocks cannot be shared by {p} ranks")
    ready = [0.0] * p
    add = nbytes * net.gamma
    for _, _, left, right in _tree_ops(int(count), int(p)):
        if left == right:
            ready[left] += add
            continue
        arrive = ready[right] + net.tree_o + net.p2p(nbytes, left, right)
        ready[right] = arrive
        ready[left] = max(ready[left], arrive) + add
    return ready[0]


def fit_tree_overhead(send: Link, tree_reduce: dict, gamma: float, small: int = 2048) -> float:
    """TreeSum's own time per message: the median over the small sizes (``tree_reduce``:
    bytes -> seconds of one fixed-tree sum over two ranks, one message and one add) of what
    the message (``send``'s fit) and the add (``gamma``) leave unexplained; 0 if none.

    At two ranks the tree is one message, so the Python around it shows as a constant that
    no alpha-beta line of MPI's own calls holds; the model adds it per message of larger
    trees, where a rank waits for each level's sender in turn."""
    gaps = [t - send.t(n) - n * gamma for n, t in tree_reduce.items() if n <= small]
    return max(0.0, float(np.median(gaps))) if gaps else 0.0


# the first aepar whose TreeSum.allreduce halves (aepar.parallel.blocks: power-of-two ranks
# holding one node each, vectors of HALVING_BYTES and more); a record names its version
# (aepar.machine's ``aepar`` column), older records have none
HALVING_FROM = (0, 8, 51)


def sums_by_halving(version: str | None) -> bool:
    """Whether aepar ``version`` (a record's ``aepar`` column, empty before the column was
    kept) took its fixed-tree sums on every rank by halving where TreeSum does."""
    parts = tuple(int(x) for x in re.findall(r"\d+", version or "")[:3])
    return bool(parts) and parts >= HALVING_FROM


def halves(net: Network, nbytes: float, p: int, count: int) -> bool:
    """Whether TreeSum.allreduce of ``count`` blocks over ``p`` ranks takes ``nbytes`` by
    halving, in the code of ``net``'s record (``net.halving``; then
    aepar.parallel.blocks.halving_pairs and HALVING_BYTES)."""
    from aepar.parallel.blocks import HALVING_BYTES, halving_pairs

    return net.halving and halving_pairs(int(count), int(p)) and nbytes >= HALVING_BYTES


def halving_allreduce_s(net: Network, nbytes: float, p: int) -> float:
    """TreeSum.allreduce by recursive halving, then doubling (``TreeSum._halving``, p a power
    of two): at distance d = 1, 2, .. p/2 every rank swaps half of the piece it holds with
    rank r ^ d and adds the half it keeps; then the finished pieces travel back the same
    way, without adds. A swap is a message each way at once, each priced as a one-way send
    (the two copies share the node's memory; priced as one, bench.tree_sum's halving at np 2
    came out 36-69% too fast for vectors of 0.5 MB and more), after aepar's own ``tree_o``."""
    t, piece, d = 0.0, float(nbytes), 1
    while d < p:
        piece /= 2
        t += 2.0 * (net.tree_o + 2.0 * net.p2p(piece, 0, d)) + piece * net.gamma
        d *= 2
    return t


def tree_allreduce_s(net: Network, nbytes: float, p: int, count: int) -> float:
    """TreeSum.allreduce: the fixed-tree sum to rank 0, then a Bcast of it; by halving
    where the code of ``net``'s record takes it so (:func:`halves`)."""
    if halves(net, nbytes, p, count):
        return halving_allreduce_s(net, nbytes, p)
    return tree_reduce_s(net, nbytes, p, count) + collective_s(net, "bcast", nbytes, p)


def step_tree_allreduce_s(net: Network, nbytes: float, p: int, count: int, copy_s: float) -> float:
    """The fixed-tree sum a greedy step ends with. Two ranks on one node: the call itself as
    measure-mpi timed it at np 2, the way the code took it (``tree_allreduce``: one message,
    the add and the Bcast of the sum just written, which took longer than those parts timed
    alone, less the root's copy of the sum, ``copy_s``, which the step's own work counts;
    ``tree_halving``, where the record has it); elsewhere composed from the parts
    (:func:`tree_allreduce_s`)."""
    halving = halves(net, nbytes, p, count)
    measured = net.intra.get("tree_halving" if halving else "tree_allreduce")
    if p == 2 and _levels(p, net) == (1, 0) and measured is not None:
        return measured.t(nbytes) if halving else max(measured.t(nbytes) - copy_s, 0.0)
    return tree_allreduce_s(net, nbytes, p, count)


# =============================================================================================
# Compute record (measured, then pure lookups)
# =============================================================================================
def contention_factor(contention: dict, family: str, copies: int) -> float:
    """How much slower a rank computes while ``copies`` ranks share a machine's cores and
    memory (1 alone), from measure-contention's table (family -> {copies at once: the
    slowest copy's seconds}): measured for one copy and one per core, linear between, the
    last beyond; 1 where not measured, and never below 1: sharing the machine cannot make
    a rank faster, so a measured ratio below 1 is the VM's drift between the rounds."""
    t = contention.get(family)
    if not t or copies <= 1 or 1 not in t:
        return 1.0
    n = np.array(sorted(t), dtype=float)
    return max(1.0, float(np.interp(copies, n, [t[k] for k in sorted(t)])) / t[1])


@dataclass
class Compute:
    """Per-machine compute costs (seconds), from :func:`measure_compute`'s CSV.

    ``sparse``: serial_s (root per evaluation: assembly, L-BFGS-B, Python), block_s (one
    block of 128 patches' partials and its share of the local tree), evals_per_iter,
    cg_10k_s (cost+gradient of 10k patches in one process: the figure compared across
    machines). ``layers``: key -> {"leaf": {rows: s}, "fused": {rows: s}, "apply": s,
    "transform_row": s, "recon_row": s, "grad_bytes": n, "param_bytes": n, "flops": f}.
    ``mem``: op ("add", "copy") -> {bytes: s}. ``rbm_epoch_50k``: one fused CD-1 epoch of
    784x1000 over 50,000 rows, batch 100 (the figure bench/results/rbm_epoch.csv has for
    the Xeon).
    """

    sparse: dict = field(default_factory=dict)
    layers: dict = field(default_factory=dict)
    mem: dict = field(default_factory=dict)
    rbm_epoch_50k: float | None = None
    in_loop: float = 1.0          # a step inside train_epoch / the same step composed (measured)
    in_loop_ratios: list = field(default_factory=list)
    contention: dict = field(default_factory=dict)  # family -> {copies at once: slowest copy's seconds}

    def shared(self, family: str, copies: int) -> float:
        """How much slower a rank computes while ``copies`` ranks share this machine's cores
        and memory: :func:`contention_factor` of this machine's measure-contention."""
        return contention_factor(self.contention, family, copies)

    def mem_s(self, op: str, nbytes: float) -> float:
        """Seconds of an add or copy of ``nbytes``: interpolated per byte, log-log in size."""
        table = self.mem.get(op)
        if not table or nbytes <= 0:
            return 0.0
        sizes = np.array(sorted(table), dtype=float)
        per = np.array([table[s] / s for s in sorted(table)])
        x = float(np.clip(nbytes, sizes[0], sizes[-1]))
        return float(nbytes * np.exp(np.interp(np.log(x), np.log(sizes), np.log(per))))

    def gamma(self) -> float:
        """Seconds per byte of a large add (the sums' arithmetic between nodes)."""
        table = self.mem.get("add") or {1: 0.0}
        big = max(table)
        return table[big] / big

    def _rows(self, table: dict, rows: float) -> float:
        """Piecewise linear in rows; beyond the largest measured, the last slope."""
        r = np.array(sorted(table), dtype=float)
        t = np.array([table[k] for k in sorted(table)])
        rows = max(float(rows), 0.0)
        if rows <= 0:
            return 0.0
        if rows <= r[-1]:
            return float(np.interp(rows, r, t))
        slope = (t[-1] - t[-2]) / (r[-1] - r[-2])
        return float(t[-1] + slope * (rows - r[-1]))

    def leaf(self, key, rows) -> float:
        return self.in_loop * self._rows(self.layers[key]["leaf"], rows) if rows > 0 else 0.0

    def fused(self, key, rows) -> float:
        return self.in_loop * self._rows(self.layers[key]["fused"], rows)

    def alone(self, key, blocks: int, batch: float) -> float | None:
        """A whole step of ``blocks`` blocks at ``batch`` rows on one process and one thread
        (gradients, tree and optimiser step, in one kernel call where the layer has one),
        as measured in train_epoch; None where not measured at that block count."""
        table = self.layers[key].get("alone", {}).get(blocks)
        return self._rows(table, batch) if table else None

    def blocks(self, key, k: int, rows: float) -> float | None:
        """``k`` blocks of ``rows`` rows each in one step on one rank (their gradients and
        their local sum), from the measured multi-block steps; None where not measured."""
        table = self.layers[key].get("block")
        return k * self._rows(table, rows) if table else None


@lru_cache(maxsize=None)
def expected_max(p: int) -> float:
    """The expected largest of ``p`` independent standard normal draws (0 for one; 0.564 for
    two): how a step's wait for its slowest rank grows with the ranks, at a given spread of
    each rank's step (numerically, over -10..10 standard deviations)."""
    if p <= 1:
        return 0.0
    from scipy.special import ndtr  # the standard normal's distribution function

    x = np.linspace(-10.0, 10.0, 20001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(x * p * pdf * ndtr(x) ** (p - 1), x))


def layer_key(kind: str, n_in: int, n_out: int, hidden: str, dtype: str = "float32") -> str:
    return f"{kind}:{n_in}-{n_out}:{hidden}:{dtype}"


@dataclass(frozen=True)
class Stack:
    """A stacked network's pre-training workload."""

    name: str
    kind: str                 # "rbm" | "ae"
    sizes: tuple
    n_train: int
    batch: int
    epochs: int
    extras: tuple = (0, 5, 20, 40)
    n_test: int = 0
    n_val: int = 0
    blocks: int = 8
    dtype: str = "float32"

    @property
    def n_layers(self) -> int:
        return len(self.sizes) - 1

    def keys(self) -> list:
        n = self.n_layers
        return [layer_key(self.kind, self.sizes[i], self.sizes[i + 1],
                          "gaussian" if i == n - 1 else "bernoulli", self.dtype) for i in range(n)]

    @property
    def steps(self) -> int:
        return -(-self.n_train // self.batch)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def flops(self, i: int) -> float:
        a, b = self.sizes[i], self.sizes[i + 1]
        return 10.0 * a * b + (12.0 if self.kind == "rbm" else 10.0) * (a + b)


# =============================================================================================
# Scheme models (pure given a Compute and a Network)
# =============================================================================================
def oversubscription(active: int, cores) -> float:
    """Compute slows by active threads / cores when they exceed the cores (None: enough cores)."""
    return max(1.0, active / cores) if cores else 1.0


def sparse_eval_s(comp: Compute, net: Network, p: int, samples: int, *, scale: float = 1.0,
                  cores=None, n_theta: int = 3289, n_partials: int = 4940, n_shared: int = 25) -> dict | None:
    """One evaluation of the root-optimiser scheme (aepar.sparse) on ``p`` ranks.

    Bcast of [control, theta] (float64), every rank's blocks (the busiest has
    ceil(blocks / p)) in two rounds with the fixed-tree sum of the blocks' Σ a2 to the root
    and its Bcast between them, the fixed-tree reduction of [partials, flag] to the root,
    then the root's serial part. ``scale``: the compute of another machine relative to
    this one. None where the scheme cannot run (fewer blocks of 128 than ranks).
    """
    count = -(-samples // 128)
    if p > count:
        return None
    s = comp.sparse
    f = oversubscription(p, cores) * scale
    compute = s["block_s"] * min(-(-count // p), count) * samples / (count * 128) * f
    serial = s["serial_s"] * f
    comm = (collective_s(net, "bcast", 8 * (n_theta + 1), p) + tree_reduce_s(net, 8 * n_shared, p, count)
            + collective_s(net, "bcast", 8 * n_shared, p) + tree_reduce_s(net, 8 * (n_partials + 1), p, count))
    return {"seconds": compute + serial + comm, "compute_s": compute, "serial_s": serial, "comm_s": comm}


def sparse_run_s(comp, net, p, samples, iterations=400, evaluations=None, **kw) -> dict | None:
    """A whole aepar.sparse run: ``evaluations`` (default iterations x evaluations per
    iteration measured here) evaluations."""
    e = sparse_eval_s(comp, net, p, samples, **kw)
    if e is None:
        return None
    n = evaluations if evaluations is not None else iterations * comp.sparse["evals_per_iter"]
    return {k: v * n for k, v in e.items()} | {"per_iteration": e["seconds"] * n / iterations}


def step_s(comp: Compute, net: Network, st: Stack, i: int, p: int, *, blocks: int, allreduce: bool,
           threads: int = 1, f: float = 1.0, speedup: float | None = None) -> tuple[float, float]:
    """(compute, comm) seconds of one optimiser step of layer ``i`` in
    aepar.parallel.data_parallel.train_epoch on ``p`` ranks sharing ``blocks`` blocks.

    One block on one process takes the fused step (RBM) or one block's gradient + the copy
    of the sum + the optimiser step; several blocks on one process and one thread, the
    whole step as measured so (one kernel call for all three, where the layer has one),
    where the record has it. Otherwise the busiest rank computes ceil(blocks/p)
    blocks' gradients (ceil(batch/blocks) rows each, spread over ``threads``) and their
    local sum: as the measured multi-block step prices them (every block's factors, one sum
    of their products), or, where a compute record lacks it, as that many one-block
    gradients and adds. Then the ranks sum either in the fixed tree then Bcast
    (``allreduce`` False) or with one MPI Allreduce, and every rank takes the optimiser step.

    ``speedup``: what ``threads`` threads gain over one on the rank's whole step, as
    measured on the machine (:func:`~bench.scaling_model.validate.thread_speedups`); the
    step at one thread (the whole step of one process, or the rank's path) is divided by
    it. Without it the blocks' gradients are split evenly over the threads, a thread
    taking whole blocks, with no cost for the hand-offs.

    On more than one rank the step's sum is priced as it is paid in a loop of steps, where
    measured (``net.step_sums``, ``net.straggle``, at np 2; the fixed tree's by the way
    the code takes it, :meth:`Network.in_step`): the collective times how much
    longer it took there than alone, plus the wait for the slowest rank, the measured
    fraction of the step's compute times :func:`expected_max` of the ranks over that of two
    (each rank's step spread alike and independently).
    """
    key = st.keys()[i]
    lay = comp.layers[key]
    gb = lay["grad_bytes"]
    if blocks == 1 and p == 1:
        if st.kind == "rbm":
            return comp.fused(key, st.batch) * f, 0.0
        return (comp.leaf(key, st.batch) + comp.mem_s("copy", gb) + lay["apply"]) * f, 0.0
    shared = threads > 1 and speedup is not None
    alone = comp.alone(key, blocks, st.batch) if p == 1 and (threads == 1 or shared) else None
    if alone is not None:  # one process holding every block: its one-thread step measured whole
        return alone / (speedup if shared else 1.0) * f, 0.0
    k = -(-blocks // p)
    rows = -(-st.batch // blocks)
    several = comp.blocks(key, k, rows) if k > 1 else None
    if several is not None:  # the rank's blocks in one factored sum (measured as such)
        gradients, rest = several, comp.mem_s("copy", gb) + lay["apply"]
    else:
        gradients = k * comp.leaf(key, rows)
        rest = max(k - 1, 0) * comp.mem_s("add", gb) + comp.mem_s("copy", gb) + lay["apply"]
    if shared:  # the measured gain is the whole step's
        work = (gradients + rest) / speedup
    else:
        work = gradients * -(-k // threads) / k + rest
    op = "allreduce" if allreduce else "tree_halving" if halves(net, gb, p, blocks) else "tree_allreduce"
    comm = collective_s(net, op, gb, p) if allreduce else \
        step_tree_allreduce_s(net, gb, p, blocks, comp.mem_s("copy", gb))
    work *= f
    if p > 1:
        comm = comm * net.in_step(op, gb) + net.straggle * expected_max(p) / expected_max(2) * work
    return work, comm


def layerwise_s(comp, net, st: Stack, p: int, *, scheme: str, threads: int = 1, cores=None,
                scale: float = 1.0, speedup: float | None = None) -> dict | None:
    """greedy (fixed tree over ``st.blocks``, at least one per rank) or data (one block per
    rank, Allreduce) pre-training: every layer's epochs, then its transform of the
    training and test rows (split over the ranks), as aepar.parallel.layerwise times them
    (``pretrain_time_s``: the per-epoch test reconstruction error is left out of it).

    A layer whose rank's step is below aepar's ``SHARED_STEP_FLOPS`` trains on one thread,
    as aepar does; ``speedup`` is what ``threads`` threads gain over one, measured on the
    machine (:func:`step_s`), also on the transforms (split over the threads by blocks)."""
    blocks = p if scheme == "data" else st.blocks
    if p > blocks or p > st.batch or p > st.n_train:
        return None
    threads = max(1, min(threads, -(-blocks // p)))  # a thread takes whole blocks
    f = oversubscription(p * threads, cores) * scale
    mine = st.batch * -(-blocks // p) / blocks  # the busiest rank's rows of a batch
    compute = comm = 0.0
    for i in range(st.n_layers):
        layer_threads = 1 if st.flops(i) * mine < SHARED_STEP_FLOPS else threads
        c, m = step_s(comp, net, st, i, p, blocks=blocks, allreduce=scheme == "data", threads=layer_threads, f=f,
                      speedup=speedup)
        compute += st.epochs * st.steps * c
        comm += st.epochs * st.steps * m
        if i + 1 < st.n_layers:
            rows = -(-(st.n_train + st.n_test) // p)
            split = speedup if threads > 1 and speedup is not None else threads
            compute += comp.layers[st.keys()[i]]["transform_row"] * rows / split * f
    return {"seconds": compute + comm, "compute_s": compute, "comm_s": comm, "serial_s": 0.0}

def layer_costs(st: Stack, epoch_s, transform_s, blocks: int | None = None) -> planner.LayerCosts:
    """The planner's record of ``st`` with these per-layer seconds: its shapes, epochs and
    extras, and the executor's FLOP clock the pipeline's plan is made with."""
    layers = [SimpleNamespace(n_in=st.sizes[i], n_out=st.sizes[i + 1], epochs=st.epochs,
                              flops_per_sample=lambda i=i: st.flops(i)) for i in range(st.n_layers)]
    return planner.LayerCosts.measured(layers, epoch_s, transform_s, st.n_train, st.batch,
                                       list(st.extras)[:st.n_layers], dtype=st.dtype, n_val=st.n_val, blocks=blocks)


# communication handed to the planner as free: the measured links are charged here instead
NO_LINK = dict(alpha=0.0, beta=math.inf)


def model_parallel_s(comp, net, st: Stack, p: int, *, cores=None, scale: float = 1.0) -> dict | None:
    """CMU 15-618's model parallelism (aepar.parallel.model_parallel), group = ranks.

    The slots are the planner's (:func:`aepar.parallel.planner.model_parallel_s`, given the
    measured compute: one-block epochs, transforms of the training rows): a slot lasts as
    long as its busiest rank (the refresh of its layer's input through the group's layers
    below when one changed, then one epoch), and a group's output is computed for the next
    group. What the planner lacks is the exchange as the code does it: one Bcast of each
    trained layer's weights from its owner, an Allreduce of the flags and two small gathers
    (modelled as small Allreduces) per slot, over the measured links, where the planner
    charges one alpha-beta allgather.
    """
    from aepar.parallel.model_parallel import schedule

    n = st.n_layers
    if p > n:
        return None
    keys = st.keys()
    epoch = [st.steps * step_s(comp, net, st, i, 1, blocks=1, allreduce=False, f=scale)[0] for i in range(n)]
    transform = [comp.layers[k]["transform_row"] * st.n_train * scale for k in keys]
    compute = planner.model_parallel_s(layer_costs(st, epoch, transform), p, cores=cores, **NO_LINK)["seconds"]
    small = collective_s(net, "allreduce", 8, p)
    comm = sum(sum(collective_s(net, "bcast", comp.layers[keys[j]]["param_bytes"], p) for j, _ in active) + 3 * small
               for group in schedule([st.epochs] * n, p) for active in group)
    return {"seconds": compute + comm, "compute_s": compute, "comm_s": comm, "serial_s": 0.0}


def _pipeline_layout(plan_costs: planner.LayerCosts, p: int, replicas: bool, end_with_first: bool):
    """The layout :func:`aepar.parallel.planner.pipeline_s` makes (the same plan and call):
    which ranks a hand-over's message travels between."""
    from aepar.parallel.pipeline import make_layout, plan_schedule

    c = plan_costs
    plan = plan_schedule(c.plan_epoch, c.plan_handover, c.epochs, c.extras, end_with_first)
    totals = [c.plan_epoch[j] * plan.epochs(j) for j in range(c.n_layers)]
    return make_layout(totals, p if replicas else min(p, c.n_layers), max_per_stage=min(c.batch, c.blocks))


def pipeline_s(comp, net, st: Stack, p: int, *, replicas: bool, mode: str | None = None,
               end_with_first: bool = False, cores=None, scale: float = 1.0) -> dict | None:
    """The synchronized pipeline (aepar.sync): :func:`aepar.parallel.planner.pipeline_s` (the
    executor's plan on its FLOP clock, the layout, the hand-overs of ``mode``, replayed) on
    the stage costs measured here.

    ``replicas`` False (sync): at most one rank per layer; True (hybrid, p > layers): the
    extra ranks are data-parallel replicas allotted by cost (capped by the batch and the
    blocks). What the planner lacks, kept here:

    - a stage epoch on r replicas is measured, not the one-rank epoch / r: steps x
      :func:`step_s` (r replicas' share of the blocks, the fixed-tree sum over the measured
      links) + the reconstruction of its share of the validation rows. The planner divides
      a stage's epoch by its replicas, so it is handed r x that.
    - a ``data`` hand-over to another rank Sends the rows (rows x n_out x itemsize / r
      bytes) over the measured link, charged to the producer with its transform. (The
      message of a ``weights`` hand-over, one layer's parameters, is not charged: the
      planner has no term for it.)
    - ``mode`` None: the faster replay of the two (the planner picks by its FLOP clock);
    - ranks beyond ``cores``: compute slows by the ranks busy on average (stages sleep
      while they wait for input), found by a first replay, not by all the ranks.
    """
    n = st.n_layers
    if replicas != (p > n):
        return None
    blocks = max(st.blocks, p) if replicas else st.blocks  # assumed: --reduce-blocks raised to the ranks
    try:
        layout = _pipeline_layout(layer_costs(st, [1.0] * n, [0.0] * n, blocks), p, replicas, end_with_first)
    except ValueError:
        return None
    keys = st.keys()
    reps = [layout.replicas(j) for j in range(n)]
    group_of = {s: g for g, stages in enumerate(layout.groups) for s in stages}

    def replay(md, f):
        epoch, transform, tree = [], [], []
        for j in range(n):
            c, m = step_s(comp, net, st, j, reps[j], blocks=blocks, allreduce=False, f=f)
            val = comp.layers[keys[j]]["recon_row"] * -(-st.n_val // reps[j]) * f
            epoch.append(reps[j] * (st.steps * (c + m) + val))
            tree.append(st.steps * m)
            transform.append(comp.layers[keys[j]]["transform_row"] * (st.n_train + st.n_val) * f)
            if md == "data" and j + 1 < n and group_of[j] != group_of[j + 1]:
                nbytes = (st.n_train + st.n_val) * st.sizes[j + 1] * st.itemsize / reps[j]
                a, b = layout.ranks[group_of[j]][0], layout.ranks[group_of[j + 1]][0]
                transform[j] += reps[j] * net.p2p(nbytes, a, b)
        out = planner.pipeline_s(layer_costs(st, epoch, transform, blocks), p, replicas=replicas, mode=md,
                                 end_with_first=end_with_first, **NO_LINK)
        assert out["layout"] == layout.describe(), (out["layout"], layout.describe())
        return dict(out, tree_s=sum(t * e for t, e in zip(tree, out["epochs"])))

    modes = ("data", "weights") if mode is None else (mode,)
    times = {md: replay(md, scale) for md in modes}
    if cores and layout.n_ranks > cores:
        r = min(times.values(), key=lambda x: x["seconds"])
        active = sum(b * reps[j] for j, b in enumerate(r["busy"])) / r["seconds"]
        times = {md: replay(md, scale * max(1.0, active / cores)) for md in modes}
    chosen = min(times, key=lambda k: (times[k]["seconds"], k != "data"))
    return {"seconds": times[chosen]["seconds"], "mode": chosen, "comm_s": times[chosen]["tree_s"],
            "compute_s": None, "serial_s": 0.0, "layout": layout.describe(), "ranks_used": layout.n_ranks}


def stack_scheme_s(comp, net, st, scheme, p, **kw) -> dict | None:
    """Pre-training seconds of ``scheme`` (greedy, data, model, sync, hybrid) on ``p`` ranks."""
    common = dict(cores=kw.get("cores"), scale=kw.get("scale", 1.0))
    if scheme in ("greedy", "data"):
        return layerwise_s(comp, net, st, p, scheme=scheme, threads=kw.get("threads", 1),
                           speedup=kw.get("speedup"), **common)
    if scheme == "model":
        return model_parallel_s(comp, net, st, p, **common)
    if scheme in ("sync", "hybrid"):
        return pipeline_s(comp, net, st, p, replicas=scheme == "hybrid", mode=kw.get("mode"),
                          end_with_first=kw.get("end_with_first", False), **common)
    raise ValueError(f"unknown scheme {scheme!r}")


def efficiency(times: dict) -> dict:
    """{P: T(1) / (P T(P))} over the runnable ranks (T(P) None: left out); needs T(1)."""
    t1 = times.get(1)
    return {p: t1 / (p * t) for p, t in sorted(times.items()) if t is not None and t1 is not None and t > 0}


def stops_scaling(times: dict) -> tuple:
    """(first P with efficiency < 0.5 or None, P of the least time, True if the time was
    still decreasing at the largest runnable P)."""
    eff = efficiency(times)
    below = next((p for p, e in sorted(eff.items()) if e < 0.5), None)
    run = {p: t for p, t in times.items() if t is not None}
    best = min(run, key=lambda p: (run[p], p))
    return below, best, best == max(run)


# =============================================================================================


def networks(links: dict, gamma: float, ranks_per_node: int, tree_o: float = 0.0) -> dict:
    """The measured links inside a node, each profile's between nodes."""
    return {name: Network(name, links, Link(pr["alpha"], pr["beta"]), ranks_per_node, gamma, tree_o)
            for name, pr in PROFILES.items()}
