"""The sparse autoencoder kernels (partials + assembly), the model and the root optimiser
in one process, and the report helpers."""
import csv
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import backend, kernels
from aepar.comm import Comm
from aepar.models.sparse_ae import SparseAutoencoder, init_theta
from aepar.rows import block_bounds
from aepar.parallel.root_optimizer import FAILED, STOP, RootOptimizer
from tests.conftest import host_and_avx2_runs, kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad

RHO, BETA, LAM = 0.05, 3.0, 1e-3
V, H, M = 16, 5, 30
ref = kernels.load("numpy")
ROOT = Path(__file__).resolve().parents[2]


def textbook(theta, x, v, h, rho=RHO, beta=BETA, lam=LAM):
    """UFLDL sparseAutoencoderCost.m, transcribed (samples in columns), θ as aepar packs it."""
    W1 = theta[:v * h].reshape(v, h).T
    W2 = theta[v * h:2 * v * h].reshape(h, v).T
    b1 = theta[2 * v * h:2 * v * h + h, None]
    b2 = theta[2 * v * h + h:, None]
    data, m = x.T, x.shape[0]
    a2 = 1 / (1 + np.exp(-(W1 @ data + b1)))
    a3 = 1 / (1 + np.exp(-(W2 @ a2 + b2)))
    rho_hat = a2.mean(axis=1, keepdims=True)
    cost = (0.5 / m * np.sum((a3 - data) ** 2) + lam / 2 * (np.sum(W1 ** 2) + np.sum(W2 ** 2))
            + beta * np.sum(rho * np.log(rho / rho_hat) + (1 - rho) * np.log((1 - rho) / (1 - rho_hat))))
    d3 = (a3 - data) * a3 * (1 - a3)
    d2 = (W2.T @ d3 + beta * (-rho / rho_hat + (1 - rho) / (1 - rho_hat))) * a2 * (1 - a2)
    grad = np.concatenate([(d2 @ data.T / m + lam * W1).T.ravel(), (d3 @ a2.T / m + lam * W2).T.ravel(),
                           d2.mean(axis=1), d3.mean(axis=1)])
    return cost, grad


def data(rng, m=M, v=V):
    return rng.uniform(0.1, 0.9, size=(m, v))


def theta_for(rng, v=V, h=H, scale=1.0):
    theta = init_theta(v, h, rng)
    theta[2 * v * h:] = 0.1 * rng.standard_normal(h + v)  # non-zero biases test their gradients
    return theta * scale


def unpack(theta, v, h):
    """W1, b1, W2, b2 as views into a packed θ (aepar's order: W1, W2, b1, b2)."""
    return (theta[:v * h].reshape(v, h), theta[2 * v * h:2 * v * h + h], theta[v * h:2 * v * h].reshape(h, v),
            theta[2 * v * h + h:])


def run_kernels(K, x, theta, v, h, kl, dtype=np.float64, shards=1, block=None, rounds=False):
    """Cost and gradient through partials (per shard, summed) + assemble in kernel set K;
    with ``rounds`` the shards' Σ a2 summed first and ρ̂ given to every shard's partials."""
    m = x.shape[0]
    th = theta.astype(dtype)
    W1, b1, W2, b2 = unpack(th, v, h)
    b = block_bounds(m, shards)
    xs = [np.ascontiguousarray(x[b[r]:b[r + 1]], dtype=dtype) for r in range(shards)]
    ws = [K.sparse_ae_workspace(xr.shape[0], v, h, dtype, block) for xr in xs]
    rho_hat = None
    if rounds:
        rho_hat = sum(K.sparse_ae_activations(xr, W1, b1, np.full(h, np.nan, dtype), w).astype(np.float64)
                      for xr, w in zip(xs, ws)) / m
    total = np.zeros(K.sparse_ae_partials_size(v, h), dtype=np.float64)
    for xr, w in zip(xs, ws):
        out = np.full(K.sparse_ae_partials_size(v, h), np.nan, dtype=dtype)
        K.sparse_ae_partials(xr, W1, b1, W2, b2, out, w, kl if shards == 1 or rounds else None, rho_hat=rho_hat)
        total += out
    return K.sparse_ae_assemble(total, theta[:v * h].reshape(v, h), theta[v * h:2 * v * h].reshape(h, v),
                                m, RHO, BETA, LAM)


# ---- the formulation ----------------------------------------------------------------------
@pytest.mark.parametrize("shards, fold", [(1, False), (3, False), (1, True), (3, "rounds")],
                         ids=["one-shard", "three-shards", "one-shard-folded", "three-shards-two-rounds"])
def test_packed_reduction_equals_textbook(rng, shards, fold):
    """Summed shard partials + P + diag(k)Q assembly = the textbook gradient: the KL
    term needs no second reduction (and folding k in on one shard, or on every shard
    given ρ̂ from a first round, gives the same)."""
    x, theta = data(rng, m=31), theta_for(rng)
    cost, grad = run_kernels(ref, x, theta, V, H, (RHO, BETA) if fold else None, shards=shards,
                             rounds=fold == "rounds")
    want_cost, want_grad = textbook(theta, x, V, H)
    assert_close(cost, want_cost, np.float64, work=x.size)
    assert_close(grad, want_grad, np.float64, work=x.size)


def test_partials_layout_and_size():
    for v, h in ((64, 25), (16, 5), (1, 1)):
        layout = ref.sparse_ae_layout(v, h)
        end = max(o + int(np.prod(s)) for o, s in layout.values())
        assert end == ref.sparse_ae_partials_size(v, h) == 3 * v * h + 3 * h + v + 1
        assert list(layout) == ["w1", "b1", "w2", "b2", "act", "err"]
        assert sum(int(np.prod(s)) for _, s in ref.sparse_ae_theta_layout(v, h).values()) \
            == ref.sparse_ae_theta_size(v, h)


# ---- gradients against finite differences ------------------------------------------------
@pytest.mark.parametrize("fold", [False, True, "rounds"], ids=["split", "folded", "two-rounds"])
@pytest.mark.parametrize("kset", ["numpy", pytest.param("numba")])
def test_gradcheck_sparse_ae(rng, kset, fold):
    K = kernels.load(kset)
    x, theta = data(rng), theta_for(rng)
    kl = (RHO, BETA) if fold else None
    shards, rounds = (3, True) if fold == "rounds" else (1, False)

    def run():
        return run_kernels(K, x, theta, V, H, kl, block=7, shards=shards, rounds=rounds)
    _, grad = run()
    numeric = numerical_grad(lambda: run()[0], theta)
    assert_grad_close(grad, numeric, rtol=1e-6, atol=1e-8, name=f"{kset} dJ/dtheta")


