"""rbm family: free energy, conditionals and CD-k on every kernel set.

The CD gradient is checked by float64 central differences of mean(F(v0) - F(vk)) with the
returned vk held fixed; the chain itself against the recipe written out step by step; the
free energy against brute-force enumeration of hidden states; numba/cupy against the
NumPy oracle with the same noise; and CD-1 + SGD must actually learn a toy dataset.
The fused training step rbm_cd_update is checked the same ways: its velocity step by
central differences, against rbm_cd_backward + weight_decay_backward + sgd_momentum_update
of the same set, and numba/cupy against the oracle.
"""
import importlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from aepar.kernels.nb.rowprod import MAX_ROWS as CPU_MAX_ROWS
from tests.conftest import gpu_rows, kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad, scalar_value

REF = kernels.load("numpy")
CPU_SETS = ["numpy", "numba"]
HIDDEN = ["bernoulli", "gaussian"]


def kit(name):
    K = kernels.load(name)
    if name == "cupy":
        import cupy
        return K, cupy.asarray, cupy.asnumpy
    return K, np.asarray, np.asarray


def rbm_problem(rng, hidden, k, batch=5, nv=6, nh=4, dtype=np.float64):
    v0 = rng.random((batch, nv))
    W = 0.5 * rng.standard_normal((nv, nh))
    bv, bh = 0.3 * rng.standard_normal(nv), 0.3 * rng.standard_normal(nh)
    shape = (k, batch, nh)
    noise = rng.random(shape) if hidden == "bernoulli" else rng.standard_normal(shape)
    return [a.astype(dtype) for a in (v0, W, bv, bh, noise)]


def cd(K, v0, W, bv, bh, noise, hidden):
    dW, dbv, dbh = np.zeros_like(W), np.zeros_like(bv), np.zeros_like(bh)
    h0, vk, err = K.rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh)
    return h0, vk, err, dW, dbv, dbh


# ---- the CD gradient is the gradient of mean(F(v0) - F(vk)), vk fixed ------------------

@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", CPU_SETS)
def test_gradcheck_rbm_cd(name, hidden, k, rng):
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, k)
    _, vk, _, dW, dbv, dbh = cd(K, v0, W, bv, bh, noise, hidden)

    def objective():
        return float(np.mean(REF.rbm_free_energy(v0, W, bv, bh, hidden)
                             - REF.rbm_free_energy(vk, W, bv, bh, hidden)))
    assert_grad_close(dW, numerical_grad(objective, W), name="dW")
    assert_grad_close(dbv, numerical_grad(objective, bv), name="dbv")
    assert_grad_close(dbh, numerical_grad(objective, bh), name="dbh")
    assert np.abs(dW).max() > 1e-3   # not vacuous: vk differs from v0


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", CPU_SETS)
def test_gradcheck_rbm_free_energy(name, hidden, rng):
    """dF/dv = -bv - W @ h(v): the free energy is consistent with rbm_hidden."""
    K = kernels.load(name)
    v, W, bv, bh, _ = rbm_problem(rng, hidden, 1, batch=3)
    num = numerical_grad(lambda: float(K.rbm_free_energy(v, W, bv, bh, hidden).sum()), v)
    assert_grad_close(-bv - K.rbm_hidden(v, W, bh, hidden) @ W.T, num, name="dF/dv")


def test_free_energy_by_enumeration(rng):
    """Bernoulli hidden: F(v) = -log sum_h exp(-E(v, h)), E = -v.bv - h.bh - v W h."""
    v, W, bv, bh, _ = rbm_problem(rng, "bernoulli", 1, batch=4, nv=5, nh=4)
    hs = np.array(list(itertools.product([0.0, 1.0], repeat=4)))           # (16, nh)
    neg_energy = (v @ bv)[:, None] + (hs @ bh)[None, :] + v @ W @ hs.T     # (batch, 16)
    want = -np.log(np.exp(neg_energy).sum(axis=1))
    np.testing.assert_allclose(REF.rbm_free_energy(v, W, bv, bh, "bernoulli"), want, rtol=1e-12)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", CPU_SETS)
