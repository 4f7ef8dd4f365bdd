"""Dense layer and activation kernels: float64 gradient checks for every set, agreement
of the Numba/CuPy sets with the NumPy reference in float64 and float32, accumulation."""
import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from aepar.kernels.nb.rowprod import MAX_ROWS as CPU_MAX_ROWS
from tests.conftest import gpu_rows, kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad, scalar_value, to_host

ALL_SETS = [pytest.param("numpy", id="numpy")] + kernel_set_params()
ACTS = ["sigmoid", "relu", "identity"]
# (batch, in, out): batch 1, odd sizes, one size past a SIMD/blocking boundary
SHAPES = [(1, 7, 3), (5, 13, 17), (64, 65, 31)]
DTYPES = [np.float64, np.float32]
REF = kernels.load("numpy")


def load(name):
    """The kernel set and a host -> its-device array converter."""
    if name == "cupy":
        import cupy
        return kernels.load(name), cupy.asarray
    return kernels.load(name), np.asarray


def dense_problem(rng, batch, n_in, n_out, dtype=np.float64):
    x = rng.standard_normal((batch, n_in)).astype(dtype)
    W = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    return x, W, b


# ---------------------------------------------------------------- gradient checks


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_dense(kset, act, rng):
    K, dev = load(kset)
    x, W, b = dense_problem(rng, 4, 5, 3)
    R = rng.standard_normal((4, 3))  # L = sum(a * R), so dL/da = R

    def loss():
        return float(to_host(K.dense_forward(dev(x), dev(W), dev(b), act)).ravel() @ R.ravel())

    a = K.dense_forward(dev(x), dev(W), dev(b), act)
    dW, db = dev(np.zeros_like(W)), dev(np.zeros_like(b))
    dx = K.dense_backward(dev(R), dev(x), dev(W), a, act, dW, db)
    assert_grad_close(to_host(dx), numerical_grad(loss, x), name=f"{kset} {act} dx")
    assert_grad_close(to_host(dW), numerical_grad(loss, W), name=f"{kset} {act} dW")
    assert_grad_close(to_host(db), numerical_grad(loss, b), name=f"{kset} {act} db")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kset", ALL_SETS)
def test_gradcheck_activation(kset, act, rng):
    K, dev = load(kset)
    forward, backward = getattr(K, f"{act}_forward"), getattr(K, f"{act}_backward")
    z = rng.standard_normal((3, 4)) * 3
    R = rng.standard_normal(z.shape)

    def loss():
        return float(np.sum(to_host(forward(dev(z))) * R))

    dz = backward(dev(R), forward(dev(z)))
    assert_grad_close(to_host(dz), numerical_grad(loss, z), name=f"{kset} {act}")


# ---------------------------------------------------------------- agreement with the reference


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_dense(kset, act, shape, dtype, rng):
    K, dev = load(kset)
    batch, n_in, n_out = shape
    x, W, b = dense_problem(rng, batch, n_in, n_out, dtype)
    da = rng.standard_normal((batch, n_out)).astype(dtype)

    a_ref = REF.dense_forward(x, W, b, act)
    a = K.dense_forward(dev(x), dev(W), dev(b), act)
    assert a.dtype == dtype and a.shape == (batch, n_out)
    assert_close(a, a_ref, dtype, work=n_in, name="a")

    # both sets differentiate the same output a
    dW_ref, db_ref = np.zeros_like(W), np.zeros_like(b)
    dx_ref = REF.dense_backward(da, x, W, a_ref, act, dW_ref, db_ref)
    dW, db = dev(np.zeros_like(W)), dev(np.zeros_like(b))
    dx = K.dense_backward(dev(da), dev(x), dev(W), dev(a_ref), act, dW, db)
    assert dx.dtype == dW.dtype == db.dtype == dtype
    assert_close(dx, dx_ref, dtype, work=n_out, name="dx")
    assert_close(dW, dW_ref, dtype, work=batch, name="dW")
    assert_close(db, db_ref, dtype, work=batch, name="db")


