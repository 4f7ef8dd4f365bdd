"""scipy's extensions loaded from their files alone (aepar.extensions), each in a fresh process."""
import subprocess
import sys

from tests.conftest import ROOT


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_numba_finds_the_blas_without_scipy_linalg_and_scipy_linalg_still_imports():
    out = _run(r"""
import sys
from aepar.extensions import preload_numba_blas
preload_numba_blas()
print("linalg after preload", "scipy.linalg" in sys.modules)
print("capi", len(sys.modules["scipy.linalg.cython_blas"].__pyx_capi__) > 100)
import numpy as np
from numba import njit

@njit
def dot(a, b):
    return np.dot(a, b)  # Numba's BLAS, through the preloaded table

rng = np.random.default_rng(0)
a, b = rng.random((30, 20)), rng.random((20, 10))
print("dot", np.allclose(dot(a, b), a @ b), "linalg after numba", "scipy.linalg" in sys.modules)
import scipy.linalg
from scipy.linalg import cython_blas
square = a[:20] + 20 * np.eye(20)
print("solve", np.allclose(scipy.linalg.solve(square, b), np.linalg.solve(square, b)),
      "same", cython_blas is sys.modules["scipy.linalg.cython_blas"])
""")
    assert "linalg after preload False" in out and "capi True" in out, out
    assert "dot True linalg after numba False" in out, out
    assert "solve True same True" in out, out


def test_a_module_not_found_gives_none_and_leaves_nothing_behind():
    out = _run(r"""
import sys
from aepar.extensions import from_file
print(from_file("scipy.linalg.no_such_module", register=True), "scipy.linalg.no_such_module" in sys.modules)
print(from_file("no_such_package.x"))
print(hasattr(from_file("scipy.optimize._lbfgsb"), "setulb"), "scipy.optimize" in sys.modules)
""")
    assert out.split("\n")[:3] == ["None False", "None", "True False"], out


def test_a_module_that_fails_to_load_is_taken_back_out_of_sys_modules(tmp_path, monkeypatch):
    import importlib.machinery

    from aepar.extensions import from_file

    (tmp_path / "halfpkg").mkdir()
    (tmp_path / "halfpkg" / "__init__.py").write_text("")
    (tmp_path / "halfpkg" / "bad.py").write_text("raise ImportError('planted')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(importlib.machinery, "EXTENSION_SUFFIXES", [".py"])  # a source file stands in
    assert from_file("halfpkg.bad", register=True) is None
    assert "halfpkg.bad" not in sys.modules and "halfpkg" not in sys.modules