def test_cd_chain_follows_recipe(name, hidden, k, rng):
    """h0, vk and sq_err are the chain of the docstring, written out here by hand."""
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, k)
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    mean_h = (lambda v: sig(v @ W + bh)) if hidden == "bernoulli" else (lambda v: v @ W + bh)
    h0 = h = mean_h(v0)
    for i in range(k):
        s = (h > noise[i]) * 1.0 if hidden == "bernoulli" else h + noise[i]
        v = sig(s @ W.T + bv)
        if i == 0:
            err = ((v - v0) ** 2).sum()
        h = mean_h(v)
    got_h0, got_vk, got_err, dW, dbv, dbh = cd(K, v0, W, bv, bh, noise, hidden)
    np.testing.assert_allclose(got_h0, h0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_vk, v, rtol=1e-12, atol=1e-14)
    assert isinstance(got_err, float) and got_err == pytest.approx(err, rel=1e-12)
    np.testing.assert_allclose(dbv, (v - v0).mean(axis=0), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(dbh, (h - h0).mean(axis=0), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(K.rbm_hidden(v0, W, bh, hidden), h0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(K.rbm_visible(h0, W, bv), sig(h0 @ W.T + bv), rtol=1e-12)


# ---- numba / cupy equal the NumPy oracle with the same noise ---------------------------

def safe_noise(v0, W, bv, bh, noise, hidden, margin):
    """Move uniforms that sit within ``margin`` of their probability (where rounding in
    another kernel set could flip the sampled state) ``margin`` away from it."""
    if hidden != "bernoulli":
        return noise
    noise = noise.copy()
    h = REF.rbm_hidden(v0, W, bh, hidden)
    for i in range(noise.shape[0]):
        close = np.abs(h - noise[i]) < margin
        noise[i][close] = np.where(h[close] > 0.5, h[close] - margin, h[close] + margin)
        h = REF.rbm_hidden(REF.rbm_visible((h > noise[i]).astype(h.dtype), W, bv), W, bh, hidden)
    return noise


CASES = [(1, 1, 1, 1), (7, 13, 5, 1), (10, 33, 17, 2), (4, 20, 31, 3), (100, 64, 48, 1)]


@pytest.mark.parametrize("batch,nv,nh,k", CASES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", [pytest.param(np.float64, id="f64"),
                                   pytest.param(np.float32, id="f32")])
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_rbm(name, dtype, hidden, batch, nv, nh, k):
    K, dev, host = kit(name)
    g = np.random.default_rng(batch * 1000 + nv * 10 + k)
    v0, W, bv, bh, noise = rbm_problem(g, hidden, k, batch, nv, nh, dtype)
    noise = safe_noise(v0, W, bv, bh, noise, hidden, margin=1e-3)
    want = cd(REF, v0, W, bv, bh, noise, hidden)
    dW, dbv, dbh = (dev(np.full_like(a, 0.5)) for a in (W, bv, bh))   # backward must add
    h0, vk, err = K.rbm_cd_backward(dev(v0), dev(W), dev(bv), dev(bh), dev(noise), hidden, dW, dbv, dbh)
    assert h0.dtype == dtype and vk.dtype == dtype
    err = scalar_value(err)
    work = max(nv, nh, batch)
    for got, ref, what in [(h0, want[0], "h0"), (vk, want[1], "vk"), (host(dW) - 0.5, want[3], "dW"),
                           (host(dbv) - 0.5, want[4], "dbv"), (host(dbh) - 0.5, want[5], "dbh")]:
        assert_close(got, ref, dtype, work=work, name=what)
    assert_close(np.array(err), np.array(want[2]), dtype, work=batch * nv, name="sq_err")
    dv, dW_, dbv_, dbh_ = (dev(a) for a in (v0, W, bv, bh))
    assert_close(K.rbm_hidden(dv, dW_, dbh_, hidden), REF.rbm_hidden(v0, W, bh, hidden), dtype, work=nv)
    assert_close(K.rbm_visible(dev(want[0]), dW_, dbv_), REF.rbm_visible(want[0], W, bv), dtype, work=nh)
    assert_close(K.rbm_free_energy(dv, dW_, dbv_, dbh_, hidden),
                 REF.rbm_free_energy(v0, W, bv, bh, hidden), dtype, work=nv * nh)


@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_rbm_sigmoid_extremes(name):
    """Huge |pre-activations| give 0/1 probabilities, not NaN or overflow, in float32."""
    K, dev, host = kit(name)
    v = np.array([[1.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    W = np.array([[400.0, -400.0, 0.0], [400.0, -400.0, 1e-3]], dtype=np.float32)
    bh = np.zeros(3, dtype=np.float32)
    got = host(K.rbm_hidden(dev(v), dev(W), dev(bh), "bernoulli"))
    assert np.all(np.isfinite(got))
    assert_close(got, REF.rbm_hidden(v, W, bh, "bernoulli"), np.float32)
    np.testing.assert_array_equal(got[:, :2], [[1, 0], [1, 0]])


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", CPU_SETS)
def test_rbm_keeps_float32_with_float64_noise(name, hidden, rng):
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, 2, dtype=np.float32)
    h0, vk, _, dW, _, _ = cd(K, v0, W, bv, bh, noise.astype(np.float64), hidden)
    assert h0.dtype == vk.dtype == dW.dtype == np.float32
    want = cd(REF, v0, W, bv, bh, noise, hidden)
    assert_close(vk, want[1], np.float32, work=8, name="vk")


# ---- CD-1 learns -----------------------------------------------------------------------

@pytest.mark.parametrize("name", CPU_SETS)
def test_cd1_sgd_reduces_reconstruction_error(name):
    """300 CD-1 SGD steps (lr 0.1) on 4 noisy 16-bit prototypes: the reconstruction error
    per image falls from ~3.8 to ~1.2 (the 5% bit-flip noise alone costs ~0.8)."""
    K = kernels.load(name)
    g = np.random.default_rng(0)
    protos = (g.random((4, 16)) < 0.5).astype(float)
    data = protos[g.integers(0, 4, 200)]
    data = np.abs(data - (g.random(data.shape) < 0.05))
    W, bv, bh = 0.1 * g.standard_normal((16, 8)), np.zeros(16), np.zeros(8)
    errors = []
    for _ in range(300):
        v0 = data[g.choice(200, 20, replace=False)]
        _, _, err, dW, dbv, dbh = cd(K, v0, W, bv, bh, g.random((1, 20, 8)), "bernoulli")
        for p, d in ((W, dW), (bv, dbv), (bh, dbh)):   # SGD subtracts lr * grad
            p -= 0.1 * d
        errors.append(err / 20)
    first, last = np.mean(errors[:10]), np.mean(errors[-30:])
    assert last < 0.5 * first, f"reconstruction error per image {first:.2f} -> {last:.2f}"
    assert last < 2.0


# ---- rbm_cd_update: the CD gradient, the weight cost and the momentum step in one call -----

LR, MOMENTUM, WEIGHT_COST = 0.1, 0.9, 0.05


def velocities(rng, W, bv, bh):
    return [0.01 * rng.standard_normal(a.shape).astype(a.dtype) for a in (W, bv, bh)]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", CPU_SETS)
def test_gradcheck_rbm_cd_update(name, hidden, k, rng):
    """vel' = momentum vel - lr (dJ/dp + weight_cost W), p' = p + vel', J = mean(F(v0) - F(vk))
    with vk held fixed; dJ/dp by central differences at the parameters before the step."""
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, k)
    vel = velocities(rng, W, bv, bh)
    _, vk, err, *_ = cd(REF, v0, W, bv, bh, noise, hidden)   # the chain the step will run

    def objective():
        return float(np.mean(REF.rbm_free_energy(v0, W, bv, bh, hidden)
                             - REF.rbm_free_energy(vk, W, bv, bh, hidden)))
    num = [numerical_grad(objective, a) for a in (W, bv, bh)]
    before = [a.copy() for a in (W, bv, bh)] + [a.copy() for a in vel]
    got_err = K.rbm_cd_update(v0, W, bv, bh, noise, hidden, *vel, LR, MOMENTUM, WEIGHT_COST)
    assert isinstance(got_err, float) and got_err == pytest.approx(err, rel=1e-12)
    for i, what in enumerate(("W", "bv", "bh")):
        decay = WEIGHT_COST * before[0] if what == "W" else 0.0
        grad = (MOMENTUM * before[3 + i] - vel[i]) / LR - decay      # the gradient the step used
        assert_grad_close(grad, num[i], name=f"d{what}")
        np.testing.assert_allclose((W, bv, bh)[i], before[i] + vel[i], rtol=1e-13, atol=1e-15)
    assert np.abs(W - before[0]).max() > 1e-4   # not vacuous


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", kernel_set_params())
def test_rbm_cd_update_is_backward_decay_and_sgd(name, hidden, rng):
    """The fused step equals the three kernels it replaces, on the same kernel set."""
    K, dev, host = kit(name)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, 1, batch=12, nv=9, nh=7)
    vel = velocities(rng, W, bv, bh)
    fused = [dev(a.copy()) for a in (W, bv, bh, *vel)]
    err = scalar_value(K.rbm_cd_update(dev(v0), *fused[:3], dev(noise), hidden, *fused[3:], LR, MOMENTUM,
                                       WEIGHT_COST))
    params, vels = [dev(a.copy()) for a in (W, bv, bh)], [dev(a.copy()) for a in vel]
    grads = [dev(np.zeros_like(a)) for a in (W, bv, bh)]
    _, _, want_err = K.rbm_cd_backward(dev(v0), *params, dev(noise), hidden, *grads)
    K.weight_decay_backward(params[0], WEIGHT_COST, grads[0])
    for p, g, v in zip(params, grads, vels):
        K.sgd_momentum_update(p, g, v, LR, MOMENTUM)
    assert err == pytest.approx(scalar_value(want_err), rel=1e-12)
    for got, want, what in zip(fused, params + vels, ("W", "bv", "bh", "vW", "vbv", "vbh")):
        assert_close(host(got), host(want), np.float64, work=12, name=what)


@pytest.mark.parametrize("batch,nv,nh,k", CASES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", [pytest.param(np.float64, id="f64"),
                                   pytest.param(np.float32, id="f32")])
@pytest.mark.parametrize("name", kernel_set_params())
def test_matches_reference_rbm_cd_update(name, dtype, hidden, batch, nv, nh, k):
    K, dev, host = kit(name)
    g = np.random.default_rng(batch * 1000 + nv * 10 + k + 7)
    v0, W, bv, bh, noise = rbm_problem(g, hidden, k, batch, nv, nh, dtype)
    noise = safe_noise(v0, W, bv, bh, noise, hidden, margin=1e-3)
    vel = velocities(g, W, bv, bh)
    want = [a.copy() for a in (W, bv, bh, *vel)]
    want_err = REF.rbm_cd_update(v0, *want[:3], noise, hidden, *want[3:], LR, MOMENTUM, WEIGHT_COST)
    got = [dev(a.copy()) for a in (W, bv, bh, *vel)]
    err = K.rbm_cd_update(dev(v0), *got[:3], dev(noise), hidden, *got[3:], LR, MOMENTUM, WEIGHT_COST)
    err = scalar_value(err)
    assert got[0].dtype == dtype and got[3].dtype == dtype
    work = max(nv, nh, batch)
    for a, b, what in zip(got, want, ("W", "bv", "bh", "vW", "vbv", "vbh")):
        assert_close(host(a), b, dtype, work=work, name=what)
    assert_close(np.array(err), np.array(want_err), dtype, work=batch * nv, name="sq_err")


@pytest.mark.parametrize("name", CPU_SETS)
def test_rbm_cd_update_any_layout(name, rng):
    """Fortran-ordered parameters and float64 data with float32 parameters: still the
    reference step, applied to the caller's arrays."""
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, "bernoulli", 1, batch=6, nv=5, nh=4)
    vel = velocities(rng, W, bv, bh)
    want = [a.copy() for a in (W, bv, bh, *vel)]
    REF.rbm_cd_update(v0, *want[:3], noise, "bernoulli", *want[3:], LR, MOMENTUM, WEIGHT_COST)
    got = [np.asfortranarray(W), bv.copy(), bh.copy(), np.asfortranarray(vel[0]), vel[1].copy(), vel[2].copy()]
    K.rbm_cd_update(v0, *got[:3], noise, "bernoulli", *got[3:], LR, MOMENTUM, WEIGHT_COST)
    for a, b in zip(got, want):
        assert_close(a, b, np.float64, work=6)
    W32, vel32 = W.astype(np.float32), [a.astype(np.float32) for a in vel]
    bv32, bh32 = bv.astype(np.float32), bh.astype(np.float32)
    K.rbm_cd_update(v0, W32, bv32, bh32, noise, "bernoulli", *vel32, LR, MOMENTUM, WEIGHT_COST)
    assert W32.dtype == np.float32
    assert_close(W32, want[0], np.float32, work=6, name="W float32")


