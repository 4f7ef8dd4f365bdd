"""What rank-independent results cost: ``python -m bench.determinism``.

aepar sums over samples in fixed blocks added in one fixed tree (aepar.parallel.blocks),
so 1 process and any number of ranks (and threads) give the same bits. This measures the
price against the fastest sums that depend on the layout, side by side in one process per
thread count (1 and 2 here; aepar's threads take whole blocks, BLAS runs single-threaded):

- sparse autoencoder, 10,000 patches, float64: one cost/gradient evaluation over the
  shard as one sum with the KL term folded in (the fastest one-process path, what aepar
  did before) vs blocks of 128 samples added in the tree (what it does now);
- one CD-1 epoch of the 784x1000 RBM, batch 100, float32: the batch as 1 block (fastest
  on one process, but then only one rank can share it) vs the default 8 blocks;
- one fine-tuning epoch of the unrolled 784-1000-500-250-30 (Adam, cross-entropy), the
  same two ways;
- under ``mpirun -np 2`` and ``-np 4`` (``--comm``): the fixed-tree allreduce of a 3.1 MB
  float32 gradient and the tree reduction of the sparse partials against MPI_Allreduce /
  MPI_Reduce of the same bytes.

Every row carries the machine columns (aepar.machine). Writes bench/results/determinism.csv
and determinism.md (``--out DIR`` elsewhere).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (ONE_PROCESS, across_ranks, machine_columns, mpi_env, python_command, time_call,
                          with_machine, write_rows)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def child(args) -> int:
    """One process, AEPAR_THREADS already set: time every pair, print one JSON line."""
    import aepar  # noqa: F401
    import numpy as np

    from aepar import backend
    from aepar.data.patches import sample_patches
    from aepar.data.sources import load_digits, natural_images
    from aepar.optim import make_optimizer
    from aepar.models.rbm import RBM
    from aepar.models.sparse_ae import SparseAutoencoder, init_theta
    from aepar.models.stacked import StackedAutoencoder
    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import DEFAULT_BLOCKS, Shard

    rows = []
    machine = machine_columns(mpi=ONE_PROCESS)

    def row(what, variant, timing, **extra):
        rows.extend(with_machine([{"what": what, "variant": variant, "seconds": timing.seconds,
                                   "all_seconds": " ".join(f"{t:.4f}" for t in timing.samples), **extra}], machine))

    # sparse autoencoder: one evaluation
    be = backend.select("cpu", "numba", "float64")
    x = sample_patches(natural_images()[0], args.patches, 8, seed=0)
    theta = init_theta(64, 25, 0)
    K = be.K
    n = K.sparse_ae_partials_size(64, 25)
    whole, ws = np.zeros(n), K.sparse_ae_workspace(x.shape[0], 64, 25, np.float64)
    model = SparseAutoencoder(be, 64, 25).attach(x)
    p = model.views(theta)

    def one_sum():
        K.sparse_ae_partials(x, p["W1"], p["b1"], p["W2"], p["b2"], whole, ws, (0.01, 3.0))
        return model.assemble(whole, theta)

    def blocks():
        return model.cost_grad(theta)
    assert abs(one_sum()[0] - blocks()[0]) <= 1e-12 * abs(blocks()[0])
    for name, fn in (("one sum over the process's samples (KL folded in)", one_sum),
                     ("blocks of 128, fixed tree (aepar)", blocks)):
        row("sparse AE cost+gradient, 10k patches, float64", name, time_call(fn, args.repeats * 10),
            samples=x.shape[0])

    # layer-wise: the RBM epoch and the fine-tuning epoch, 1 block vs the default 8
    digits = load_digits(args.dataset, seed=0, dtype=np.float32)
    data = np.ascontiguousarray(digits.train_x[:args.rows])
    be32 = backend.select("cpu", "numba", "float32")
    for count in (1, DEFAULT_BLOCKS):
        shard = Shard.of(be32, data, count)
        rbm = RBM(be32, 784, 1000, batch=100, seed=0)
        epoch = [6]

        def rbm_epoch():
            train_epoch(rbm, shard, epoch[0])
            epoch[0] += 1
        row("RBM CD-1 epoch 784x1000, batch 100, float32", f"{count} block{'s' if count > 1 else ''}",
            time_call(rbm_epoch, args.repeats), samples=data.shape[0], data=digits.source.split(":")[0])
        net = StackedAutoencoder(be32, [784, 1000, 500, 250, 30], loss="xent")
        opt = make_optimizer(be32, net.params, "adam", 1e-3)
        fine = Shard.of(be32, data[:args.finetune_rows], count)

        def finetune_epoch():
            train_epoch(net, fine, 0, batch=100, optimizer=opt)
        row("fine-tuning epoch 784-1000-500-250-30 unrolled, batch 100, Adam, float32",
            f"{count} block{'s' if count > 1 else ''}", time_call(finetune_epoch, args.repeats), samples=fine.n)
    print("DETERMINISM " + json.dumps(rows), flush=True)
    return 0


def comm_child(args) -> int:
    """Under mpirun: the tree against MPI's own collectives, the same bytes."""
    import aepar  # noqa: F401
    import numpy as np

    from aepar.comm import world
    from aepar.parallel.blocks import TreeSum
    from aepar.rows import rank_blocks

    comm = world()
    rows = []
    machine = machine_columns()
    for what, count, size, dtype, reduce in (
            ("RBM gradient 784x1000 (+biases, sums) float32, all ranks", 8, 784 * 1000 + 784 + 1000 + 2,
             np.float32, False),
            ("sparse AE partials, 10k patches (79 blocks) float64, to rank 0", 79, 4940, np.float64, True)):
        first, stop = rank_blocks(count, comm.rank, comm.size)
        leaves = [np.ones(size, dtype) for _ in range(stop - first)]
        out = np.empty(size, dtype)
        tree = TreeSum(comm, count)

        def fixed_tree():
            vs = [v.copy() for v in leaves]  # the copies are timed in both
            if reduce:
                tree.reduce(vs)
            else:
                tree.allreduce(vs, out)

        def mpi():
            vs = [v.copy() for v in leaves]
            local = vs[0]
            for v in vs[1:]:
                local += v
            comm.Reduce(local) if reduce else comm.Allreduce(local)
        for name, fn in (("fixed tree (aepar)", fixed_tree), ("MPI " + ("Reduce" if reduce else "Allreduce")
                                                                  + " of each rank's own sum", mpi)):
            timing = across_ranks(comm, time_call(fn, args.repeats * 10, warmup=3, between=comm.barrier))
            rows.extend(with_machine([{"what": what, "variant": name, "seconds": timing.seconds, "ranks": comm.size,
                                       "all_seconds": f"median {np.median(timing.samples):.6f}"}], machine))
    if comm.is_root:
        print("DETERMINISM " + json.dumps(rows), flush=True)
    return 0


