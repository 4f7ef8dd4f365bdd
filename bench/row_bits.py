"""Whether a BLAS gives a product's rows the same bits whatever else is in the call:
``python -m bench.row_bits`` (``--device gpu``: cuBLAS through CuPy).

aepar's blocks give the same weights on 1-8 ranks only if each block's products come out
the same whether a rank computes that block alone or beside others. On the CPU aepar takes
a block's rows with its own row kernels (``kernels/nb/rowprod.py``), which sum each row in
an order of its own. On the GPU each block is still its own cuBLAS calls, eight times the
launches at the default 8 blocks: the one big cost of the default there
(docs/performance-gpu.md). Stacking the blocks into one product, or one batched product,
would be one launch a step, but only if the BLAS gives each block the bits it gives that
block alone. This measures that for the stacked autoencoder's shapes, float32:

- ``rows``: rows r0..r0+12 of ``X[:M] @ W`` (M = 26, 100, 1000, 5000; r0 = 0 and 13)
  against those 13 rows alone: one product over all blocks' rows;
- ``batched``: ``B`` matrices of 13 rows in one batched call (``matmul`` of a 3-D array:
  cuBLAS's strided-batched GEMM on the GPU), B = 2, 8, 64, against each alone;
- ``gradient``: the weight gradient's blocks, ``A_b.T @ D_b`` for 8 blocks of 25 rows, in
  one batched call against each alone;
- ``repeat``: the same whole-batch call twice (whether the BLAS is deterministic at all).

A row of the CSV per test, shape and size: the rows (or matrices) compared, how many
differ in any bit, and the largest difference relative to the largest magnitude. Rows are
merged into ``--out`` (default bench/results/row_bits.csv) per machine, code path and
device. Differences are findings, not failures: the exit code is 0 whenever it ran.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import aepar  # noqa: F401  (threads before numpy: the BLAS as aepar runs it, one thread a block)
import numpy as np

from bench.common import KEY, ONE_PROCESS, machine_columns, merge_rows

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
BENCHMARK = "row_bits"
BLOCK = 13          # a block's rows at batch 100 (8 blocks of 12-13)
GRADIENT_ROWS = 25  # a block's rows of [v0; vk] in the weight gradient at batch 100
FORWARD = ((784, 1000), (1000, 784), (1000, 500), (500, 1000), (500, 250), (250, 500), (250, 30), (30, 250))
GRADIENT = ((784, 1000), (1000, 500), (500, 250), (250, 30))
ROWS = (26, 100, 1000, 5000)
BATCHES = (2, 8, 64)


def product(xp, a, b):
    """The BLAS's product (2-D, or batched over the first axis of 3-D operands)."""
    return xp.matmul(a, b)


def _compare(xp, together, alone) -> tuple[int, int, float]:
    """(matrices compared, how many differ in any bit, largest |difference| / largest |value|):
    ``together`` and ``alone`` stacked along the first axis."""
    together, alone = xp.asarray(together), xp.asarray(alone)
    differ = xp.any(together.view(xp.uint32) != alone.view(xp.uint32), axis=tuple(range(1, together.ndim)))
    scale = float(xp.abs(alone).max()) or 1.0
    return int(differ.size), int(differ.sum()), float(xp.abs(together - alone).max()) / scale


def measure(xp, forward=FORWARD, gradient=GRADIENT, rows=ROWS, batches=BATCHES, integers=False, seed=0):
    """The rows of one run on the array module ``xp`` (numpy or cupy). ``integers``: inputs
    of small integers, whose products and sums are exact in any order (a control: every
    row must then agree)."""
    rng = np.random.default_rng(seed)

    def draw(*shape):
        a = rng.integers(-3, 4, shape) if integers else rng.standard_normal(shape)
        return xp.asarray(a.astype(np.float32))

    out = []

    def row(test, shape, size, found):
        compared, differing, rel = found
        out.append({"test": test, "shape": "x".join(map(str, shape)), "size": size, "compared": compared,
                    "differing": differing, "max_rel_diff": rel})

    most = max((*rows, *(b * BLOCK for b in batches), BLOCK * 2))
    for k, n in forward:
        x, w = draw(most, k), draw(k, n)
        for r0 in (0, BLOCK):
            alone = product(xp, x[r0:r0 + BLOCK], w)
            for m in rows:
                if m >= r0 + BLOCK:
                    row("rows", (k, n), f"{m} rows, block at {r0}", _compare(
                        xp, product(xp, x[:m], w)[None, r0:r0 + BLOCK], alone[None]))
        for b in batches:
            xb = x[:b * BLOCK].reshape(b, BLOCK, k)
            alone = xp.stack([product(xp, xb[i], w) for i in range(b)])
            row("batched", (k, n), f"{b} matrices", _compare(xp, product(xp, xb, w), alone))
        whole = product(xp, x[:max(rows)], w)
        row("repeat", (k, n), f"{max(rows)} rows", _compare(xp, product(xp, x[:max(rows)], w)[None], whole[None]))
    for m, n in gradient:
        a, d = draw(8, GRADIENT_ROWS, m), draw(8, GRADIENT_ROWS, n)
        at = a.transpose(0, 2, 1)
        alone = xp.stack([product(xp, at[i], d[i]) for i in range(8)])
        row("gradient", (m, n), f"8 blocks of {GRADIENT_ROWS} rows", _compare(xp, product(xp, at, d), alone))
    return out


def summary(rows) -> list[str]:
    """One line per test: how many of its comparisons came out the same bits."""
    lines = []
    for test in dict.fromkeys(r["test"] for r in rows):
        mine = [r for r in rows if r["test"] == test]
        differ = [r for r in mine if r["differing"]]
        lines.append(f"{test}: " + ("the same bits in all" if not differ else f"different bits in {len(differ)} of")
                     + f" {len(mine)} comparisons" + ("" if not differ else ", e.g. " + ", ".join(
                         f"{r['shape']} {r['size']} ({r['differing']} of {r['compared']})" for r in differ[:3])))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.row_bits", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="cpu: NumPy's BLAS; gpu: cuBLAS through CuPy (default cpu)")
    p.add_argument("--out", type=Path, default=RESULTS / "row_bits.csv",
                   help="the CSV its rows are merged into (default bench/results/row_bits.csv)")
    opts = p.parse_args(argv)
    if opts.device == "gpu":
        import cupy as xp
        name = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"]
        blas = f"cuBLAS {xp.cuda.cublas.getVersion(xp.cuda.device.get_cublas_handle())}, " + (
            name.decode() if isinstance(name, bytes) else str(name))
    else:
        xp, blas = np, None
    rows = measure(xp)
    machine = machine_columns(mpi=ONE_PROCESS)
    merge_rows([{**r, "device": opts.device, "gpu_blas": blas or "", **machine} for r in rows], opts.out,
               BENCHMARK, key=(*KEY, "device"))
    for line in summary(rows):
        print(f"bench.row_bits ({opts.device}): {line}")
    print(f"bench.row_bits: rows in {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