def test_numba_float32_probabilities_have_no_subnormals():
    """The numba set stores a float32 probability below 2**-100 as 0 (subnormal operands
    slow the GEMMs down); in float64 it keeps it, and larger ones are kept in both."""
    K = kernels.load("numba")
    v = np.ones((1, 1))
    W = np.array([[-90.0, -60.0, 3.0]])
    bh = np.zeros(3)
    want = REF.rbm_hidden(v, W, bh, "bernoulli")[0]                  # ~8e-40, ~9e-27, ~0.95
    np.testing.assert_allclose(K.rbm_hidden(v, W, bh, "bernoulli")[0], want, rtol=1e-12)
    h32 = K.rbm_hidden(*(a.astype(np.float32) for a in (v, W, bh)), "bernoulli")[0]
    assert h32[0] == 0.0 and want[0] > 0
    np.testing.assert_allclose(h32[1:], want[1:], rtol=1e-5)
    v32 = K.rbm_visible(np.ones((1, 1), np.float32), W.T.astype(np.float32), np.zeros(3, np.float32))[0]
    np.testing.assert_allclose(v32, [0.0, *want[1:]], rtol=1e-5)
    assert not np.any((h32 > 0) & (h32 < np.finfo(np.float32).tiny))


# ---- bad input is refused with a message -----------------------------------------------

