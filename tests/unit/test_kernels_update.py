"""Update kernels (SGD with momentum, Adam): the reference against a direct formula over
several steps, the Numba/CuPy sets against the reference, in-place semantics."""
import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close, to_host

ALL_SETS = [pytest.param("numpy", id="numpy")] + kernel_set_params()
DTYPES = [np.float64, np.float32]
SHAPES = [(1,), (7, 3), (5, 13, 17), (64, 65)]
REF = kernels.load("numpy")
STEPS = 4


def load(name):
    if name == "cupy":
        import cupy
        return kernels.load(name), cupy.asarray
    return kernels.load(name), np.asarray


# a model's parameters for the *_many updates: an empty one, one of a single element, and
# last one whose arrays are strided views
MANY_SHAPES = [(64, 65), (65,), (0,), (1,), (5, 13, 17), (6, 14)]


def on_device(dev, a):
    """``a`` on the device; the last of MANY_SHAPES as every other column of a (6, 28) array."""
    if a.shape != MANY_SHAPES[-1]:
        return dev(a.copy())
    wide = dev(np.zeros((6, 28), a.dtype))
    wide[:, ::2] = dev(a)
    return wide[:, ::2]


def test_reference_sgd_momentum_matches_formula(rng):
    p, v = rng.standard_normal((4, 3)), np.zeros((4, 3))
    p_direct, v_direct = p.copy(), v.copy()
    for _ in range(STEPS):
        g = rng.standard_normal(p.shape)
        assert REF.sgd_momentum_update(p, g, v, 0.1, 0.9) is None
        v_direct = 0.9 * v_direct - 0.1 * g
        p_direct = p_direct + v_direct
        np.testing.assert_allclose(v, v_direct, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(p, p_direct, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("decay", [0.0, 3.0])
def test_reference_adam_matches_formula(decay, rng):
    """Adam, and AdamW's decoupled decay: p shrinks by 1 - lr * decay before the step."""
    lr, b1, b2, eps = 0.01, 0.8, 0.95, 1e-8
    p, m, v = rng.standard_normal(6), np.zeros(6), np.zeros(6)
    p_direct, m_direct, v_direct = p.copy(), m.copy(), v.copy()
    for t in range(1, STEPS + 1):
        g = rng.standard_normal(6)
        assert REF.adam_update(p, g, m, v, t, lr, b1, b2, eps, weight_decay=decay) is None
        m_direct = b1 * m_direct + (1 - b1) * g
        v_direct = b2 * v_direct + (1 - b2) * g ** 2
        p_direct = (1 - lr * decay) * p_direct - lr * (m_direct / (1 - b1 ** t)) / (np.sqrt(v_direct / (1 - b2 ** t))
                                                                                     + eps)
        np.testing.assert_allclose(m, m_direct, rtol=1e-14)
        np.testing.assert_allclose(v, v_direct, rtol=1e-14)
        np.testing.assert_allclose(p, p_direct, rtol=1e-14)


def test_numba_sgd_and_weight_cost_round_as_numpy_does_in_float32(rng):
    # the scalars go in in the arrays' dtype: float32 arithmetic, each operation rounded as
    # NumPy rounds it (with float64 scalars the pass ran in float64: other bits, 2x slower)
    K = kernels.load("numba")
    p0, v0, g, W = (rng.standard_normal(1000).astype(np.float32) for _ in range(4))
    p, v, p_ref, v_ref = p0.copy(), v0.copy(), p0.copy(), v0.copy()
    K.sgd_momentum_update(p, g, v, 0.1, 0.9)
    REF.sgd_momentum_update(p_ref, g, v_ref, 0.1, 0.9)
    assert p.tobytes() == p_ref.tobytes() and v.tobytes() == v_ref.tobytes()
    dW, dW_ref = g.copy(), g.copy()
    K.weight_decay_backward(W, 2e-4, dW)
    REF.weight_decay_backward(W, 2e-4, dW_ref)
    assert dW.tobytes() == dW_ref.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_adam_bias_correction_at_first_step(kset, dtype, rng):
    """From m = v = 0, the first corrected step is lr * g / (|g| + eps): lr per element.

    Without the correction it would be lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.16 lr.
    """
    K, dev = load(kset)
    g = rng.standard_normal(50).astype(dtype)
    g[np.abs(g) < 0.05] = 0.5  # |g| >> eps
    p0 = rng.standard_normal(50).astype(dtype)
    p, m, v = dev(p0.copy()), dev(np.zeros(50, dtype)), dev(np.zeros(50, dtype))
    K.adam_update(p, dev(g), m, v, 1, 1e-3)
    step = p0.astype(np.float64) - to_host(p)
    tol = 1e-6 if dtype == np.float64 else 5e-3  # float32 p0 - p loses digits: |p| ~ 1000 lr
    np.testing.assert_allclose(step, 1e-3 * np.sign(g), rtol=tol)
    np.testing.assert_allclose(to_host(m), 0.1 * g, rtol=1e-6)
    np.testing.assert_allclose(to_host(v), 0.001 * g.astype(np.float64) ** 2, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_sgd_weight_decay_is_the_weight_cost_then_the_step_bit_for_bit(name, dtype, rng):
    """sgd_momentum_update(..., weight_decay=c) gives the bits of weight_decay_backward(p, c,
    g) then the step (what the RBM did in two passes), and leaves g as it was."""
    K = kernels.load(name)
    p0, v0, g0 = (rng.standard_normal((33, 17)).astype(dtype) for _ in range(3))
    p, v, g = p0.copy(), v0.copy(), g0.copy()
    K.sgd_momentum_update(p, g, v, 0.1, 0.9, weight_decay=2e-4)
    assert g.tobytes() == g0.tobytes()
    p_two, v_two, g_two = p0.copy(), v0.copy(), g0.copy()
    K.weight_decay_backward(p_two, 2e-4, g_two)
    K.sgd_momentum_update(p_two, g_two, v_two, 0.1, 0.9)
    assert p.tobytes() == p_two.tobytes() and v.tobytes() == v_two.tobytes()
    assert p.tobytes() != p0.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_update(kset, shape, dtype, rng):
    K, dev = load(kset)
    p0 = rng.standard_normal(shape).astype(dtype)
    grads = [rng.standard_normal(shape).astype(dtype) for _ in range(STEPS)]

    p_ref, v_ref = p0.copy(), np.zeros(shape, dtype)
    p, v = dev(p0.copy()), dev(np.zeros(shape, dtype))
    for g in grads:
        REF.sgd_momentum_update(p_ref, g, v_ref, 0.05, 0.9, weight_decay=1e-2)
        assert K.sgd_momentum_update(p, dev(g), v, 0.05, 0.9, weight_decay=1e-2) is None
    assert p.dtype == v.dtype == dtype
    assert_close(v, v_ref, dtype, work=STEPS, name="sgd v")
    assert_close(p, p_ref, dtype, work=STEPS, name="sgd p")

    p_ref, m_ref, v_ref = p0.copy(), np.zeros(shape, dtype), np.zeros(shape, dtype)
    p, m, v = dev(p0.copy()), dev(np.zeros(shape, dtype)), dev(np.zeros(shape, dtype))
    for t, g in enumerate(grads, start=1):
        REF.adam_update(p_ref, g, m_ref, v_ref, t, 1e-2)
        assert K.adam_update(p, dev(g), m, v, t, 1e-2) is None
    assert p.dtype == m.dtype == v.dtype == dtype
    assert_close(m, m_ref, dtype, work=STEPS, name="adam m")
    assert_close(v, v_ref, dtype, work=STEPS, name="adam v")
    assert_close(p, p_ref, dtype, work=STEPS, name="adam p")

    p_ref, m_ref, v_ref = p0.copy(), np.zeros(shape, dtype), np.zeros(shape, dtype)
    p, m, v = dev(p0.copy()), dev(np.zeros(shape, dtype)), dev(np.zeros(shape, dtype))
    for t, g in enumerate(grads, start=1):  # AdamW: a decay of 1/6 a step at this rate
        REF.adam_update(p_ref, g, m_ref, v_ref, t, 1e-2, weight_decay=16.0)
        assert K.adam_update(p, dev(g), m, v, t, 1e-2, weight_decay=16.0) is None
    assert_close(p, p_ref, dtype, work=STEPS, name="adamw p")


@pytest.mark.parametrize("kset", ALL_SETS)
def test_updates_work_in_place_on_views(kset, rng):
    """Transposed/strided parameters are updated where they lie, as contiguous ones."""
    K, dev = load(kset)
    base = rng.standard_normal((6, 4))
    g = rng.standard_normal((4, 6))
    want_p, want_v = base.T.copy(), np.zeros((4, 6))
    REF.sgd_momentum_update(want_p, g, want_v, 0.1, 0.5)
    P, V = dev(base.copy()), dev(np.zeros((6, 4)))
    K.sgd_momentum_update(P.T, dev(g), V.T, 0.1, 0.5)
    assert_close(P.T, want_p, np.float64, name="sgd p view")
    assert_close(V.T, want_v, np.float64, name="sgd v view")

    want_p, want_m, want_v = base[:, ::2].copy(), np.zeros((6, 2)), np.zeros((6, 2))
    REF.adam_update(want_p, g[:2].T, want_m, want_v, 1, 0.1)
    P, M, V = dev(base.copy()), dev(np.zeros((6, 4))), dev(np.zeros((6, 4)))
    K.adam_update(P[:, ::2], dev(g[:2].T), M[:, ::2], V[:, ::2], 1, 0.1)
    assert_close(P[:, ::2], want_p, np.float64, name="adam p view")
    np.testing.assert_array_equal(to_host(P[:, 1::2]), base[:, 1::2])  # the rest untouched
    assert_close(M[:, ::2], want_m, np.float64, name="adam m view")


@pytest.mark.parametrize("kset", ALL_SETS)
def test_updates_reject_bad_arguments(kset, rng):
    K, dev = load(kset)
    p, g = dev(rng.standard_normal(5)), dev(rng.standard_normal(5))
    with pytest.raises(ValueError, match="step"):
        K.adam_update(p, g, dev(np.zeros(5)), dev(np.zeros(5)), 0, 1e-3)
    with pytest.raises(ValueError, match="shape"):
        K.adam_update(p, g, dev(np.zeros(4)), dev(np.zeros(5)), 1, 1e-3)
    with pytest.raises(ValueError, match="shape"):
        K.sgd_momentum_update(p, dev(np.zeros(6)), dev(np.zeros(5)), 0.1, 0.9)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_adam_update_many_is_each_parameters_own_step(kset, dtype, rng):
    """One call for a model's parameters (one launch on a GPU): the bits of adam_update on
    each, over several steps, an empty parameter, one of a single element and strided views
    (every other column of a larger array) included."""
    K, dev = load(kset)
    shapes = MANY_SHAPES

    def new(a):
        return on_device(dev, a)
    p0 = [rng.standard_normal(s).astype(dtype) for s in shapes]
    many, each = ([new(a) for a in p0] for _ in range(2))
    state = {name: ([new(np.zeros(s, dtype)) for s in shapes], [new(np.zeros(s, dtype)) for s in shapes])
             for name in ("many", "each")}
    assert not many[-1].flags.c_contiguous
    decays = [5.0, 0.0, 5.0, 0.0, 5.0, 5.0]  # AdamW's on the matrices only, as aepar.optim.Adam
    for t in range(1, STEPS + 1):
        gs = [new(rng.standard_normal(s).astype(dtype)) for s in shapes]
        assert K.adam_update_many(many, gs, *state["many"], t, 1e-2 * t, 0.8, 0.95, weight_decays=decays) is None
        for p, g, m, v, c in zip(each, gs, *state["each"], decays):
            K.adam_update(p, g, m, v, t, 1e-2 * t, 0.8, 0.95, weight_decay=c)
    for a, b in zip(many + state["many"][0] + state["many"][1], each + state["each"][0] + state["each"][1]):
        assert to_host(a).tobytes() == to_host(b).tobytes()
    assert not np.array_equal(to_host(many[0]), p0[0]) and not np.array_equal(to_host(many[-1]), p0[-1])


@pytest.mark.parametrize("kset", ALL_SETS)
def test_adam_update_many_refuses_lists_that_do_not_match(kset, rng):
    K, dev = load(kset)
    p = [dev(np.zeros((3, 2))), dev(np.zeros(4))]
    with pytest.raises(ValueError, match="2 parameters but a list of 1"):
        K.adam_update_many(p, p[:1], p, p, 1, 1e-3)
    with pytest.raises(ValueError, match="shape"):
        K.adam_update_many(p, [p[1], p[0]], p, p, 1, 1e-3)
    with pytest.raises(ValueError, match="2 parameters but 1 weight decays"):
        K.adam_update_many(p, p, p, p, 1, 1e-3, weight_decays=[0.1])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kset", ALL_SETS)
def test_sgd_momentum_update_many_is_each_parameters_own_step(kset, dtype, rng):
    """One call for a model's parameters, each at its own rate and decay (one launch for
    every four on a GPU: six here, so two): the bits of sgd_momentum_update on each, over
    several steps, an empty parameter, one of a single element and a strided view
    included; and the GPU's single update rounds each operation as NumPy does."""
    K, dev = load(kset)
    shapes = MANY_SHAPES

    def new(a):
        return on_device(dev, a)
    p0 = [rng.standard_normal(s).astype(dtype) for s in shapes]
    many, each, numpy = ([new(a) for a in p0] for _ in range(3))
    velocity = {name: [new(np.zeros(s, dtype)) for s in shapes] for name in ("many", "each", "numpy")}
    rates, decays = [0.1, 0.05, 0.1, 0.3, 0.02, 0.07], [0.5, 0.0, 0.5, 0.0, 0.5, 0.25]
    for t in range(1, STEPS + 1):
        gs = [new(rng.standard_normal(s).astype(dtype)) for s in shapes]
        assert K.sgd_momentum_update_many(many, gs, velocity["many"], rates, 0.5 + 0.1 * t, decays) is None
        for p, g, v, lr, c in zip(each, gs, velocity["each"], rates, decays):
            K.sgd_momentum_update(p, g, v, lr, 0.5 + 0.1 * t, c)
        for i, (g, lr, c) in enumerate(zip(gs, rates, decays)):  # the reference on the host
            p, v = to_host(numpy[i]).copy(), to_host(velocity["numpy"][i]).copy()
            REF.sgd_momentum_update(p, to_host(g), v, dtype(lr), dtype(0.5 + 0.1 * t), dtype(c))
            numpy[i], velocity["numpy"][i] = p, v
    for a, b in zip(many + velocity["many"], each + velocity["each"]):
        assert to_host(a).tobytes() == to_host(b).tobytes()
    assert not np.array_equal(to_host(many[0]), p0[0]) and not np.array_equal(to_host(many[-1]), p0[-1])
    if kset == "cupy":  # one rounding per operation, as NumPy's: the reference's bits
        for a, b in zip(many + velocity["many"], numpy + velocity["numpy"]):
            assert to_host(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("kset", ALL_SETS)
def test_sgd_momentum_update_many_refuses_lists_that_do_not_match(kset, rng):
    K, dev = load(kset)
    p = [dev(np.zeros((3, 2))), dev(np.zeros(4))]
    with pytest.raises(ValueError, match="2 parameters but a list of 1"):
        K.sgd_momentum_update_many(p, p[:1], p, [0.1, 0.1], 0.9)
    with pytest.raises(ValueError, match="shape"):
        K.sgd_momentum_update_many(p, [p[1], p[0]], p, [0.1, 0.1], 0.9)
    with pytest.raises(ValueError, match="2 parameters but 1 rates"):
        K.sgd_momentum_update_many(p, p, p, [0.1], 0.9)
    with pytest.raises(ValueError, match="2 parameters but 1 weight decays"):
        K.sgd_momentum_update_many(p, p, p, [0.1, 0.1], 0.9, [0.1])


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "serial"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_numba_adam_rounds_each_operation_on_its_own(dtype, parallel, rng, monkeypatch):
    """The CPU's Adam is its formula with one rounding per operation, as NumPy computes it:
    no product fused into an FMA, whose choice differs between CPUs and between a loop's
    vector and scalar forms (AArch64's vector loop had kept keep * p - s apart). So its
    bits are the same on every CPU and through either loop."""
    import math
    import sys
    K = kernels.load("numba")
    update = sys.modules[K.adam_update.__module__]
    monkeypatch.setattr(update, "PARALLEL_ELEMENTS", 0 if parallel else 10**9)
    dt = np.dtype(dtype).type
    p, g, m = rng.standard_normal((3, 3001)).astype(dtype)
    v = rng.random(3001).astype(dtype)
    t, lr, decay, beta1, beta2, eps = 3, 1e-2, 0.5, 0.9, 0.999, 1e-8
    bc1, bc2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
    want_m = dt(beta1) * m + dt(1.0 - beta1) * g
    want_v = dt(beta2) * v + dt(1.0 - beta2) * g * g
    want_p = dt(1.0 - lr * decay) * p - dt(lr / bc1) * want_m / (np.sqrt(want_v) * dt(1.0 / math.sqrt(bc2)) + dt(eps))
    K.adam_update(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay=decay)
    for got, want in ((m, want_m), (v, want_v), (p, want_p)):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_numba_updates_give_the_same_bits_with_or_without_a_parallel_loop(dtype, rng, monkeypatch):
    """An array under PARALLEL_ELEMENTS takes the loops compiled without ``parallel`` (a
    parallel region's start costs more than a layer's biases take): SGD with momentum and
    Adam (AdamW's decay too) give each element the same bits through either loop."""
    import sys
    K = kernels.load("numba")
    update = sys.modules[K.sgd_momentum_update.__module__]
    p0, g = rng.standard_normal((2, 3001)).astype(dtype)
    m0, v0 = rng.standard_normal(3001).astype(dtype), rng.random(3001).astype(dtype)
    results = []
    for limit in (0, 10**9):  # every array parallel, then none
        monkeypatch.setattr(update, "PARALLEL_ELEMENTS", limit)
        p, v = p0.copy(), m0.copy()
        K.sgd_momentum_update(p, g, v, 0.05, 0.9)
        pa, ma, va = p0.copy(), m0.copy(), v0.copy()
        K.adam_update(pa, g, ma, va, 3, 1e-2, weight_decay=0.5)
        results.append([a.tobytes() for a in (p, v, pa, ma, va)])
    assert results[0] == results[1]
    assert results[0][0] != p0.tobytes() and results[0][2] != p0.tobytes()
