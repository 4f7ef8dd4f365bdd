"""Every kernel set offers the reference's kernels; the CuPy set's modules import and build
their kernels' sources even where no GPU is (CuPy replaced by a recorder), so that a
slip in the GPU set's Python shows up on every CI machine, not only on a lent GPU."""
import sys
import types

import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar import kernels


def _public(module) -> set:
    return {n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))}


class _Recorder:
    """Stands for any CuPy object: calling it logs the call and returns another one."""

    def __init__(self, name, log):
        self._name, self._log = name, log

    def __call__(self, *args, **kwargs):
        self._log.append((self._name, args, kwargs))
        return _Recorder(self._name + "()", self._log)

    def __getattr__(self, attr):
        return _Recorder(f"{self._name}.{attr}", self._log)


@pytest.fixture
def cupy_recorder(monkeypatch):
    """A fresh import of aepar.kernels.cp against a stand-in ``cupy`` (and ``cupy_backends``);
    the calls it made at import time. The real modules (if any) come back after the test."""
    log = []
    stand_ins = ("cupy", "cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs")
    for name in [m for m in sys.modules if m in stand_ins or m.startswith(("cupy.", "cupy_backends.",
                                                                           "aepar.kernels.cp"))]:
        monkeypatch.delitem(sys.modules, name)
    for name in stand_ins:  # cuBLAS comes from cupy_backends (kernels/cp/gemm.py)
        fake = types.ModuleType(name)
        fake.__getattr__ = lambda attr, name=name: _Recorder(f"{name}.{attr}", log)
        monkeypatch.setitem(sys.modules, name, fake)
    monkeypatch.delattr(kernels, "cp", raising=False)  # the package's attribute, put back after
    cp_set = kernels.load("cupy")
    yield cp_set, log
    # what monkeypatch does not know of: the modules imported with the fake, and the
    # package attribute their import set
    for name in [m for m in sys.modules if m.startswith("aepar.kernels.cp")]:
        del sys.modules[name]
    if hasattr(kernels, "cp"):
        delattr(kernels, "cp")


@pytest.mark.parametrize("name", ["numba", "cupy"])
def test_every_set_offers_the_reference_kernels(name, cupy_recorder):
    module = cupy_recorder[0] if name == "cupy" else kernels.load(name)
    missing = _public(kernels.load("numpy")) - _public(module)
    assert not missing, f"the {name} set lacks {sorted(missing)}"


def test_the_cupy_set_builds_float_and_double_kernels(cupy_recorder):
    _, log = cupy_recorder
    raw = [args for name, args, _ in log if name == "cupy.RawKernel"]
    assert raw, "no RawKernel was built at import"
    sources = [args[0] for args in raw]
    floats = sum("typedef float T;" in s for s in sources)
    doubles = sum("typedef double T;" in s for s in sources)
    assert floats == doubles > 0, f"{floats} float and {doubles} double RawKernels"
    modules = [kwargs.get("name_expressions", []) for name, _, kwargs in log if name == "cupy.RawModule"]
    for names in modules:  # every templated kernel instantiated for both types
        assert sorted(n.replace("<float>", "<T>") for n in names if "<float>" in n) == \
            sorted(n.replace("<double>", "<T>") for n in names if "<double>" in n)
