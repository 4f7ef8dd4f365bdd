"""Kernels written as source for the target CPU (the register tiles of :mod:`.rowprod` and
:mod:`.sparse_tiles`), compiled and jitted here.

Python's ``compile()`` of those hundred-odd sources was the larger part of importing the
kernels, in every process of every run, although the same source always gives the same
code object. So each code object is kept, marshalled, beside Numba's cache of these
kernels (the directory keyed on this package's sources, see ``__init__``), under a name
made of the source text, the file it is compiled as and the Python that compiled it; any
other source, file or Python is compiled afresh. Where the directory cannot be read or
written, every source is compiled as before.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
import types

from numba import njit
from numba.core import config

from .simd import JIT

__all__ = ["define", "compiled_as"]


def compiled_as(py, suffix: str, **flags):
    """njit(cache=True, nogil=True, **flags) of the plain function ``py`` under the name
    ``py.__name__ + suffix``: one loop compiled twice (with and without ``parallel``) needs
    two names, as Numba's cache index keys on the function's name and bytecode, not on
    its flags."""
    fn = types.FunctionType(py.__code__, py.__globals__, py.__name__ + suffix, py.__defaults__)
    fn.__qualname__ = fn.__name__
    return njit(cache=True, nogil=True, **flags)(fn)


def define(name: str, source: str, namespace: dict, filename: str):
    """Run generated ``source`` in ``namespace`` as if written in ``filename`` (so that Numba
    caches its kernel beside that file's), jit the function ``name`` it defines, bind it
    there too and return it."""
    scope = {}
    exec(_code(source, filename), namespace, scope)  # noqa: S102  (aepar's own generated source)
    fn = njit(**JIT)(scope[name])
    namespace[name] = fn
    return fn


def _code(source: str, filename: str):
    """``compile(source, filename, "exec")``, from the kept copy when there is one."""
    key = hashlib.sha256("\0".join((sys.implementation.cache_tag, filename, source)).encode()).hexdigest()[:32]
    folder = os.path.join(config.CACHE_DIR, "generated") if config.CACHE_DIR else None
    path = os.path.join(folder, key + ".marshal") if folder else None
    if path is not None:
        try:
            with open(path, "rb") as f:
                return marshal.load(f)
        except (OSError, EOFError, ValueError, TypeError):
            pass  # not kept yet, or unreadable: compiled below
    code = compile(source, filename, "exec", dont_inherit=True)
    if path is not None:
        try:
            os.makedirs(folder, exist_ok=True)
            # ranks starting together may all write it: each writes its own file, then renames
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=key, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    marshal.dump(code, f)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass  # a read-only install: compiled every time, as before
    return code
