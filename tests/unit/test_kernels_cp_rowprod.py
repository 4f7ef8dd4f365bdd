"""kernels/cp/rowprod.cu's arithmetic on the CPU: kernels/cp/rowprod.py on the emulated GPU
(tests/unit/cuda/emulated: the .cu compiled as C++, each launch's arguments read as the
kernels declare them). Without a GPU this is what can be shown: the same bits as the CPU's
row kernels (kernels/nb/rowprod.py, the same FMA chains in the same order), each row's
result the same whatever rows share the call, and the blocks' tree the same as the CPU's,
in either instance of the kernels' tiles (wide and thin: the same chains, other steps).
Whether it compiles for a GPU: nvcc, where it is installed."""
import importlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar.kernels.nb.rowprod import block_outer_sum, rows_times, rows_times_t
from aepar.rows import tree_merges, tree_top
from tests.conftest import HAVE_GPU, needs_cpu_fma

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "cp" / "rowprod.cu"


@pytest.fixture(scope="module")
def gpu(emulated_cupy):
    """(kernels/cp/rowprod.py imported against the emulated CuPy, that CuPy)."""
    return importlib.import_module("aepar.kernels.cp.rowprod"), emulated_cupy


TILES = ["", "_mid", "_thin"]  # kernels/cp/rowprod.py's TILES: the wide instance, the mid, the thin


def test_every_instance_of_the_tiles_is_tested(gpu):
    """The instances these tests take are those rowprod.cu has (TILES): a new one is tested."""
    assert list(gpu[0].TILES) == TILES


def gpu_rows_times(gpu, a, W, transposed=False, tiles=None):
    """a @ W (or a @ W.T) through kernels/cp/rowprod.py, into an output of NaNs: an element
    the launch's grid misses stays NaN."""
    K, cp = gpu
    out = cp.full((a.shape[0], W.shape[0] if transposed else W.shape[1]), np.nan, np.float32)
    return (K.rows_times_t if transposed else K.rows_times)(cp.asarray(a), cp.asarray(W), out, tiles).get()


def gpu_block_outer_sum(gpu, A, D, starts, merges, alphas, tiles=None):
    K, cp = gpu
    out = cp.full((A.shape[1], D.shape[1]), np.nan, np.float32)
    return K.block_outer_sum(cp.asarray(A), cp.asarray(D), starts, merges, alphas, out, tiles).get()