@pytest.mark.parametrize("name", CPU_SETS)
def test_rbm_rejects_bad_input(name, rng):
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, "bernoulli", 1)
    z = [np.zeros_like(a) for a in (W, bv, bh)]
    with pytest.raises(ValueError, match="hidden units"):
        K.rbm_hidden(v0, W, bh, "relu")
    with pytest.raises(ValueError, match="do not fit"):
        K.rbm_hidden(v0[:, :-1], W, bh, "bernoulli")
    with pytest.raises(ValueError, match="noise"):
        K.rbm_cd_backward(v0, W, bv, bh, noise[0], "bernoulli", *z)
    with pytest.raises(ValueError, match="noise"):
        K.rbm_cd_backward(v0, W, bv, bh, noise[:, :, :-1], "bernoulli", *z)
    with pytest.raises(ValueError, match="bv"):
        K.rbm_free_energy(v0, W, bh, bh, "gaussian")
    with pytest.raises(ValueError, match="vW"):
        K.rbm_cd_update(v0, W, bv, bh, noise, "bernoulli", z[0][:, :-1], z[1], z[2], 0.1, 0.9, 0.0)
    with pytest.raises(ValueError, match="noise"):
        K.rbm_cd_update(v0, W, bv, bh, noise[0], "bernoulli", *z, 0.1, 0.9, 0.0)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("name", CPU_SETS)
