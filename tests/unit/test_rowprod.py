"""kernels.nb.rowprod: the float32 row-product kernels the blocks' products use.

Against float64 products within float32 rounding; each row's result the same whatever
other rows share the call (what makes it safe for the fixed blocks of aepar.rows); no
memory past a row's end read or written (masked last vectors); refusals."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar.kernels.nb.rowprod import COPY_PANELS, COPY_ROWS, MAX_ROWS, rows_times, rows_times_t, thin
from tests.conftest import ROOT, host_and_avx2_runs

EPS32 = np.finfo(np.float32).eps


def _padded(rng, shape, pad_rows=1):
    """A C-contiguous float32 array that is the first rows of a larger one whose extra
    rows are NaN: a read past its end would show in the result."""
    buf = np.full((shape[0] + pad_rows, shape[1]), np.nan, dtype=np.float32)
    buf[:shape[0]] = rng.standard_normal(shape, dtype=np.float32)
    return buf[:shape[0]], buf


def _bound(a, b):
    """Sequential float32 sums of K products: |error| <= K eps Σ|terms| (a loose bound)."""
    k = a.shape[1]
    return (k + 2) * EPS32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-30


def _check_rows(kernel, a, W, Wt, out_shape):
    """``kernel(a, W, out)`` against a @ Wt in float64 within float32 rounding, with the row
    past ``out`` untouched and every run of rows sliced out of the call giving the same bits."""
    m = out_shape[0]
    out, obuf = _padded(np.random.default_rng(1), out_shape)
    obuf[m:] = 7.0  # the row past out: must stay
    kernel(a, W, out)
    want = a.astype(np.float64) @ Wt.astype(np.float64)
    assert np.all(np.abs(out - want) <= _bound(a, Wt))
    assert np.all(obuf[m:] == 7.0)
    for lo, hi in ((0, 1), (m // 2, m), (1, m)):
        if lo < hi:  # a row's result does not depend on the other rows of the call
            part = np.empty((hi - lo, out_shape[1]), np.float32)
            np.testing.assert_array_equal(kernel(np.ascontiguousarray(a[lo:hi]), W, part), out[lo:hi])


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 20), k=st.integers(1, 70), n=st.integers(1, 90), seed=st.integers(0, 2**16))
def test_rows_times_is_the_product_row_by_row(m, k, n, seed):
    rng = np.random.default_rng(seed)
    v, _ = _padded(rng, (m, k))
    W, _ = _padded(rng, (k, n))
    _check_rows(rows_times, v, W, W, (m, n))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 20), k=st.integers(1, 30), n=st.integers(1, 90), seed=st.integers(0, 2**16))
def test_rows_times_t_is_the_product_with_the_transpose_row_by_row(m, k, n, seed):
    rng = np.random.default_rng(seed)
    h, _ = _padded(rng, (m, n))
    W, _ = _padded(rng, (k, n))
    _check_rows(rows_times_t, h, W, W.T, (m, k))


def test_the_models_block_shapes_and_empty_sums():
    rng = np.random.default_rng(0)
    for m, k, n in ((13, 784, 1000), (12, 1000, 500), (13, 250, 30)):
        v = rng.random((m, k), dtype=np.float32)
        W = rng.standard_normal((k, n), dtype=np.float32) * np.float32(0.1)
        out = rows_times(v, W, np.empty((m, n), np.float32))
        assert np.all(np.abs(out - v.astype(np.float64) @ W) <= _bound(v, W))
        back = rows_times_t(out, W, np.empty((m, k), np.float32))
        assert np.all(np.abs(back - out.astype(np.float64) @ W.T.astype(np.float64)) <= _bound(out, W.T))
    out = np.full((2, 3), np.nan, np.float32)
    assert not rows_times(np.empty((2, 0), np.float32), np.empty((0, 3), np.float32), out).any()


def test_refusals_and_which_products_it_takes():
    f32 = np.zeros((4, 5), np.float32)
    with pytest.raises(TypeError, match="float32"):
        rows_times(f32.astype(np.float64), np.zeros((5, 2), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="do not match"):
        rows_times(f32, np.zeros((6, 2), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        rows_times_t(np.zeros((5, 4), np.float32).T, np.zeros((3, 5), np.float32), np.zeros((4, 3), np.float32))
    W = np.zeros((5, 16), np.float32)
    assert thin(f32, np.zeros((5, 2), np.float32), np.zeros((4, 2), np.float32))
    assert not thin(np.zeros((MAX_ROWS + 1, 5), np.float32), W, np.zeros((MAX_ROWS + 1, 16), np.float32))
    assert not thin(f32.astype(np.float64), W.astype(np.float64), np.zeros((4, 16)))
    # h @ W.T with rows of any length, a softmax layer's 10 classes too
    assert thin(np.zeros((4, 10), np.float32), W[:, :10].copy(), np.zeros((4, 5), np.float32))


def test_rows_times_t_adds_in_order_along_the_row():
    """h @ W.T's out[r, i] is the FMA chain over h's row r and W's row i in order (as
    v @ W's), not lane sums added in a tree: values whose float32 sums differ between the
    two orders (checked here, so that the test can tell them apart)."""
    lanes = np.float32([1e8, 1, 1, 1, 1, 1, 1, 1, -1e8, 3, 3, 3, 3, 3, 3, 3] * 5)
    h = np.ones((1, lanes.size), np.float32)
    out = rows_times_t(h, lanes[None, :].copy(), np.empty((1, 1), np.float32))
    chain = np.float32(0)
    for v in lanes:  # h is 1: each FMA is a float32 addition
        chain = np.float32(chain + v)
    s = lanes.reshape(-1, 16).sum(axis=0, dtype=np.float32)
    while s.size > 1:
        s = s[:s.size // 2] + s[s.size // 2:]
    assert s[0] != chain
    assert out[0, 0] == chain


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 20), k=st.integers(1, 90), n=st.integers(1, 150), seed=st.integers(0, 2**16))
def test_rows_times_t_is_rows_times_on_the_transpose_bit_for_bit(m, k, n, seed):
    """W's rows copied transposed into each column panel (16 x 16 blocks in registers, a
    width or row count not a multiple of 16 one float at a time): the same bits as
    rows_times given W.T as an array."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((m, n), np.float32)
    W = rng.standard_normal((k, n), np.float32)
    want = rows_times(h, np.ascontiguousarray(W.T), np.empty((m, k), np.float32))
    got = rows_times_t(h, W, np.full((m, k), np.nan, np.float32))
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@settings(max_examples=30, deadline=None)
@given(m=st.integers(24, MAX_ROWS), k=st.integers(1, 40), panels=st.integers(1, 3 * COPY_PANELS),
       tail=st.integers(0, 15), seed=st.integers(0, 2**16))
