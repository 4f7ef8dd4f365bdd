"""scipy's compiled extensions that aepar needs, loaded from their files alone.

Imported the usual way, ``scipy.optimize._lbfgsb`` and ``scipy.linalg.cython_blas`` first
run their packages' ``__init__``, which import every solver there and scipy's array-API
layer: a large part of a short run's start-up, in every process, for one extension each
(L-BFGS-B's routine, :mod:`aepar.optim`; the BLAS table that Numba's compiled products
import at their first call). Any surprise in these private layouts gives None, and the
caller the usual import.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

__all__ = ["from_file", "preload_numba_blas"]


def from_file(name: str, register: bool = False):
    """The extension module ``name`` (dotted, e.g. ``scipy.optimize._lbfgsb``) loaded from
    its file without its packages, or None. ``register``: also in ``sys.modules``, where a
    later ``import name`` finds it."""
    module = None
    try:
        top, *packages, leaf = name.split(".")
        folder = os.path.join(importlib.util.find_spec(top).submodule_search_locations[0], *packages)
        files = [os.path.join(folder, leaf + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        spec = importlib.util.spec_from_file_location(name, next(f for f in files if os.path.isfile(f)))
        module = importlib.util.module_from_spec(spec)
        if register:
            sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    except Exception:
        if module is not None and sys.modules.get(name) is module:
            del sys.modules[name]  # half-loaded: the usual import instead
        return None


def preload_numba_blas():
    """``scipy.linalg.cython_blas`` alone, for the kernels' BLAS calls (Numba's compiled
    code imports it at its first product, its compiler when it compiles). For a CLI's
    process only (:func:`aepar.comm.run_main`): a later ``import scipy.linalg`` works as
    before, but its ``cython_blas`` is then reached by import, not as the package's
    attribute."""
    if "scipy.linalg" not in sys.modules and "scipy.linalg.cython_blas" not in sys.modules:
        from_file("scipy.linalg.cython_blas", register=True)