def test_rbm_cd_factors_are_the_backward_without_its_product(name, hidden, rng):
    """alpha * A.T @ D is rbm_cd_backward's dW; the bias gradients and the error are its own."""
    K = kernels.load(name)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, 2)
    _, _, err, dW, dbv, dbh = cd(K, v0, W, bv, bh, noise, hidden)
    gbv, gbh = np.zeros_like(bv), np.zeros_like(bh)
    A, D, alpha, err_f = K.rbm_cd_factors(v0, W, bv, bh, noise, hidden, gbv, gbh, 1.0 / v0.shape[0])
    np.testing.assert_allclose(alpha * (A.T @ D), dW, rtol=1e-12, atol=1e-14)
    assert np.array_equal(gbv, dbv) and np.array_equal(gbh, dbh) and err_f == err
    with pytest.raises(ValueError, match="rbm_cd_factors: noise"):
        K.rbm_cd_factors(v0, W, bv, bh, noise[:, :2], hidden, gbv, gbh)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, CPU_MAX_ROWS + 8), min_size=1, max_size=6), hidden=st.sampled_from(HIDDEN),
       nh=st.sampled_from([8, 30, 96]), k=st.sampled_from([1, 1, 2]), f32=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("name", CPU_SETS)
def test_rbm_cd_factors_blocks_give_each_blocks_own_bits(name, sizes, hidden, nh, k, f32, seed):
    """rbm_cd_factors_blocks on stacked rows: bit for bit each block's rbm_cd_factors (the
    numba set runs CD-1 on every block at once when each block has at most MAX_ROWS rows,
    which the sizes cross; 8 hidden units, rows shorter than a vector in rows_times_t, as
    the 30 of the stack's code layer; CD-2 goes block by block)."""
    K, dtype = kernels.load(name), np.float32 if f32 else np.float64
    rng = np.random.default_rng(seed)
    starts = np.cumsum([0] + sizes)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, k, int(starts[-1]), 70, nh, dtype)
    scale = 1.0 / max(int(starts[-1]), 1)
    dbvs, dbhs = [np.zeros_like(bv) for _ in sizes], [np.zeros_like(bh) for _ in sizes]
    A, D, alpha, errs = K.rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale)
    assert A.shape == (2 * starts[-1], 70) and D.shape == (2 * starts[-1], nh) and len(errs) == len(sizes)
    for b, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        dbv, dbh = np.zeros_like(bv), np.zeros_like(bh)
        A_b, D_b, alpha_b, err_b = K.rbm_cd_factors(v0[lo:hi], W, bv, bh, noise[:, lo:hi], hidden, dbv, dbh, scale)
        assert np.array_equal(A[2 * lo:2 * hi], A_b) and np.array_equal(D[2 * lo:2 * hi], D_b)
        assert alpha == alpha_b and errs[b] == err_b
        assert np.array_equal(dbvs[b], dbv) and np.array_equal(dbhs[b], dbh)


@pytest.mark.parametrize("sizes, calls", [([13, 12, 13], 1), ([CPU_MAX_ROWS, CPU_MAX_ROWS - 3], 1),
                                          ([CPU_MAX_ROWS + 1, 10], 0)])
def test_numba_cd_blocks_in_one_call_up_to_max_rows(sizes, calls, monkeypatch):
    """The numba set runs CD-1 on all blocks in one compiled call (``_cd_blocks``) where
    each block has at most MAX_ROWS rows (128 on the AVX2 path: 8 blocks of a batch of
    1,000), block by block past it; each block its own bits either way."""
    from aepar.kernels.nb import rbm

    taken = []
    real = rbm._cd_blocks
    monkeypatch.setattr(rbm, "_cd_blocks", lambda *a: (taken.append(1), real(*a)))
    K = kernels.load("numba")
    starts = np.cumsum([0] + sizes)
    v0, W, bv, bh, noise = rbm_problem(np.random.default_rng(sum(sizes)), "bernoulli", 1, int(starts[-1]), 70, 40,
                                       np.float32)
    dbvs, dbhs = [np.zeros_like(bv) for _ in sizes], [np.zeros_like(bh) for _ in sizes]
    A, D, _, errs = K.rbm_cd_factors_blocks(v0, W, bv, bh, noise, "bernoulli", dbvs, dbhs, starts, 0.01)
    assert len(taken) == calls
    for b, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        dbv, dbh = np.zeros_like(bv), np.zeros_like(bh)
        A_b, D_b, _, err_b = K.rbm_cd_factors(v0[lo:hi], W, bv, bh, noise[:, lo:hi], "bernoulli", dbv, dbh, 0.01)
        assert np.array_equal(A[2 * lo:2 * hi], A_b) and np.array_equal(D[2 * lo:2 * hi], D_b) and errs[b] == err_b
        assert np.array_equal(dbvs[b], dbv) and np.array_equal(dbhs[b], dbh)