@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_dense_strided_inputs(kset, rng):
    """Views (column slices, a transposed W) give the same result as contiguous copies."""
    K, dev = load(kset)
    xf = rng.standard_normal((6, 22))
    Wt = rng.standard_normal((9, 11))
    x, W, b = xf[:, ::2], Wt.T, rng.standard_normal(9)
    da = rng.standard_normal((6, 9 * 2))[:, ::2]
    for act in ACTS:
        a_ref = REF.dense_forward(np.ascontiguousarray(x), np.ascontiguousarray(W), b, act)
        assert_close(K.dense_forward(dev(x), dev(W), dev(b), act), a_ref, np.float64, work=11)
        dW_ref, db_ref = np.zeros((11, 9)), np.zeros(9)
        dx_ref = REF.dense_backward(np.ascontiguousarray(da), np.ascontiguousarray(x),
                                    np.ascontiguousarray(W), a_ref, act, dW_ref, db_ref)
        dW, db = dev(np.zeros((11, 9))), dev(np.zeros(9))
        dx = K.dense_backward(dev(da), dev(x), dev(W), dev(a_ref), act, dW, db)
        assert_close(dx, dx_ref, np.float64, work=9, name=f"{act} dx")
        assert_close(dW, dW_ref, np.float64, work=6, name=f"{act} dW")
        assert_close(db, db_ref, np.float64, work=6, name=f"{act} db")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("shape", [(1,), (7, 3), (5, 13, 17), (64, 65)], ids=str)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_activation(kset, act, shape, dtype, rng):
    K, dev = load(kset)
    z = (rng.standard_normal(shape) * 4).astype(dtype)
    da = rng.standard_normal(shape).astype(dtype)
    forward, backward = getattr(K, f"{act}_forward"), getattr(K, f"{act}_backward")
    a_ref = getattr(REF, f"{act}_forward")(z)
    a = forward(dev(z))
    assert a.dtype == dtype and a.shape == shape
    assert_close(a, a_ref, dtype, name="forward")
    dz = backward(dev(da), dev(a_ref))
    assert dz.dtype == dtype
    assert_close(dz, getattr(REF, f"{act}_backward")(da, a_ref), dtype, name="backward")


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("kset", ALL_SETS)
def test_dense_backward_accumulates(kset, rng):
    """Backward adds into dW/db: twice from zero doubles them, and a non-zero start is kept."""
    K, dev = load(kset)
    x, W, b = dense_problem(rng, 5, 6, 4)
    da = rng.standard_normal((5, 4))
    for act in ACTS:
        a = K.dense_forward(dev(x), dev(W), dev(b), act)
        dW1, db1 = dev(np.zeros_like(W)), dev(np.zeros_like(b))
        dx1 = K.dense_backward(dev(da), dev(x), dev(W), a, act, dW1, db1)
        dW2, db2 = dev(np.zeros_like(W)), dev(np.zeros_like(b))
        K.dense_backward(dev(da), dev(x), dev(W), a, act, dW2, db2)
        dx2 = K.dense_backward(dev(da), dev(x), dev(W), a, act, dW2, db2)
        assert np.any(to_host(dW1) != 0) and np.any(to_host(db1) != 0)
        assert_close(dW2, 2 * to_host(dW1), np.float64, name=f"{act} dW twice")
        assert_close(db2, 2 * to_host(db1), np.float64, name=f"{act} db twice")
        assert_close(dx2, dx1, np.float64, name=f"{act} dx does not accumulate")
        # a Fortran-ordered dW with something already in it
        start = rng.standard_normal(W.shape)
        dW3 = dev(np.asfortranarray(start))
        db3 = dev(np.ones_like(b))
        assert K.dense_backward(dev(da), dev(x), dev(W), a, act, dW3, db3, need_dx=False) is None
        assert_close(dW3, start + to_host(dW1), np.float64, name=f"{act} dW onto a start")
        assert_close(db3, 1 + to_host(db1), np.float64, name=f"{act} db onto a start")


@pytest.mark.parametrize("kset", ALL_SETS)
def test_dense_does_not_mutate_inputs(kset, rng):
    K, dev = load(kset)
    x, W, b = dense_problem(rng, 3, 4, 5)
    da = rng.standard_normal((3, 5))
    for act in ACTS:
        xs, Ws, bs, das = dev(x), dev(W), dev(b), dev(da)
        a = K.dense_forward(xs, Ws, bs, act)
        a_copy = to_host(a).copy()
        K.dense_backward(das, xs, Ws, a, act, dev(np.zeros_like(W)), dev(np.zeros_like(b)))
        for got, want in ((xs, x), (Ws, W), (bs, b), (das, da), (a, a_copy)):
            np.testing.assert_array_equal(to_host(got), want)


@pytest.mark.parametrize("kset", ALL_SETS)
def test_sigmoid_stable_at_extremes(kset):
    K, dev = load(kset)
    for dtype in DTYPES:
        z = np.array([-1e4, -100.0, -30.0, 0.0, 30.0, 100.0, 1e4], dtype=dtype)
        with np.errstate(over="raise", invalid="raise"):
            a = to_host(K.sigmoid_forward(dev(z)))
        assert np.all(np.isfinite(a)) and np.all((a >= 0) & (a <= 1))
        assert a[0] == 0 and a[3] == 0.5 and a[-1] == 1
        # tiny tails stay relative-accurate: sigmoid(-30) = exp(-30) / (1 + exp(-30))
        np.testing.assert_allclose(a[2], np.exp(-30.0) / (1 + np.exp(-30.0)), rtol=1e-6)
        a_dense = to_host(K.dense_forward(dev(z[None, :]), dev(np.eye(7, dtype=dtype)),
                                          dev(np.zeros(7, dtype=dtype)), "sigmoid"))
        np.testing.assert_array_equal(a_dense[0], a)
        # a NaN stays NaN (the divergence guard looks for it), whatever the sigmoid's clamps
        assert np.isnan(to_host(K.sigmoid_forward(dev(np.array([np.nan, 1.0], dtype=dtype))))[0])


