"""The fixed-tree sum on every rank, its two ways side by side.

``python -m bench.tree_sum`` (``make bench-tree-sum``) times
:meth:`aepar.parallel.blocks.TreeSum.allreduce_nodes` over ``--ranks`` ranks (default 2)
for the packed gradients of the stacked autoencoder's layers (784x1000 .. 250x30, float32,
what a greedy or synchronized step sums) and of its unrolled network (fine-tuning's), with
8 blocks (the default ``--reduce-blocks``):

- ``tree + Bcast``: the tree's messages up to rank 0, then a Bcast of the sum;
- ``halving``: recursive halving, then doubling, which a power-of-two number of ranks
  holding one node each takes for vectors of ``blocks.HALVING_BYTES`` and more (timed
  here at every size, the shorter vectors included, to show where that bound lies).

Both give the same bits (tests/mpi/mpi_comm.py). The two alternate within each round;
a call's time is its slowest rank's, and a row keeps the fastest call of all rounds.
Rows, with the machine, are merged into ``bench/results/tree_sum.csv``; the table per
machine is ``tree_sum.md``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import machine_columns, merge_rows, mpi_env, python_command, read_rows

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "tree_sum.csv"
STACK = (784, 1000, 500, 250, 30)


def vectors() -> dict:
    """name -> floats of each packed gradient: the layers' (weights and both biases, as the
    tied autoencoder and RBM layers pack them) and the unrolled network's."""
    pairs = list(zip(STACK, STACK[1:]))
    out = {"100 B": 25, "4 KB": 1024, "64 KB": 16384}
    out.update({f"{a}x{b} layer": a * b + a + b for a, b in pairs})
    out["784-1000-500-250-30 unrolled"] = 2 * sum(a * b for a, b in pairs) + 2 * sum(STACK[1:-1]) + STACK[0] + STACK[-1]
    return out


def _child(rounds: int, reps: int) -> dict:
    import aepar  # noqa: F401  (threads before NumPy)
    import numpy as np

    from aepar.comm import world
    from aepar.parallel import blocks
    from aepar.parallel.blocks import TreeSum

    comm = world()
    tree = TreeSum(comm, 8)
    if not tree.butterfly:
        raise SystemExit(f"bench.tree_sum: {comm.size} ranks holding 8 blocks do not halve (a power of two up to 8)")
    blocks.HALVING_BYTES = 0  # every size halves when asked to
    rng = np.random.default_rng(comm.rank)
    given = {name: rng.random(floats).astype(np.float32) for name, floats in vectors().items()}
    best = {}
    for _ in range(rounds):
        for name, v0 in given.items():
            v, out = v0.copy(), np.empty_like(v0)
            for way, halves in (("tree_bcast", False), ("halving", True)):
                tree.butterfly = halves
                for _ in range(reps):
                    v[...] = v0
                    comm.barrier()
                    t0 = time.perf_counter()
                    tree.allreduce_nodes({tree.nodes[0]: v}, out)
                    dt = comm.allreduce(time.perf_counter() - t0, op="max")
                    best[(name, way)] = min(best.get((name, way), dt), dt)
    return {"ranks": comm.size, "rows": [{"vector": name, "bytes": 4 * floats,
                                          "tree_bcast_ms": best[(name, "tree_bcast")] * 1e3,
                                          "halving_ms": best[(name, "halving")] * 1e3}
                                         for name, floats in vectors().items()]}


def table(rows: list[dict]) -> str:
    """tree_sum.md: a table per machine and rank count."""
    lines = ["# The fixed-tree sum on every rank: tree + Bcast against halving",
             "", "Written by `python -m bench.tree_sum` from `tree_sum.csv` (lower is better; the same bits "
             "either way). Each figure is the fastest call, its slowest rank's time, over the rounds; the two "
             "ways alternate within each round.", ""]
    groups = {}
    for r in rows:
        groups.setdefault((r["cpu_model"], r["isa"], r["mpi"], r["ranks"], r.get("date", "")), []).append(r)
    for (cpu, isa, mpi, ranks, date), group in groups.items():
        lines += [f"## {cpu} ({isa}), {mpi}, {ranks} ranks", "", f"Measured {date} with `python -m bench.tree_sum "
                  f"--ranks {ranks}`.", "", "| vector | MB | tree + Bcast (ms) | halving (ms) | halving / tree |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for r in sorted(group, key=lambda r: int(r["bytes"])):
            t, h = float(r["tree_bcast_ms"]), float(r["halving_ms"])
            lines.append(f"| {r['vector']} | {int(r['bytes']) / 1e6:.3f} | {t:.3f} | {h:.3f} | {h / t:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tree_sum", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="ranks, a power of two up to 8 (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="rounds over the vectors (default 5)")
    p.add_argument("--reps", type=int, default=20, help="calls per way, vector and round (default 20)")
    p.add_argument("--out", type=Path, default=OUT, help=f"CSV the rows are merged into (default {OUT})")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        result = _child(args.rounds, args.reps)
        import aepar.comm
        if aepar.comm.world().is_root:
            print(json.dumps(result), flush=True)
        return 0
    if args.ranks not in (2, 4, 8) or args.rounds < 1 or args.reps < 1:
        p.error("need --ranks of 2, 4 or 8, --rounds >= 1 and --reps >= 1")
    cmd = python_command("bench.tree_sum", ["--child", "--rounds", args.rounds, "--reps", args.reps], args.ranks)
    done = subprocess.run(cmd, env=mpi_env(AEPAR_THREADS=1, PYTHONPATH=ROOT), cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"bench.tree_sum: not measured ({last})", file=sys.stderr)
        return 1
    result = json.loads(done.stdout.strip().splitlines()[-1])
    machine = machine_columns(threads=1)  # the ranks' (AEPAR_THREADS=1), not this process's
    rows = [{**r, "ranks": result["ranks"], "halving_over_tree": r["halving_ms"] / r["tree_bcast_ms"],
             "date": time.strftime("%Y-%m-%d"), "command": f"python -m bench.tree_sum --ranks {args.ranks}",
             **{k: v for k, v in machine.items() if k not in r}} for r in result["rows"]]
    merge_rows(rows, args.out, "tree_sum", key=("hostname", "cpu_model", "isa", "blas_coretype", "ranks", "vector"))
    args.out.with_suffix(".md").write_text(table(read_rows(args.out)) + "\n")
    for r in rows:
        print(f"{r['vector']:>30}: tree + Bcast {r['tree_bcast_ms']:.3f} ms, halving {r['halving_ms']:.3f} ms "
              f"({r['halving_over_tree']:.2f})")
    print(f"bench.tree_sum: {len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