@pytest.mark.parametrize("name", CPU_SETS + kernel_set_params())
def test_rbm_cd_factors_blocks_reject_what_does_not_split_the_rows(name, rng):
    K, dev, _ = kit(name)
    v0, W, bv, bh, noise = (dev(a) for a in rbm_problem(rng, "bernoulli", 1, batch=6))
    g = [dev(np.zeros(6)), dev(np.zeros(4))]
    for starts in ([0, 4], [1, 6], [0, 4, 3, 6], []):
        with pytest.raises(ValueError, match="offsets"):
            K.rbm_cd_factors_blocks(v0, W, bv, bh, noise, "bernoulli", [g[0]], [g[1]], starts)
    with pytest.raises(ValueError, match="1 and 1 bias gradients for 2 blocks"):
        K.rbm_cd_factors_blocks(v0, W, bv, bh, noise, "bernoulli", [g[0]], [g[1]], [0, 2, 6])
    with pytest.raises(ValueError, match="noise"):
        K.rbm_cd_factors_blocks(v0, W, bv, bh, noise[:, :5], "bernoulli", [g[0]], [g[1]], [0, 6])


def trainer_cd_step(K, xp, v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost,
                    scale):
    """The data-parallel trainer's step for blocks that one process holds, kernel by kernel:
    each block's bias gradients into its own zeroed row, the rows added in the tree, W's
    sum and step from the blocks' factors, then each bias's step."""
    blocks, nv, n = len(starts) - 1, W.shape[0], W.shape[0] + W.shape[1]
    rows = xp.zeros((blocks, n + 1), dtype=W.dtype)  # as a block's row of the trainer's: its gradients, its sum
    A, D, alpha, errs = K.rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, [r[:nv] for r in rows],
                                                [r[nv:n] for r in rows], starts, scale)
    for b, err in enumerate(errs):
        rows[b, n] = err
    total = K.rows_tree_sum(rows, merges)
    K.block_outer_sum_sgd(A, D, 2 * np.asarray(starts), merges, [alpha] * blocks, W, vW, lr, momentum, weight_cost)
    K.sgd_momentum_update(bv, total[:nv], vbv, lr, momentum, 0.0)
    K.sgd_momentum_update(bh, total[nv:n], vbh, lr, momentum, 0.0)
    return total[n]


@pytest.mark.parametrize("sizes, nh, hidden, k, f32, compiled", [
    ([13, 12, 13, 12, 13, 12, 13, 12], 30, "bernoulli", 1, True, True),
    ([CPU_MAX_ROWS, 3, 40], 40, "gaussian", 1, True, True),
    ([5], 30, "bernoulli", 1, True, True),
    ([CPU_MAX_ROWS + 1, 7], 30, "bernoulli", 1, True, False),  # a block past the row kernels
    ([13, 12, 13], 8, "bernoulli", 1, True, True),  # 8 hidden units: rows shorter than a vector
    ([13, 12, 13], 30, "bernoulli", 2, True, False),  # CD-2
    ([13, 12, 13], 30, "bernoulli", 1, False, False)])  # float64
@pytest.mark.parametrize("name", ["numpy"] + kernel_set_params())
def test_rbm_cd_update_blocks_is_the_trainers_step(name, sizes, nh, hidden, k, f32, compiled, monkeypatch):
    """rbm_cd_update_blocks: bit for bit the trainer's kernels one by one (each block's
    factors and bias gradients, the tree, W's and the biases' steps), the errors' sum in
    the tree too; the
    numba set's compiled step where every block takes the row kernels (the kernels one
    after another for the rest); and within rounding of the numpy set in float64."""
    from aepar.kernels.nb import rbm as nb_rbm
    from aepar.rows import tree_merges, tree_top

    if name == "numba":  # which path the numba set took
        taken = []
        real = nb_rbm.cd_update_blocks_via
        monkeypatch.setattr(nb_rbm, "cd_update_blocks_via", lambda *a: (taken.append(1), real(*a))[1])
    K, dev, host = kit(name)
    xp = np if name != "cupy" else importlib.import_module("cupy")
    dtype = np.float32 if f32 else np.float64
    rng = np.random.default_rng(sum(sizes) + nh)
    starts = np.cumsum([0] + sizes)
    v0, W, bv, bh, noise = rbm_problem(rng, hidden, k, int(starts[-1]), 70, nh, dtype)
    velocity = [(0.1 * rng.standard_normal(a.shape)).astype(dtype) for a in (W, bv, bh)]
    merges = tree_merges(tree_top(len(sizes)), 0, len(sizes))
    scale = 1.0 / int(starts[-1])
    got = [dev(a.copy()) for a in (W, bv, bh, *velocity)]
    err = K.rbm_cd_update_blocks(dev(v0), *got[:3], dev(noise), hidden, starts, merges, *got[3:], 0.1, 0.9, 2e-4,
                                 scale)
    if name == "numba":
        assert (not taken) == compiled
    want = [dev(a.copy()) for a in (W, bv, bh, *velocity)]
    want_err = trainer_cd_step(K, xp, dev(v0), *want[:3], dev(noise), hidden, starts, merges, *want[3:], 0.1, 0.9,
                               2e-4, scale)
    assert host(err).dtype == dtype and host(err).tobytes() == host(want_err).tobytes()
    for g, w in zip(got, want):
        assert g.dtype == dtype and host(g).tobytes() == host(w).tobytes()
    ref = [a.astype(np.float64) for a in (W, bv, bh, *velocity)]
    ref_err = REF.rbm_cd_update_blocks(v0.astype(np.float64), *ref[:3], noise.astype(np.float64), hidden, starts,
                                       merges, *ref[3:], 0.1, 0.9, 2e-4, scale)
    assert float(err) == pytest.approx(float(ref_err), rel=1e-4 if f32 else 1e-10)
    for g, w, what in zip(got, ref, ("W", "bv", "bh", "vW", "vbv", "vbh")):
        assert_close(host(g), w, dtype, work=4 * int(starts[-1]), name=what)