# ---- every kernel set against the NumPy oracle -------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fold", [False, True], ids=["split", "folded"])
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_sparse_ae(rng, kset, fold, dtype):
    K = kernels.load(kset)
    xp = np
    if kset == "cupy":
        import cupy as xp
    m, v, h = 203, 36, 7  # 203 rows: blocks of 64 leave a ragged last block
    x = rng.uniform(0.1, 0.9, size=(m, v)).astype(dtype)
    theta = theta_for(rng, v, h, scale=2.0).astype(dtype)
    W1, b1, W2, b2 = unpack(theta, v, h)
    kl = (RHO, BETA) if fold else None
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(ref.sparse_ae_partials_size(v, h), dtype), kl=kl)
    args = [xp.asarray(a) for a in (x, W1, b1, W2, b2)]
    copies = [a.copy() for a in args]
    out = xp.full(ref.sparse_ae_partials_size(v, h), np.nan, dtype=dtype)
    ws = K.sparse_ae_workspace(m, v, h, dtype, 64)
    got = K.sparse_ae_partials(*args, out, ws, kl)
    got = got.get() if hasattr(got, "get") else got
    assert got.dtype == dtype
    # sums run over m samples of products of length v or h
    assert_close(got, want, dtype, work=m * v, name=f"{kset} partials")
    for a, c in zip(args, copies):  # inputs untouched
        assert bool((a == c).all())
    # a second call on the same workspace gives the same (accumulators are reset)
    again = K.sparse_ae_partials(*args, out, ws, kl)
    np.testing.assert_array_equal(again.get() if hasattr(again, "get") else again, got)
    # assembly (float64 on the host) from the same partials
    c_want, g_want = ref.sparse_ae_assemble(want.astype(np.float64), W1, W2, m, RHO, BETA, LAM)
    c_got, g_got = K.sparse_ae_assemble(xp.asarray(want), xp.asarray(W1), xp.asarray(W2), m, RHO, BETA, LAM)
    assert isinstance(g_got, np.ndarray) and g_got.dtype == np.float64
    assert_close(c_got, c_want, np.float64, work=v * h)
    assert_close(g_got, g_want, np.float64, work=v * h)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kset", kernel_set_params())
def test_matches_reference_sparse_ae_two_rounds(rng, kset, dtype):
    """Per-leaf Σ a2 (the first round), then per-leaf partials with ρ̂ given (the KL term
    folded, Q = 0): the reference's numbers, and the act slots the first round's sums bit
    for bit (their total is then the ρ̂ the partials were given)."""
    K = kernels.load(kset)
    xp = np
    if kset == "cupy":
        import cupy as xp
    m, v, h, leaf = 203, 36, 7, 64
    x = rng.uniform(0.1, 0.9, size=(m, v)).astype(dtype)
    theta = theta_for(rng, v, h, scale=2.0).astype(dtype)
    W1, b1, W2, b2 = unpack(theta, v, h)
    n, size = -(-m // leaf), ref.sparse_ae_partials_size(v, h)
    act_want = ref.sparse_ae_activations(x, W1, b1, np.empty((n, h), dtype), leaf=leaf)
    rho_hat = act_want.astype(np.float64).sum(axis=0) / m
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size), dtype), None, (RHO, BETA), leaf, rho_hat)
    args = [xp.asarray(a) for a in (x, W1, b1, W2, b2)]
    ws = K.sparse_ae_workspace(m, v, h, dtype, None, leaf)
    act = K.sparse_ae_activations(*args[:3], xp.full((n, h), np.nan, dtype), ws, leaf)
    got = K.sparse_ae_partials(*args, xp.full((n, size), np.nan, dtype), ws, (RHO, BETA), leaf, rho_hat)
    act, got = (a.get() if hasattr(a, "get") else a for a in (act, got))
    assert act.dtype == got.dtype == dtype
    assert_close(act, act_want, dtype, work=v, name=f"{kset} activations")
    assert_close(got, want, dtype, work=leaf * v, name=f"{kset} partials given rho_hat")
    o, _ = ref.sparse_ae_layout(v, h)["act"]
    np.testing.assert_array_equal(got[:, o:o + h], act)
    w1 = got[:, :2 * v * h].reshape(n, v, 2 * h)
    assert not w1[:, :, h:].any() and not got[:, 2 * v * h + h:2 * v * h + 2 * h].any()  # Q, Σs: zero
    with pytest.raises(ValueError, match="rho_hat"):  # per leaf, ρ̂ cannot come from the leaf
        K.sparse_ae_partials(*args, xp.zeros((n, size), dtype), ws, (RHO, BETA), leaf)


def _each_leaf_alone(nb, x, W1, b1, W2, b2, leaf, kl=None, rho_hat=None):
    """Partials of each leaf of x on its own, a row each: in float32 asked for as one leaf
    (the SIMD kernels run float32 in leaves), in float64 as a whole shard."""
    dtype = x.dtype
    size = nb.sparse_ae_partials_size(*W1.shape)
    per_leaf = dict(leaf=leaf) if dtype == np.float32 else {}
    return np.stack([nb.sparse_ae_partials(x[i:i + leaf], W1, b1, W2, b2, np.full((1, size), np.nan, dtype),
                                           None, kl, rho_hat=rho_hat, **per_leaf)[0] for i in range(0, len(x), leaf)])


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 300), v=st.integers(1, 70), h=st.integers(1, 30), leaf=st.sampled_from([32, 64, 128]),
       seed=st.integers(0, 2 ** 31), dtype=st.sampled_from([np.float64, np.float32]))