def test_products_reading_kept_panels_are_rows_times(m, k, panels, tail, seed):
    """Two products with one W (CD-1's v0 @ W and vk @ W, a tied layer's x @ W and dz2 @
    W): the first copies W's column panels into the room that w_panels keeps, the second
    reads them there (``filled``); both the bits of rows_times alone, whatever the panels'
    count (fewer than, as many as and more than a pass copies) or a last one's width. Rows
    enough for the AVX2 path to copy W's panels; the AVX-512 path copies only where W's
    rows alias (512 columns)."""
    from aepar.kernels.nb.rowprod import _rows_times, w_panels

    rng = np.random.default_rng(seed)
    n = panels * 16 + tail if COPY_ROWS is not None else 512 * (1 + panels % 2)
    W = rng.standard_normal((k, n), np.float32)
    panel, keeps = w_panels(m, W, True)
    assert keeps
    for filled in (False, True):
        v = rng.standard_normal((m, k), np.float32)
        got = np.full((m, n), np.nan, np.float32)
        _rows_times(v, W, got, panel, False, filled)
        want = rows_times(v, W, np.empty((m, n), np.float32))
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_panels_kept_only_for_a_small_w(monkeypatch):
    """A W larger than KEEP_PANELS_BYTES gets the room of COPY_PANELS panels, which a
    second product copies again: none of its size stays with the thread."""
    from aepar.kernels.nb import rowprod
    W = np.zeros((20, 512), np.float32)
    panel, keeps = rowprod.w_panels(30, W, True)
    assert keeps and panel.size >= 512 * 20
    monkeypatch.setattr(rowprod, "KEEP_PANELS_BYTES", 1000)
    panel, keeps = rowprod.w_panels(30, W, True)
    assert not keeps and panel.size == COPY_PANELS * 20 * rowprod.CT * rowprod.LANES32


