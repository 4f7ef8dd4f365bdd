"""An optional HDF5 cache for arrays that are slow to build (decompressed or whitened data).

Caching is off unless a directory is given or ``$AEPAR_CACHE`` is set. Each key is one
file ``<key>-<hash>.h5`` holding the array and the full key; entries are written to a
temporary file and renamed into place, so concurrent writers (MPI ranks) and crashes
never leave a half-written entry, and an unreadable entry is rebuilt.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from aepar.errors import UserError

__all__ = ["cached_array", "resolve_cache_dir"]

ENV = "AEPAR_CACHE"


def resolve_cache_dir(cache_dir=None) -> Path | None:
    """The cache directory in use: the argument, else ``$AEPAR_CACHE``, else None (off)."""
    d = cache_dir if cache_dir is not None else os.environ.get(ENV) or None
    return None if d is None else Path(d)


def _entry(directory: Path, key: str) -> Path:
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", key)[:80]
    return directory / f"{stem}-{digest}.h5"


def _read(path: Path, key: str):
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("key") != key or "array" not in f:
                return None
            return f["array"][()]
    except (OSError, KeyError, ValueError):  # corrupt or foreign file: rebuild it
        return None


def _write(path: Path, key: str, array: np.ndarray):
    import h5py

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["key"] = key
            f.create_dataset("array", data=array)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cached_array(key: str, builder, cache_dir=None) -> np.ndarray:
    """Return ``builder()``, from the cache when an entry for ``key`` exists.

    Parameters
    ----------
    key : str
        Names the content: include everything the result depends on (source file, its
        size and mtime, parameters, a format version).
    builder : callable
        ``builder() -> array_like``, called on a miss (or always when caching is off).
    cache_dir : str or Path, optional
        Overrides ``$AEPAR_CACHE``; with neither, nothing is cached.

    Returns
    -------
    numpy.ndarray
    """
    directory = resolve_cache_dir(cache_dir)
    if directory is None:
        return np.asarray(builder())
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cache directory {directory} cannot be created ({e.strerror or e})") from None
    entry = _entry(directory, key)
    if entry.exists():
        hit = _read(entry, key)
        if hit is not None:
            return hit
    array = np.asarray(builder())
    try:
        _write(entry, key, array)
    except OSError as e:
        raise UserError(f"cache entry {entry} cannot be written ({e.strerror or e})") from None
    return array