def test_numba_second_round_is_each_leaf_alone(m, v, h, leaf, seed, dtype):
    """Given ρ̂, row L holds bit for bit the sums over leaf L alone; the a2 that the first
    round left in the workspace gives the same bits as a2 made again (a fresh workspace,
    or one whose a2 belongs to other weights). Both precisions run the SIMD kernels."""
    nb = kernels.load("numba")
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 0.9, size=(m, v)).astype(dtype)
    theta = theta_for(rng, v, h, scale=2.0).astype(dtype)
    W1, b1, W2, b2 = unpack(theta, v, h)
    rho_hat = rng.uniform(0.02, 0.9, h)
    size, n, kl = nb.sparse_ae_partials_size(v, h), -(-m // leaf), (RHO, BETA)
    alone = _each_leaf_alone(nb, x, W1, b1, W2, b2, leaf, kl, rho_hat)
    ws = nb.sparse_ae_workspace(m, v, h, dtype, leaf=leaf)
    assert ws.simd
    act = nb.sparse_ae_activations(x, W1, b1, np.full((n, h), np.nan, dtype), ws, leaf)
    kept = nb.sparse_ae_partials(x, W1, b1, W2, b2, np.full((n, size), np.nan, dtype), ws, kl, leaf, rho_hat)
    np.testing.assert_array_equal(kept, alone)
    np.testing.assert_array_equal(act, alone[:, 3 * v * h + 2 * h + v:3 * v * h + 3 * h + v])
    fresh = nb.sparse_ae_workspace(m, v, h, dtype, leaf=leaf)
    np.testing.assert_array_equal(
        nb.sparse_ae_partials(x, W1, b1, W2, b2, np.full((n, size), np.nan, dtype), fresh, kl, leaf, rho_hat), alone)
    nb.sparse_ae_activations(x, 2 * W1, b1, np.empty((n, h), dtype), ws, leaf)  # a2 of other weights
    np.testing.assert_array_equal(
        nb.sparse_ae_partials(x, W1, b1, W2, b2, np.full((n, size), np.nan, dtype), ws, kl, leaf, rho_hat), alone)


@settings(max_examples=25, deadline=None)
@given(leaves=st.integers(1, 40), first=st.integers(0, 60), extra=st.integers(0, 60), seed=st.integers(0, 2 ** 31),
       dtype=st.sampled_from([np.float64, np.float32]), kset=st.sampled_from(["numpy", "numba"]))
def test_merged_leaves_are_the_tree_over_the_leaves(leaves, first, extra, seed, dtype, kset):
    """With merges (a thread's run of blocks [first, first + leaves) of a tree over more), the
    kernel's rows are, bit for bit, the cover nodes' sums of its per-leaf rows in the tree."""
    from aepar.rows import cover_merges, tree_node

    K = kernels.load(kset)
    rng = np.random.default_rng(seed)
    v, h, leaf = 12, 5, 32
    count = first + leaves + extra
    m = leaves * leaf - int(rng.integers(0, leaf)) if first + leaves == count else leaves * leaf
    x = rng.uniform(0.1, 0.9, (m, v)).astype(dtype)
    theta = theta_for(rng, v, h, scale=2.0).astype(dtype)
    W1, b1, W2, b2 = unpack(theta, v, h)
    size, kl, rho_hat = K.sparse_ae_partials_size(v, h), (RHO, BETA), rng.uniform(0.05, 0.9, h)
    ws = K.sparse_ae_workspace(m, v, h, dtype, None, leaf)
    each = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full((leaves, size), np.nan, dtype), ws, kl, leaf, rho_hat)
    nodes, merges = cover_merges(first, first + leaves, count)
    got = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full((len(nodes), size), np.nan, dtype), ws, kl, leaf,
                               rho_hat, merges)
    rows = {first + i: r.copy() for i, r in enumerate(each)}
    for i, node in enumerate(nodes):
        assert got[i].tobytes() == tree_node(*node, rows, count).tobytes(), (node, kset, dtype)
    # merged on a fresh workspace (the first round's a2 made there): the same rows
    fresh = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full((len(nodes), size), np.nan, dtype),
                                 K.sparse_ae_workspace(m, v, h, dtype, None, leaf), kl, leaf, rho_hat, merges)
    np.testing.assert_array_equal(fresh, got)


def test_numba_blocks_do_not_matter(rng):
    """Any block size (1, ragged, larger than m) gives the reference's numbers."""
    nb = kernels.load("numba")
    x, theta = data(rng, m=50), theta_for(rng)
    want = run_kernels(ref, x, theta, V, H, None)[1]
    for block in (1, 16, 49, 50, 1000):
        for kl in (None, (RHO, BETA)):
            got = run_kernels(nb, x, theta, V, H, kl, block=block)[1]
            assert_close(got, want, np.float64, work=x.size, name=f"block {block} kl {kl}")


def test_numba_sigmoid_exp_accuracy():
    """The vectorised sigmoid of the numba kernels is within a few ulp of 1/(1 + np.exp(-z))."""
    from aepar.kernels.nb.sparse_ae import _hidden_forward

    z = np.concatenate([np.linspace(-700, 700, 40001), np.random.default_rng(0).normal(0, 3, 5000)])
    a = z.copy()[None, :]
    act = np.zeros(z.size)
    _hidden_forward(a, np.zeros(z.size), act)
    want = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(a[0], want, rtol=4 * np.finfo(np.float64).eps, atol=0)
    np.testing.assert_array_equal(act, a[0])
    # saturation: no overflow, no NaN, limits reached
    big = np.array([[-800.0, -709.0, 709.0, 800.0]])
    _hidden_forward(big, np.zeros(4), np.zeros(4))
    assert np.all(np.isfinite(big)) and big[0, 0] < 1e-300 and big[0, 3] == 1.0



def test_numba_vector_sigmoid_accuracy():
    """The 8-lane sigmoid of the float64 panels: a few ulp from 1/(1 + np.exp(-z)), the
    scalar kernel's numbers, saturation without overflow, and NaN kept NaN."""
    from aepar.kernels.memory import zeros
    from aepar.kernels.nb.simd import vsigmoid_array
    from aepar.kernels.nb.sparse_ae import _hidden_forward

    z = np.concatenate([np.linspace(-700, 700, 40000), np.random.default_rng(1).normal(0, 3, 4992),
                        [-800.0, -709.0, 709.0, 800.0, -np.inf, np.inf, np.nan, 0.0]])
    zz, out = zeros(z.size), zeros(z.size)
    zz[:] = z
    vsigmoid_array(zz, out)
    body = slice(0, -8)
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(out[body], 1 / (1 + np.exp(-z[body])), rtol=4 * eps, atol=0)
    scalar = z[None, body].copy()
    _hidden_forward(scalar, np.zeros(scalar.shape[1]), np.zeros(scalar.shape[1]))
    np.testing.assert_allclose(out[body], scalar[0], rtol=2 * eps, atol=0)
    edge = out[-8:]
    assert np.all(edge[[0, 1, 4]] < 1e-300) and np.all(edge[[2, 3, 5]] == 1.0)
    assert np.isnan(edge[6]) and edge[7] == 0.5