def _collect(cmd, env) -> list[dict]:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    found = [line for line in proc.stdout.splitlines() if line.startswith("DETERMINISM ")]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"bench.determinism: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(found[-1][len("DETERMINISM "):])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.determinism", description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="thread counts, one process each (default 1,2)")
    p.add_argument("--ranks", default="2,4", help="mpirun sizes of the communication rows (default 2,4; '' none)")
    p.add_argument("--dataset", default="mnist5k", help="digits for the layer-wise rows (default mnist5k)")
    p.add_argument("--rows", type=int, default=4000, help="rows of an RBM epoch (default 4000)")
    p.add_argument("--finetune-rows", type=int, default=2000, help="rows of a fine-tuning epoch (default 2000)")
    p.add_argument("--patches", type=int, default=10000, help="patches of the sparse autoencoder runs (default 10000)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per configuration, each compared bit for bit (default 3)")
    p.add_argument("--out", default=str(RESULTS), help="directory of determinism.csv (default bench/results)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--comm-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.comm_child:
        return comm_child(args)
    common = ["--dataset", args.dataset, "--rows", str(args.rows), "--finetune-rows", str(args.finetune_rows),
              "--patches", str(args.patches), "--repeats", str(args.repeats)]
    rows = []
    for t in (int(v) for v in args.threads.split(",") if v.strip()):
        env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
        env["AEPAR_THREADS"] = str(t)
        rows += _collect([sys.executable, "-m", "bench.determinism", "--child", *common], env)
    for n in (int(v) for v in args.ranks.split(",") if v.strip()):
        rows += _collect(python_command("bench.determinism", ["--comm-child", "--repeats", args.repeats], n),
                         mpi_env(AEPAR_THREADS=1))
    out = Path(args.out)
    write_rows(out / "determinism.csv", rows)
    command = " ".join(["python -m bench.determinism", *map(str, sys.argv[1:] if argv is None else argv)])
    md = ["# What rank-independent sums cost (measured side by side; bench/determinism.py)", "",
          f"Machine: {rows[0]['cpu_model']} ({rows[0]['isa']}), {rows[0]['cores']} cores, {rows[0]['blas']}; "
          f"measured {time.strftime('%Y-%m-%d')} by `{command}`.", "",
          "| what | threads / ranks | variant | seconds (best) | vs the first variant |", "| --- | --- | --- | --- | --- |"]
    base = {}
    for r in rows:
        key = (r["what"], r.get("ranks") or r["threads"])
        base.setdefault(key, r["seconds"])
        where = f"{r['ranks']} ranks" if r.get("ranks") else f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}"
        md.append(f"| {r['what']} | {where} | {r['variant']} | {r['seconds']:.5f} | {r['seconds'] / base[key]:.2f}x |")
    (out / "determinism.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    print(f"bench.determinism: wrote {out / 'determinism.csv'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