@pytest.mark.parametrize("name", ["numpy"] + kernel_set_params())
def test_rbm_cd_update_blocks_rejects_a_tree_of_other_blocks(name, rng):
    K, dev, _ = kit(name)
    v0, W, bv, bh, noise = (dev(a) for a in rbm_problem(rng, "bernoulli", 1, batch=6))
    vel = [dev(np.zeros(a.shape)) for a in (W, bv, bh)]
    with pytest.raises(ValueError, match="not one postfix tree over the 2 blocks"):
        K.rbm_cd_update_blocks(v0, W, bv, bh, noise, "bernoulli", [0, 3, 6], [0, 1, 1], *vel, 0.1, 0.5, 0.0)
    with pytest.raises(ValueError, match="offsets"):
        K.rbm_cd_update_blocks(v0, W, bv, bh, noise, "bernoulli", [0, 3, 5], [0, 1], *vel, 0.1, 0.5, 0.0)
    with pytest.raises(ValueError, match="vW"):
        K.rbm_cd_update_blocks(v0, W, bv, bh, noise, "bernoulli", [0, 3, 6], [0, 1], vel[0][:2], *vel[1:], 0.1, 0.5,
                               0.0)


def test_numba_rbm_scratch_is_kept_per_shape_for_the_latest_shapes_only():
    """The numba set's CD-1 scratch: the same arrays again for a shape seen last call, fresh
    ones for a batch too large to keep, and no more than KEEP_SHAPES shapes held per
    thread and kind (a notebook trying shape after shape must not grow without bound)."""
    from aepar.kernels.nb import rbm as nb_rbm

    first = nb_rbm._chain_workspace(100, 784, 1000, np.float32)
    assert all(a is b for a, b in zip(first, nb_rbm._chain_workspace(100, 784, 1000, np.float32)))
    assert [a.shape for a in first] == [(100, 1000), (100, 1000), (100, 784), (100, 1000)]
    big = nb_rbm._chain_workspace(5000, 784, 1000, np.float32)
    assert not any(a is b for a, b in zip(big, nb_rbm._chain_workspace(5000, 784, 1000, np.float32)))
    for nh in range(1, 3 * nb_rbm.KEEP_SHAPES):
        nb_rbm._chain_workspace(10, 20, nh, np.float32)
        nb_rbm._workspace(10, 20, nh, np.float32)
    assert len(nb_rbm._work.chains) == len(nb_rbm._work.bufs) == nb_rbm.KEEP_SHAPES
    # the oldest went first: the 784x1000 scratch is made afresh
    assert not any(a is b for a, b in zip(first, nb_rbm._chain_workspace(100, 784, 1000, np.float32)))


def test_numba_float32_sigmoid_accuracy():
    """The float32 RBM passes' sigmoid (nbmath.sigmoid32_capped, vectorised in the pass): within
    3 ulp of the float64 sigmoid for |z| <= 72; beyond, 1 above and at most σ(-72) (5e-32,
    which the passes' flush takes to 0) below; no NaN."""
    from aepar.kernels.nb.rbm import _visible_pass

    z = np.concatenate([np.linspace(-110, 110, 220001), np.random.default_rng(2).normal(0, 4, 9999),
                        [-1e30, 1e30, -np.inf, np.inf, 0.0, -0.0, 72.0, -72.0]]).astype(np.float32)
    got = z.copy()[None, :]
    _visible_pass(got, np.zeros(z.size, np.float32), 0.0)
    got = got[0].astype(np.float64)
    with np.errstate(over="ignore"):  # exp(1e30) is inf: want is then 0, as it should be
        want = 1 / (1 + np.exp(-z.astype(np.float64)))
    inside = np.abs(z) <= 72
    ulp = np.spacing(want[inside].astype(np.float32)).astype(np.float64)
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got[inside] - want[inside]) / ulp) <= 3.0
    assert np.all(got[z > 72] == 1.0) and np.all(got[z < -72] <= 1 / (1 + np.exp(72.0)) * (1 + 1e-6))


