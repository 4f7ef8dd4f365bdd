"""Loss and regulariser kernels (loss, sparsity families): float64 gradient checks for
every set, the reference against textbook formulas, Numba/CuPy against the reference."""
import itertools
import math

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad, scalar_value, to_host

ALL_SETS = [pytest.param("numpy", id="numpy")] + kernel_set_params()
DTYPES = [np.float64, np.float32]
SHAPES = [(1, 7), (5, 13), (64, 65)]
REF = kernels.load("numpy")


def load(name):
    if name == "cupy":
        import cupy
        return kernels.load(name), cupy.asarray
    return kernels.load(name), np.asarray


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


# ---------------------------------------------------------------- gradient checks (float64)


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_loss_mse(kset, scale, rng):
    K, dev = load(kset)
    y, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    num = numerical_grad(lambda: K.mse_forward(dev(y), dev(t), scale), y)
    assert_grad_close(to_host(K.mse_backward(dev(y), dev(t), scale)), num, name="mse")


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_loss_softmax_xent(kset, scale, rng):
    K, dev = load(kset)
    z, labels = rng.standard_normal((4, 5)) * 2, np.array([0, 4, 2, 2])
    num = numerical_grad(lambda: K.softmax_xent_forward(dev(z), dev(labels), scale)[0], z)
    _, probs = K.softmax_xent_forward(dev(z), dev(labels), scale)
    assert_grad_close(to_host(K.softmax_xent_backward(probs, dev(labels), scale)), num, name="softmax")


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_loss_sigmoid_xent(kset, scale, rng):
    K, dev = load(kset)
    z, t = rng.standard_normal((3, 4)) * 3, rng.uniform(0, 1, (3, 4))
    num = numerical_grad(lambda: K.sigmoid_xent_forward(dev(z), dev(t), scale)[0], z)
    _, y = K.sigmoid_xent_forward(dev(z), dev(t), scale)
    assert_grad_close(to_host(K.sigmoid_xent_backward(y, dev(t), scale)), num, name="sigmoid_xent")


@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_sparsity_kl(kset, rng):
    K, dev = load(kset)
    rho_hat = rng.uniform(0.05, 0.95, 6)
    num = numerical_grad(lambda: K.kl_sparsity_forward(dev(rho_hat), 0.1, 3.0), rho_hat)
    assert_grad_close(to_host(K.kl_sparsity_backward(dev(rho_hat), 0.1, 3.0)), num, name="kl")


@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_sparsity_weight_decay(kset, rng):
    K, dev = load(kset)
    W = rng.standard_normal((4, 3))
    num = numerical_grad(lambda: K.weight_decay_forward(dev(W), 1e-2), W)
    start = rng.standard_normal(W.shape)
    dW = dev(start.copy())
    assert K.weight_decay_backward(dev(W), 1e-2, dW) is None
    assert_grad_close(to_host(dW) - start, num, name="weight decay (added onto dW)")


# ---------------------------------------------------------------- the reference, by formula


def test_reference_losses_match_textbook_formulas(rng):
    """The reference against the plain (unstable, but fine here) formulas."""
    y, t = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    assert np.isclose(REF.mse_forward(y, t), 0.5 * np.sum((y - t) ** 2) / 6, rtol=1e-13)
    assert np.isclose(REF.mse_forward(y, t, scale=2.0), np.sum((y - t) ** 2), rtol=1e-13)

    z, labels = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    loss, probs = REF.softmax_xent_forward(z, labels)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probs, p, rtol=1e-13)
    assert np.isclose(loss, -np.mean(np.log(p[np.arange(6), labels])), rtol=1e-13)

    tt = rng.uniform(0, 1, z.shape)
    loss, yy = REF.sigmoid_xent_forward(z, tt, scale=1.0)
    np.testing.assert_allclose(yy, sigmoid(z), rtol=1e-14)
    assert np.isclose(loss, -np.sum(tt * np.log(sigmoid(z)) + (1 - tt) * np.log(1 - sigmoid(z))), rtol=1e-12)

    rho_hat, rho = rng.uniform(0.01, 0.99, 7), 0.05
    kl = rho * np.log(rho / rho_hat) + (1 - rho) * np.log((1 - rho) / (1 - rho_hat))
    assert np.isclose(REF.kl_sparsity_forward(rho_hat, rho, 3.0), 3.0 * kl.sum(), rtol=1e-13)
    assert np.isclose(REF.weight_decay_forward(z, 0.2), 0.1 * np.sum(z * z), rtol=1e-13)