# Odd shapes on purpose: masked last vectors (n % 16 of 4, 8 and 11 columns: a tail in
# the first half only, exactly one half, and both halves), row counts that leave short tiles,
# W's rows 2 KiB apart (512 columns: the tiles copy its column panels first), and enough
# rows for the AVX2 path to copy every panel (COPY_ROWS) where the host's reads W in place, and
# rows of h shorter than a vector in h @ W.T (a softmax layer's 10 classes).
_ISA_SHAPES = ((13, 70, 37), (12, 75, 100), (7, 88, 72), (13, 130, 1000), (13, 40, 512), (30, 70, 100), (13, 30, 10))
_ISA_SCRIPT = """
import sys, numpy as np
import aepar
from aepar.kernels.nb.rowprod import block_outer_sum, block_outer_sum_sgd, rows_times, rows_times_t
from aepar.kernels.nb.simd import target_isa
from aepar.rows import tree_merges
out = {"isa": np.array(target_isa())}
for m, k, n in %r:
    rng = np.random.default_rng(m * k * n)
    v, W = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    h = rng.standard_normal((m, n), np.float32)
    out[f"vW{m}x{k}x{n}"] = rows_times(v, W, np.empty((m, n), np.float32))
    out[f"hWt{m}x{k}x{n}"] = rows_times_t(h, W, np.empty((m, k), np.float32))
    sizes = [m, m - 1, m, 2]
    starts = np.cumsum([0] + sizes)
    A, D = rng.standard_normal((starts[-1], k), np.float32), rng.standard_normal((starts[-1], n), np.float32)
    out[f"AtD{m}x{k}x{n}"] = block_outer_sum(A, D, starts, tree_merges(2, 0, 4), [0.5, -1.0, 1.0, 3.0],
                                             np.empty((k, n), np.float32))
    # the SGD step in the tiles (their epilogue differs between the paths)
    p, vel = rng.standard_normal((k, n), np.float32), rng.standard_normal((k, n), np.float32)
    block_outer_sum_sgd(A, D, starts, tree_merges(2, 0, 4), [0.5, -1.0, 1.0, 3.0], p, vel, 0.1, 0.9, 2e-4)
    out[f"sgd_p{m}x{k}x{n}"], out[f"sgd_v{m}x{k}x{n}"] = p, vel
# blocks longer than LONG_ROWS: taken in stretches (on the AVX2 path longer than the host's)
starts = np.cumsum([0, 300, 0, 140, 600])
A, D = rng.standard_normal((starts[-1], 70), np.float32), rng.standard_normal((starts[-1], 37), np.float32)
out["AtD_long"] = block_outer_sum(A, D, starts, tree_merges(2, 0, 4), [0.5, -1.0, 1.0, 3.0],
                                  np.empty((70, 37), np.float32))
D = rng.standard_normal((starts[-1], 512), np.float32)  # rows 2 KiB long: padded further on AVX2
out["AtD_long512"] = block_outer_sum(A, D, starts, tree_merges(2, 0, 4), [0.5, -1.0, 1.0, 3.0],
                                     np.empty((70, 512), np.float32))
np.savez(sys.argv[1], **out)
""" % (_ISA_SHAPES,)


def test_the_avx2_tiles_give_the_same_bits_as_the_hosts(tmp_path):
    """Every output's sums are in one fixed order whatever tiles the CPU's registers get
    (AVX-512: 6 x 4 vectors, AVX2: 6 x 1), so a run gives the same weights on either kind
    of CPU: the AVX2 build (AEPAR_ISA=avx2, in a child) against this one."""
    host, avx2 = host_and_avx2_runs(_ISA_SCRIPT, tmp_path)
    for name, want in host.items():
        np.testing.assert_array_equal(avx2[name].view(np.int32), want.view(np.int32), err_msg=name)


