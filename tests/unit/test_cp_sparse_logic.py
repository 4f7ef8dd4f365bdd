"""The CuPy set's sparse-autoencoder Python, run where no GPU is: kernels/cp/sparse_ae.py
against a NumPy stand-in for ``cupy`` (its ElementwiseKernels' C bodies evaluated as NumPy
expressions), compared with the reference. The GPU tests check the real thing on a lent
GPU; this catches slips in the batched per-leaf sums, the two rounds and the merges on
every CI machine."""
import importlib.util
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels
from aepar.kernels.ref.sparse_ae import merge_rows
from aepar.rows import cover_merges
from tests.gradcheck import assert_close

ROOT = Path(__file__).resolve().parents[2]
ref = kernels.load("numpy")


class _Elementwise:
    """cupy.ElementwiseKernel on NumPy arrays: the C statements run as array expressions
    (``(T)1`` a Python 1, ``T name =`` a plain name), then every output name is written
    back into the output array it was given."""

    def __init__(self, in_params, out_params, operation, name):
        self.ins = [p.split()[-1] for p in in_params.split(",")]
        self.outs = [p.split()[-1] for p in out_params.split(",")]
        body = re.sub(r"\(T\)\s*", "", operation)
        body = re.sub(r"\bT\s+(\w+)\s*=", r"\1 =", body)
        self.statements = [s.strip() for s in re.split(r"[;\n]", body) if s.strip()]

    def __call__(self, *arrays):
        scope = {"exp": np.exp, **dict(zip(self.ins + self.outs, arrays))}
        for statement in self.statements:
            target, _, value = statement.partition("=")
            scope[target.strip()] = eval(value, {}, scope)  # noqa: S307  (the kernels' own bodies)
        for name, out in zip(self.outs, arrays[len(self.ins):]):
            out[...] = scope[name]


@pytest.fixture
def cp_sparse(monkeypatch):
    """kernels/cp/sparse_ae.py loaded against the NumPy stand-in (its sparsity helper: the
    reference's)."""
    cupy = types.ModuleType("cupy")
    cupy.ElementwiseKernel = _Elementwise
    cupy.matmul = lambda a, b, out=None: np.matmul(a, b, out=out)
    cupy.sum = lambda a, axis=None, out=None: np.sum(a, axis=axis, out=out)
    cupy.empty, cupy.asarray, cupy.float64 = np.empty, np.asarray, np.float64
    package = types.ModuleType("kernels.cp")
    package.__path__ = [str(ROOT / "kernels" / "cp")]
    sparsity = types.ModuleType("kernels.cp.sparsity")
    sparsity.kl_sparsity_backward = ref.kl_sparsity_backward
    for name, module in (("cupy", cupy), ("kernels.cp", package), ("kernels.cp.sparsity", sparsity)):
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("kernels.cp.sparse_ae", ROOT / "kernels" / "cp" / "sparse_ae.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kernels.cp.sparse_ae", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", [203, 256])  # a short last leaf, or none
def test_cupy_sparse_set_matches_the_reference(cp_sparse, rng, m, dtype):
    K = cp_sparse
    v, h, leaf = 36, 7, 64
    x = rng.uniform(0.1, 0.9, (m, v)).astype(dtype)
    r = np.sqrt(6 / (v + h + 1))
    W1, W2 = rng.uniform(-2 * r, 2 * r, (v, h)).astype(dtype), rng.uniform(-2 * r, 2 * r, (h, v)).astype(dtype)
    b1, b2 = ((0.2 * rng.standard_normal(n)).astype(dtype) for n in (h, v))
    n, size, kl = -(-m // leaf), ref.sparse_ae_partials_size(v, h), (0.05, 3.0)
    ws = K.sparse_ae_workspace(m, v, h, dtype)
    # one shard: split and folded
    for fold in (None, kl):
        want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size, dtype), kl=fold)
        got = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full(size, np.nan, dtype), ws, fold)
        assert_close(got, want, dtype, work=m * v, name=f"cupy stand-in, one shard, kl {fold}")
    # per leaf, one round (Q)
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size), dtype), leaf=leaf)
    got = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full((n, size), np.nan, dtype), ws, None, leaf)
    assert_close(got, want, dtype, work=leaf * v, name="cupy stand-in, per leaf")
    # the two rounds: Σ a2 per leaf, then the leaves with ρ̂ given, alone and added in the tree
    act = K.sparse_ae_activations(x, W1, b1, np.full((n, h), np.nan, dtype), ws, leaf)
    assert_close(act, ref.sparse_ae_activations(x, W1, b1, np.empty((n, h), dtype), leaf=leaf), dtype, work=v)
    rho_hat = act.astype(np.float64).sum(axis=0) / m
    want = ref.sparse_ae_partials(x, W1, b1, W2, b2, np.empty((n, size), dtype), None, kl, leaf, rho_hat)
    got = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full((n, size), np.nan, dtype), ws, kl, leaf, rho_hat)
    assert_close(got, want, dtype, work=leaf * v, name="cupy stand-in, ρ̂ given")
    o = ref.sparse_ae_layout(v, h)["act"][0]
    np.testing.assert_array_equal(got[:, o:o + h], act)  # the first round's sums, bit for bit
    nodes, merges = cover_merges(1, 1 + n, n + 3)  # a run of blocks [1, 1 + n) of a larger tree
    merged = K.sparse_ae_partials(x, W1, b1, W2, b2, np.full((len(nodes), size), np.nan, dtype), ws, kl, leaf,
                                  rho_hat, merges)
    want = merge_rows(got.copy(), merges, np.empty((len(nodes), size), dtype))
    np.testing.assert_array_equal(merged, want)
    with pytest.raises(ValueError, match="give leaf"):
        K.sparse_ae_partials(x, W1, b1, W2, b2, np.empty(size, dtype), ws, kl, None, rho_hat, merges)