@pytest.mark.parametrize("sizes, hidden", [([13, 12, 0, 13], "bernoulli"), ([64, 65, 3], "bernoulli"),
                                           ([12, 13, 12], "gaussian")])
@pytest.mark.parametrize("name", kernel_set_params())
def test_rbm_blocks_have_their_own_bits_however_grouped(name, sizes, hidden, monkeypatch):
    """What ranks sharing a batch rely on, on every compiled set: a block's factors, bias
    gradients and error are the same bits in a call of all blocks, in a call of some of them
    (another rank's share) and alone, with gradients in one buffer's rows as the trainer
    keeps them. The GPU set takes its row kernels for a block of at most ``MAX_ROWS`` rows
    and cuBLAS above (the sizes, written about 64, are scaled to it), block by block: which
    one a block alone took is checked too, as the emulated GPU's cuBLAS sums small products
    in the row kernels' order."""
    K, dev, host = kit(name)
    by_rows = []  # the rows of every product the GPU set's row kernels made
    bound = None
    if name == "cupy":
        gpu_rbm = importlib.import_module("aepar.kernels.cp.rbm")
        sizes, bound = gpu_rows(sizes)

        def spy(a, W, out=None, rows_times=gpu_rbm.rows_times):
            by_rows.append(a.shape[0])
            return rows_times(a, W, out)
        monkeypatch.setattr(gpu_rbm, "rows_times", spy)
    rng = np.random.default_rng(len(sizes))
    starts = np.cumsum([0] + sizes)
    v0, W, bv, bh, noise = (dev(a) for a in rbm_problem(rng, hidden, 1, int(starts[-1]), 40, 30, np.float32))
    scale = 1.0 / int(starts[-1])

    def blocks(first, stop):
        rows = dev(np.zeros((stop - first, 128), np.float32))  # one row per block: 40 + 30 used
        lo, hi = starts[first], starts[stop]
        A, D, alpha, errs = K.rbm_cd_factors_blocks(v0[lo:hi], W, bv, bh, noise[:, lo:hi], hidden,
                                                    [r[:40] for r in rows], [r[64:94] for r in rows],
                                                    starts[first:stop + 1] - lo, scale)
        return host(A), host(D), alpha, [float(e) for e in errs], host(rows)

    everything = blocks(0, len(sizes))
    cut = len(sizes) // 2
    for first, stop in [(0, cut), (cut, len(sizes))] + [(b, b + 1) for b in range(len(sizes))]:
        by_rows.clear()
        got = blocks(first, stop)
        if name == "cupy":  # all blocks' chains in one call of each product, or block by block
            mine = sizes[first:stop]
            assert by_rows == ([sum(mine)] * 2 if max(mine) <= bound else [n for n in mine if n <= bound
                                                                           for _ in "up"])
        for b in range(first, stop):
            here = slice(2 * (starts[b] - starts[first]), 2 * (starts[b + 1] - starts[first]))
            there = slice(2 * starts[b], 2 * starts[b + 1])
            assert np.array_equal(got[0][here], everything[0][there])
            assert np.array_equal(got[1][here], everything[1][there])
            assert got[3][b - first] == everything[3][b]
            assert np.array_equal(got[4][b - first], everything[4][b])
    for b, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):  # and rbm_cd_factors of the block alone
        gv, gh = dev(np.zeros(40, np.float32)), dev(np.zeros(30, np.float32))
        by_rows.clear()
        A, D, _, err = K.rbm_cd_factors(v0[lo:hi], W, bv, bh, noise[:, lo:hi], hidden, gv, gh, scale)
        rows = slice(2 * lo, 2 * hi)
        assert np.array_equal(host(A), everything[0][rows]) and np.array_equal(host(D), everything[1][rows])
        assert float(err) == everything[3][b] and np.array_equal(host(gv), everything[4][b, :40])
        assert by_rows == ([hi - lo] * 2 if name == "cupy" and hi - lo <= bound else [])
    # and they are CD-1's: the reference's within float32 rounding
    R = kernels.load("numpy")
    rv, rh = [np.zeros(40, np.float32) for _ in sizes], [np.zeros(30, np.float32) for _ in sizes]
    A, D, alpha, errs = R.rbm_cd_factors_blocks(*(host(a) for a in (v0, W, bv, bh, noise)), hidden, rv, rh, starts,
                                               scale)
    np.testing.assert_allclose(everything[2] * everything[0].T.astype(np.float64) @ everything[1],
                               alpha * A.T.astype(np.float64) @ D, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(everything[3], errs, rtol=1e-4)
    np.testing.assert_allclose(everything[4][:, :40], rv, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(everything[4][:, 64:94], rh, rtol=1e-4, atol=1e-6)