@pytest.mark.parametrize("kset", ALL_SETS)
def test_losses_stable_at_extreme_logits(kset):
    K, dev = load(kset)
    for dtype in DTYPES:
        z = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]], dtype=dtype)
        loss, probs = K.softmax_xent_forward(dev(z), dev(np.array([1, 2])), scale=1.0)
        probs = to_host(probs)
        assert np.all(np.isfinite(probs)) and probs.dtype == dtype
        # -log p: row 0 label 1 is 1000 below the max; row 1 is uniform
        assert np.isclose(scalar_value(loss), 1000.0 + np.log(3.0), rtol=1e-6)
        z = np.array([100.0, -100.0, 100.0, -100.0], dtype=dtype)
        t = np.array([0.0, 1.0, 1.0, 0.0], dtype=dtype)
        loss, y = K.sigmoid_xent_forward(dev(z), dev(t), scale=1.0)
        assert np.isclose(scalar_value(loss), 200.0, rtol=1e-6)  # two confident misses of 100 nats each
        assert np.all(np.isfinite(to_host(y)))


def test_numba_sigmoid_xent_rounds_as_libm_over_the_float32_range(rng):
    """The Numba pass builds exp and log1p from polynomials (kernels/nb/nbmath.py) so that it
    vectorises: y within one float32 ulp of the libm formula, log1p within 1e-15, NaN kept."""
    from aepar.kernels.nb.nbmath import log1p_unit
    from numba import njit
    K = kernels.load("numba")
    z = np.concatenate([np.linspace(-800, 800, 200_001), rng.standard_normal(200_000) * 20]).astype(np.float32)
    t = rng.uniform(0, 1, z.size).astype(np.float32)
    loss, y = K.sigmoid_xent_forward(z, t, scale=1.0)
    v = z.astype(np.float64)
    e = np.exp(-np.abs(v))
    y_libm = np.where(v >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)
    assert np.all(np.abs(y - y_libm) <= np.spacing(y_libm))
    assert np.isclose(loss, math.fsum(np.maximum(v, 0) - v * t + np.log1p(e)), rtol=1e-12)  # 4e5 terms in order

    z[[3, 200_500]] = np.nan
    loss, y = K.sigmoid_xent_forward(z, t, scale=1.0)
    assert np.isnan(loss) and np.isnan(y[[3, 200_500]]).all() and np.isfinite(np.delete(y, [3, 200_500])).all()

    # e >= exp(-708) in the kernel: a normal number, where u = e / (2 + e) keeps its bits
    e = np.concatenate([[0.0, 1.0], np.exp(-np.linspace(0, 708, 100_001)), rng.uniform(0, 1, 100_000)])
    got = njit(lambda e: [log1p_unit(x) for x in e])(e)
    assert np.all(np.abs(np.array(got) - np.log1p(e)) <= 1e-15 * np.log1p(e))


@pytest.mark.parametrize("kset", ALL_SETS)
def test_scalar_results_are_floats_or_left_on_the_gpu(kset, rng):
    """Losses are floats on the CPU sets and 0-d float64 arrays on the GPU (a step must not
    wait for the device); the sparsity family's are floats everywhere (L-BFGS reads them)."""
    K, dev = load(kset)
    y, t = rng.standard_normal((3, 2)).astype(np.float32), rng.uniform(0, 1, (3, 2)).astype(np.float32)
    losses = [K.mse_forward(dev(y), dev(t)), K.softmax_xent_forward(dev(y), dev(np.array([0, 1, 1])))[0],
              K.sigmoid_xent_forward(dev(y), dev(t))[0]]
    on_gpu = kset == "cupy"
    assert all((type(v) is not float) == on_gpu for v in losses)
    assert all(type(scalar_value(v)) is float for v in losses)
    assert all(type(v) is float for v in [K.kl_sparsity_forward(dev(t[0] * 0.5 + 0.25), 0.1, 3.0),
                                           K.weight_decay_forward(dev(y), 0.1)])


