"""What the scaling model is fitted on, measured here: the collectives under mpirun, the
compute in one process with one thread, and whole ``aepar.sparse`` / ``aepar.pretrain``
runs; and the measurements read back (:func:`load_mpi`, :func:`load_compute`).

Every timing goes through bench.common's loop and its one statistic (the fastest sample);
every row carries the machine and the 1-minute load average at its time.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from bench.common import (across_ranks, fastest, fastest_run, in_rounds, machine_columns, mpi_env, python_command,
                          read_rows, time_call, with_machine, write_rows)
from bench.scaling_model.model import Curve, OPS, Compute, fit_alpha_beta, layer_key

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
MPI_CSV = RESULTS / "scaling_model_mpi.csv"
COMPUTE_CSV = RESULTS / "scaling_model_compute.csv"
SPARSE_CSV = RESULTS / "scaling_model_sparse.csv"
STACKED_CSV = RESULTS / "scaling_model_stacked.csv"
CONTENTION_CSV = RESULTS / "scaling_model_contention.csv"


def measured_on(compute_csv: Path) -> dict:
    """The machine columns of the compute measurements (``--reuse`` on another machine
    still describes, and validates against, the one that measured them)."""
    rows = read_rows(compute_csv)
    here = machine_columns()
    return {k: rows[0].get(k) or v for k, v in here.items()} if rows else here


def _row(machine: dict, **columns) -> dict:
    """A measurement row: its columns, the load average now, the machine."""
    return with_machine([{**columns, "load_1min": os.getloadavg()[0]}], machine)[0]


# ==== communication ==============================================================================
def _tree_way(tree, buf, out_buf, halving: bool):
    """``TreeSum.allreduce`` of ``buf`` taken one way whatever the code would choose for its
    size: up the tree and back by Bcast (``tree_allreduce``: every aepar before 0.8.51), or
    by halving at every size (``tree_halving``: the code's way from HALVING_BYTES on, for a
    power-of-two number of ranks). Each op's points then stand for one way, whichever
    version measured them."""
    from aepar.parallel import blocks

    def call():
        tree.butterfly, bound = halving, blocks.HALVING_BYTES
        blocks.HALVING_BYTES = 0
        try:
            return tree.allreduce([buf], out_buf)
        finally:
            blocks.HALVING_BYTES = bound
    return call


def _mpi_ops(comm, tree, buf, out_buf) -> dict:
    """Every op of :data:`OPS` as a call on ``buf`` (``out_buf``: where a one-way message lands);
    ``tree_halving`` only where the ranks can halve (a power of two of them)."""
    from aepar.parallel.blocks import halving_pairs

    def pingpong():
        if comm.rank == 0:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)
        elif comm.rank == 1:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)

    def oneway():  # what a tree node or a hand-over does: one message, barrier to delivery
        if comm.rank == 1:
            comm.Send(buf, 0)
        elif comm.rank == 0:
            comm.Recv(out_buf, 1)

    ops = {"bcast": lambda: comm.Bcast(buf), "reduce": lambda: comm.Reduce(buf),
           "allreduce": lambda: comm.Allreduce(buf), "sendrecv": pingpong, "send": oneway,
           "tree_reduce": lambda: tree.reduce([buf]), "tree_allreduce": _tree_way(tree, buf, out_buf, False)}
    if halving_pairs(comm.size, comm.size):
        ops["tree_halving"] = _tree_way(tree, buf, out_buf, True)
    return ops


def _collective_timing(comm, fn, repeats: int, warmup: int = 0):
    """Each call alone after a barrier, as a scheme issues it; per call the slowest rank's."""
    return across_ranks(comm, time_call(fn, repeats, warmup=warmup, between=comm.barrier))