def test_numba_float32_vector_sigmoid_is_the_scalar_ones_bits():
    """The 16-lane sigmoid of the float32 panels gives, lane for lane, the bits of
    nbmath.sigmoid32 compiled as the kernels are (products and sums contracted into FMAs):
    over the whole range, its subnormal tails (exp(-104) and below round to 0), ±inf, ±0
    and NaN; and it is within 3 ulp of the float64 sigmoid where that is normal."""
    from numba import njit

    from aepar.kernels.memory import zeros
    from aepar.kernels.nb.nbmath import sigmoid32
    from aepar.kernels.nb.simd import JIT, vsigmoid_array

    @njit(**JIT)
    def scalar(z, out):
        for i in range(z.size):
            out[i] = sigmoid32(z[i])

    edges = [-np.inf, np.inf, np.nan, 0.0, -0.0, -104.0, -103.5, -87.5, 88.7, 1e-30, -1e-30]
    z = np.concatenate([np.linspace(-110, 110, 44000), np.random.default_rng(2).normal(0, 5, 4000), edges])
    z = np.concatenate([z, np.zeros(-z.size % 16)]).astype(np.float32)
    zz, out, want = zeros(z.size, np.float32), zeros(z.size, np.float32), np.empty(z.size, np.float32)
    zz[:] = z
    vsigmoid_array(zz, out)
    scalar(zz, want)
    nan = np.isnan(want)
    assert nan.sum() == 1 and np.isnan(out[nan]).all()  # (a NaN's sign and payload may differ)
    np.testing.assert_array_equal(out[~nan].view(np.int32), want[~nan].view(np.int32))
    exact = 1 / (1 + np.exp(-z.astype(np.float64)))
    normal = exact >= np.finfo(np.float32).tiny
    ulp = np.spacing(exact[normal].astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(out[normal] - exact[normal]) <= 3 * ulp)
    assert 0 < out[z == np.float32(-103.5)][0] < 1e-44  # a subnormal kept, not flushed


@pytest.mark.parametrize("fold", [False, True], ids=["split", "folded"])
@pytest.mark.parametrize("m, v, h", [(1, 3, 2), (31, 16, 5), (65, 64, 25), (130, 40, 9)])
def test_numba_float64_panels_match_reference(rng, m, v, h, fold):
    """The float64 SIMD path at sizes that leave every kind of padding: samples past the
    last full panel (m not a multiple of 32, or m < 32), visible units past a tile (v not
    a multiple of 32), hidden units past a tile (h not a multiple of 5); several groups."""
    nb = kernels.load("numba")
    x = rng.uniform(0.1, 0.9, size=(m, v))
    theta = theta_for(rng, v, h, scale=2.0)
    W1, b1, W2, b2 = unpack(theta, v, h)
    kl = (RHO, BETA) if fold else None
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(ref.sparse_ae_partials_size(v, h)), kl=kl)
    for block in (32, None, 10 ** 6):
        ws = nb.sparse_ae_workspace(m, v, h, np.float64, block)
        assert ws.simd
        got = nb.sparse_ae_partials(x, W1, b1, W2, b2, np.full(want.size, np.nan), ws, kl)
        assert_close(got, want, np.float64, work=m * v, name=f"m={m} v={v} h={h} block={block}")


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 300), v=st.integers(1, 70), h=st.integers(1, 30), leaf=st.sampled_from([32, 64, 128]),
       seed=st.integers(0, 2 ** 31), dtype=st.sampled_from([np.float64, np.float32]))