def test_numba_float32_sigmoid_keeps_its_tails():
    """The numba set's float32 sigmoid (nbmath.sigmoid32: sigmoid_forward's here, and
    dense_forward's, which test_sigmoid_stable_at_extremes finds equal) runs in float32
    arithmetic: within 3 ulp of the float64 sigmoid where that is a normal float32, within
    a step of the smallest subnormal below it (0 past -104), 0 and 1 at the infinities, NaN
    for NaN; the RBM passes' capped one (sigmoid32_capped, which they flush below 2**-100)
    the same bits above -72."""
    from numba import njit

    from aepar.kernels.nb.nbmath import sigmoid32, sigmoid32_capped

    K = kernels.load("numba")
    z = np.concatenate([np.linspace(-120, 40, 160001), np.random.default_rng(3).normal(0, 30, 9999),
                        [-np.inf, np.inf, -1e30, 1e30, 0.0, -0.0, -72.0, -87.3, -103.3, -104.0]]).astype(np.float32)
    got = K.sigmoid_forward(z).astype(np.float64)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-z.astype(np.float64)))
    normal = want >= np.finfo(np.float32).tiny
    ulp = np.spacing(want[normal].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[normal] - want[normal]) / ulp) <= 3.0
    assert np.max(np.abs(got[~normal] - want[~normal])) <= 2.0 ** -149
    assert got[z == -np.inf][0] == 0.0 and got[z == np.inf][0] == 1.0
    assert np.isnan(K.sigmoid_forward(np.array([np.nan], np.float32))[0])

    @njit(error_model="numpy", fastmath={"contract"})  # as the kernels are compiled
    def both(z):
        a, c = np.empty_like(z), np.empty_like(z)
        for i in range(z.size):
            a[i], c[i] = sigmoid32(z[i]), sigmoid32_capped(z[i])
        return a, c
    full, capped = both(z)
    above = z >= -72
    np.testing.assert_array_equal(full[above], capped[above])
    np.testing.assert_array_equal(full, K.sigmoid_forward(z))


@pytest.mark.parametrize("kset", ALL_SETS)
def test_dense_rejects_bad_arguments(kset, rng):
    K, dev = load(kset)
    x, W, b = dense_problem(rng, 2, 3, 4)
    with pytest.raises(ValueError, match="activation"):
        K.dense_forward(dev(x), dev(W), dev(b), "tanh")
    with pytest.raises(ValueError, match="b has shape"):
        K.dense_forward(dev(x), dev(W), dev(b[:3]), "relu")
    a = K.dense_forward(dev(x), dev(W), dev(b), "relu")
    with pytest.raises(ValueError, match="dW"):
        K.dense_backward(a, dev(x), dev(W), a, "relu", dev(np.zeros((4, 3))), dev(np.zeros(4)))
    with pytest.raises(ValueError, match="da"):
        K.dense_backward(a[:1], dev(x), dev(W), a, "relu", dev(np.zeros_like(W)), dev(np.zeros(4)))


@pytest.mark.parametrize("act", ["sigmoid", "relu", "identity"])
@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_dense_backward_factors_are_the_backward_without_its_product(name, act, rng):
    """dense_backward_factors: the same dx and db as dense_backward, and x.T @ dz its dW."""
    K = kernels.load(name)
    x, W, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 4)), rng.standard_normal(4)
    a = K.dense_forward(x, W, b, act)
    da = rng.standard_normal(a.shape)
    dW, db, db_f = np.zeros_like(W), np.zeros_like(b), np.zeros_like(b)
    dx = K.dense_backward(da, x, W, a, act, dW, db)
    dx_f, dz = K.dense_backward_factors(da, x, W, a, act, db_f)
    assert np.array_equal(dx_f, dx) and np.array_equal(db_f, db)
    np.testing.assert_allclose(x.T @ dz, dW, rtol=1e-12, atol=1e-14)
    assert K.dense_backward_factors(da, x, W, a, act, db_f, need_dx=False)[0] is None


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, CPU_MAX_ROWS + 8), min_size=1, max_size=6), act=st.sampled_from(ACTS),
       shape=st.sampled_from([(70, 96), (100, 40), (40, 20)]), f32=st.booleans(), view=st.booleans(),
       rows=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_dense_blocks_give_each_blocks_own_bits(name, sizes, act, shape, f32, view, rows, seed):
    """dense_forward_blocks / dense_backward_blocks on stacked rows: bit for bit the blocks
    one by one (the Numba set runs them in one call of the row kernel when every block has
    at most MAX_ROWS rows, which the sizes cross; rows of 20 columns too), also
    with W a transposed view (a tied decoder's weight, which the row kernels take as it is),
    and with the bias gradients as separate arrays or (``rows``) as the trainer gives them,
    the same columns of each row of one buffer (the Numba set's dz one call for all blocks
    either way), or of two dtypes (a call per block)."""
    K, dtype = kernels.load(name), np.float32 if f32 else np.float64
    rng = np.random.default_rng(seed)
    starts = np.cumsum([0] + sizes)
    x, W, b = dense_problem(rng, int(starts[-1]), *shape, dtype=dtype)
    if view:
        W = np.ascontiguousarray(W.T).T
    a = K.dense_forward_blocks(x, W, b, act, starts)
    alone = [K.dense_forward(x[lo:hi], W, b, act) for lo, hi in zip(starts[:-1], starts[1:])]
    assert a.dtype == dtype and np.array_equal(a, np.concatenate(alone))
    assert_close(a, REF.dense_forward(x, W, b, act), dtype, work=shape[0], name="a")

    da = rng.standard_normal(a.shape).astype(dtype)
    before = rng.standard_normal(shape[1])  # the column sums are added to what the dbs hold
    dbs = [before.copy() for _ in sizes]
    if rows:
        held = np.zeros((len(sizes), shape[1] + 7))
        held[:, 3:-4] = before
        dbs = list(held[:, 3:-4])
    dx, dz = K.dense_backward_blocks(da, x, W, a, act, dbs, starts)
    for k, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        db = before.copy()
        dx_k, dz_k = K.dense_backward_factors(da[lo:hi], x[lo:hi], W, a[lo:hi], act, db)
        assert np.array_equal(dx[lo:hi], dx_k) and np.array_equal(dz[lo:hi], dz_k) and np.array_equal(dbs[k], db)
    assert_close(dx, REF.dense_backward_factors(da, x, W, a, act, np.zeros(shape[1]))[0], dtype, work=shape[1],
                 name="dx")
    assert K.dense_backward_blocks(da, x, W, a, act, dbs, starts, need_dx=False)[0] is None
    # bias gradients of two dtypes (the Numba set's dz then a call per block): the same sums
    dbs = [before.astype(np.float32 if k % 2 else np.float64) for k in range(len(sizes))]
    K.dense_backward_blocks(da, x, W, a, act, dbs, starts)
    for k, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        db = before.astype(dbs[k].dtype)
        K.dense_backward_factors(da[lo:hi], x[lo:hi], W, a[lo:hi], act, db)
        assert np.array_equal(dbs[k], db)



