"""Numba's cache of the CPU kernels (kernels/nb/__init__.py): a directory keyed on the
sources and on the name the package was imported under, loads without the compiler's
registries and saves under a lock (kernels/nb/caching.py)."""
import os
import subprocess
import sys
import time
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


# one process of the race below: Numba's index write held back (so that the other process
# reads the index in the meantime), the two started together, then one signature of the
# Adam step compiled and saved
RACER = """
import os, sys, time
import numpy as np
import aepar.kernels.nb as k
from numba.core import caching

save_index = caching.IndexDataCacheFile._save_index
def held_back(self, overloads):
    time.sleep(2.0)
    save_index(self, overloads)
caching.IndexDataCacheFile._save_index = held_back

mine, other = sys.argv[1:3]
open(mine, "w").close()
while not os.path.exists(other):
    time.sleep(0.01)
dtype = np.float32 if sys.argv[3] == "float32" else np.float64
p, g, m, v = (np.linspace(0.5, 1.5, 7).astype(dtype) for _ in range(4))
k.adam_update(p, g, m, v, 1, 1e-3)
"""
# afterwards: both signatures from the cache, each computing its own dtype's step
LOADER = ("import numpy as np, aepar.kernels.nb as k, aepar.kernels.ref as ref\n"
          "for dtype in (np.float32, np.float64):\n"
          "    p, g, m, v = (np.linspace(0.5, 1.5, 7).astype(dtype) for _ in range(4))\n"
          "    q, h, n, w = (a.copy() for a in (p, g, m, v))\n"
          "    k.adam_update(p, g, m, v, 1, 1e-3); ref.adam_update(q, h, n, w, 1, 1e-3)\n"
          "    assert p.dtype == dtype and np.allclose(p, q, rtol=1e-6), (dtype, p, q)\n"
          "stats = k.update._adam_serial.stats\n"
          "print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))\n")


def test_two_processes_compiling_one_kernel_for_different_types_keep_both_cache_entries(tmp_path):
    """Numba saves a new signature by reading the kernel's index, taking the first free data
    file number and writing both back, unlocked: two processes saving different signatures
    at once both took number 1, and the index lost one signature's entry or sent it to the
    other's machine code (four processes compiling a small kernel for four types at once:
    a later run failed with "can't unbox array", summed wrongly without an error, or
    compiled again). aepar's saves hold a lock (kernels/nb/caching.py), so the
    second reads the first's entry; here the index write is held back 2 s to make the two
    overlap every time."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    a, b = tmp_path / "a.ready", tmp_path / "b.ready"
    racers = [subprocess.Popen([sys.executable, str(script), str(mine), str(other), dtype], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for mine, other, dtype in ((a, b, "float32"), (b, a, "float64"))]
    for racer in racers:
        _, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err[-2000:]
    loaded = subprocess.run([sys.executable, "-c", LOADER], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split() == ["2", "0"]  # both signatures loaded, none compiled again


# holds the save lock of a directory until its stdin closes
HOLDER = ("import fcntl, os, sys; fd = os.open(os.path.join(sys.argv[1], sys.argv[2]), os.O_RDWR | os.O_CREAT); "
          "fcntl.lockf(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")


def test_a_save_waits_for_the_lock_then_goes_on_without_it(tmp_path, monkeypatch):
    """A save waits while another process holds the directory's lock, and after
    LOCK_WAIT_S saves anyway (unlocked, as Numba's own save): a holder stuck on a file
    system must not stop a run."""
    from aepar.kernels.nb import caching

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), caching.LOCK_NAME],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(caching, "LOCK_WAIT_S", 0.3)
        saved = []
        started = time.monotonic()
        caching._locked_save(lambda key, data: saved.append((key, data)), str(tmp_path), "key", "data")
        waited = time.monotonic() - started
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert saved == [("key", "data")] and 0.3 <= waited < 5


def test_every_cached_kernel_of_the_set_saves_under_the_lock():
    """Every cached kernel of the numba set's modules, the generated tiles included, has
    the locked save (a kernel module the package's import did not reach would not)."""
    from functools import partial

    from numba.core.caching import FunctionCache
    from numba.core.dispatcher import Dispatcher

    import aepar.kernels.nb as nb

    kernels = [(name, kernel) for module_name, module in list(sys.modules.items())
               if module_name == nb.__name__ or module_name.startswith(nb.__name__ + ".")
               for name, kernel in vars(module).items()
               if isinstance(kernel, Dispatcher) and isinstance(kernel._cache, FunctionCache)]
    unlocked = [name for name, kernel in kernels if not isinstance(kernel._cache._cache_file.save, partial)]
    assert len(kernels) > 100 and not unlocked