_NO_FMA_SCRIPT = """
import sys, numpy as np
import aepar
from numba import njit
from aepar.kernels.memory import zeros
from aepar.kernels.nb.nbmath import sigmoid32
from aepar.kernels.nb.rowprod import rows_times
from aepar.kernels.nb.simd import JIT, hardware_fma, vsigmoid_array

@njit(**{**JIT, "cache": False})  # compiled as the kernels are; a script has no file to cache for
def scalar(z, out):
    for i in range(z.size):
        out[i] = sigmoid32(z[i])

rng = np.random.default_rng(0)
z, vector, want = (zeros(4096, np.float32) for _ in range(3))
z[:] = rng.normal(0, 8, z.size)
vsigmoid_array(z, vector)
scalar(z, want)
v, W = rng.standard_normal((13, 70), np.float32), rng.standard_normal((70, 100), np.float32)
np.savez(sys.argv[1], fma=np.array(str(hardware_fma())), vector=vector, scalar=want, v=v, W=W,
         vW=rows_times(v, W, np.empty((13, 100), np.float32)))
"""


@pytest.mark.parametrize("target", [dict(NUMBA_CPU_NAME="sandybridge", NUMBA_CPU_FEATURES="-avx512f,-avx2,-fma"),
                                    dict(NUMBA_CPU_NAME="generic")], ids=["sandybridge", "generic"])