def test_numba_dense_results_start_on_a_cache_line(rng):
    """The products' results are the next kernels' inputs (h @ W.T loads h's rows as
    vectors) and their stores' targets: on a 64-byte boundary, as aepar.kernels.memory
    gives them (NumPy's own start 16 bytes past one)."""
    from aepar.kernels.memory import is_aligned

    K, starts = kernels.load("numba"), [0, 13, 26, 38, 51, 63, 76, 88, 100]
    x, W, b = dense_problem(rng, 100, 784, 1000, dtype=np.float32)
    a = K.dense_forward_blocks(x, W, b, "sigmoid", starts)
    dx, dz = K.dense_backward_blocks(a, x, W, a, "sigmoid", [np.zeros(1000) for _ in starts[1:]], starts)
    one = K.dense_forward(x, W, b, "sigmoid")
    assert all(is_aligned(v) for v in (a, dx, dz, one))

@pytest.mark.parametrize("kset", ALL_SETS)
def test_dense_blocks_reject_offsets_that_do_not_split_the_rows(kset, rng):
    K, dev = load(kset)
    x, W, b = dense_problem(rng, 6, 3, 4)
    for starts in ([0, 4], [1, 6], [0, 4, 3, 6], []):
        with pytest.raises(ValueError, match="offsets"):
            K.dense_forward_blocks(dev(x), dev(W), dev(b), "relu", starts)
    a = K.dense_forward_blocks(dev(x), dev(W), dev(b), "relu", [0, 2, 6])
    with pytest.raises(ValueError, match="2 bias gradients for 1 blocks"):
        K.dense_backward_blocks(a, dev(x), dev(W), a, "relu", [dev(np.zeros(4))] * 2, [0, 6])


# ---------------------------------------------------------------- the tied autoencoder's step


def tied_ae_problem(rng, batch, n_in, n_out, dtype=np.float64):
    x = rng.random((batch, n_in)).astype(dtype)  # pixels in [0, 1]
    W = (0.5 * rng.standard_normal((n_in, n_out))).astype(dtype)
    bv, bh = ((0.3 * rng.standard_normal(n)).astype(dtype) for n in (n_in, n_out))
    velocity = [(0.1 * rng.standard_normal(a.shape)).astype(dtype) for a in (W, bv, bh)]
    return x, W, bv, bh, velocity


def tied_ae_loss(x, W, bv, bh, code_act):
    """½ Σ(x̂ − x)² / batch in float64, and Σ(x̂ − x)²: the textbook's formulas."""
    z = x @ W + bh
    h = 1 / (1 + np.exp(-z)) if code_act == "sigmoid" else z
    y = 1 / (1 + np.exp(-(h @ W.T + bv)))
    sq = float(((y - x) ** 2).sum())
    return 0.5 * sq / x.shape[0], sq


