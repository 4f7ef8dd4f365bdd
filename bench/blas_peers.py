"""The layer products three ways, one thread: ``python -m bench.blas_peers``.

Where the CPU layer epochs lose to PyTorch: each product of a 784x1000 RBM / autoencoder
step (and of a 784x1024 one, ``--widths``) timed as aepar computes it (8 blocks, every
block's bits its own, so that 1-8 ranks agree), as one OpenBLAS call over the whole batch
(NumPy's BLAS, aepar's for products of many rows) and as one ``torch.mm`` (PyTorch's own
BLAS: MKL on x86), at batch 100 and 5000:

- ``v @ W`` (batch x 784 x 1000) and ``h @ W.T`` (batch x 1000 x 784): aepar's row kernels
  on the eight stacked blocks at batch 100 (blocks of 12-13 rows), BLAS block by block at
  5000 (blocks of 625 rows), into the rows of one result (``dense_forward_blocks``'s way);
- the weight gradient ``[v0; vk].T @ [h0; -hk]`` over 2 x batch rows: aepar's
  ``block_outer_sum`` (each block's product an FMA chain over its rows, the blocks added
  in the fixed tree) against one product over all rows (other bits on other ranks).

GFLOP/s of the best of ``--repeats`` after a warm-up, the three ways of a product timed in
turns (one call of each per round: a shared VM's speed changes for seconds at a time),
against the n x n SGEMM rate of OpenBLAS measured in the same run (before and after the
products; the faster counts). Rows to bench/results/blas_peers.csv (the machine's
columns on each; a run on another CPU or code path adds its rows), the table to
blas_peers.md. Without PyTorch its column stays empty. For the AVX2 code paths on an
AVX-512 machine: ``AEPAR_ISA=avx2 python -m bench.blas_peers`` (Numba, OpenBLAS and
PyTorch held to AVX2).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("AEPAR_THREADS", "1")

import aepar  # noqa: E402,F401  (threads before numpy)
import numpy as np  # noqa: E402

from bench.common import KEY, ONE_PROCESS, machine_columns, merge_rows, time_calls, with_machine  # noqa: E402
from bench.epoch_peers import sgemm_gflops  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
BENCHMARK = "layer_products"
BLOCKS = 8
N_IN = 784
# 1000: the stack's first layer; 1024: W's rows 4 KiB apart, where the row tiles copy
# each column panel of W before they read it (kernels/nb/rowprod.py, ALIAS_BYTES)
WIDTHS = (1000, 1024)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


def cases(batch: int, rng, n_out: int = WIDTHS[0]):
    """(product, shape, flops, aepar's way, one OpenBLAS call, the operands for torch) of a
    784 x ``n_out`` layer."""
    from aepar.kernels import nb
    from aepar.kernels.memory import aligned, empty
    from aepar.kernels.nb.dense import blocks_times
    from aepar.rows import block_bounds, tree_merges, tree_top

    f32 = np.float32
    starts = np.asarray(block_bounds(batch, BLOCKS), dtype=np.int64)
    # every operand on a cache line, as a training step's (aepar.kernels.memory): NumPy's
    # own 16 or 32 bytes past one made rows_times_t's rate jump by 25-40% between runs
    v = aligned(rng.random((batch, N_IN), dtype=f32))
    h = aligned(rng.random((batch, n_out), dtype=f32))
    W = aligned(0.1 * rng.standard_normal((N_IN, n_out)), f32)
    z, x = empty((batch, n_out), f32), empty((batch, N_IN), f32)

    A = aligned(rng.random((2 * batch, N_IN), dtype=f32))
    D = aligned(rng.random((2 * batch, n_out), dtype=f32))
    gstarts = 2 * starts
    merges = tree_merges(tree_top(BLOCKS), 0, BLOCKS)
    dW = empty((N_IN, n_out), f32)
    fwd = 2.0 * batch * N_IN * n_out
    return [
        ("v @ W", f"{batch}x{N_IN}x{n_out}", fwd, lambda: blocks_times(v, W, z, starts),
         lambda: np.matmul(v, W, out=z), (v, W)),
        ("h @ W.T", f"{batch}x{n_out}x{N_IN}", fwd, lambda: blocks_times(h, W.T, x, starts),
         lambda: np.matmul(h, W.T, out=x), (h, W.T)),
        ("[v0;vk].T @ [h0;-hk]", f"{N_IN}x{2 * batch}x{n_out}", 2 * fwd,
         lambda: nb.block_outer_sum(A, D, gstarts, merges, [1.0] * BLOCKS, dW),
         lambda: np.matmul(A.T, D, out=dW), (A.T, D)),
    ]


def measure(batches, repeats: int, widths=WIDTHS) -> list[dict]:
    rng = np.random.default_rng(0)
    torch = _torch()
    sgemm, method = sgemm_gflops(1)
    machine = machine_columns(mpi=ONE_PROCESS, threads=1)
    rows = []
    for n_out, batch in itertools.product(widths, batches):
        for name, shape, flops, ours, blas, (a, b) in cases(batch, rng, n_out):
            fns = {"ours": ours, "blas": blas}
            if torch is not None:
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)  # views as they are: MKL takes the transposes
                out = torch.empty(ta.shape[0], tb.shape[1])
                fns["torch"] = lambda: torch.mm(ta, tb, out=out)
            best = {way: t.seconds for way, t in time_calls(fns, repeats).items()}
            t_ours, t_blas, t_torch = best["ours"], best["blas"], best.get("torch")
            row = {"product": name, "batch": batch, "shape": shape, "blocks": BLOCKS,
                   "aepar_gflops": round(flops / t_ours / 1e9, 1),
                   "openblas_gflops": round(flops / t_blas / 1e9, 1),
                   "torch_gflops": "" if t_torch is None else round(flops / t_torch / 1e9, 1),
                   "sgemm_method": method,
                   "date": time.strftime("%Y-%m-%d %H:%M"),
                   "torch": "" if torch is None else torch.__version__}
            rows += with_machine([row], machine)
    sgemm = max(sgemm, sgemm_gflops(1)[0])  # before and after the products
    for row in rows:
        row["sgemm_peak_gflops"] = round(sgemm, 1)
    return rows


def table(rows) -> list[str]:
    """The Markdown tables of every code path's rows (one section each, as merged in the CSV)."""
    def cell(r, key):
        return "–" if r[key] in ("", None) else \
            f"{float(r[key]):.1f} ({float(r[key]) / float(r['sgemm_peak_gflops']):.0%})"
    lines = ["# The layer products: aepar's blocked kernels, one OpenBLAS call, one torch.mm", "",
             "`python -m bench.blas_peers`, 1 thread. GFLOP/s (fraction of OpenBLAS's n x n SGEMM rate "
             "measured in the same run), best of the repeats. aepar's column is the product as a "
             f"training step computes it: {BLOCKS} blocks, each block's bits its own (identical on 1-8 "
             "ranks); the other two are one call over the whole batch. At batch 100 aepar's blocks "
             "(12-13 rows) go through its row kernels in one call, at 5000 (625 rows) through "
             "OpenBLAS block by block; the weight gradient is `block_outer_sum` (the blocks' "
             "products added in the fixed tree).", ""]
    paths = {}
    for r in rows:
        paths.setdefault((r["hostname"], r["cpu_model"], r["isa"], r["blas"], r["blas_coretype"]), []).append(r)
    for (host, cpu, isa, blas, core), group in paths.items():
        r0 = group[0]
        lines += [f"## {cpu} ({isa}), {blas} ({core}), PyTorch {r0['torch'] or 'not installed'}"
                  f"{', ' + r0['date'] if r0.get('date') else ''}", "",
                  f"OpenBLAS SGEMM {float(r0['sgemm_peak_gflops']):.1f} GFLOP/s; host {host}.", "",
                  "| batch | product | shape | aepar (8 blocks) | OpenBLAS, one call | torch.mm, one call |",
                  "| ---: | --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {r['batch']} | `{r['product']}` | {r['shape']} | {cell(r, 'aepar_gflops')} | "
                  f"{cell(r, 'openblas_gflops')} | {cell(r, 'torch_gflops')} |" for r in group]
        lines.append("")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.blas_peers", description=__doc__.split("\n\n")[0],
                                epilog="Writes bench/results/blas_peers.{csv,md} (or --out DIR).")
    p.add_argument("--batches", default="100,5000", help="batch sizes, comma-separated (default 100,5000)")
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                   help="the layers' widths (784 x width), comma-separated (default 1000,1024: the stack's "
                        "first layer, and W's rows 4 KiB apart)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per product after a warm-up (default 5)")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory of the CSV and table (default bench/results)")
    args = p.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        p.error(f"--batches {args.batches!r} and --widths {args.widths!r}: give whole numbers, e.g. 100,5000")
    if any(b < BLOCKS for b in batches) or args.repeats < 1 or any(w < 1 for w in widths):
        p.error(f"--batches need at least {BLOCKS} rows each (one per block), --widths and --repeats at least 1")
    rows = measure(batches, args.repeats, widths)
    path = args.out / "blas_peers.csv"
    merge_rows(rows, path, BENCHMARK, key=KEY + ("product", "batch", "shape"))
    with open(path, newline="") as f:
        everything = list(csv.DictReader(f))
    (args.out / "blas_peers.md").write_text("\n".join(table(everything)))
    print("\n".join(table(rows)))
    print(f"bench.blas_peers: wrote {args.out / 'blas_peers.csv'} and blas_peers.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