def measure_mpi(out: Path, quick: bool = False, target_s: float = 0.15) -> int:
    """Under mpirun: every op of :data:`OPS` (:func:`_mpi_ops`) through aepar.comm for 8 B .. 64 MB (float64
    buffers). A trial times ``reps`` calls (the same count on every rank), each alone
    after a barrier, takes per call the slowest rank's time and of those the fastest
    (:func:`bench.common.fastest`); rank 0 writes one row per (op, size): the median,
    minimum and maximum over the trials. At np 2 also a training step's sums
    (:func:`_step_sums`)."""
    import aepar  # noqa: F401  (threads configured before NumPy's BLAS loads)
    from aepar.comm import world
    from aepar.parallel.blocks import TreeSum

    comm = world()
    if comm.size < 2:
        raise SystemExit("measure-mpi: run it under mpirun -np 2 (or more)")
    sizes = sorted({2 ** e for e in range(3, 27, 3 if quick else 1)} | {2 ** 26})
    # rounds over the whole sweep, trials within: this VM's shared-memory timings switch
    # between modes from one moment to the next, the median over rounds sees them all
    rounds, trials = (2, 2) if quick else (3, 3)
    tree = TreeSum(comm, comm.size)  # one block per rank: the tree's messages alone
    per = {}
    for _ in range(rounds):
        for nbytes in sizes:
            buf = np.zeros(nbytes // 8)
            for op, fn in _mpi_ops(comm, tree, buf, np.empty_like(buf)).items():
                buf[:] = 0.0  # sums of zeros stay zeros whatever the repetitions
                half = 2.0 if op == "sendrecv" else 1.0  # a round trip is two messages
                first = _collective_timing(comm, fn, 5, warmup=2).seconds
                reps = int(comm.bcast(max(5, min(2000, int(target_s / trials / max(first, 1e-7))))))
                got = [_collective_timing(comm, fn, reps).seconds / half for _ in range(trials)]
                per.setdefault((op, nbytes), []).extend(got)
                per[(op, nbytes, "reps")] = reps
    steps = _step_sums(comm, tree, quick) if comm.size == 2 else []  # the model reads them at np 2
    if comm.is_root:
        machine = machine_columns()
        rows = [_row(machine, op=op, bytes=nbytes, seconds=float(np.median(per[(op, nbytes)])),
                     min_seconds=fastest(per[(op, nbytes)]), max_seconds=max(per[(op, nbytes)]),
                     reps=per[(op, nbytes, "reps")], trials=len(per[(op, nbytes)]), ranks=comm.size)
                for nbytes in sizes for op in OPS if (op, nbytes) in per]
        rows += [_row(machine, **r, ranks=comm.size) for r in steps]
        write_rows(out, rows)
        print(f"measure-mpi: {len(rows)} rows -> {out}", flush=True)
    comm.barrier()
    return 0


def fastest_times(rows: list, op: str) -> dict:
    """bytes -> seconds of ``op``'s fastest trial in measure-mpi's rows: on this VM the same
    operation varies 2-4x from one minute to the next and other jobs' time slices hit whole
    trials; the fastest is the figure a rerun reproduces (what every fit reads)."""
    return {int(r["bytes"]): float(r.get("min_seconds") or r["seconds"]) for r in rows if r["op"] == op}


# the sums a training step ends with (data; greedy and the replicas, either way: tree_halving
# where the ranks can halve)
STEP_OPS = ("allreduce", "tree_allreduce", "tree_halving")
STEP_WORK_S = 0.005  # a step's compute before its sum: about a layer's step at batch 100


def _step_work(comm):
    """About :data:`STEP_WORK_S` of a step's kind of compute, the same on every rank: float32
    products of 50 rows through a 784x1000 layer, as many as rank 0 takes for that long."""
    rng = np.random.default_rng(comm.rank)
    x, w = rng.random((50, 784), dtype=np.float32), rng.random((784, 1000), dtype=np.float32)
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        x @ w
        calls += 1
    count = int(comm.bcast(max(1, round(STEP_WORK_S / ((time.perf_counter() - t0) / calls)))))

    def work():
        for _ in range(count):
            x @ w
    return work


def _step_sums(comm, tree, quick: bool) -> list:
    """The sums as a training loop issues them: each step a fixed compute, the buffer
    written, a barrier, then the sum (:data:`STEP_OPS`). Per step, the slowest rank's time
    in the sum after the barrier, and each rank's wait at the barrier for the slower ranks
    (what a step's sum waits beyond itself). A trial is the mean over its steps (a run pays
    every step), a row the fastest trial: ``<op>_step`` rows (per size) and one ``straggle``
    row, the mean wait over the mean compute of a step (``seconds``: the wait,
    ``compute_seconds``: the compute)."""
    work = _step_work(comm)
    sizes = (2 ** 15, 2 ** 20, 2 ** 23) if quick else (2 ** 15, 2 ** 17, 2 ** 19, 2 ** 21, 2 ** 23, 2 ** 24)
    n_steps, trials = (30, 2) if quick else (60, 3)
    rows, waits, computes = [], [], []
    for nbytes in sizes:
        buf, out_buf = np.zeros(nbytes // 8), np.zeros(nbytes // 8)
        calls = _mpi_ops(comm, tree, buf, out_buf)  # the sums among them, each way the ranks can take
        for op in (op for op in STEP_OPS if op in calls):
            means = []
            for _ in range(trials):
                times = np.zeros((3, n_steps))  # compute, wait, sum
                for k in range(n_steps + 2):  # two untimed steps first
                    t0 = time.perf_counter()
                    work()
                    buf[:] = 0.0  # written by the step (sums of zeros stay zeros)
                    t1 = time.perf_counter()
                    comm.barrier()
                    t2 = time.perf_counter()
                    calls[op]()
                    if k >= 2:
                        times[:, k - 2] = t1 - t0, t2 - t1, time.perf_counter() - t2
                slowest = times[2].copy()
                comm.Allreduce(slowest, op="max")
                means.append(float(slowest.mean()))
                waits.append(float(times[1].mean()))
                computes.append(float(times[0].mean()))
            rows.append(dict(op=f"{op}_step", bytes=nbytes, seconds=fastest(means), min_seconds=fastest(means),
                             max_seconds=max(means), reps=n_steps, trials=trials))
    wait = comm.allreduce(float(np.mean(waits))) / comm.size
    compute = comm.allreduce(float(np.mean(computes))) / comm.size
    rows.append(dict(op="straggle", bytes=0, seconds=wait, compute_seconds=compute, reps=n_steps,
                     trials=len(waits)))
    return rows


def load_steps(rows: list) -> tuple[dict, float]:
    """(op of :data:`STEP_OPS` -> {bytes: the sum's seconds in a step / its fastest alone},
    the straggle fraction: a step's wait for the slower ranks over its compute) from
    measure-mpi's rows ({}, 0 where they were not measured)."""
    ratios = {}
    for op in STEP_OPS:
        alone = fastest_times(rows, op)
        in_step = {int(r["bytes"]): float(r["seconds"]) for r in rows if r["op"] == f"{op}_step"}
        if alone and in_step:  # the op alone as the model reads it: its fastest points, log-log between
            sizes = sorted(alone)
            # (alpha: the one size's time, where only one was measured)
            curve = Curve(alone[sizes[0]], math.inf, tuple(map(float, sizes)), tuple(alone[n] for n in sizes))
            ratios[op] = {n: t / curve.t(n) for n, t in sorted(in_step.items())}
    straggle = next((float(r["seconds"]) / float(r["compute_seconds"]) for r in rows
                     if r["op"] == "straggle" and float(r.get("compute_seconds") or 0) > 0), 0.0)
    return ratios, straggle


def load_mpi(path: Path) -> tuple[dict, dict, list]:
    """(op -> Curve: its fitted line and its fastest time per size, op -> the line's max
    relative residual, rows) from measure-mpi's CSV."""
    rows = read_rows(path)
    links, resid = {}, {}
    for op in OPS:
        pts = fastest_times(rows, op)
        if len(pts) >= 2:
            line, resid[op] = fit_alpha_beta(list(pts), list(pts.values()))
            sizes = sorted(pts)
            links[op] = Curve(line.alpha, line.beta, tuple(map(float, sizes)), tuple(pts[n] for n in sizes))
    return links, resid, rows


# ==== compute ====================================================================================
# the layers every validated or predicted workload uses: (kind, n_in, n_out, hidden)
LAYERS = (("rbm", 784, 1000, "bernoulli"), ("rbm", 1000, 500, "bernoulli"), ("rbm", 500, 250, "bernoulli"),
          ("rbm", 250, 30, "gaussian"),
          ("ae", 784, 2000, "bernoulli"), ("ae", 2000, 1000, "gaussian"), ("ae", 2000, 1000, "bernoulli"),
          ("ae", 1000, 500, "bernoulli"), ("ae", 500, 100, "gaussian"))
BLOCKED = 8  # the blocks of measure-compute's blocked steps: aepar's default decomposition
LEAF_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _seconds(fn, budget: float, min_reps: int = 3, max_reps: int = 200, between=None) -> float:
    """Seconds of ``fn()``: the fastest of as many calls as fill about ``budget`` seconds
    (after a warm-up); ``between()``, untimed, before each (what the real loop does
    between two calls)."""
    first = time_call(fn, 1, between=between).seconds
    reps = max(min_reps, min(max_reps, int(budget / max(first, 1e-7))))
    return time_call(fn, reps, warmup=0, between=between).seconds


def _measure_memory(row, budget):
    """The adds and copies of the sums (float32 arrays; per byte)."""
    for nbytes in (32 * 1024, 256 * 1024, 4 * 2 ** 20, 32 * 2 ** 20):
        a = np.ones(nbytes // 4, np.float32)
        b = np.ones_like(a)
        row("mem", "add", nbytes, _seconds(lambda: a.__iadd__(b), budget, max_reps=2000))
        row("mem", "copy", nbytes, _seconds(lambda: b.copy(), budget, max_reps=2000))


def _sparse_optimiser(rng, m: int = 10000):
    """The root-optimiser of aepar.sparse in one process over ``m`` random 64-pixel patches,
    at its initial θ: (optimiser, model, θ)."""
    from aepar import backend
    from aepar.comm import Comm
    from aepar.models.sparse_ae import LEAF, SparseAutoencoder
    from aepar.parallel.root_optimizer import RootOptimizer
    from aepar.rows import Blocks

    be = backend.select("cpu", "auto", "float64")
    model = SparseAutoencoder(be, 64, 25)
    model.attach(rng.uniform(0.1, 0.9, (m, 64)), Blocks.fixed(m, LEAF))
    opt = RootOptimizer(Comm.serial(), model, xp=be.xp, dtype=be.dtype)
    theta64 = model.init_theta(0)
    opt.buffer[1:] = theta64
    return opt, model, theta64


def _measure_sparse_evaluation(row, budget, quick, rng):
    """The sparse autoencoder's evaluation: per block (many calls), serial (the rest)."""
    from aepar.optim import _setulb

    m = 10000
    opt, model, theta64 = _sparse_optimiser(rng, m)
    count = model.blocks.count
    local = _seconds(lambda: opt._local(opt.buffer[1:]), budget * 2)  # partials + the local tree
    total = np.asarray(opt._local(opt.buffer[1:]))
    assemble = _seconds(lambda: model.assemble(total[:model.n_partials], theta64), budget)
    row("sparse_local", "64-25 float64", m, local, blocks=count)
    row("sparse_assemble", "64-25 float64", m, assemble)
    _setulb()  # aepar.sparse loads the optimiser before its clock starts, so here too
    opt.run(theta64, 3)  # warm-up: the optimiser's first calls
    res = opt.run(theta64, 15 if quick else 60)
    row("sparse_eval", "64-25 float64", m, res.total_s / res.evaluations, evaluations=res.evaluations,
        iterations=res.iterations, blocks=count)
    # the serial part from the same run (what its evaluations took beyond the blocks' two
    # rounds and their sums): the difference of two runs timed apart would carry the VM's
    # drift between them, several times this part on a 2-vCPU VM
    row("sparse_serial", "64-25 float64", m, (res.total_s - opt.blocks_s - res.comm_s) / res.evaluations,
        evaluations=res.evaluations)


def _gradient_views(flat, shapes) -> dict:
    """The layer's gradient arrays as views of one flat buffer, as train_epoch lays them out."""
    o, out = 0, {}
    for k, s in shapes.items():
        size = int(np.prod(s))
        out[k] = flat[o:o + size].reshape(s)
        o += size
    return out


def _measure_layer(row, budget, quick, be32, layer, key, x):
    """One layer: a block's gradient (and the fused RBM step) at 1..1024 rows, the optimiser
    step, the transform and reconstruction per row, its byte counts."""
    shapes = layer.grad_shapes()
    n_grad = sum(int(np.prod(s)) for s in shapes.values())
    flat = be32.zeros(n_grad + 2)
    grads = _gradient_views(flat, shapes)
    lrng = np.random.default_rng(1)

    def step():  # a zero gradient: the step's memory traffic without moving the weights
        flat.fill(0)
        layer.apply(grads, 0)
    for r in (LEAF_ROWS[::2] if quick else LEAF_ROWS):
        def leaf(r=r):
            idx = lrng.integers(0, x.shape[0], r)
            flat.fill(0)
            layer.leaf_gradient(x[idx], lrng, 1.0 / r, grads)
        # the optimiser step between two gradients, untimed: it leaves the cache as a
        # training step does (back-to-back gradients alone measured ~25% faster)
        row("leaf", key, r, _seconds(leaf, budget, between=step))
        if key.startswith("rbm"):
            def fused(r=r):
                layer.fused_step(x[lrng.integers(0, x.shape[0], r)], lrng, 0)
            row("fused", key, r, _seconds(fused, budget))
    flat.fill(0)
    row("apply", key, "", _seconds(lambda: layer.apply(grads, 0), budget))
    chunk = x[:1024]
    row("transform_row", key, 1024, _seconds(lambda: layer._encode(chunk), budget) / 1024)
    row("recon_row", key, 1024, _seconds(lambda: layer._reconstruct(chunk), budget) / 1024)
    params = layer.n_in * layer.n_out + layer.n_in + layer.n_out
    row("bytes", key, "", 0.0, grad_bytes=4 * (n_grad + 2), param_bytes=4 * params, flops=layer.flops_per_sample())


def _measure_epochs(row, budget, quick, be32, layer_cls, x_all, rng):
    """Whole one-block epochs in train_epoch (the composed step checked in its loop) and
    the figure rbm_epoch.csv has for the Xeon: one fused CD-1 epoch, 784x1000, batch 100."""
    from aepar.models.rbm import RBM
    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import Shard

    for kind, n_in, n_out, hidden in (("ae", 784, 2000, "bernoulli"), ("rbm", 784, 1000, "bernoulli")):
        key = layer_key(kind, n_in, n_out, hidden)
        for b in (100, 1000):
            layer = layer_cls[kind](be32, n_in, n_out, hidden=hidden, batch=b)
            shard = Shard.of(be32, x_all[:2000, :n_in], 1)
            train_epoch(layer, shard, 0)  # warm-up
            steps = -(-2000 // b)
            row("epoch_step", key, b, _seconds(lambda: train_epoch(layer, shard, 1), budget * 4, min_reps=3) / steps)
    # several blocks in one step, as the fixed decomposition takes them: every block's factors,
    # then one sum of their products per weight (data_parallel._local_sum), a cost that no
    # one-block measurement composes; 8 blocks on one process, per layer and batch. A rank
    # of several takes the gradients, their sum and the step apart (allreduce=True on one
    # process goes that way: the other ranks' sum is all it leaves out); one process and
    # one thread holding every block takes the three in one kernel call where the layer
    # has one (alone_blocked_step)
    for kind, n_in, n_out, hidden in LAYERS:
        key = layer_key(kind, n_in, n_out, hidden)
        for b in (100, 1000):
            layer = layer_cls[kind](be32, n_in, n_out, hidden=hidden, batch=b)
            _measure_blocked_steps(row, budget * 4, layer, key, Shard.of(be32, x_all[:2000, :n_in], BLOCKED))
    n = 10000 if quick else 20000
    layer = RBM(be32, 784, 1000, batch=100)
    train_epoch(layer, Shard.of(be32, x_all[:min(n, 4096), :784], 1), 0)  # warm-up
    shard = Shard.of(be32, be32.asarray(rng.random((n, 784)).astype(np.float32)), 1)
    epoch = time_call(lambda: train_epoch(layer, shard, 0), 1, warmup=0).seconds
    row("rbm_epoch_50k", "rbm:784-1000:bernoulli:float32", 50000, epoch * 50000 / n)


def _measure_blocked_steps(row, budget, layer, key, shard):
    """A step of ``shard``'s blocks at ``layer.batch`` rows inside train_epoch: as a rank of
    several takes it (``blocked_step``; ``update_in_loop`` its optimiser step) and as one
    process alone on one thread does (``alone_blocked_step``)."""
    from aepar.parallel.data_parallel import train_epoch

    steps = -(-shard.n // layer.batch)
    train_epoch(layer, shard, 0, allreduce=True)  # warm-up
    row("blocked_step", key, layer.batch, _seconds(lambda: train_epoch(layer, shard, 1, allreduce=True), budget,
                                                   min_reps=3) / steps, blocks=shard.blocks.count)
    # the optimiser step as the loop pays it, after the gradients (not the isolated one)
    row("update_in_loop", key, layer.batch, train_epoch(layer, shard, 1, allreduce=True).phases["update"] / steps)
    train_epoch(layer, shard, 0)  # warm-up
    row("alone_blocked_step", key, layer.batch,
        _seconds(lambda: train_epoch(layer, shard, 1), budget, min_reps=3) / steps, blocks=shard.blocks.count)


def measure_compute(out: Path, quick: bool = False) -> int:
    """One process, one thread: the compute terms of every scheme (see :class:`Compute`)."""
    os.environ.setdefault("AEPAR_THREADS", "1")
    import aepar  # noqa: F401
    from aepar import backend
    from aepar.models.ae_layer import AELayer
    from aepar.models.rbm import RBM

    budget = 0.05 if quick else 0.25
    rows, machine = [], machine_columns()
    rng = np.random.default_rng(0)

    def row(what, key, rows_, seconds, **kw):
        rows.append(_row(machine, what=what, key=key, rows=rows_, seconds=seconds, **kw))
        print(f"measure-compute: {what:14s} {key:34s} rows {rows_!s:>6s} {seconds:.4g} s", flush=True)

    _measure_memory(row, budget)
    _measure_sparse_evaluation(row, budget, quick, rng)
    be32 = backend.select("cpu", "auto", "float32")
    layer_cls = {"rbm": RBM, "ae": AELayer}
    x_all = be32.asarray(rng.random((4096, 2000)).astype(np.float32))
    for kind, n_in, n_out, hidden in LAYERS:
        layer = layer_cls[kind](be32, n_in, n_out, hidden=hidden, batch=100)
        _measure_layer(row, budget, quick, be32, layer, layer_key(kind, n_in, n_out, hidden),
                       x_all[:, :n_in].copy())
    _measure_epochs(row, budget, quick, be32, layer_cls, x_all, rng)
    write_rows(out, rows)
    print(f"measure-compute: {len(rows)} rows -> {out}", flush=True)
    return 0


TRIAD_BYTES = 16 << 20  # each array of measure-contention's memory triad


def _contended_work(family: str):
    """One unit of a kernel family's work, as a rank does it (one thread): ``layers`` one
    training epoch of the 784-2000 autoencoder layer over 2,000 rows, one block, batch 100;
    ``sparse`` the partial sums of 10k patches' blocks; ``memory`` a STREAM triad
    (a = b + s c) over float64 arrays of 16 MB each, the size of the larger messages whose
    copies a collective's level makes at once."""
    rng = np.random.default_rng(0)
    if family == "memory":
        a, b, c = (np.full(TRIAD_BYTES // 8, 1.0) for _ in range(3))

        def triad():
            np.multiply(c, 3.0, out=a)
            np.add(a, b, out=a)
        return triad
    if family == "layers":
        from aepar import backend
        from aepar.models.ae_layer import AELayer
        from aepar.parallel.data_parallel import train_epoch
        from aepar.rows import Shard

        be = backend.select("cpu", "auto", "float32")
        layer = AELayer(be, 784, 2000, hidden="bernoulli", batch=100)
        shard = Shard.of(be, rng.random((2000, 784)).astype(np.float32), 1)
        return lambda: train_epoch(layer, shard, 1)
    opt, _, _ = _sparse_optimiser(rng)
    return lambda: opt._local(opt.buffer[1:])


def _contended_copy(family, budget, barrier, results):
    """A copy's median seconds of :func:`_contended_work` over about ``budget`` seconds, all
    copies starting together."""
    work = _contended_work(family)
    t0 = time.perf_counter()
    work()  # warm-up: the kernels' first load
    repeats = max(5, int(budget / max(time.perf_counter() - t0, 1e-6)))
    barrier.wait()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    results.put(float(np.median(times)))


def _contended_round(ctx, family: str, copies: int, budget: float) -> list:
    """Every copy's median, ``copies`` fresh one-thread processes started together."""
    barrier, results = ctx.Barrier(copies), ctx.Queue()
    procs = [ctx.Process(target=_contended_copy, args=(family, budget, barrier, results)) for _ in range(copies)]
    for proc in procs:
        proc.start()
    medians = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return medians


CONTENDED = ("layers", "sparse", "memory")  # measure-contention's families of work (_contended_work)


def measure_contention(out: Path, rounds: int = 5, budget: float = 2.0) -> int:
    """How ranks sharing a machine slow each other: each family's work in 1 process,
    then in one process per core started together (fresh processes of one thread each),
    the two taken in turns ``rounds`` times, because this VM's speed drifts by more than
    the effect between minutes. Every step waits for the slowest rank, so a round keeps
    the slowest copy's median; a row is the median over the rounds, and the contention
    the median of the rounds' ratios."""
    import multiprocessing

    os.environ["AEPAR_THREADS"] = "1"  # the copies inherit it: one thread each, as a rank
    ctx = multiprocessing.get_context("spawn")
    machine, rows = machine_columns(), []
    cores = int(machine.get("cores") or os.cpu_count() or 1)
    for family in CONTENDED:
        alone, together = [], []
        for _ in range(rounds):
            alone.append(max(_contended_round(ctx, family, 1, budget)))
            together.append(max(_contended_round(ctx, family, cores, budget)))
        ratio = float(np.median(np.array(together) / np.array(alone)))
        for copies, times in ((1, alone), (cores, together)):
            med = float(np.median(times))
            rows.append(_row(machine, what="contention", key=family, rows=copies,
                             seconds=float(np.median(alone)) * (ratio if copies > 1 else 1.0),
                             round_seconds=" ".join(f"{t:.4g}" for t in times), median_seconds=med))
        print(f"measure-contention: {family:7s} {cores} copies at once: {ratio:.3f}x one alone (rounds: "
              + " ".join(f"{t / a:.2f}" for a, t in zip(alone, together)) + ")", flush=True)
    write_rows(out, rows)
    print(f"measure-contention: {len(rows)} rows -> {out}", flush=True)
    return 0


def _layer_entry(comp: Compute, what: str, key: str, r: dict):
    """One per-layer row of measure-compute's CSV into ``comp.layers``."""
    lay = comp.layers.setdefault(key, {"leaf": {}, "fused": {}})
    if what in ("leaf", "fused"):
        lay[what][int(r["rows"])] = float(r["seconds"])
    elif what in ("apply", "transform_row", "recon_row"):
        lay[what] = float(r["seconds"])
    elif what == "bytes":
        lay.update(grad_bytes=int(r["grad_bytes"]), param_bytes=int(r["param_bytes"]), flops=float(r["flops"]))


def read_contention(path: Path) -> dict:
    """measure-contention's CSV as family -> {copies at once: the slowest copy's seconds}
    ({} where the file is missing)."""
    table: dict = {}
    for r in read_rows(path) if Path(path).exists() else ():
        table.setdefault(r["key"], {})[int(r["rows"])] = float(r["seconds"])
    return table


def memory_bandwidth(contention: dict) -> dict:
    """Processes at once -> the slowest process's triad rate, relative (the rate alone 1.0),
    from :func:`read_contention`'s table ({} where its memory triad was not measured)."""
    seconds = contention.get("memory", {})
    return {k: seconds[1] / t for k, t in seconds.items()} if 1 in seconds else {}


def read_bandwidth(path: Path) -> dict:
    """The per-process memory bandwidth of a probe run with 1..N processes at once, from the
    JSON lines of its log (``{"processes": N, ..., "triad_min": GB/s}``, a STREAM triad in
    each process, the slowest one's rate), as processes -> GB/s ({} where the file is missing)."""
    table: dict = {}
    for line in Path(path).read_text().splitlines() if Path(path).exists() else ():
        if line.startswith('{"processes"'):
            r = json.loads(line)
            table[int(r["processes"])] = float(r["triad_min"])
    return table


def load_compute(path: Path, contention: Path | None = None) -> Compute:
    """The :class:`Compute` record of measure-compute's CSV (and measure-contention's, where
    given and present)."""
    comp = Compute(contention=read_contention(contention) if contention is not None else {})
    ev, checks, blocked, updates = {}, [], [], {}
    for r in read_rows(path):
        what, key, s = r["what"], r["key"], float(r["seconds"])
        if what == "mem":
            comp.mem.setdefault(key, {})[int(r["rows"])] = s
        elif what == "sparse_eval":
            ev["eval"] = (s, int(r["evaluations"]), int(r["iterations"]))
        elif what == "sparse_serial":
            ev["serial"] = s
        elif what == "sparse_local":
            ev["local"], ev["blocks"] = s, int(r["blocks"])
        elif what == "sparse_assemble":
            ev["assemble"] = s
        elif what == "rbm_epoch_50k":
            comp.rbm_epoch_50k = s
        elif what == "epoch_step":
            checks.append((key, int(r["rows"]), s))
        elif what == "blocked_step":
            blocked.append((key, int(r["rows"]), int(r["blocks"]), s))
        elif what == "update_in_loop":
            updates.setdefault(key, []).append(s)
        elif what == "alone_blocked_step":
            comp.layers.setdefault(key, {"leaf": {}, "fused": {}}).setdefault("alone", {}) \
                .setdefault(int(r["blocks"]), {})[int(r["rows"])] = s
        else:
            _layer_entry(comp, what, key, r)
    for key, seconds in updates.items():
        # the model's optimiser step is the one the loop pays (the isolated one kept for the report)
        lay = comp.layers[key]
        lay["apply_isolated"], lay["apply"] = lay["apply"], float(np.median(seconds))
    if checks:
        # one-block steps inside train_epoch against the same step composed from the isolated
        # measurements: the ratio (median) multiplies every gradient and fused step
        ratios = []
        for key, b, t in checks:
            lay = comp.layers[key]
            composed = comp.fused(key, b) if key.startswith("rbm") else \
                comp.leaf(key, b) + comp.mem_s("copy", lay["grad_bytes"]) + lay["apply"]
            ratios.append(t / composed)
        comp.in_loop = float(np.median(ratios))
        comp.in_loop_ratios = ratios
    for key, b, k, t in blocked:
        # one block's share of a k-block step, at its rows: the step less its copy and update
        lay = comp.layers[key]
        lay.setdefault("block", {})[b / k] = max(t - comp.mem_s("copy", lay["grad_bytes"]) - lay["apply"], 0.0) / k
    if "eval" in ev:
        (t_eval, evals, iters), local, blocks = ev["eval"], ev["local"], ev["blocks"]
        # serial: what an evaluation costs beyond its blocks (L-BFGS-B, assembly, Python),
        # from one run where measured so (older records: the difference of two timings)
        serial = ev["serial"] if "serial" in ev else t_eval - local
        comp.sparse = {"serial_s": max(serial, 0.0), "block_s": local / blocks,
                       "evals_per_iter": evals / iters, "cg_10k_s": local + ev["assemble"]}
    return comp


# ==== whole runs here ============================================================================
def _run_summary(cmd, out_dir: Path, what: str) -> dict:
    """Run a scheme's command (one thread per rank) and read back its summary.json."""
    r = subprocess.run(cmd, cwd=REPO, env=mpi_env(AEPAR_THREADS=1), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{what}: {' '.join(cmd)} failed ({r.returncode}): {r.stderr[-800:]}")
    return json.loads((out_dir / "summary.json").read_text())


def measure_sparse(out: Path, samples=(10000, 40000, 160000), procs=(1, 2), iterations=400, repeats=3) -> int:
    """``python -m aepar.sparse`` at each (processes, samples), one thread per rank, as
    jobs/lib.sh runs a point (mpirun for P > 1); the fastest of ``repeats`` counts, the
    points run once per round (:func:`~bench.common.in_rounds`)."""
    work = REPO / "runs" / f"scaling-model-{time.strftime('%Y%m%d-%H%M%S')}"
    rows, machine = [], machine_columns()

    def one(point, k):
        s_, p = point
        d = work / f"sparse-{p}-{s_}-{k}"
        # float64: the precision the model's compute is measured in (_sparse_optimiser)
        cmd = python_command("aepar.sparse", ["--limit", s_, "--iterations", iterations, "--dtype", "float64",
                                              "--out", d, "--quiet"], p)
        t0 = time.time()
        summ = _run_summary(cmd, d, "measure-sparse")
        summ["_wall"] = time.time() - t0
        print(f"measure-sparse: np {p} {s_} patches: {summ['total_s']:.3f} s "
              f"({summ['evaluations']} evaluations)", flush=True)
        return summ
    for (s_, p), runs in in_rounds([(s_, p) for s_ in samples for p in procs], repeats, one).items():
        best = fastest_run(runs, seconds=lambda run: run["total_s"])
        rows.append(_row(machine, scheme="aepar.sparse", processes=p, samples=s_, iterations=best["iterations"],
                         evaluations=best["evaluations"], seconds=best["total_s"],
                         seconds_compute=best["compute_s"], seconds_comm=best["comm_s"],
                         repeats=repeats, wall_seconds=best["_wall"]))
    write_rows(out, rows)
    print(f"measure-sparse: {len(rows)} rows -> {out} (runs in {work})", flush=True)
    return 0


# (scheme, ranks, extra options): the sweep of bench.pretrain (AE 784-2000-1000, 2,000 rows) and
# the synchronized pipeline of sync_measured_quick.csv (RBMs, 4,000 digits), on this machine now
STACKED_RUNS = (
    [("greedy", 1, ["--reduce-blocks", "1"], b) for b in (100, 2000)]
    + [(s_, 2, [], b) for b in (100, 2000) for s_ in ("greedy", "data", "model")]
    + [("sync", 2, ["--handover-mode", m], 100) for m in ("data", "weights")])
SWEEP_NET = ["--layers", "784-2000-1000", "--pretrainer", "ae", "--dataset", "mnist5k", "--limit", "2000",
             "--epochs", "2", "--finetune-epochs", "0"]
SYNC_NET = ["--dataset", "mnist5k", "--epochs", "10", "--finetune-epochs", "0", "--extra", "0,5,20,40",
            "--no-plot"]


def measure_stacked(out: Path, repeats: int = 3) -> int:
    """``python -m aepar.pretrain`` for :data:`STACKED_RUNS`, one thread per rank: the
    engine's points of bench/results measured again here, now; the fastest of ``repeats``,
    the runs once per round (the same run varies 2x from one minute to the next on this VM)."""
    work = REPO / "runs" / f"scaling-model-stacked-{time.strftime('%Y%m%d-%H%M%S')}"
    rows, machine = [], machine_columns()

    def net_args(scheme):
        return SYNC_NET if scheme == "sync" else SWEEP_NET

    def one(i, k):
        scheme, p, extra, batch = STACKED_RUNS[i]
        d = work / f"{scheme}-{p}-{batch}-{'-'.join(extra).strip('-') or 'default'}-{k}"
        cmd = python_command("aepar.pretrain", ["--scheme", scheme, *net_args(scheme), "--batch", batch, *extra,
                                                "--out", d, "--quiet"], p)
        summ = _run_summary(cmd, d, "measure-stacked")
        print(f"measure-stacked: {scheme} np {p} batch {batch} {' '.join(extra)}, round {k + 1}: "
              f"{summ['pretrain_time_s']:.3f} s", flush=True)
        return summ
    for i, times in in_rounds(range(len(STACKED_RUNS)), repeats, one).items():
        scheme, p, extra, batch = STACKED_RUNS[i]
        summ = fastest_run(times, seconds=lambda run: run["pretrain_time_s"])
        blocks = 1 if extra[:1] == ["--reduce-blocks"] else {"data": p, "model": 1}.get(scheme, 8)
        rows.append(_row(machine, scheme=scheme, ranks=p, blocks=blocks, batch=batch,
                         mode=extra[1] if scheme == "sync" else "", net=" ".join(net_args(scheme)),
                         pretrain_s=summ["pretrain_time_s"], n_train=summ.get("n_train", ""),
                         all_seconds=" ".join(f"{x['pretrain_time_s']:.3f}" for x in times), repeats=repeats))
    write_rows(out, rows)
    print(f"measure-stacked: {len(rows)} rows -> {out} (runs in {work})", flush=True)
    return 0
