"""The CuPy set's sparse-autoencoder Python, run where no GPU is: kernels/cp/sparse_ae.py on
the emulated GPU (tests/unit/cuda/emulated), compared with the reference, in the quick
tier too: the batched per-leaf sums, a short last leaf, the two rounds and the merges. The
GPU tests check the real thing on a GPU."""
import importlib

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from aepar.kernels.ref.sparse_ae import merge_rows
from aepar.rows import cover_merges
from tests.gradcheck import assert_close

ref = kernels.load("numpy")


@pytest.fixture(scope="module")
def cp_sparse(emulated_cupy):
    """(kernels/cp/sparse_ae.py imported against the emulated CuPy, that CuPy)."""
    return importlib.import_module("aepar.kernels.cp.sparse_ae"), emulated_cupy


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", [203, 256])  # a short last leaf, or none
def test_cupy_sparse_set_matches_the_reference(cp_sparse, rng, m, dtype):
    K, cp = cp_sparse
    v, h, leaf = 36, 7, 64
    x = rng.uniform(0.1, 0.9, (m, v)).astype(dtype)
    r = np.sqrt(6 / (v + h + 1))
    W1, W2 = rng.uniform(-2 * r, 2 * r, (v, h)).astype(dtype), rng.uniform(-2 * r, 2 * r, (h, v)).astype(dtype)
    b1, b2 = ((0.2 * rng.standard_normal(n)).astype(dtype) for n in (h, v))
    n, size, kl = -(-m // leaf), ref.sparse_ae_partials_size(v, h), (0.05, 3.0)
    ws = K.sparse_ae_workspace(m, v, h, dtype)
    on_gpu = [cp.asarray(a) for a in (x, W1, b1, W2, b2)]

    def nans(*shape):
        return cp.full(shape, np.nan, dtype)
    # one shard: split and folded
    for fold in (None, kl):
        want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size, dtype), kl=fold)
        got = K.sparse_ae_partials(*on_gpu, nans(size), ws, fold).get()
        assert_close(got, want, dtype, work=m * v, name=f"emulated GPU, one shard, kl {fold}")
    # per leaf, one round (Q)
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size), dtype), leaf=leaf)
    got = K.sparse_ae_partials(*on_gpu, nans(n, size), ws, None, leaf).get()
    assert_close(got, want, dtype, work=leaf * v, name="emulated GPU, per leaf")
    # the two rounds: Σ a2 per leaf, then the leaves with ρ̂ given, alone and added in the tree
    act = K.sparse_ae_activations(*on_gpu[:3], nans(n, h), ws, leaf).get()
    assert_close(act, ref.sparse_ae_activations(x, W1, b1, np.empty((n, h), dtype), leaf=leaf), dtype, work=v)
    rho_hat = act.astype(np.float64).sum(axis=0) / m
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size), dtype), None, kl, leaf, rho_hat)
    got = K.sparse_ae_partials(*on_gpu, nans(n, size), ws, kl, leaf, rho_hat).get()
    assert_close(got, want, dtype, work=leaf * v, name="emulated GPU, ρ̂ given")
    o = ref.sparse_ae_layout(v, h)["act"][0]
    np.testing.assert_array_equal(got[:, o:o + h], act)  # the first round's sums, bit for bit
    nodes, merges = cover_merges(1, 1 + n, n + 3)  # a run of blocks [1, 1 + n) of a larger tree
    merged = K.sparse_ae_partials(*on_gpu, nans(len(nodes), size), ws, kl, leaf, rho_hat, merges).get()
    want = merge_rows(got.copy(), merges, np.empty((len(nodes), size), dtype))
    np.testing.assert_array_equal(merged, want)
    with pytest.raises(ValueError, match="give leaf"):
        K.sparse_ae_partials(*on_gpu, nans(size), ws, kl, None, rho_hat, merges)