def draw(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@needs_cpu_fma
@pytest.mark.parametrize("tiles", TILES, ids=["wide", "mid", "thin"])
@pytest.mark.parametrize("M, K, N", [(13, 40, 70), (100, 33, 20), (1, 16, 64), (70, 5, 130), (17, 130, 33)])
def test_rows_times_has_the_cpu_kernels_bits(gpu, M, K, N, tiles):
    rng = np.random.default_rng(M * K + N)
    a, W = draw(rng, M, K), draw(rng, K, N)
    want = rows_times(a, W, np.empty((M, N), np.float32))
    assert np.array_equal(gpu_rows_times(gpu, a, W, tiles=tiles).view(np.uint32), want.view(np.uint32))
    Wt = np.ascontiguousarray(W.T)  # (N, K): a @ Wt.T is a @ W
    want_t = rows_times_t(a, Wt, np.empty((M, N), np.float32))
    got_t = gpu_rows_times(gpu, a, Wt, transposed=True, tiles=tiles)
    assert np.array_equal(got_t.view(np.uint32), want_t.view(np.uint32))


@needs_cpu_fma
@pytest.mark.parametrize("tiles", TILES, ids=["wide", "mid", "thin"])
def test_views_and_stacks_have_the_bits_of_their_copies(gpu, tiles, monkeypatch):
    """Either operand as a transposed view or a band of a wider array, and a stack of
    products in one launch (a convolution's images, each its own chains over its pixels):
    every product the bits of the CPU's row kernels on contiguous copies."""
    K, cp = gpu
    rng = np.random.default_rng(9)
    a, W = draw(rng, 40, 23), draw(rng, 40, 29)  # a.T (23 x 40) and a band of W (40 x 19)
    band = W[:, 4:23]
    want = rows_times(np.ascontiguousarray(a.T), np.ascontiguousarray(band), np.empty((23, 19), np.float32))
    got = K.rows_times(cp.asarray(a).T, cp.asarray(W)[:, 4:23], tiles=tiles).get()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the same shapes laid out otherwise: a launch's plan is kept per layout, not per shape
    again = K.rows_times(cp.asarray(np.ascontiguousarray(a.T)), cp.asarray(np.ascontiguousarray(band)), tiles=tiles)
    assert np.array_equal(again.get().view(np.uint32), want.view(np.uint32))
    h, w = draw(rng, 16, 5 * 31), draw(rng, 9, 5 * 31)  # 5 images of 31 pixels, side by side
    stack = K.rows_times_t(cp.asarray(h).reshape(16, 5, 31).transpose(1, 0, 2),
                           cp.asarray(w).reshape(9, 5, 31).transpose(1, 0, 2), tiles=tiles).get()
    assert stack.shape == (5, 16, 9)
    for z in range(5):
        one = rows_times_t(np.ascontiguousarray(h[:, 31 * z:31 * (z + 1)]),
                           np.ascontiguousarray(w[:, 31 * z:31 * (z + 1)]), np.empty((16, 9), np.float32))
        assert np.array_equal(stack[z].view(np.uint32), one.view(np.uint32))
    with pytest.raises(ValueError, match="do not chain"):
        K.rows_times_t(cp.asarray(h).reshape(16, 5, 31).transpose(1, 0, 2), cp.asarray(w))
    monkeypatch.setattr(K, "_MAX_GRID_Z", 2)  # a stack longer than a grid's z extent: launches of 2, 2 and 1
    again = K.rows_times_t(cp.asarray(h).reshape(16, 5, 31).transpose(1, 0, 2),
                           cp.asarray(w).reshape(9, 5, 31).transpose(1, 0, 2), tiles=tiles).get()
    assert np.array_equal(again.view(np.uint32), stack.view(np.uint32))
    with pytest.raises(TypeError, match="whole-float strides"):
        K.rows_times(cp.asarray(a)[:, ::-1], cp.asarray(W)[:23])


def test_the_tiles_are_wide_where_they_fill_most_multiprocessors(gpu, monkeypatch):
    """The emulated GPU has an H100's or H200's 132 multiprocessors: a batch of 100 rows
    through a 784x1000 layer makes 32 wide tiles (thin), the 784x1000 weight gradient 208
    (wide), 512 rows through it 128 and the 1000x500 gradient 128 (wide: two thirds of the
    multiprocessors, 88, are enough), 5000 rows through 250x30 79 (thin)."""
    K, _ = gpu
    assert K.tiles_for(100, 1000) == "_thin" and K.tiles_for(784, 1000) == "" and K.tiles_for(250, 30) == "_thin"
    assert K.tiles_for(1000, 1000) == "" and K.tiles_for(0, 30) == "_thin"
    assert K.tiles_for(512, 1000) == "" and K.tiles_for(1000, 500) == "" and K.tiles_for(5000, 30) == "_thin"
    assert K.tiles_for(64, 64, 87) == "_thin" and K.tiles_for(64, 64, 88) == ""  # the bound: 2/3 of 132
    assert K.tiles_for(16, 9, 80) == "_thin" and K.tiles_for(16, 9, 132) == ""  # a stack counts every product
    monkeypatch.setattr(K, "_multiprocessors", lambda: 32)
    assert K.tiles_for(100, 1000) == ""


def test_a_rows_result_does_not_depend_on_the_rows_beside_it(gpu):
    rng = np.random.default_rng(5)
    a, W = draw(rng, 100, 50), draw(rng, 50, 90)
    whole = gpu_rows_times(gpu, a, W)
    for lo, hi in ((0, 13), (13, 25), (87, 100), (40, 41)):
        part = gpu_rows_times(gpu, np.ascontiguousarray(a[lo:hi]), W)
        assert np.array_equal(part.view(np.uint32), whole[lo:hi].view(np.uint32))


@needs_cpu_fma
@pytest.mark.parametrize("tiles", TILES, ids=["wide", "mid", "thin"])
@pytest.mark.parametrize("sizes", [(25,) * 8, (7, 6, 12, 1, 14, 10), (40,), (3, 17), (70, 130)])
def test_block_outer_sum_has_the_cpu_kernels_bits(gpu, sizes, tiles):
    rng = np.random.default_rng(sum(sizes))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    A, D = draw(rng, starts[-1], 70), draw(rng, starts[-1], 30)
    count = len(sizes)
    merges = tree_merges(tree_top(count), 0, count)
    alphas = [0.01] * (count - 1) + [1.0]  # one block left unscaled, as alpha 1 skips the multiply
    want = block_outer_sum(A, D, starts, merges, alphas, np.empty((70, 30), np.float32))
    got = gpu_block_outer_sum(gpu, A, D, starts, merges, alphas, tiles)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    K, cp = gpu  # and the step with the sum: the sum's bits, then the step's
    p0, v0 = draw(rng, 70, 30), draw(rng, 70, 30)
    p, v = cp.asarray(p0), cp.asarray(v0)
    K.block_outer_sum_sgd(cp.asarray(A), cp.asarray(D), starts, merges, alphas, p, v, 0.1, 0.9, 2e-4, tiles)
    v_want = np.float32(0.9) * v0 - np.float32(0.1) * (want + np.float32(2e-4) * p0)
    assert np.array_equal(v.get().view(np.uint32), v_want.view(np.uint32))
    assert np.array_equal(p.get().view(np.uint32), (p0 + v_want).view(np.uint32))


@needs_cpu_fma
@pytest.mark.parametrize("tiles", TILES, ids=["wide", "mid", "thin"])
@pytest.mark.parametrize("sizes", [(25,) * 8, (7, 6, 12, 1, 14, 10), (3,)])
def test_a_tied_autoencoders_two_parts_have_the_bits_of_their_interleaving(gpu, sizes, tiles):
    """Parts go to the kernel as they are (no copy): each block's chain runs over its rows
    of the first part, then of the second, as over the interleaved arrays; and A's parts
    may be bands of wider arrays (strided rows), as the trainer's are."""
    from aepar.kernels.ref.blocksum import interleaved
    K, cp = gpu
    rng = np.random.default_rng(len(sizes))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    R, count = starts[-1], len(sizes)
    wide = draw(rng, R, 90)
    A = (draw(rng, R, 70), np.ascontiguousarray(wide[:, 10:80]))
    D = (draw(rng, R, 30), draw(rng, R, 30))
    merges = tree_merges(tree_top(count), 0, count)
    alphas = [0.01] * (count - 1) + [1.0]
    a, d, s = interleaved(A, D, starts)
    want = block_outer_sum(a, d, s, merges, alphas, np.empty((70, 30), np.float32))
    out = cp.full((70, 30), np.nan, np.float32)
    band = cp.asarray(wide)[:, 10:80]
    assert band.strides[0] == 90 * 4  # the kernel reads the band where it lies
    got = K.block_outer_sum((cp.asarray(A[0]), band), tuple(cp.asarray(p) for p in D), starts, merges,
                            alphas, out, tiles).get()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@needs_cpu_fma
def test_block_outer_sum_adds_in_the_tree_given(gpu):
    # the same blocks in two trees: other sums, each the CPU's
    rng = np.random.default_rng(9)
    starts = np.arange(0, 41, 10)
    A, D = draw(rng, 40, 20), draw(rng, 40, 20)
    outs = []
    for merges in ([0, 1, 0, 2], [0, 0, 0, 3]):
        want = block_outer_sum(A, D, starts, merges, [1.0] * 4, np.empty((20, 20), np.float32))
        got = gpu_block_outer_sum(gpu, A, D, starts, merges, [1.0] * 4)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        outs.append(got)
    assert not np.array_equal(outs[0], outs[1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_kernels_compile_for_a_gpu(tmp_path):
    done = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_80", "--fmad=false", "-c", str(SOURCE), "-o",
                           str(tmp_path / "rowprod.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_cpu_fma
@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")
@pytest.mark.parametrize("M, K, N", [(13, 784, 1000), (100, 1000, 500), (100, 250, 30)])
def test_on_a_gpu_the_kernels_give_the_cpu_kernels_bits(M, K, N):
    import cupy as cp

    from aepar.kernels.cp import rowprod as gpu

    rng = np.random.default_rng(M + K + N)
    a, W = draw(rng, M, K), draw(rng, K, N)

    def same(got, want):
        return np.array_equal(cp.asnumpy(got).view(np.uint32), want.view(np.uint32))

    assert same(gpu.rows_times(cp.asarray(a), cp.asarray(W)), rows_times(a, W, np.empty((M, N), np.float32)))
    Wt = np.ascontiguousarray(W.T)
    assert same(gpu.rows_times_t(cp.asarray(a), cp.asarray(Wt)), rows_times_t(a, Wt, np.empty((M, N), np.float32)))
    starts = np.linspace(0, M, 9).astype(np.int64)
    merges, alphas = tree_merges(tree_top(8), 0, 8), [0.01] * 8
    D = draw(rng, M, N)
    want = block_outer_sum(a, D, starts, merges, alphas, np.empty((K, N), np.float32))
    got = gpu.block_outer_sum(cp.asarray(a), cp.asarray(D), starts, merges, alphas, cp.empty((K, N), np.float32))
    assert same(got, want)