@pytest.mark.parametrize("kset", ["numpy", "numba"])
def test_loss_rejects_bad_arguments(kset, rng):
    K = kernels.load(kset)
    z = rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match="labels"):
        K.softmax_xent_forward(z, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match="labels"):
        K.softmax_xent_backward(z, np.array([0, -1, 1]))
    with pytest.raises(ValueError, match="labels"):
        K.softmax_xent_forward(z, np.array([0, 1]))
    with pytest.raises(ValueError, match="shape"):
        K.mse_forward(z, z[:2])
    with pytest.raises(ValueError, match="shape"):
        K.sigmoid_xent_backward(z, z.T)


# ---------------------------------------------------------------- agreement with the reference


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_loss(kset, shape, dtype, rng):
    K, dev = load(kset)
    n = int(np.prod(shape))
    y = (rng.standard_normal(shape) * 3).astype(dtype)
    t = rng.uniform(0, 1, shape).astype(dtype)
    labels = rng.integers(0, shape[1], shape[0])

    for scale in (None, 0.25):
        assert np.isclose(scalar_value(K.mse_forward(dev(y), dev(t), scale)), REF.mse_forward(y, t, scale),
                          rtol=1e-12 * np.sqrt(n)), "mse (both sum in float64)"
        assert_close(K.mse_backward(dev(y), dev(t), scale), REF.mse_backward(y, t, scale), dtype,
                     name="mse_backward")

        loss, probs = K.softmax_xent_forward(dev(y), dev(labels), scale)
        loss_ref, probs_ref = REF.softmax_xent_forward(y, labels, scale)
        assert probs.dtype == dtype
        assert_close(probs, probs_ref, dtype, work=shape[1], name="probs")
        assert_close(loss, loss_ref, dtype, work=n, name="softmax loss")
        assert_close(K.softmax_xent_backward(dev(probs_ref), dev(labels), scale),
                     REF.softmax_xent_backward(probs_ref, labels, scale), dtype, name="softmax_backward")

        loss, yy = K.sigmoid_xent_forward(dev(y), dev(t), scale)
        loss_ref, yy_ref = REF.sigmoid_xent_forward(y, t, scale)
        assert yy.dtype == dtype
        assert_close(yy, yy_ref, dtype, name="sigmoid_xent y")
        assert np.isclose(scalar_value(loss), loss_ref, rtol=1e-12 * np.sqrt(n)), "sigmoid_xent (both in float64)"
        assert_close(K.sigmoid_xent_backward(dev(yy_ref), dev(t), scale),
                     REF.sigmoid_xent_backward(yy_ref, t, scale), dtype, name="sigmoid_xent_backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("size", [1, 25, 1000])
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_sparsity(kset, size, dtype, rng):
    K, dev = load(kset)
    rho_hat = rng.uniform(0.001, 0.999, size).astype(dtype)
    assert_close(K.kl_sparsity_forward(dev(rho_hat), 0.01, 3.0), REF.kl_sparsity_forward(rho_hat, 0.01, 3.0),
                 np.float64, work=size, name="kl")
    g = K.kl_sparsity_backward(dev(rho_hat), 0.01, 3.0)
    assert g.dtype == dtype
    assert_close(g, REF.kl_sparsity_backward(rho_hat, 0.01, 3.0), dtype, name="kl backward")

    W = rng.standard_normal((size, 7)).astype(dtype)
    assert_close(K.weight_decay_forward(dev(W), 1e-4), REF.weight_decay_forward(W, 1e-4),
                 np.float64, work=W.size, name="weight decay")
    start = rng.standard_normal(W.shape).astype(dtype)
    dW, dW_ref = dev(start.copy()), start.copy()
    K.weight_decay_backward(dev(W), 1e-4, dW)
    REF.weight_decay_backward(W, 1e-4, dW_ref)
    assert dW.dtype == dtype
    assert_close(dW, dW_ref, dtype, name="weight decay backward")
    # a transposed (non-contiguous) dW is still updated where it lies
    dWt = dev(start.T.copy()).T
    K.weight_decay_backward(dev(W), 1e-4, dWt)
    assert_close(dWt, dW_ref, dtype, name="weight decay backward, transposed dW")


@pytest.mark.parametrize("rows", [1, 3, 5000])
@pytest.mark.parametrize("kset", [p for p in kernel_set_params() if p.id == "cupy"])
def test_cupy_totals_are_the_rows_reductions(kset, rows, rng):
    """The CuPy set's scalar losses (compiled two-stage totals for one float type in C
    order) against its rows-then-total ReductionKernels (what mixed types take): the same
    sums in double, to rounding; the same bits on every call; 5000 x 784 takes every block
    of the grid through several strides."""
    import cupy as cp

    from aepar.kernels.cp import loss

    y = cp.asarray(rng.standard_normal((rows, 784)).astype(np.float32))
    t = cp.asarray(rng.random((rows, 784)).astype(np.float32))
    for name in ("sq_diff", "sigmoid_xent"):
        fast = loss._scaled_total(name, y, t, 0.5)
        assert fast.shape == () and fast.dtype == np.float64
        by_rows = loss._scaled_total(name, y, t.astype(np.float64), 0.5)  # mixed: the ReductionKernels
        assert float(fast) == pytest.approx(float(by_rows), rel=1e-12), name
        assert float(loss._scaled_total(name, y, t, 0.5)) == float(fast), name
    # a transposed (non-contiguous) pair takes the ReductionKernels too
    assert float(loss._scaled_total("sq_diff", y.T, t.T, 1.0)) == \
        pytest.approx(float(loss._scaled_total("sq_diff", y, t, 1.0)), rel=1e-12)


# ---------------------------------------------------------------- per-block losses

# the rows' shapes and their blocks' offsets: a layer's 8 blocks, empty blocks, one block,
# and blocks whose sums run in chunks and tails
BLOCK_LAYOUTS = pytest.mark.parametrize(
    "shape,starts", [((100, 784), [0, 13, 25, 38, 50, 63, 75, 88, 100]), ((9, 1, 4, 4), [0, 0, 2, 2, 3, 9]),
                     ((5, 3), [0, 5]), ((2100, 3), [0, 1000, 2000, 2001, 2002, 2003, 2100])],
    ids=["ae-layer", "cae-empty-blocks", "one-block", "chunks-and-tails"])


@pytest.mark.parametrize("kset", ALL_SETS)
@BLOCK_LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_blocks_squared_errors_are_a_call_per_block(kset, shape, starts, dtype, rng):
    """mse_forward_blocks gives, bit for bit, what the same set's mse_forward gives on each
    block alone (the Numba set adds four blocks' sums side by side, in chunks, with a tail
    per block; each block's sum must stay its own chain in index order)."""
    K, dev = load(kset)
    y, t = rng.random(shape).astype(dtype), rng.random(shape).astype(dtype)
    for scale in (2.0, None) if starts[1] > 0 else (2.0,):
        got = K.mse_forward_blocks(dev(y), dev(t), starts, scale)
        want = [K.mse_forward(dev(y[lo:hi]), dev(t[lo:hi]), scale) for lo, hi in zip(starts[:-1], starts[1:])]
        assert [float(scalar_value(a)).hex() for a in got] == [float(scalar_value(b)).hex() for b in want]


@pytest.mark.parametrize("kset", ALL_SETS)
@BLOCK_LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_blocks_cross_entropies_are_a_call_per_block(kset, shape, starts, dtype, rng):
    """sigmoid_xent_forward_blocks gives, bit for bit, each block's loss as the same set's
    sigmoid_xent_forward gives it on the block alone, and y of every row as those calls'
    y stacked (the fine-tuning stack's head on all its blocks at once)."""
    K, dev = load(kset)
    z = (4 * rng.standard_normal(shape)).astype(dtype)
    for t, scale in itertools.product((rng.random(shape).astype(dtype), rng.random(shape)),  # (other types:
                                      (0.01, None) if starts[1] > 0 else (0.01,)):  # the GPU's call a block)
        losses, y = K.sigmoid_xent_forward_blocks(dev(z), dev(t), starts, scale)
        alone = [K.sigmoid_xent_forward(dev(z[lo:hi]), dev(t[lo:hi]), scale) for lo, hi in zip(starts[:-1], starts[1:])]
        assert [float(scalar_value(a)).hex() for a in losses] == [float(scalar_value(b)).hex() for b, _ in alone]
        want_y = np.concatenate([np.asarray(to_host(b)) for _, b in alone])
        assert np.asarray(to_host(y)).tobytes() == want_y.tobytes()


@pytest.mark.parametrize("kset", ALL_SETS)
@pytest.mark.parametrize("rows,classes,starts", [(100, 10, [0, 13, 25, 38, 50, 63, 75, 88, 100]),
                                                 (9, 3, [0, 0, 2, 2, 3, 9]), (5, 7, [0, 5]),
                                                 (2100, 4, [0, 1000, 2000, 2001, 2002, 2003, 2100])],
                         ids=["classifier-blocks", "empty-blocks", "one-block", "chunks-and-tails"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_blocks_softmax_losses_are_a_call_per_block(kset, rows, classes, starts, dtype, rng):
    """softmax_xent_forward_blocks gives, bit for bit, each block's loss as the same set's
    softmax_xent_forward gives it on the block alone, and probs of every row as those
    calls' probs stacked: a row's probabilities do not depend on the rows beside it (the
    classifier's head on all its blocks at once)."""
    K, dev = load(kset)
    z = (3 * rng.standard_normal((rows, classes))).astype(dtype)
    z[0, :2] = z[0, 2] if classes > 2 else z[0, 0]  # a tie
    labels = rng.integers(0, classes, rows)
    for scale in (0.01, None) if starts[1] > 0 else (0.01,):
        losses, probs = K.softmax_xent_forward_blocks(dev(z), dev(labels), starts, scale)
        alone = [K.softmax_xent_forward(dev(z[lo:hi]), dev(labels[lo:hi]), scale)
                 for lo, hi in zip(starts[:-1], starts[1:])]
        assert [float(scalar_value(a)).hex() for a in losses] == [float(scalar_value(b)).hex() for b, _ in alone]
        want = np.concatenate([np.asarray(to_host(b)) for _, b in alone])
        assert np.asarray(to_host(probs)).tobytes() == want.tobytes()


@pytest.mark.parametrize("kset", kernel_set_params()[1:])
def test_gpu_softmax_loss_of_a_label_out_of_range_is_nan(kset):
    """The GPU set does not check the labels' values (a check would wait for the device):
    a label out of range makes its block's loss NaN, and reads nothing past its row."""
    K, dev = load(kset)
    z = np.zeros((4, 3), np.float32)
    losses, probs = K.softmax_xent_forward_blocks(dev(z), dev(np.array([0, 3, 1, -1])), [0, 1, 2, 4], 1.0)
    assert [math.isnan(float(scalar_value(v))) for v in losses] == [False, True, True]
    assert np.allclose(to_host(probs), 1 / 3)


@pytest.mark.parametrize("kset", ["numpy", "numba"])
def test_blocks_squared_errors_refuse_offsets_that_do_not_split_the_rows(kset):
    K = kernels.load(kset)
    y = np.zeros((4, 3))
    with pytest.raises(ValueError, match="do not split"):
        K.mse_forward_blocks(y, y, [0, 3])
    with pytest.raises(ValueError, match="do not split"):
        K.mse_forward_blocks(y, y, [0, 3, 2, 4])
    with pytest.raises(ValueError, match="shape"):
        K.mse_forward_blocks(y, y[:2], [0, 2])
    with pytest.raises(ValueError, match="do not split"):
        K.sigmoid_xent_forward_blocks(y, y, [0, 3])
    with pytest.raises(ValueError, match="do not split"):
        K.softmax_xent_forward_blocks(y, np.zeros(4, np.int64), [0, 3])
    with pytest.raises(ValueError, match="shape"):
        K.sigmoid_xent_forward_blocks(y, y[:2], [0, 2])
