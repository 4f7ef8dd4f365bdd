"""Numba's cache of the CPU kernels (kernels/nb/__init__.py): a directory keyed on the
sources and on the name the package was imported under."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# compile and cache one kernel, print the cache directory
STEP = ("import numpy as np; {imp}; p, g, m, v = (np.ones(5, np.float32) for _ in range(4)); "
        "k.adam_update(p, g, m, v, 1, 1e-3); print(k._keyed_cache_dir())")


def _run(imp, cwd, cache):
    return subprocess.run([sys.executable, "-c", STEP.format(imp=imp)], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, NUMBA_CACHE_DIR=str(cache)), timeout=300)


def test_kernels_cached_by_import_kernels_nb_from_a_checkout_do_not_break_aepar(tmp_path):
    """``import kernels.nb`` from a checkout's root caches kernels that name the module
    kernels.nb.update; loaded by aepar.kernels.nb where no ``kernels`` package is on the
    path they failed (ModuleNotFoundError). Each import name has its own directory."""
    top = _run("import kernels.nb as k", ROOT, tmp_path)
    assert top.returncode == 0, top.stderr
    installed = _run("import aepar, aepar.kernels.nb as k", tmp_path, tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert top.stdout.split()[-1] != installed.stdout.split()[-1]


# a parallel kernel (its threads are started by the loaded code) and one that calls BLAS
LOAD = ("import sys, numpy as np, aepar.kernels.nb as k; z = np.linspace(-3, 3, 4096); "
        "a = k.sigmoid_forward(z); "
        "y = k.conv2d_forward(z[:72].reshape(2, 1, 6, 6), z[:18].reshape(2, 1, 3, 3), z[:2]); "
        "hits = sum(k.activation._forward.stats.cache_hits.values()); "
        "print(hits, 'numba.np.arraymath' in sys.modules, a.sum().hex(), y.sum().hex())")


def test_cached_kernels_load_without_numbas_registries(tmp_path):
    """A cache hit loads the kernel's machine code and Numba's runtime only, not the
    compiler's registries (numba.np.arraymath and the rest, the larger part of the first
    load); a miss compiles them as before, and both give the same numbers."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    first, second = (subprocess.run([sys.executable, "-c", LOAD], cwd=tmp_path, capture_output=True, text=True,
                                    env=env, timeout=300) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    hits, registries, *numbers = first.stdout.split()
    assert (hits, registries) == ("0", "True")  # compiled: the compiler loads them
    hits, registries, *again = second.stdout.split()
    assert (hits, registries) == ("1", "False") and again == numbers