def test_numba_leaves_are_each_leaf_alone(m, v, h, leaf, seed, dtype):
    """Per-leaf partials (the model's rank-independent blocks): row L holds, bit for bit,
    the sums over leaf L's samples taken alone; the same into a C-contiguous buffer and into
    the first columns of a wider one (the root optimiser's, a flags column after them, whose
    rows Numba sees as non-contiguous)."""
    nb = kernels.load("numba")
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 0.9, size=(m, v)).astype(dtype)
    theta = theta_for(rng, v, h, scale=2.0).astype(dtype)
    W1, b1, W2, b2 = unpack(theta, v, h)
    size, n = nb.sparse_ae_partials_size(v, h), -(-m // leaf)
    alone = _each_leaf_alone(nb, x, W1, b1, W2, b2, leaf)
    flat = np.full((n, size), np.nan, dtype)
    wide = np.full((n, size + 1), np.nan, dtype)
    ws = nb.sparse_ae_workspace(m, v, h, dtype, leaf=leaf)
    assert ws.simd
    nb.sparse_ae_partials(x, W1, b1, W2, b2, flat, ws, None, leaf)
    nb.sparse_ae_partials(x, W1, b1, W2, b2, wide[:, :size], ws, None, leaf)
    np.testing.assert_array_equal(flat, alone)
    np.testing.assert_array_equal(wide[:, :size], alone)
    assert np.isnan(wide[:, size]).all()  # the column after them untouched


@pytest.mark.parametrize("sizes", [(300, 256, 130), (300,)], ids=["three shards", "one shard"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numba_shards_on_helper_threads_give_each_shards_bits(rng, dtype, sizes):
    """The Numba set's shards run a round's shares on helpers waiting in compiled code
    (aepar.kernels.nb.team), one shard on this thread alone, with the arguments kept from
    round to round: every shard's rows are the bits of its own calls, round after round as
    θ changes in place, after another model's shards used the helpers, and into other
    arrays."""
    from aepar.kernels.ref.sparse_ae import SparseAEShards
    nb = kernels.load("numba")
    v, h, leaf = 64, 25, 64
    width = nb.sparse_ae_partials_size(v, h)

    def model(seed):
        x = [np.random.default_rng(seed + i).uniform(0.1, 0.9, size=(m, v)).astype(dtype)
             for i, m in enumerate(sizes)]
        merges = [tuple([0, 1] * (-(-m // leaf) // 2) + [0] * (-(-m // leaf) % 2)) for m in sizes]
        parts = [(xi, nb.sparse_ae_workspace(len(xi), v, h, dtype, leaf=leaf), mi) for xi, mi in zip(x, merges)]
        alone = [(xi, nb.sparse_ae_workspace(len(xi), v, h, dtype, leaf=leaf), mi) for xi, mi in zip(x, merges)]
        return (nb.sparse_ae_shards(parts, leaf), SparseAEShards(alone, leaf, None, (nb.sparse_ae_activations,
                nb.sparse_ae_partials))) + buffers()

    def buffers():
        theta = np.empty(2 * v * h + h + v, dtype)
        W1, b1, W2, b2 = unpack(theta, v, h)  # views of one buffer, written in place below
        act = [np.full((-(-m // leaf), h), np.nan, dtype) for m in sizes]
        part = [np.full(((-(-m // leaf) + 1) // 2, width + 1), np.nan, dtype)[:, :width] for m in sizes]
        return theta, (W1, b1, W2, b2), act, part

    def evaluate(m, seed):
        shards, one_by_one, theta, (W1, b1, W2, b2), act, part = m
        theta[:] = theta_for(np.random.default_rng(seed), v, h, scale=2.0)
        shards.activations(W1, b1, act)
        want_act = one_by_one.activations(W1, b1, [np.full_like(a, np.nan) for a in act])
        rho_hat = sum(a.sum(axis=0, dtype=np.float64) for a in act) / sum(sizes)
        shards.partials(W1, b1, W2, b2, part, (RHO, BETA), rho_hat)
        want = one_by_one.partials(W1, b1, W2, b2, [np.full_like(p, np.nan) for p in part], (RHO, BETA), rho_hat)
        for got, expected in zip(act + part, want_act + want):
            np.testing.assert_array_equal(got, expected)

    first, second = model(1), model(2)
    assert first[0].native
    for seed in range(3):
        evaluate(first, seed)
    evaluate(second, 10)
    evaluate(first, 11)
    evaluate(first[:2] + buffers(), 12)  # other θ and output arrays


def test_numba_shards_dropped_let_the_helpers_go_with_their_arrays(rng):
    """A model's shards, once dropped, end the helpers that held their arrays (a notebook
    that trains one model after another keeps no old workspace alive)."""
    import gc
    import weakref
    from aepar.kernels.nb import team
    nb = kernels.load("numba")
    v, h, leaf, m = 64, 25, 64, 128
    parts = [(rng.uniform(0.1, 0.9, size=(m, v)), nb.sparse_ae_workspace(m, v, h, leaf=leaf), None)
             for _ in range(2)]
    shards = nb.sparse_ae_shards(parts, leaf)
    theta = theta_for(rng, v, h)
    W1, b1, W2, b2 = unpack(theta, v, h)
    act = [np.empty((2, h)) for _ in parts]
    shards.activations(W1, b1, act)
    shards.partials(W1, b1, W2, b2, [np.empty((2, nb.sparse_ae_partials_size(v, h))) for _ in parts],
                    (RHO, BETA), sum(a.sum(axis=0) for a in act) / (2 * m))
    helpers = [t for t in team._TEAMS.values() if t.bound is not None and t.bound[0] is shards._act]
    assert len(helpers) == 1
    held = weakref.ref(parts[1][1].blocks)  # shard 1's panels, in its helper's arguments
    del shards, parts
    gc.collect()
    for t in helpers[0].threads:
        t.join(10)
    assert not any(t.is_alive() for t in helpers[0].threads)
    assert held() is None


def test_numba_float64_saturation_and_nan(rng):
    """Saturated units (|z| in the hundreds) give the reference's sums; a NaN weight
    makes NaN partials, as in the reference, instead of a plausible-looking number."""
    nb = kernels.load("numba")
    m, v, h = 40, 16, 5
    x = rng.uniform(0.1, 0.9, size=(m, v))
    theta = theta_for(rng, v, h, scale=300.0)
    W1, b1, W2, b2 = unpack(theta, v, h)
    size = ref.sparse_ae_partials_size(v, h)
    with np.errstate(over="ignore"):
        want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size))
    got = nb.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size), nb.sparse_ae_workspace(m, v, h))
    assert_close(got, want, np.float64, work=m * v)
    W1 = W1.copy()
    W1[3, 2] = np.nan
    got = nb.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size), nb.sparse_ae_workspace(m, v, h))
    assert np.isnan(got[-1])  # the squared error
    assert np.isnan(got[ref.sparse_ae_layout(v, h)["w2"][0]:][:h * v]).any()


def test_numba_workspace_repacks_new_or_changed_samples(rng):
    """The float64 workspace keeps x packed between calls: the same array gives the same
    bits, a different array or one rewritten in place is packed again."""
    nb = kernels.load("numba")
    m, v, h = 70, 16, 5
    theta = theta_for(rng, v, h)
    W1, b1, W2, b2 = unpack(theta, v, h)
    size = ref.sparse_ae_partials_size(v, h)
    ws = nb.sparse_ae_workspace(m, v, h)

    def run(x):
        return nb.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size), ws, (RHO, BETA))

    def want(x):
        return ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size), kl=(RHO, BETA))

    x = rng.uniform(0.1, 0.9, size=(m, v))
    first = run(x)
    np.testing.assert_array_equal(run(x), first)
    x[:] = rng.uniform(0.1, 0.9, size=(m, v))  # the same object, new values
    assert_close(run(x), want(x), np.float64, work=m * v)
    assert not np.allclose(run(x), first)
    y = rng.uniform(0.1, 0.9, size=(m, v))
    assert_close(run(y), want(y), np.float64, work=m * v)


@pytest.mark.parametrize("changed", ["W1", "b1", "none"])
def test_numba_second_round_makes_a2_again_where_the_weights_changed(rng, changed):
    """The second round takes the a2 that the first round left in the workspace only at the
    same W1 and b1: weights rewritten in place in between give the partials at the new ones."""
    nb = kernels.load("numba")
    m, v, h, leaf = 96, 16, 5, 32
    x = rng.uniform(0.1, 0.9, size=(m, v))
    W1, b1, W2, b2 = (a.copy() for a in unpack(theta_for(rng, v, h, scale=2.0), v, h))
    n, size = m // leaf, ref.sparse_ae_partials_size(v, h)
    ws = nb.sparse_ae_workspace(m, v, h, np.float64, None, leaf)
    rho_hat = nb.sparse_ae_activations(x, W1, b1, np.empty((n, h)), ws, leaf).sum(axis=0) / m
    if changed != "none":
        weights = {"W1": W1, "b1": b1}[changed]
        weights[...] = weights[::-1].copy() if weights.ndim == 1 else weights[:, ::-1].copy()
    got = nb.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size)), ws, (RHO, BETA), leaf, rho_hat)
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size)), None, (RHO, BETA), leaf, rho_hat)
    assert_close(got, want, np.float64, work=leaf * v)