@pytest.mark.parametrize("code_act", ["sigmoid", "identity"])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_tied_ae_update_steps_along_the_finite_difference_gradient(kset, code_act, rng):
    """With no momentum and no weight cost a step is p -= lr * g: g is the float64 central
    difference of the loss, for W's encoder and decoder parts together and both biases."""
    K, dev = load(kset)
    x, W, bv, bh, _ = tied_ae_problem(rng, 6, 5, 3)
    grads = {}
    for name, p in (("W", W), ("bv", bv), ("bh", bh)):
        grads[name] = numerical_grad(lambda: tied_ae_loss(x, W, bv, bh, code_act)[0], p)
    params = [dev(a.copy()) for a in (W, bv, bh)]
    zeros = [dev(np.zeros_like(a)) for a in (W, bv, bh)]
    lr = 0.5
    err = K.tied_ae_update(dev(x), *params, code_act, *zeros, lr, 0.0, 0.0)
    assert scalar_value(err) == pytest.approx(tied_ae_loss(x, W, bv, bh, code_act)[1], rel=1e-12)
    for name, before, after in zip(("W", "bv", "bh"), (W, bv, bh), params):
        assert_grad_close((before - to_host(after)) / lr, grads[name], name=f"{kset} {code_act} {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("code_act", ["sigmoid", "identity"])
@pytest.mark.parametrize("shape", [(1, 7, 3), (100, 65, 31)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kset", kernel_set_params())
def test_tied_ae_update_matches_reference(kset, shape, code_act, dtype, rng):
    """A step with momentum and weight cost: parameters, velocities and the error."""
    K, dev = load(kset)
    x, W, bv, bh, velocity = tied_ae_problem(rng, *shape, dtype)
    want = [a.copy() for a in (W, bv, bh, *velocity)]
    err_ref = REF.tied_ae_update(x, *want[:3], code_act, *want[3:], 0.1, 0.9, 2e-4)
    got = [dev(a.copy()) for a in (W, bv, bh, *velocity)]
    err = K.tied_ae_update(dev(x), *got[:3], code_act, *got[3:], 0.1, 0.9, 2e-4)
    assert scalar_value(err) == pytest.approx(err_ref, rel=1e-10 if dtype == np.float64 else 1e-5)
    for name, g, w in zip(("W", "bv", "bh", "vW", "vbv", "vbh"), got, want):
        assert g.dtype == dtype
        assert_close(g, w, dtype, work=2 * shape[0], name=name)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, CPU_MAX_ROWS + 8), min_size=1, max_size=8),
       code_act=st.sampled_from(["sigmoid", "identity"]),
       shape=st.sampled_from([(70, 40), (100, 20), (40, 12)]), f32=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("name", kernel_set_params())
def test_tied_ae_factors_blocks_are_the_block_kernels_one_by_one(name, sizes, code_act, shape, f32, seed):
    """A tied layer's pass over stacked blocks: the bits of the set's own block kernels one
    after another (``tied_ae_factors_blocks_via``), the bias gradients added into what the
    dbs held; the numba set's one compiled call where every block takes its row kernels
    (float32, at most MAX_ROWS rows a block, 20 or more code units), the block kernels for
    the rest (more rows, 12 code units, float64); and within rounding of the numpy set."""
    from aepar.kernels.ref.dense import tied_ae_factors_blocks_via

    K, dev = load(name)
    dtype = np.float32 if f32 else np.float64
    rng = np.random.default_rng(seed)
    starts = np.cumsum([0] + sizes)
    x, W, bv, bh, _ = tied_ae_problem(rng, int(starts[-1]), *shape, dtype)
    before_v, before_h = rng.standard_normal(shape[0]).astype(dtype), rng.standard_normal(shape[1]).astype(dtype)
    held = [[dev(b.copy()) for _ in sizes] for b in (before_v, before_h, before_v, before_h)]
    held += [[b.copy() for _ in sizes] for b in (before_v, before_h)]  # the numpy set's, on the host
    args = [dev(a) for a in (x, W, bv, bh)]
    got = K.tied_ae_factors_blocks(*args, code_act, held[0], held[1], starts, 0.01)
    want = tied_ae_factors_blocks_via(K, *args, code_act, held[2], held[3], starts, 0.01)
    assert [float(e) for e in got[0]] == [float(e) for e in want[0]]
    for g, w in zip(got[1:] + tuple(held[0] + held[1]), want[1:] + tuple(held[2] + held[3])):
        assert g.dtype == w.dtype and np.array_equal(to_host(g).view(np.uint8), to_host(w).view(np.uint8))
    ref = REF.tied_ae_factors_blocks(x, W, bv, bh, code_act, held[4], held[5], starts, 0.01)
    for g, w, what in zip(got[1:] + tuple(held[0] + held[1]), ref[1:] + tuple(held[4] + held[5]),
                          ["dz2", "dz1", "h"] + ["dbv"] * len(sizes) + ["dbh"] * len(sizes)):
        assert_close(to_host(g), w, dtype, work=2 * shape[0], name=what)
    np.testing.assert_allclose([float(e) for e in got[0]], ref[0], rtol=1e-10 if dtype == np.float64 else 1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_identity_units_bias_gradient_is_numpys_float64_column_sum_in_row_order(dtype):
    """The bias gradient of identity code units (the one compiled call's and _dz's, one
    helper): each block's rows added in order in float64, as NumPy's ``sum(axis=0,
    dtype=float64)`` adds them, then into db, bit for bit; also where the order decides
    the sum (1e20, then -1e20, then 1 is 1; in any other order 0)."""
    from aepar.kernels.nb import dense
    from aepar.kernels.nb.activation import IDENTITY

    rng = np.random.default_rng(3)
    dz = (rng.standard_normal((40, 24)) * np.exp(rng.uniform(-20, 20, (40, 24)))).astype(dtype)
    dz[3:6, :4] = np.array([[1e20], [-1e20], [1.0]], dtype)
    starts = np.array([0, 3, 6, 19, 40])
    before = rng.standard_normal((4, 24)).astype(dtype)
    want = [b.copy() for b in before]
    for lo, hi, db in zip(starts[:-1], starts[1:], want):
        db += dz[lo:hi].sum(axis=0, dtype=np.float64)
    got, each = [b.copy() for b in before], [b.copy() for b in before]
    dense._colsum64_blocks(dz, starts, tuple(got))
    dense._dz(dz, None, IDENTITY, each, starts)
    for g, e, w in zip(got, each, want):
        assert np.array_equal(g, w) and np.array_equal(e, w) and g.tobytes() == w.tobytes() == e.tobytes()
    assert got[1][0] == dtype(before[1][0] + 1.0)


@pytest.mark.parametrize("starts", [[0, 13], [0, 13, 25, 38, 50, 63, 75, 88, 100]])
def test_numba_dx_of_a_softmax_layer_takes_the_row_kernel(starts, monkeypatch):
    """dx = dz @ W.T of a layer of 10 outputs (a classifier's softmax layer: rows of dz
    shorter than a vector) goes through the row kernel, for one block and for a batch's 8
    blocks in one call: its bits are the same on every CPU with FMA, where OpenBLAS's
    product, which such short rows took before, had other bits on 64-bit ARM."""
    from aepar.kernels.nb import dense

    taken = []
    real = dense.rows_times_t
    monkeypatch.setattr(dense, "rows_times_t", lambda *a: (taken.append(a[0].shape), real(*a))[1])
    K = kernels.load("numba")
    rng = np.random.default_rng(10)
    rows = starts[-1]
    x, W = rng.standard_normal((rows, 30), np.float32), rng.standard_normal((30, 10), np.float32)
    a = K.dense_forward(x, W, np.zeros(10, np.float32), "identity")
    da = rng.standard_normal(a.shape, np.float32)
    dbs = [np.zeros(10, np.float32) for _ in starts[1:]]
    dx, dz = K.dense_backward_blocks(da, x, W, a, "identity", dbs, np.array(starts))
    assert taken == [(rows, 10)]
    want = real(np.ascontiguousarray(dz), W, np.empty((rows, 30), np.float32))
    np.testing.assert_array_equal(dx.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("sizes, shape, code_act, calls", [([13, 12, 13, 12], (784, 100), "sigmoid", 1),
                                                            ([25, 25], (64, 16), "sigmoid", 1),
                                                            ([CPU_MAX_ROWS, CPU_MAX_ROWS - 3], (64, 16), "sigmoid", 1),
                                                            ([CPU_MAX_ROWS + 8, 10], (64, 16), "sigmoid", 0),
                                                            ([13, 12], (64, 10), "sigmoid", 1),
                                                            ([13, 12], (64, 16), "identity", 1),
                                                            ([13, 12] * 4, (100, 30), "identity", 1),
                                                            ([CPU_MAX_ROWS + 8, 10], (64, 16), "identity", 0)])
def test_numba_tied_ae_factors_blocks_in_one_call_where_the_blocks_are_thin(sizes, shape, code_act, calls, monkeypatch):
    """The numba set's one compiled call takes the blocks where each takes its row kernels
    (a thread's share of a batch of 100 of the 784-100 layer; 25 rows, where the AVX2 path
    copies W's panels and keeps them for dz2 @ W; blocks of MAX_ROWS rows, 128 on the AVX2
    path: 8 blocks of a batch of 1,000; identity code units, as a stack's top layer, the
    100-30 one's 8 blocks of a batch of 100; 10 code units, rows shorter than a vector),
    and gives the block kernels' bits; a block of more than MAX_ROWS rows takes the
    block kernels."""
    from aepar.kernels.nb import dense
    from aepar.kernels.ref.dense import tied_ae_factors_blocks_via

    taken = []
    real = dense._tied_ae_blocks
    monkeypatch.setattr(dense, "_tied_ae_blocks", lambda *a: (taken.append(1), real(*a)))
    K = kernels.load("numba")
    rng = np.random.default_rng(sum(sizes))
    starts = np.cumsum([0] + sizes)
    x, W, bv, bh, _ = tied_ae_problem(rng, int(starts[-1]), *shape, np.float32)
    dbs = [[np.zeros(n, np.float32) for _ in sizes] for n in (shape[0], shape[1], shape[0], shape[1])]
    got = K.tied_ae_factors_blocks(x, W, bv, bh, code_act, dbs[0], dbs[1], starts, 0.01)
    want = tied_ae_factors_blocks_via(K, x, W, bv, bh, code_act, dbs[2], dbs[3], starts, 0.01)
    assert len(taken) == calls
    assert got[0] == want[0]
    for g, w in zip(got[1:] + tuple(dbs[0] + dbs[1]), want[1:] + tuple(dbs[2] + dbs[3])):
        assert np.array_equal(g.view(np.int32), w.view(np.int32))


@pytest.mark.parametrize("sizes, shape, code_act, f32, compiled", [
    ([13, 12, 13, 12, 13, 12, 13, 12], (64, 16), "sigmoid", True, True),
    ([CPU_MAX_ROWS, 5, 3], (64, 16), "identity", True, True),
    ([CPU_MAX_ROWS + 8, 10, 3], (64, 16), "sigmoid", True, False),  # a block past the row kernels
    ([13, 12, 13], (40, 12), "identity", True, True),  # 12 code units: rows shorter than a vector
    ([13, 12, 13], (40, 20), "sigmoid", False, False)])  # float64
@pytest.mark.parametrize("kset", ALL_SETS)
def test_tied_ae_update_blocks_is_the_trainers_step(kset, sizes, shape, code_act, f32, compiled, monkeypatch):
    """tied_ae_update_blocks: bit for bit the trainer's kernels one by one (each block's
    factors, bias gradients and error into its zeroed row, the rows' tree, W's sum and
    step from the two parts, each bias's step), the errors' sum in the tree too; the numba
    set's compiled step where every block takes the row kernels (the kernels one after
    another for the rest); and within rounding of the numpy set in float64."""
    from aepar.kernels.nb import dense as nb_dense
    from aepar.rows import tree_merges, tree_top

    if kset == "numba":  # which path the numba set took
        taken = []
        real = nb_dense.tied_ae_update_blocks_via
        monkeypatch.setattr(nb_dense, "tied_ae_update_blocks_via", lambda *a: (taken.append(1), real(*a))[1])
    K, dev = load(kset)
    xp = importlib.import_module("cupy") if kset == "cupy" else np
    dtype = np.float32 if f32 else np.float64
    rng = np.random.default_rng(sum(sizes) + shape[1])
    starts = np.cumsum([0] + sizes)
    x, W, bv, bh, velocity = tied_ae_problem(rng, int(starts[-1]), *shape, dtype)
    merges, blocks, scale = tree_merges(tree_top(len(sizes)), 0, len(sizes)), len(sizes), 1.0 / int(starts[-1])
    got = [dev(a.copy()) for a in (W, bv, bh, *velocity)]
    err = K.tied_ae_update_blocks(dev(x), *got[:3], code_act, starts, merges, *got[3:], 0.1, 0.9, 2e-4, scale)
    if kset == "numba":
        assert (not taken) == compiled
    W2, bv2, bh2, vW2, vbv2, vbh2 = want = [dev(a.copy()) for a in (W, bv, bh, *velocity)]
    n_in, n = shape[0], shape[0] + shape[1]
    rows = xp.zeros((blocks, n + 1), dtype)  # as a block's row of the trainer's: its gradients, its sum
    errs, dz2, dz1, h = K.tied_ae_factors_blocks(dev(x), W2, bv2, bh2, code_act, [r[:n_in] for r in rows],
                                                 [r[n_in:n] for r in rows], starts, scale)
    for k, e in enumerate(errs):
        rows[k, n] = e
    total = K.rows_tree_sum(rows, merges)
    K.block_outer_sum_sgd((dev(x), dz2), (dz1, h), starts, merges, [1.0] * blocks, W2, vW2, 0.1, 0.9, 2e-4)
    K.sgd_momentum_update(bv2, total[:n_in], vbv2, 0.1, 0.9, 0.0)
    K.sgd_momentum_update(bh2, total[n_in:n], vbh2, 0.1, 0.9, 0.0)
    assert to_host(err).dtype == dtype and to_host(err).tobytes() == to_host(total[n]).tobytes()
    for g, w in zip(got, want):
        assert g.dtype == dtype and to_host(g).tobytes() == to_host(w).tobytes()
    ref = [a.astype(np.float64) for a in (W, bv, bh, *velocity)]
    ref_err = REF.tied_ae_update_blocks(x.astype(np.float64), *ref[:3], code_act, starts, merges, *ref[3:], 0.1, 0.9,
                                        2e-4, scale)
    assert float(err) == pytest.approx(float(ref_err), rel=1e-4 if f32 else 1e-10)
    for g, w, what in zip(got, ref, ("W", "bv", "bh", "vW", "vbv", "vbh")):
        assert_close(to_host(g), w, dtype, work=4 * int(starts[-1]), name=what)


@pytest.mark.parametrize("kset", ALL_SETS)
def test_tied_ae_update_blocks_rejects_a_tree_of_other_blocks(kset, rng):
    K, dev = load(kset)
    x, W, bv, bh, vel = tied_ae_problem(rng, 6, 5, 3)
    x, W, bv, bh, vel = dev(x), dev(W), dev(bv), dev(bh), [dev(v) for v in vel]
    with pytest.raises(ValueError, match="not one postfix tree over the 2 blocks"):
        K.tied_ae_update_blocks(x, W, bv, bh, "sigmoid", [0, 3, 6], [0, 1, 1], *vel, 0.1, 0.5, 0.0, 0.1)
    with pytest.raises(ValueError, match="offsets"):
        K.tied_ae_update_blocks(x, W, bv, bh, "sigmoid", [0, 3, 5], [0, 1], *vel, 0.1, 0.5, 0.0, 0.1)


@pytest.mark.parametrize("kset", ALL_SETS)
def test_tied_ae_update_refuses_what_does_not_fit(kset, rng):
    K, dev = load(kset)
    x, W, bv, bh, (vW, vbv, vbh) = tied_ae_problem(rng, 4, 5, 3)
    with pytest.raises(ValueError, match="code units"):
        K.tied_ae_update(dev(x), dev(W), dev(bv), dev(bh), "relu", dev(vW), dev(vbv), dev(vbh), 0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="bh"):
        K.tied_ae_update(dev(x), dev(W), dev(bv), dev(bv), "sigmoid", dev(vW), dev(vbv), dev(vbh), 0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="do not fit"):
        K.tied_ae_update(dev(x.T), dev(W), dev(bv), dev(bh), "sigmoid", dev(vW), dev(vbv), dev(vbh), 0.1, 0.0, 0.0)


@pytest.mark.parametrize("sizes, act, view", [([13, 12, 0, 13], "sigmoid", False), ([64, 65, 3], "relu", True),
                                              ([12, 13, 12], "identity", True)])
@pytest.mark.parametrize("name", kernel_set_params())
def test_dense_blocks_have_their_own_bits_however_grouped(name, sizes, act, view, monkeypatch):
    """A block's activations, dz, dx and bias gradient are the same bits in a call of all
    blocks, of some (another rank's share) and alone, float32 with the bias gradients in one
    buffer's rows as the trainer keeps them, W C-ordered or a transposed view. The GPU set
    takes its row kernels for a block of at most ``MAX_ROWS`` rows and cuBLAS above (the
    sizes, written about 64, are scaled to it), block by block: which products took them is
    checked too (the emulated GPU's cuBLAS gives the row kernels' bits at these sizes, so
    bits alone would not tell)."""
    K, dev = load(name)
    by_rows = []  # the rows of every product the GPU set's row kernels made
    bound = None
    if name == "cupy":
        gpu_dense = importlib.import_module("aepar.kernels.cp.dense")
        sizes, bound = gpu_rows(sizes)

        for kernel in ("rows_times", "rows_times_t"):
            def spy(a, W, out=None, real=getattr(gpu_dense, kernel)):
                by_rows.append(a.shape[0])
                return real(a, W, out)
            monkeypatch.setattr(gpu_dense, kernel, spy)
    rng = np.random.default_rng(len(sizes))
    starts = np.cumsum([0] + sizes)
    x, W, bias = dense_problem(rng, int(starts[-1]), 40, 30, np.float32)
    if view:
        W = np.ascontiguousarray(W.T).T
    da = rng.standard_normal((int(starts[-1]), 30)).astype(np.float32)
    x, W, bias, da = dev(x), (dev(W.T).T if view else dev(W)), dev(bias), dev(da)

    def blocks(first, stop):
        lo, hi = starts[first], starts[stop]
        at = starts[first:stop + 1] - lo
        by_rows.clear()
        a = K.dense_forward_blocks(x[lo:hi], W, bias, act, at)
        grads = dev(np.ones((stop - first, 64), np.float32))  # one row per block: 30 used
        dx, dz = K.dense_backward_blocks(da[lo:hi], x[lo:hi], W, a, act, [g[:30] for g in grads], at)
        if name == "cupy":  # all blocks in one call of each product, or block by block
            mine = sizes[first:stop]
            assert by_rows == ([sum(mine)] * 2 if max(mine) <= bound else [n for n in mine if n <= bound] * 2)
        return [to_host(v) for v in (a, dx, dz, grads)]

    everything = blocks(0, len(sizes))
    cut = len(sizes) // 2
    for first, stop in [(0, cut), (cut, len(sizes))] + [(b, b + 1) for b in range(len(sizes))]:
        got = blocks(first, stop)
        for b in range(first, stop):
            here = slice(starts[b] - starts[first], starts[b + 1] - starts[first])
            there = slice(starts[b], starts[b + 1])
            for k in range(3):
                assert np.array_equal(got[k][here], everything[k][there])
            assert np.array_equal(got[3][b - first], everything[3][b])
    host = [to_host(v) for v in (x, W, bias, da)]
    assert_close(everything[0], REF.dense_forward(*host[:3], act), np.float32, work=40, name="a")
    assert_close(everything[1], REF.dense_backward_factors(host[3], host[0], host[1], everything[0], act,
                                                           np.zeros(30, np.float32))[0], np.float32, work=30, name="dx")
