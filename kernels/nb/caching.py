"""Numba's on-disk cache of these kernels, adapted in two ways (:func:`adapt`).

Loads skip the compiler's registries. Before its first cache hit Numba refreshes them,
importing the implementations of all of Python and NumPy it can compile; machine code
loaded from the cache calls none of them, only Numba's runtime (NRT), which is started
instead. A miss compiles as usual (the compiler refreshes then).

Saves hold a lock. Numba keeps one index per kernel, from each compiled signature (and
CPU) to a numbered data file, and saves a new entry by reading the index, taking the
first free number and writing both back, without a lock. Two processes that compile
different signatures of one kernel at once (ranks holding groups of 3 and of 2 blocks,
nodes of two CPU models sharing a checkout, a float32 and a float64 run) could both take
number 1: the index then sent one signature to the other's machine code, and a later
run loaded it for the wrong types. Under the lock the second process reads the first's
entry and takes the next number.
"""
import errno
import os
import time
from functools import partial

try:
    import fcntl
except ImportError:  # not a POSIX system: Numba's saves as they are
    fcntl = None

__all__ = ["adapt", "LOCK_NAME"]

# one lock file per cache directory: a save takes milliseconds, so one kernel's save
# waiting for another's costs nothing worth a file per kernel
LOCK_NAME = "aepar-saves.lock"
# how long a save waits for the lock before it saves unlocked, as Numba does: a holder
# stuck on a file system (not a dead process: its locks go with it) never stops a run
LOCK_WAIT_S = 60.0


def adapt(kernel) -> None:
    """Give a Numba dispatcher both adaptations, once. A dispatcher without caching, or
    whose cache is not laid out as expected (another Numba), keeps Numba's own."""
    from numba.core.caching import FunctionCache

    cache = getattr(kernel, "_cache", None)
    if not isinstance(cache, FunctionCache):
        return
    if hasattr(cache, "_load_overload") and hasattr(cache, "_guard_against_spurious_io_errors"):
        cache.load_overload = partial(_load_without_registries, cache)
    cache_file = getattr(cache, "_cache_file", None)
    save = getattr(cache_file, "save", None)
    path = getattr(cache_file, "_cache_path", None)
    if fcntl is not None and save is not None and path and not isinstance(save, partial):
        cache_file.save = partial(_locked_save, save, path)


def _load_without_registries(cache, sig, target_context):
    """Numba's ``Cache.load_overload`` less its ``target_context.refresh()``."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)  # what loaded code needs: the runtime's functions
    with cache._guard_against_spurious_io_errors():
        return cache._load_overload(sig, target_context)


def _locked_save(save, cache_path, key, data):
    """Numba's ``IndexDataCacheFile.save`` under an exclusive lock on its directory's
    :data:`LOCK_NAME`: the index is read, given its new entry and written by one process
    at a time. After :data:`LOCK_WAIT_S` without the lock, or where the file system has
    no locks, the save goes on unlocked."""
    try:
        fd = os.open(os.path.join(cache_path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return save(key, data)  # an unwritable directory: Numba's own save, which fails there as before
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    break  # a file system without locks (NFS without its lock daemon): unlocked, as Numba saves
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)  # another process saves: a few milliseconds
        return save(key, data)
    finally:
        os.close(fd)  # and with it the lock