def test_numba_workspace_buffers_are_cache_line_aligned():
    """Vector loads that straddle two cache lines would halve the kernels' speed."""
    nb = kernels.load("numba")
    ws = nb.sparse_ae_workspace(1000, 64, 25)
    for name in ("blocks", "zt", "d3", "d2", "act", "err", "db1", "db2", "mask"):
        assert getattr(ws, name).ctypes.data % 64 == 0, name

# ---- the model and the optimiser in one process ------------------------------------------
@pytest.mark.parametrize("kset", ["numpy"] + kernel_set_params())
def test_model_cost_grad_equals_textbook(rng, kset):
    be = backend.select("gpu" if kset == "cupy" else "cpu", kset, "float64")
    x, theta = data(rng, m=300), theta_for(rng)  # three blocks of 128 (the last short): the tree
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(x)
    assert (model.blocks.first, model.blocks.stop, model.blocks.count) == (0, 3, 3)
    cost, grad = model.cost_grad(theta)
    want_cost, want_grad = textbook(theta, x, V, H)
    assert_close(cost, want_cost, np.float64, work=x.size)
    assert_close(grad, want_grad, np.float64, work=x.size)
    assert set(model.params(theta)) == {"W1", "W2", "b1", "b2"}
    np.testing.assert_array_equal(model.params(theta)["W2"], theta[V * H:2 * V * H].reshape(H, V))



def test_model_rounds_follow_the_theta_array_they_are_given(rng):
    """The model keeps its views of the θ array its rounds were given last: another array
    (here cost_grad's own, after a root optimiser's buffer) gives the sums at its values."""
    be = backend.select("cpu", "numba", "float64")
    x, theta = data(rng, m=300), theta_for(rng)
    other = theta_for(rng)
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(x)
    opt = RootOptimizer(Comm.serial(), model)
    opt.buffer[1:] = other
    opt.warm_up()  # both rounds at the root optimiser's θ buffer
    cost, grad = model.cost_grad(theta)
    want_cost, want_grad = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(x).cost_grad(theta)
    assert cost == want_cost and np.array_equal(grad, want_grad)


@pytest.mark.parametrize("method, name", [("lbfgs-b", "LBFGSB"), ("lbfgs", "LBFGS")])
def test_the_warm_up_loads_the_roots_own_optimiser(rng, monkeypatch, method, name):
    """The root's warm-up (before a run's timer) loads the optimiser the run takes, and only
    that one: its loading is not training time."""
    from aepar import optim
    loaded = []
    for cls in ("LBFGSB", "LBFGS"):
        monkeypatch.setattr(getattr(optim, cls), "warm_up", staticmethod(lambda cls=cls: loaded.append(cls)))
    be = backend.select("cpu", "numba", "float64")
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(data(rng, m=300))
    RootOptimizer(Comm.serial(), model, optimizer=method).warm_up()
    assert loaded == [name]


@pytest.mark.parametrize("bad, named", [("cost", "the cost is nan"), ("one gradient element", "the gradient is"),
                                        ("infinite gradient element", "the gradient is"), (None, None)])
def test_the_root_names_a_cost_or_gradient_that_is_not_finite(rng, bad, named):
    """The root's check of each evaluation (one compiled pass over the gradient) stops at
    a cost, or at any one gradient element, that is NaN or infinite, and names which."""
    from aepar.errors import Diverged
    from aepar.guard import Guard

    be = backend.select("cpu", "numba", "float64")
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(data(rng, m=300))
    assemble = model.assemble

    def spoilt(partials, theta64, grad=None):
        cost, grad = assemble(partials, theta64, grad)
        if bad == "cost":
            return float("nan"), grad
        if bad is not None:
            grad[17] = np.inf if bad.startswith("infinite") else np.nan
        return cost, grad
    model.assemble = spoilt
    opt = RootOptimizer(Comm.serial(), model, guard=Guard(Comm.serial(), "test", faults=[]), optimizer="lbfgs")
    opt.warm_up()
    if bad is None:
        assert opt.run(model.init_theta(0), 3).iterations == 3
        return
    with pytest.raises(Diverged, match=f"diverged: sparse autoencoder, iteration 1 \\(evaluation 1\\): {named}"):
        opt.run(model.init_theta(0), 3)


