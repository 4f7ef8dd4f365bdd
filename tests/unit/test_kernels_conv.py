"""conv family: conv2d, conv2d_transpose, maxpool2x2 on every kernel set.

Float64 central differences for the backward kernels, dot-product adjoint tests for the
linear maps (pylops ``dottest`` style), and agreement of numba/cupy with the NumPy oracle.
"""
import importlib

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from aepar.kernels.ref.conv import conv_geometry
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad

REF = kernels.load("numpy")
ALL_SETS = [pytest.param("numpy", id="numpy")] + kernel_set_params()
CPU_SETS = ["numpy", "numba"]
STRIDE_PAD = [(1, 0), (1, 1), (2, 0), (2, 1)]


def kit(name):
    """(kernel module, host->set array, set->host array) for kernel set ``name``."""
    K = kernels.load(name)
    if name == "cupy":
        import cupy
        return K, cupy.asarray, cupy.asnumpy
    return K, np.asarray, np.asarray


def randn(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# ---- gradient checks (float64 central differences) -------------------------------------

@pytest.mark.parametrize("stride,pad", STRIDE_PAD)
@pytest.mark.parametrize("name", CPU_SETS)
def test_gradcheck_conv2d(name, stride, pad, rng):
    K = kernels.load(name)
    x, W, b = randn(rng, 2, 2, 5, 6), randn(rng, 3, 2, 3, 2), randn(rng, 3)
    R = randn(rng, *K.conv2d_forward(x, W, b, stride, pad).shape)   # L = <y, R>
    loss = lambda: float(np.vdot(K.conv2d_forward(x, W, b, stride, pad), R))  # noqa: E731
    dW, db = np.zeros_like(W), np.zeros_like(b)
    dx = K.conv2d_backward(R, x, W, stride, pad, dW, db)
    assert_grad_close(dx, numerical_grad(loss, x), name="dx")
    assert_grad_close(dW, numerical_grad(loss, W), name="dW")
    assert_grad_close(db, numerical_grad(loss, b), name="db")


@pytest.mark.parametrize("stride,pad", STRIDE_PAD)
@pytest.mark.parametrize("name", CPU_SETS)
def test_gradcheck_conv2dtranspose(name, stride, pad, rng):
    K = kernels.load(name)
    x, W, b = randn(rng, 2, 3, 3, 4), randn(rng, 3, 2, 3, 3), randn(rng, 2)
    y = K.conv2d_transpose_forward(x, W, b, stride, pad)
    assert y.shape == (2, 2, 2 * stride + 3 - 2 * pad, 3 * stride + 3 - 2 * pad)
    R = randn(rng, *y.shape)
    loss = lambda: float(np.vdot(K.conv2d_transpose_forward(x, W, b, stride, pad), R))  # noqa: E731
    dW, db = np.zeros_like(W), np.zeros_like(b)
    dx = K.conv2d_transpose_backward(R, x, W, stride, pad, dW, db)
    assert_grad_close(dx, numerical_grad(loss, x), name="dx")
    assert_grad_close(dW, numerical_grad(loss, W), name="dW")
    assert_grad_close(db, numerical_grad(loss, b), name="db")


def untied(rng, shape):
    """Random values at least 0.01 apart: no ties, and no argmax flips under eps = 1e-6."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.01 + rng.uniform(0, 0.001, n)).reshape(shape) - n * 0.005


@pytest.mark.parametrize("shape", [(2, 3, 4, 6), (1, 2, 5, 7)])   # even and odd H, W
@pytest.mark.parametrize("name", CPU_SETS)
def test_gradcheck_maxpool2x2(name, shape, rng):
    K = kernels.load(name)
    x = untied(rng, shape)
    y, argmax = K.maxpool2x2_forward(x)
    assert y.shape == (shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    R = randn(rng, *y.shape)
    loss = lambda: float(np.vdot(K.maxpool2x2_forward(x)[0], R))  # noqa: E731
    dx = K.maxpool2x2_backward(R, argmax, x.shape)
    assert_grad_close(dx, numerical_grad(loss, x), name="dx")


def test_maxpool2x2_picks_window_maxima(rng):
    x = untied(rng, (2, 2, 5, 7))
    y, argmax = REF.maxpool2x2_forward(x)
    want = x[:, :, :4, :6].reshape(2, 2, 2, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(y, want)
    n, c, h, w = np.indices(y.shape)
    np.testing.assert_array_equal(x[n, c, 2 * h + argmax // 2, 2 * w + argmax % 2], y)


# ---- dot-product adjoint tests ---------------------------------------------------------

ADJOINT_CASES = [  # (x shape, W shape, stride, pad); (H + 2 pad - kh) % stride == 0
    ((2, 3, 7, 9), (4, 3, 3, 3), 1, 0),
    ((2, 3, 7, 9), (4, 3, 3, 3), 2, 1),
    ((1, 2, 8, 6), (3, 2, 2, 4), 2, 0),
    ((3, 1, 10, 7), (2, 1, 4, 1), 3, 0),
    ((2, 2, 9, 9), (2, 2, 5, 3), 2, 2),
]


def rel_gap(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


@pytest.mark.parametrize("xs,ws,stride,pad", ADJOINT_CASES)
@pytest.mark.parametrize("name", ALL_SETS)
def test_adjoint_conv2d(name, xs, ws, stride, pad, rng):
    """<A x, y> = <x, A^T y> for A = conv2d(., W) and for A = conv2d(x, .)."""
    K, dev, host = kit(name)
    x, W = randn(rng, *xs), randn(rng, *ws)
    zero = np.zeros(ws[0])
    Ax = host(K.conv2d_forward(dev(x), dev(W), dev(zero), stride, pad))
    y = randn(rng, *Ax.shape)
    dW, db = dev(np.zeros_like(W)), dev(zero)
    ATy = host(K.conv2d_backward(dev(y), dev(x), dev(W), stride, pad, dW, db))
    lhs = np.vdot(Ax, y)
    assert rel_gap(lhs, np.vdot(x, ATy)) < 1e-12
    assert rel_gap(lhs, np.vdot(W, host(dW))) < 1e-12


@pytest.mark.parametrize("xs,ws,stride,pad", ADJOINT_CASES)
@pytest.mark.parametrize("name", ALL_SETS)
def test_adjoint_conv2dtranspose_is_conv2d_adjoint(name, xs, ws, stride, pad, rng):
    """conv2d_transpose(., W) (W read as (Cin_t, Cout_t, kh, kw)) is conv2d(., W)^T."""
    K, dev, host = kit(name)
    x, W = randn(rng, *xs), randn(rng, *ws)
    Ax = host(K.conv2d_forward(dev(x), dev(W), dev(np.zeros(ws[0])), stride, pad))
    y = randn(rng, *Ax.shape)
    ATy = host(K.conv2d_transpose_forward(dev(y), dev(W), dev(np.zeros(ws[1])), stride, pad))
    assert ATy.shape == x.shape
    assert rel_gap(np.vdot(Ax, y), np.vdot(x, ATy)) < 1e-12


@pytest.mark.parametrize("xs,ws,stride,pad", ADJOINT_CASES)
@pytest.mark.parametrize("name", ALL_SETS)
def test_adjoint_conv2dtranspose_backward(name, xs, ws, stride, pad, rng):
    """<B u, z> = <u, B^T z> for B = conv2d_transpose(., W) and B = conv2d_transpose(u, .)."""
    K, dev, host = kit(name)
    W = randn(rng, *ws)
    u = randn(rng, xs[0], ws[0], 3, 4)
    zero = np.zeros(ws[1])
    Bu = host(K.conv2d_transpose_forward(dev(u), dev(W), dev(zero), stride, pad))
    z = randn(rng, *Bu.shape)
    dW, db = dev(np.zeros_like(W)), dev(zero)
    BTz = host(K.conv2d_transpose_backward(dev(z), dev(u), dev(W), stride, pad, dW, db))
    lhs = np.vdot(Bu, z)
    assert rel_gap(lhs, np.vdot(u, BTz)) < 1e-12
    assert rel_gap(lhs, np.vdot(W, host(dW))) < 1e-12


# ---- every kernel set equals the NumPy oracle ------------------------------------------

def random_conv_case(seed):
    """Random sizes (odd and even, non-square kernels, batch 1) with a valid output."""
    g = np.random.default_rng(seed)
    while True:
        N = 1 if seed % 3 == 0 else int(g.integers(2, 5))
        Cin, Cout = (int(c) for c in g.integers(1, 5, 2))
        kh, kw = (int(k) for k in g.integers(1, 5, 2))
        H, W = (int(s) for s in g.integers(1, 12, 2))
        stride, pad = int(g.integers(1, 4)), int(g.integers(0, 3))
        if (H + 2 * pad - kh) >= 0 and (W + 2 * pad - kw) >= 0 \
                and (H - 1) * stride - 2 * pad + kh >= 1 and (W - 1) * stride - 2 * pad + kw >= 1:
            return g, N, Cin, Cout, kh, kw, H, W, stride, pad


SEEDS = range(6)
DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_conv2d(name, dtype, seed):
    K, dev, host = kit(name)
    g, N, Cin, Cout, kh, kw, H, W, stride, pad = random_conv_case(seed)
    x, Wt, b = randn(g, N, Cin, H, W, dtype=dtype), randn(g, Cout, Cin, kh, kw, dtype=dtype), \
        randn(g, Cout, dtype=dtype)
    want = REF.conv2d_forward(x, Wt, b, stride, pad)
    got = K.conv2d_forward(dev(x), dev(Wt), dev(b), stride, pad)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want, dtype, work=Cin * kh * kw, name="y")
    dy = randn(g, *want.shape, dtype=dtype)
    rdW, rdb = np.zeros_like(Wt), np.zeros_like(b)
    rdx = REF.conv2d_backward(dy, x, Wt, stride, pad, rdW, rdb)
    dW, db = dev(np.ones_like(Wt)), dev(np.ones_like(b))   # backward must add, not assign
    dx = K.conv2d_backward(dev(dy), dev(x), dev(Wt), stride, pad, dW, db)
    assert dx.dtype == dtype
    P = N * want.shape[2] * want.shape[3]
    assert_close(dx, rdx, dtype, work=Cout * kh * kw, name="dx")
    assert_close(host(dW) - 1, rdW, dtype, work=P, name="dW")
    assert_close(host(db) - 1, rdb, dtype, work=P, name="db")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_conv2dtranspose(name, dtype, seed):
    K, dev, host = kit(name)
    g, N, Cin, Cout, kh, kw, H, W, stride, pad = random_conv_case(seed)
    x, Wt, b = randn(g, N, Cin, H, W, dtype=dtype), randn(g, Cin, Cout, kh, kw, dtype=dtype), \
        randn(g, Cout, dtype=dtype)
    want = REF.conv2d_transpose_forward(x, Wt, b, stride, pad)
    got = K.conv2d_transpose_forward(dev(x), dev(Wt), dev(b), stride, pad)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want, dtype, work=Cin * kh * kw, name="y")
    dy = randn(g, *want.shape, dtype=dtype)
    rdW, rdb = np.zeros_like(Wt), np.zeros_like(b)
    rdx = REF.conv2d_transpose_backward(dy, x, Wt, stride, pad, rdW, rdb)
    dW, db = dev(np.ones_like(Wt)), dev(np.ones_like(b))
    dx = K.conv2d_transpose_backward(dev(dy), dev(x), dev(Wt), stride, pad, dW, db)
    assert dx.dtype == dtype and dx.shape == x.shape
    assert_close(dx, rdx, dtype, work=Cout * kh * kw, name="dx")
    assert_close(host(dW) - 1, rdW, dtype, work=N * H * W, name="dW")
    assert_close(host(db) - 1, rdb, dtype, work=want.size // Cout, name="db")


@pytest.mark.parametrize("shape", [(1, 1, 2, 2), (3, 2, 7, 5), (2, 4, 8, 10), (1, 3, 9, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_maxpool2x2(name, dtype, shape, rng):
    K, dev, host = kit(name)
    x = np.round(2 * rng.standard_normal(shape)).astype(dtype)   # many ties: the first wins
    y, argmax = REF.maxpool2x2_forward(x)
    gy, gargmax = K.maxpool2x2_forward(dev(x))
    assert gy.dtype == dtype and gy.shape == y.shape
    np.testing.assert_array_equal(host(gy), y)
    np.testing.assert_array_equal(host(gargmax), argmax)
    dy = rng.standard_normal(y.shape).astype(dtype)
    gdx = K.maxpool2x2_backward(dev(dy), gargmax, shape)
    np.testing.assert_array_equal(host(gdx), REF.maxpool2x2_backward(dy, argmax, shape))


@pytest.mark.parametrize("transpose", [False, True], ids=["conv2d", "transpose"])
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_conv2d_chunked_strided_inputs(name, transpose, monkeypatch, rng):
    """Several chunks of images (the last one short) and non-contiguous inputs."""
    K, dev, host = kit(name)
    # chunks of 6+1 images (conv2d) and 2+2+2+1 (transpose)
    monkeypatch.setattr(importlib.import_module(K.__name__ + ".conv"), "_COLS_ELEMENTS", 750)
    x = randn(rng, 7, 6, 3, 5)[:, ::2, :, ::-1]             # (7, 3, 3, 5), strided
    W = randn(rng, 3, 4, 3, 2).transpose(1, 0, 2, 3)          # (4, 3, 3, 2), strided
    fwd, bwd = ((REF.conv2d_transpose_forward, REF.conv2d_transpose_backward) if transpose
                else (REF.conv2d_forward, REF.conv2d_backward))
    if transpose:
        W = W.transpose(1, 0, 2, 3)                           # (Cin, Cout) = (3, 4)
    b = randn(rng, W.shape[1] if transpose else W.shape[0])
    kf = K.conv2d_transpose_forward if transpose else K.conv2d_forward
    kb = K.conv2d_transpose_backward if transpose else K.conv2d_backward
    want = fwd(x, W, b, 2, 1)
    assert_close(kf(dev(x), dev(W), dev(b), 2, 1), want, np.float64, work=24, name="y")
    dy = randn(rng, *want.shape)
    rdW, rdb = np.zeros_like(W), np.zeros_like(b)
    rdx = bwd(dy, x, W, 2, 1, rdW, rdb)
    dW, db = dev(np.zeros(W.shape[::-1]).T), dev(np.zeros_like(b))    # a strided dW too
    assert_close(kb(dev(dy), dev(x), dev(W), 2, 1, dW, db), rdx, np.float64, work=24, name="dx")
    assert_close(dW, rdW, np.float64, work=200, name="dW")
    assert_close(db, rdb, np.float64, work=200, name="db")


# ---- stacked blocks of images: each block's own bits ------------------------------------

def conv_blocks_case(rng, sizes, transpose, dtype):
    """(starts, x, W, b, stride, pad, the four kernels' names) of a stacked-blocks case."""
    starts = np.cumsum([0] + sizes)
    x = randn(rng, int(starts[-1]), 3, 6, 6, dtype=dtype)
    W = randn(rng, 3, 4, 2, 2, dtype=dtype) if transpose else randn(rng, 4, 3, 3, 3, dtype=dtype)
    b = randn(rng, 4, dtype=dtype)
    stride, pad = (2, 0) if transpose else (1, 1)
    names = ("conv2d_transpose_forward", "conv2d_transpose_backward") if transpose else \
        ("conv2d_forward", "conv2d_backward")
    return starts, x, W, b, stride, pad, names


@pytest.mark.parametrize("sizes", [[3, 0, 5, 1], [4], [2, 7]], ids=["four", "one", "chunked"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True], ids=["conv2d", "transpose"])
@pytest.mark.parametrize("name", ALL_SETS)
def test_conv_blocks_give_each_blocks_own_bits(name, transpose, dtype, sizes, monkeypatch, rng):
    """The *_blocks kernels on stacked images: bit for bit each block's call alone (its
    rows of y and dx, its own dW and db), also where a block spans several chunks (the
    numba set's chunks then start at the block's first image, as alone) and for an empty
    block. The CAE trains its blocks so, one call per layer (aepar.models.cae). On the CPU
    a block alone is the plain kernel's call; on the GPU the *_blocks call of that block
    alone (small float32 blocks take the row kernels there, not cuBLAS), with the GPU's
    bound lowered so that the five images' block keeps cuBLAS among blocks that do not."""
    K, dev, host = kit(name)
    if name != "numpy":  # chunks of 2 images (conv2d) and 1 (transpose)
        conv = importlib.import_module(K.__name__ + ".conv")
        monkeypatch.setattr(conv, "_COLS_ELEMENTS", 500)
        if name == "cupy":
            monkeypatch.setattr(conv, "MAX_IMAGES", 4)
    starts, x, W, b, stride, pad, (fwd_name, bwd_name) = conv_blocks_case(rng, sizes, transpose, dtype)
    fwd_blocks, bwd_blocks = getattr(K, fwd_name + "_blocks"), getattr(K, bwd_name + "_blocks")
    if name == "cupy":
        def fwd(x, *rest):
            return fwd_blocks(x, *rest, [0, x.shape[0]])

        def bwd(dy, x, W, stride, pad, dW, db):
            return bwd_blocks(dy, x, W, stride, pad, [dW], [db], [0, x.shape[0]])
    else:
        fwd, bwd = getattr(K, fwd_name), getattr(K, bwd_name)
    bounds = list(zip(starts[:-1], starts[1:]))
    y = host(fwd_blocks(dev(x), dev(W), dev(b), stride, pad, starts))
    alone = [host(fwd(dev(x[lo:hi]), dev(W), dev(b), stride, pad)) for lo, hi in bounds]
    np.testing.assert_array_equal(y, np.concatenate(alone))
    dy = randn(rng, *y.shape, dtype=dtype)
    dWs, dbs = [dev(np.zeros_like(W)) for _ in sizes], [dev(np.zeros_like(b)) for _ in sizes]
    dx = host(bwd_blocks(dev(dy), dev(x), dev(W), stride, pad, dWs, dbs, starts))
    for k, (lo, hi) in enumerate(bounds):
        dW, db = dev(np.zeros_like(W)), dev(np.zeros_like(b))
        np.testing.assert_array_equal(dx[lo:hi], host(bwd(dev(dy[lo:hi]), dev(x[lo:hi]), dev(W), stride, pad, dW, db)))
        np.testing.assert_array_equal(host(dWs[k]), host(dW))
        np.testing.assert_array_equal(host(dbs[k]), host(db))


@pytest.mark.parametrize("transpose", [False, True], ids=["conv2d", "transpose"])
def test_numba_conv_products_never_span_two_blocks(transpose, monkeypatch, rng):
    """The numba set multiplies a chunk of images' columns side by side in one GEMM, and
    BLAS may sum an element otherwise at another size: so every chunk of every *_blocks
    kernel (forward and backward) lies inside one block, starting at its first image."""
    from aepar.kernels.nb import conv

    monkeypatch.setattr(conv, "_COLS_ELEMENTS", 2000)  # chunks of 2 images (conv2d) and 13 (transpose)
    seen, chunks = [], conv._block_chunks

    def spy(starts, chunk):
        for n0, nb in chunks(starts, chunk):
            seen.append((n0, nb))
            yield n0, nb
    monkeypatch.setattr(conv, "_block_chunks", spy)
    sizes = [3, 0, 5, 1]
    starts, x, W, b, stride, pad, (fwd, bwd) = conv_blocks_case(rng, sizes, transpose, np.float32)
    K = kernels.load("numba")
    y = getattr(K, fwd + "_blocks")(x, W, b, stride, pad, starts)
    getattr(K, bwd + "_blocks")(np.ones_like(y), x, W, stride, pad, [np.zeros_like(W) for _ in sizes],
                                [np.zeros_like(b) for _ in sizes], starts)
    assert len(seen) >= 2 * len([n for n in sizes if n])
    for n0, nb in seen:
        block = np.searchsorted(starts, n0, side="right") - 1
        assert starts[block] <= n0 and n0 + nb <= starts[block + 1], (n0, nb, starts)
    firsts = {n0 for n0, _ in seen}
    assert all(lo in firsts for lo, hi in zip(starts[:-1], starts[1:]) if hi > lo)


@pytest.mark.parametrize("sizes", [[3, 0, 5, 1], [2, 7]], ids=["four", "chunked"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ALL_SETS)
def test_conv_backward_without_dx_gives_the_same_gradients(name, dtype, sizes, monkeypatch, rng):
    """need_dx=False (a network's first layer, the CAE's): no input gradient (None), and
    each block's dW and db the bits of the call that makes dx, for the blocks' kernel and
    the plain one; on the GPU through the row kernels and, with its bound lowered below
    the five images' block, through cuBLAS too."""
    K, dev, host = kit(name)
    if name != "numpy":
        conv = importlib.import_module(K.__name__ + ".conv")
        monkeypatch.setattr(conv, "_COLS_ELEMENTS", 500)
        if name == "cupy":
            monkeypatch.setattr(conv, "MAX_IMAGES", 4)
    starts, x, W, b, stride, pad, _ = conv_blocks_case(rng, sizes, False, dtype)
    dy = randn(rng, x.shape[0], W.shape[0], *conv_geometry(x.shape, W.shape, stride, pad), dtype=dtype)

    def gradients(need_dx, blocks=True):
        dWs, dbs = [dev(np.zeros_like(W)) for _ in sizes], [dev(np.zeros_like(b)) for _ in sizes]
        if blocks:
            dx = K.conv2d_backward_blocks(dev(dy), dev(x), dev(W), stride, pad, dWs, dbs, starts, need_dx=need_dx)
        else:
            dx = K.conv2d_backward(dev(dy), dev(x), dev(W), stride, pad, dWs[0], dbs[0], need_dx=need_dx)
        return dx, [host(g) for g in dWs + dbs]

    for blocks in (True, False):
        with_dx, want = gradients(True, blocks)
        without, got = gradients(False, blocks)
        assert with_dx is not None and without is None
        for a, c in zip(got, want):
            np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("transpose", [False, True], ids=["conv2d", "transpose"])
@pytest.mark.parametrize("name", [p for p in kernel_set_params() if p.values[0] == "cupy"])
def test_gpu_conv_blocks_take_the_row_kernels(name, transpose, monkeypatch, rng):
    """Small float32 blocks on the GPU: no cuBLAS call (every block's products in one
    launch of the row kernels), values those of the reference block by block, gradients
    added into what they held, also into a strided dW, a float64 db and chunked images;
    float64 blocks keep cuBLAS."""
    K, dev, host = kit(name)
    conv = importlib.import_module(K.__name__ + ".conv")
    monkeypatch.setattr(conv, "_COLS_ELEMENTS", 500)
    starts, x, W, b, stride, pad, (fwd_name, bwd_name) = conv_blocks_case(rng, [3, 0, 5, 1], transpose, np.float32)
    calls = []
    real = conv.matmul
    monkeypatch.setattr(conv, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    y = host(getattr(K, fwd_name + "_blocks")(dev(x), dev(W), dev(b), stride, pad, starts))
    dy = randn(rng, *y.shape, dtype=np.float32)
    dWs = [dev(np.ones_like(W)), dev(np.ones(W.shape[::-1], np.float32)).T, dev(np.ones_like(W)), dev(np.ones_like(W))]
    dbs = [dev(np.ones_like(b)), dev(np.ones_like(b)), dev(np.ones(4)), dev(np.ones_like(b))]
    dx = host(getattr(K, bwd_name + "_blocks")(dev(dy), dev(x), dev(W), stride, pad, dWs, dbs, starts))
    assert not calls, "a small float32 block went through cuBLAS"
    for k, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        want = getattr(REF, fwd_name)(x[lo:hi], W, b, stride, pad)
        rdW, rdb = np.zeros_like(W), np.zeros_like(b)
        rdx = getattr(REF, bwd_name)(dy[lo:hi], x[lo:hi], W, stride, pad, rdW, rdb)
        assert_close(y[lo:hi], want, np.float32, work=27, name="y")
        assert_close(dx[lo:hi], rdx, np.float32, work=36, name="dx")
        assert_close(host(dWs[k]) - 1, rdW, np.float32, work=max(1, 36 * (hi - lo)), name="dW")
        assert_close(host(dbs[k]) - 1, rdb, np.float32, work=max(1, 36 * (hi - lo)), name="db")
    getattr(K, fwd_name + "_blocks")(dev(x.astype(np.float64)), dev(W.astype(np.float64)), dev(b), stride, pad, starts)
    assert calls, "float64 blocks should keep cuBLAS"


@pytest.mark.parametrize("name", [p for p in kernel_set_params() if p.values[0] == "cupy"])
def test_gpu_one_block_of_a_batch_of_100_takes_the_row_kernels(name, monkeypatch, rng):
    """A batch of 100 images as one block takes the launches its 8 blocks take (the row
    kernels), not cuBLAS; a block over conv.MAX_IMAGES keeps cuBLAS."""
    K, dev, host = kit(name)
    conv = importlib.import_module(K.__name__ + ".conv")
    calls = []
    real = conv.matmul
    monkeypatch.setattr(conv, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, W, b = (randn(rng, *shape, dtype=np.float32) for shape in ((100, 1, 4, 4), (2, 1, 3, 3), (2,)))
    K.conv2d_forward_blocks(dev(x), dev(W), dev(b), 1, 1, [0, 100])
    assert not calls, "one block of 100 images went through cuBLAS"
    big = randn(rng, conv.MAX_IMAGES + 1, 1, 4, 4, dtype=np.float32)
    K.conv2d_forward_blocks(dev(big), dev(W), dev(b), 1, 1, [0, len(big)])
    assert calls, "a block over the bound should keep cuBLAS"


@pytest.mark.parametrize("name", CPU_SETS)
def test_conv_blocks_refuse_offsets_and_gradients_that_do_not_fit(name):
    K = kernels.load(name)
    x, W, b = np.zeros((5, 2, 4, 4)), np.zeros((3, 2, 3, 3)), np.zeros(3)
    with pytest.raises(ValueError, match="offsets"):
        K.conv2d_forward_blocks(x, W, b, 1, 1, [0, 3])
    dy = np.zeros((5, 3, 4, 4))
    with pytest.raises(ValueError, match="1 weight gradients for 2 blocks"):
        K.conv2d_backward_blocks(dy, x, W, 1, 1, [np.zeros_like(W)], [np.zeros(3)] * 2, [0, 2, 5])
    with pytest.raises(ValueError, match="db"):
        K.conv2d_backward_blocks(dy, x, W, 1, 1, [np.zeros_like(W)], [np.zeros(2)], [0, 5])


# ---- bad shapes are refused with a message ---------------------------------------------

@pytest.mark.parametrize("name", CPU_SETS)
def test_conv_rejects_bad_shapes(name):
    K = kernels.load(name)
    x = np.zeros((1, 2, 5, 5))
    with pytest.raises(ValueError, match="channels"):
        K.conv2d_forward(x, np.zeros((3, 4, 3, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="larger than"):
        K.conv2d_forward(x, np.zeros((3, 2, 7, 7)), np.zeros(3))
    with pytest.raises(ValueError, match="bias"):
        K.conv2d_forward(x, np.zeros((3, 2, 3, 3)), np.zeros(2))
    with pytest.raises(ValueError, match="channels"):
        K.conv2d_transpose_forward(x, np.zeros((3, 4, 3, 3)), np.zeros(4))
    with pytest.raises(ValueError, match="4-D"):
        K.maxpool2x2_forward(np.zeros((2, 5, 5)))