def test_without_fma_each_kernel_fma_is_a_multiply_then_an_add(target, tmp_path):
    """Numba compiling for an x86 CPU without FMA instructions (a Sandy Bridge, or the
    generic x86-64 of a cache shared by different machines, in a child) leaves its
    contracted loops as a multiply and an add, each rounded; the kernels' own FMAs are the
    same there (not an exact library call per lane, which gave other bits than those loops
    and ran far slower). So a row of v @ W is that chain over its products in order, and
    the 16-lane sigmoid keeps the scalar one's bits."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("a target without FMA is an x86-64 one")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "AEPAR_ISA")}
    env.update(**target, NUMBA_CACHE_DIR=str(tmp_path))  # a foreign target's kernels stay out of the checkout's cache
    done = subprocess.run([sys.executable, "-c", _NO_FMA_SCRIPT, str(tmp_path / "out.npz")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(tmp_path / "out.npz")
    assert str(got["fma"]) == "False"
    np.testing.assert_array_equal(got["vector"].view(np.int32), got["scalar"].view(np.int32))
    v, W = got["v"], got["W"]
    chain = np.zeros((v.shape[0], W.shape[1]), np.float32)
    for k in range(v.shape[1]):  # float32 throughout: the product rounded, then the sum
        chain = chain + v[:, k:k + 1] * W[k]
    np.testing.assert_array_equal(got["vW"].view(np.int32), chain.view(np.int32))


def _copied(monkeypatch, rows, n) -> list:
    """Whether ``rows_times`` copied W's column panels, for each row count in ``rows``
    (W 40 x n)."""
    from aepar.kernels.nb import rowprod

    panels = []
    real = rowprod._rows_times
    monkeypatch.setattr(rowprod, "_rows_times", lambda v, W, out, panel, *more: (panels.append(panel.size),
                                                                                 real(v, W, out, panel, *more)))
    rng = np.random.default_rng(n)
    W = rng.standard_normal((40, n), np.float32)
    for m in rows:
        rowprod.rows_times(rng.standard_normal((m, 40), np.float32), W, np.empty((m, n), np.float32))
    return [size > 0 for size in panels]


@pytest.mark.parametrize("n,copied", [(1024, True), (512, True), (1000, False)])
def test_aliased_rows_of_w_are_read_from_a_copy_on_every_path(n, copied, monkeypatch):
    """W's rows a multiple of 2 KiB apart are read from a contiguous copy of each column
    panel, on the host's tiles too (an Intel Xeon's AVX-512 tiles read 784 x 1024 in place
    at a quarter of the copied rate); one row tile reads the panel once and needs none."""
    from aepar.kernels.nb import rowprod

    assert _copied(monkeypatch, (rowprod.RT + 1, rowprod.RT), n) == [copied, False]


def test_stacked_blocks_are_read_from_a_copy_where_the_path_says(monkeypatch):
    """From COPY_ROWS rows on (the AVX2 path's stacked blocks) every column panel is
    copied first, whatever W's width; below it, or where the path names no such count,
    W is read in place."""
    from aepar.kernels.nb import rowprod

    if rowprod.COPY_ROWS is None:
        assert _copied(monkeypatch, (100,), 1000) == [False]
    else:
        assert _copied(monkeypatch, (rowprod.COPY_ROWS, rowprod.COPY_ROWS - 1), 1000) == [True, False]


@pytest.mark.parametrize("panels", [1, 2, 3])
@pytest.mark.parametrize("m,k,n", [(13, 40, 512), (100, 33, 64), (7, 20, 48), (30, 40, 1000), (25, 33, 37)])
def test_copied_column_panels_give_the_same_bits(m, k, n, panels):
    """Where the tiles read each column panel from a copy (W's rows aliasing in the
    caches, or many rows stacked), copied one or several panels at a time, the bits are
    those of W read in place, masked last columns included, on this CPU's tiles whatever
    it is."""
    from aepar.kernels.memory import empty
    from aepar.kernels.nb import rowprod

    rng = np.random.default_rng(m * k * n)
    v, W = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    want = np.empty((m, n), np.float32)
    rowprod._rows_times(v, W, want, empty(0, np.float32))
    got = np.full((m, n), np.nan, np.float32)
    rowprod._rows_times(v, W, got, empty(panels * k * rowprod.CT * rowprod.LANES32, np.float32))
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    np.testing.assert_allclose(got, v.astype(np.float64) @ W, rtol=1e-4, atol=1e-4)


def test_threads_at_once_each_get_their_own_bits():
    """aepar's threads run these kernels at the same time (bands of a weight, groups of
    blocks), each kernel copying panels into scratch kept between calls: every thread's
    results are those of the same calls made one after another."""
    from concurrent.futures import ThreadPoolExecutor

    from aepar.kernels.nb import rowprod
    from aepar.rows import tree_merges

    def work(seed):
        rng = np.random.default_rng(seed)
        A, D = rng.standard_normal((100, 300), np.float32), rng.standard_normal((100, 400), np.float32)
        W = rng.standard_normal((300, 400), np.float32)
        starts = [0, 13, 26, 39, 52, 64, 76, 88, 100]
        out = []
        for _ in range(5):
            out.append(rowprod.block_outer_sum(A, D, starts, tree_merges(3, 0, 8), [1.0] * 8,
                                               np.empty((300, 400), np.float32)))
            out.append(rowprod.rows_times(A, W, np.empty((100, 400), np.float32)))
            out.append(rowprod.rows_times_t(D, W, np.empty((100, 300), np.float32)))
        return out

    seeds = range(4)
    alone = [work(s) for s in seeds]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(work, seeds))
    for want, got in zip(alone, together):
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g.view(np.int32), w.view(np.int32))


def test_the_weight_step_asks_for_its_rows_in_l2_not_l1():
    """prefetch_l2 is x86's prefetcht1 (prefetch: prefetcht0), and block_outer_sum's tiles
    ask for out's lines and, where they step, the velocity's with it: into L1 they pushed
    out the tile's panel of D (docs/performance-notes.md, 0.8.4)."""
    from numba import njit
    from aepar.kernels.nb import rowprod
    from aepar.kernels.nb.simd import prefetch, prefetch_l2

    @njit
    def ask(a):
        prefetch(a, 0)
        prefetch_l2(a, 64)

    ask(np.zeros(128, np.float32))
    asm = next(iter(ask.inspect_asm().values()))
    assert "prefetcht0" in asm and "prefetcht1" in asm
    source = rowprod._outer_source(rowprod.OR, rowprod.OC)[1]
    asks = [line.strip() for line in source.splitlines() if "prefetch" in line]
    assert asks and all(line.startswith("prefetch_l2(") for line in asks)
    assert {line.split("(")[1].split(",")[0] for line in asks} == {"o", "vel"}