def test_the_roots_own_step_is_its_time_outside_its_blocks_and_the_messages(rng):
    """RootResult.step_s (summary.json's root_step_s): what every other rank waits for at
    each evaluation, the assembly and the optimiser's step; not the root's own blocks."""
    import time

    be = backend.select("cpu", "numba", "float64")
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(data(rng, m=300))
    assemble, partials = model.assemble, model.partials

    def slow_assemble(*args):
        time.sleep(0.004)
        return assemble(*args)

    def slow_partials(*args):
        time.sleep(0.010)
        return partials(*args)
    model.assemble, model.partials = slow_assemble, slow_partials
    opt = RootOptimizer(Comm.serial(), model, optimizer="lbfgs")
    opt.warm_up()
    res = opt.run(model.init_theta(0), 5)
    assert 0.004 * res.evaluations < res.step_s < 0.008 * res.evaluations
    assert res.step_s < res.total_s - 0.010 * res.evaluations


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_roots_warm_up_loads_the_assembly_and_the_gradients_check(dtype):
    """In a process of its own (cached kernels load once per process): after the root's
    warm-up the compiled assembly of J and ∂J/∂θ and the check of the gradient have a
    signature, so the first timed evaluation, which every other rank waits for, loads
    nothing."""
    code = ("import aepar; import numpy as np; from aepar import backend; from aepar.comm import Comm; "
            "from aepar.models.sparse_ae import SparseAutoencoder; "
            "from aepar.parallel.root_optimizer import RootOptimizer; "
            "from aepar.kernels.nb import lbfgs as k, sparse_ae as s; "
            f"model = SparseAutoencoder(backend.select('cpu', 'numba', '{dtype}'), 16, 5).attach("
            "np.random.default_rng(0).uniform(0.1, 0.9, (300, 16))); "
            f"RootOptimizer(Comm.serial(), model, dtype=np.{dtype}).warm_up(); "
            "print(bool(k.max_abs.signatures), bool(s._assemble.signatures))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True True"


@pytest.mark.parametrize("kset", ["numpy", "numba"])
def test_model_attach_keeps_a_private_copy(rng, kset):
    """Rewriting the caller's array after attach() changes nothing: the model (and the
    float64 kernels' packed copy of it) own their samples."""
    be = backend.select("cpu", kset, "float64")
    x, theta = data(rng, m=40), theta_for(rng)
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(x)
    cost, grad = model.cost_grad(theta)
    x[:] = rng.uniform(0.1, 0.9, size=x.shape)
    again, grad_again = model.cost_grad(theta)
    assert again == cost
    np.testing.assert_array_equal(grad_again, grad)

def test_init_theta_is_seeded_and_in_range():
    a, b, c = init_theta(64, 25, 3), init_theta(64, 25, 3), init_theta(64, 25, 4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    r = np.sqrt(6) / np.sqrt(64 + 25 + 1)
    assert a.shape == (2 * 64 * 25 + 25 + 64,)
    assert np.all(np.abs(a[:3200]) <= r) and np.abs(a[:3200]).max() > 0.9 * r
    assert np.all(a[3200:] == 0)


def test_lbfgsb_loads_setulb_without_scipy_optimize_and_matches_scipy():
    """The optimiser's setulb comes from its extension file without scipy.optimize's
    package (0.1-0.2 s of start-up), and the driver still takes scipy's own steps."""
    code = ("import sys, numpy as np\n"
            "from aepar.optim import LBFGSB, _setulb\n"
            "assert _setulb() is not None and 'scipy.optimize' not in sys.modules\n"
            "f = lambda x: (float(((x - np.arange(5.0)) ** 4).sum()), 4 * (x - np.arange(5.0)) ** 3)\n"
            "res = LBFGSB(f, np.zeros(5), 30).run()\n"
            "assert 'scipy.optimize' not in sys.modules\n"
            "from scipy.optimize import minimize\n"
            "ref = minimize(f, np.zeros(5), jac=True, method='L-BFGS-B', options={'maxiter': 30})\n"
            "assert res.nit == ref.nit and res.nfev == ref.nfev, (res.nit, ref.nit, res.nfev, ref.nfev)\n"
            "np.testing.assert_array_equal(res.x, ref.x)\n"
            "assert res.fun == ref.fun and res['fun'] == res.fun and res.success\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_short_optimisation_reduces_cost(rng, dtype):
    be = backend.select("cpu", "numba", dtype)
    x = data(rng, m=200)
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(x)
    opt = RootOptimizer(Comm.serial(), model, dtype=be.dtype)
    theta0 = model.init_theta(0)
    start = textbook(theta0, x, V, H)[0]
    seen = []
    res = opt.run(theta0, 25, on_iteration=lambda o, cost, flags: seen.append((o.iterations, cost)))
    assert res.iterations == len(seen) <= 25 and res.evaluations >= res.iterations
    assert res.cost < 0.5 * start
    # the reported cost is the textbook cost at the returned θ (float32: to float32 accuracy)
    assert_close(res.cost, textbook(res.theta, x, V, H)[0], np.dtype(dtype), work=x.size)
    assert [it for it, _ in seen] == list(range(1, len(seen) + 1))
    assert all(b <= a + 1e-12 for (_, a), (_, b) in zip(seen, seen[1:]))  # L-BFGS-B never goes up
    # 1 bcast of θ, the Σ a2's fixed-tree sum and its bcast, the partials' fixed-tree reduction
    assert res.collectives_per_evaluation == 4.0
    assert res.collectives_total == 2 * res.evaluations + 1  # the broadcasts + the stop broadcast
    assert opt.buffer[0] == STOP


def test_root_failure_sends_stop_and_raises(rng):
    """An exception on the root still ends with the FAILED control word broadcast, and a
    failure inside the root's own first or second round still joins both of that
    evaluation's sums."""
    be = backend.select("cpu", "numpy", "float64")
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(data(rng))

    class CountingComm:
        """Comm.serial() that records the collectives in order."""

        def __init__(self):
            self.inner, self.log = Comm.serial(), []
            self.rank, self.size, self.is_root, self.wtime = 0, 1, True, self.inner.wtime

        @property
        def collectives(self):
            return len(self.log)

        def Bcast(self, buf, root=0):
            self.log.append(("Bcast", float(buf[0])))
            return buf

        def Reduce(self, buf, root=0, op="sum"):
            self.log.append(("Reduce", None))
            return buf

        def bcast(self, obj, root=0):
            self.log.append(("bcast", obj))
            return obj

    class Failing:
        """The model, whose shared sums, partials or assembly raise from their 4th call on."""

        def __init__(self, where):
            self.where, self.calls = where, 0
            self.n_theta, self.n_partials, self.blocks = model.n_theta, model.n_partials, model.blocks
            self.n_shared = model.n_shared

        def _count(self):
            self.calls += 1
            if self.calls > 3:
                raise RuntimeError(f"injected failure in {self.where}")

        def shared_sums(self, *args):
            if self.where == "shared_sums":
                self._count()
            return model.shared_sums(*args)

        def partials(self, *args):
            if self.where == "partials":
                self._count()
            return model.partials(*args)

        def assemble(self, *args):
            if self.where == "assemble":
                self._count()
            return model.assemble(*args)

    for where in ("shared_sums", "partials", "assemble"):
        comm = CountingComm()
        opt = RootOptimizer(comm, Failing(where))
        reduce, reduce_nodes, allreduce = opt.tree.reduce, opt.tree.reduce_nodes, opt.tree.allreduce

        def spy(vectors, add=None, reduce=reduce, comm=comm):
            comm.log.append(("reduce", None))
            return reduce(vectors, add)

        def spy_nodes(values, add=None, reduce_nodes=reduce_nodes, comm=comm):
            comm.log.append(("reduce", None))
            return reduce_nodes(values, add)

        def spy_all(vectors, out, add=None, allreduce=allreduce, comm=comm):
            comm.log.append(("allreduce", None))
            return allreduce(vectors, out, add)
        opt.tree.reduce, opt.tree.reduce_nodes, opt.tree.allreduce = spy, spy_nodes, spy_all
        with pytest.raises(RuntimeError, match=f"injected failure in {where}"):
            opt.run(model.init_theta(0), 50)
        kinds = [k for k, _ in comm.log]
        assert comm.log[-2:] == [("Bcast", FAILED), ("bcast", ("RuntimeError", f"injected failure in {where}"))]
        # every broadcast θ got both sums (the first one's result broadcast in it)
        assert kinds[:-2] == ["Bcast", "allreduce", "Bcast", "reduce"] * 4


# ---- report helpers -------------------------------------------------------------------------
def test_features_mosaic_tiles_are_normalised_columns(rng):
    from aepar.report.sparse import features_mosaic

    patch, hidden = 4, 7
    W1 = rng.standard_normal((patch * patch, hidden))
    img = features_mosaic(W1, patch, order="F", border=1)
    assert img.shape == (1 + 3 * 5, 1 + 3 * 5)  # 3x3 grid for 7 units
    centred = W1 - W1.mean()
    for j in range(hidden):
        r, c = divmod(j, 3)
        tile = img[1 + 5 * r:1 + 5 * r + 4, 1 + 5 * c:1 + 5 * c + 4]
        want = centred[:, j].reshape(4, 4, order="F")
        np.testing.assert_allclose(tile, want / np.abs(want).max())
    assert np.all(img[0] == -1) and np.all(img[-4:, 1 + 5 * 2:] == -1)  # border, empty cells


def test_features_png_and_summary(tmp_path, rng):
    from aepar.report.sparse import SUMMARY_FIELDS, features_png, summary_csv

    png = features_png(rng.standard_normal((64, 25)), 8, tmp_path / "f.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = {k: i for i, k in enumerate(SUMMARY_FIELDS)}
    summary.update(final_cost=np.float64(0.25), source="a, \"quoted\" source", extra=[1, 2])
    rows = list(csv.reader(io.StringIO(summary_csv(summary))))
    assert rows[0] == list(SUMMARY_FIELDS) and len(rows) == 2
    assert rows[1][0] == "0.25" and rows[1][-1] == "a, \"quoted\" source"
    with pytest.raises(KeyError, match="final_cost"):
        summary_csv({"iterations": 1})


_ISA_SCRIPT = """
import sys, numpy as np
import aepar.kernels.nb as K
from aepar.kernels import ref
from aepar.kernels.nb.simd import target_isa
from aepar.rows import cover_merges
out = {"isa": np.array(target_isa())}
for m, v, h in ((1000, 64, 25), (517, 36, 13)):  # whole panels; a masked last panel and padded units
    rng = np.random.default_rng(m)
    x = rng.uniform(0.1, 0.9, (m, v))
    W1, W2 = rng.uniform(-0.3, 0.3, (v, h)), rng.uniform(-0.3, 0.3, (h, v))
    b1, b2 = rng.uniform(-0.1, 0.1, h), rng.uniform(-0.1, 0.1, v)
    size = ref.sparse_ae_partials_size(v, h)
    ws = K.sparse_ae_workspace(m, v, h, np.float64)
    out[f"kl{m}"] = K.sparse_ae_partials(x, W1, b1, W2, b2, np.zeros(size), ws, (0.01, 3.0))
    leaf, n = 128, -(-m // 128)
    ws = K.sparse_ae_workspace(m, v, h, np.float64, leaf=leaf)
    out[f"act{m}"] = act = K.sparse_ae_activations(x, W1, b1, np.zeros((n, h)), ws, leaf)
    out[f"rounds{m}"] = K.sparse_ae_partials(x, W1, b1, W2, b2, np.zeros((1, size)), ws, (0.01, 3.0), leaf,
                                             act.sum(axis=0) / m, cover_merges(0, n, n)[1])
    out[f"leaf{m}"] = K.sparse_ae_partials(x, W1, b1, W2, b2, np.zeros((n, size)), ws, None, leaf)
    f = [a.astype(np.float32) for a in (x, W1, b1, W2, b2)]  # float32 in leaves: the SIMD kernels too
    ws = K.sparse_ae_workspace(m, v, h, np.float32, leaf=leaf)
    act = K.sparse_ae_activations(*f[:3], np.zeros((n, h), np.float32), ws, leaf)
    out[f"rounds32_{m}"] = K.sparse_ae_partials(*f, np.zeros((1, size), np.float32), ws, (0.01, 3.0), leaf,
                                                act.sum(axis=0, dtype=np.float64) / m, cover_merges(0, n, n)[1])
np.savez(sys.argv[1], **out)
"""


def test_the_avx2_tiles_give_the_same_bits_as_the_hosts(tmp_path):
    """The tiles sum every output in one order whatever their shape on the CPU (AVX-512:
    32-sample panels, 8 samples per output pass; AVX2: 8 (float64) or 16-sample (float32)
    panels, 4 per pass), so the sparse autoencoder's partials, one shard or per leaf, float64
    or float32 in leaves, are the same bits on either kind of CPU: the AVX2 build
    (AEPAR_ISA=avx2, in a child) against this one."""
    host, avx2 = host_and_avx2_runs(_ISA_SCRIPT, tmp_path)
    for name, want in host.items():
        np.testing.assert_array_equal(avx2[name].view(np.int64), want.view(np.int64), err_msg=name)


@pytest.mark.parametrize("name", ["numpy"] + kernel_set_params())
@pytest.mark.parametrize("wrong", ["x", "b1", "W2", "b2"])
def test_the_kernels_refuse_shapes_that_do_not_match_W1(name, wrong):
    """The Numba tiles read through raw pointers: W1 given transposed, or an x of other
    features, would read and write past the arrays' ends, so it is refused by name, by
    every set alike."""
    K = kernels.load(name)
    xp = np
    if name == "cupy":
        import cupy as xp
    rng = np.random.default_rng(0)
    args = {"x": rng.random((M, V)), "W1": rng.random((V, H)), "b1": np.zeros(H), "W2": rng.random((H, V)),
            "b2": np.zeros(V)}
    args[wrong] = rng.random({"x": (M, V + 1), "b1": (H + 1,), "W2": (V, H), "b2": (V - 1,)}[wrong])
    args = {k: xp.asarray(v) for k, v in args.items()}
    out = xp.zeros(ref.sparse_ae_partials_size(V, H))
    with pytest.raises(ValueError, match=f"sparse_ae_partials: {wrong} has shape"):
        K.sparse_ae_partials(args["x"], args["W1"], args["b1"], args["W2"], args["b2"], out, kl=(RHO, BETA))
    if wrong in ("x", "b1"):
        with pytest.raises(ValueError, match=f"sparse_ae_activations: {wrong} has shape"):
            K.sparse_ae_activations(args["x"], args["W1"], args["b1"], xp.zeros(H))


def test_the_last_line_names_the_spread_and_where_the_blocks_went():
    from aepar.sparse import _spread

    assert _spread({"compute_per_rank_s": [1.0]}) == ""
    two = {"compute_per_rank_s": [1.0, 1.5], "rebalances": 0, "blocks_per_rank": [4, 4]}
    assert _spread(two) == "; each rank's compute 1.00-1.50 s, slowest rank 1"
    moved = dict(two, rebalances=2, blocks_per_rank=[5, 3])
    assert _spread(moved).endswith("; blocks shared by speed 2 times, now 5/3")
