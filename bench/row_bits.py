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

On the CPU also aepar's row kernels (``rows_times`` for ``x @ W``, ``rows_times_t`` for
``h @ W.T``) over a batch in 8 blocks, one call for all its rows as the layers make it,
timed against the BLAS a call per block and one call for the batch (tests ``cpu
rows_times``, ``cpu rows_times_t``): up to which rows a block they are the faster, which
``kernels.nb.rowprod.MAX_ROWS`` (in each row) should follow on this CPU and code path.

With ``--device gpu`` also aepar's own GPU products (``kernels/cp/rowprod.cu``, whose rows
keep their bits by construction) at batch 100: their bits against the CPU's row kernels
(the same sums in the same order) and their time against cuBLAS, a call per block and one
call for the batch, each launch waited for (tests ``own rows_times``, ``own
block_outer_sum``).

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

from bench.common import KEY, ONE_PROCESS, machine_columns, merge_rows, time_calls

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


# the batches the own kernels are timed at, in 8 blocks: 12-13 rows a block (the seed's
# batch of 100), 64, 125 (up to rowprod.MAX_ROWS), 250 and 625 (above it)
OWN_BATCHES = (100, 512, 1000, 2000, 5000)


def own_kernels(cp, repeats=20) -> list[dict]:
    """GPU only: kernels/cp/rowprod.cu's products of batches of :data:`OWN_BATCHES` rows in
    8 blocks (the weight gradient: twice the rows, as the RBM's factors) timed against
    cuBLAS, a call per block and one for the batch, best of ``repeats`` (µs, each launch
    waited for), and their bits against the CPU's row kernels: where the own kernels are
    the faster, up to which rows a block (the GPU set's ``rowprod.MAX_ROWS``). The own
    kernels in each instance of their tiles (``own_wide_us``, ``own_mid_us``, ``own_thin_us``:
    where each is the faster, ``rowprod.tiles_for``) and as the set launches them (``own_us``, the
    instance ``tiles``); every instance's bits are checked."""
    import time

    from aepar.kernels.cp import rowprod as own
    from aepar.kernels.cp.gemm import matmul
    from aepar.kernels.nb import rowprod as cpu
    from aepar.kernels.ref.blocksum import tree_of_products
    from aepar.rows import block_bounds, tree_merges, tree_top

    def by_cublas(A, D, starts, merges, alphas, out):  # the blocks' products one cuBLAS call each
        return tree_of_products(A, D, starts, merges, alphas, out, lambda A_b, D_b, alpha: matmul(A_b.T, D_b) * alpha)

    rng = np.random.default_rng(1)
    stream = cp.cuda.get_current_stream()

    def best_us(fn):
        fn()
        stream.synchronize()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            stream.synchronize()
            best = min(best, time.perf_counter() - t)
        return round(best * 1e6, 1)

    def same(got, want):
        return bool(np.array_equal(cp.asnumpy(got).view(np.uint32), want.view(np.uint32)))

    def instances(launch, want, chosen):  # each instance timed, every one's bits; own_us: the set's choice's
        times = {t: best_us(lambda: launch(t)) for t in own.TILES}
        return {"same_bits_as_cpu": all(same(launch(t), want) for t in own.TILES), "own_us": times[chosen],
                **{f"own{t or '_wide'}_us": us for t, us in times.items()}}

    rows = []
    for batch in OWN_BATCHES:
        starts = block_bounds(batch, 8)
        blocks = list(zip(starts[:-1], starts[1:]))
        for k, n in FORWARD:
            x, w = rng.standard_normal((batch, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
            xd, wd, out = cp.asarray(x), cp.asarray(w), cp.empty((batch, n), np.float32)
            rows.append({"test": "own rows_times", "shape": f"{k}x{n}", "size": f"{batch} rows in 8 blocks",
                         "tiles": own.tiles_for(batch, n).lstrip("_") or "wide",
                         **instances(lambda t: own.rows_times(xd, wd, out, t),
                                     cpu.rows_times(x, w, np.empty((batch, n), np.float32)), own.tiles_for(batch, n)),
                         "cublas_blocks_us": best_us(lambda: [matmul(xd[lo:hi], wd, out=out[lo:hi])
                                                              for lo, hi in blocks]),
                         "cublas_whole_us": best_us(lambda: matmul(xd, wd, out=out))})
        chain, merges, alphas = block_bounds(2 * batch, 8), tree_merges(tree_top(8), 0, 8), [0.01] * 8
        for m, n in GRADIENT:
            a = rng.standard_normal((2 * batch, m)).astype(np.float32)
            d = rng.standard_normal((2 * batch, n)).astype(np.float32)
            ad, dd, g = cp.asarray(a), cp.asarray(d), cp.empty((m, n), np.float32)
            want = cpu.block_outer_sum(a, d, chain, merges, alphas, np.empty((m, n), np.float32))
            rows.append({"test": "own block_outer_sum", "shape": f"{m}x{n}",
                         "size": f"8 blocks of {2 * batch // 8} rows",
                         "tiles": own.tiles_for(m, n).lstrip("_") or "wide",
                         **instances(lambda t: own.block_outer_sum(ad, dd, chain, merges, alphas, g, t), want,
                                     own.tiles_for(m, n)),
                         "cublas_blocks_us": best_us(lambda: by_cublas(ad, dd, chain, merges, alphas, g)),
                         "cublas_whole_us": best_us(lambda: matmul(ad.T, dd, out=g))})
    return rows


def cpu_kernels(repeats=5) -> list[dict]:
    """CPU only: the row kernels' products of batches of :data:`OWN_BATCHES` rows in 8
    blocks, all rows in one call (a row's sums do not depend on the others), timed in turns
    (:func:`bench.common.time_calls`, at least 2 ms a sample) against the BLAS a call per
    block (what a block past ``rowprod.MAX_ROWS`` gets) and one call for the batch, the
    fastest of ``repeats`` samples (µs a product): ``rows_times`` for each of
    :data:`FORWARD`'s x @ W, ``rows_times_t`` for the same shapes' h @ W.T (W kept as it
    is, as a tied decoder's)."""
    from aepar.kernels.nb import rowprod as cpu
    from aepar.rows import block_bounds

    rng = np.random.default_rng(1)
    rows = []
    for batch in OWN_BATCHES:
        starts = block_bounds(batch, 8).tolist()
        blocks = list(zip(starts[:-1], starts[1:]))
        for k, n in FORWARD:
            x, w = rng.standard_normal((batch, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
            h = rng.standard_normal((batch, n)).astype(np.float32)
            out, back = np.empty((batch, n), np.float32), np.empty((batch, k), np.float32)
            # (test, the row kernel's call, then the same product's operands and result for the BLAS)
            for test, own, a, b, c in (("cpu rows_times", lambda: cpu.rows_times(x, w, out), x, w, out),
                                       ("cpu rows_times_t", lambda: cpu.rows_times_t(h, w, back), h, w.T, back)):
                times = time_calls({"own": own,
                                    "blas_blocks": lambda: [np.matmul(a[lo:hi], b, out=c[lo:hi]) for lo, hi in blocks],
                                    "blas_whole": lambda: np.matmul(a, b, out=c)}, repeats, min_time=2e-3)
                rows.append({"test": test, "shape": f"{k}x{n}", "size": f"{batch} rows in 8 blocks",
                             "max_rows": cpu.MAX_ROWS,
                             **{f"{name}_us": round(t.seconds * 1e6, 1) for name, t in times.items()}})
    return rows


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
        blas = f"cuBLAS of CUDA runtime {xp.cuda.runtime.runtimeGetVersion()}, " + (
            name.decode() if isinstance(name, bytes) else str(name))
    else:
        xp, blas = np, None
    rows = measure(xp)
    machine = machine_columns(mpi=ONE_PROCESS)
    merge_rows([{**r, "device": opts.device, "gpu_blas": blas or "", **machine} for r in rows], opts.out,
               BENCHMARK, key=(*KEY, "device"))
    for line in summary(rows):
        print(f"bench.row_bits ({opts.device}): {line}")
    if opts.device == "cpu":  # after the BLAS's rows are written
        own = cpu_kernels()
        merge_rows([{**r, "device": opts.device, **machine} for r in rows + own], opts.out, BENCHMARK,
                   key=(*KEY, "device"))
        for r in own:
            print(f"bench.row_bits (cpu): {r['test']} {r['shape']} {r['size']}: {r['own_us']} us against the BLAS "
                  f"{r['blas_blocks_us']} us by block, {r['blas_whole_us']} us whole (MAX_ROWS {r['max_rows']})")
    if opts.device == "gpu":  # after the BLAS's rows are written
        own = own_kernels(xp)
        merge_rows([{**r, "device": opts.device, "gpu_blas": blas, **machine} for r in rows + own], opts.out,
                   BENCHMARK, key=(*KEY, "device"))
        for r in own:
            print(f"bench.row_bits (gpu): {r['test']} {r['shape']} {r['size']}: "
                  f"the CPU's bits {r['same_bits_as_cpu']}, {r['own_us']} us ({r['tiles']}; "
                  f"wide {r['own_wide_us']}, mid {r['own_mid_us']}, thin {r['own_thin_us']}) against "
                  f"cuBLAS {r['cublas_blocks_us']} us by block, {r['cublas_whole_us']} us whole")
    print(f"bench.row_bits: rows in {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
