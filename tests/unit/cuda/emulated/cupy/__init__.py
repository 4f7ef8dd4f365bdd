"""A CPU stand-in for CuPy, for tests only: aepar's GPU kernel set (``aepar.kernels.cp``)
run where no GPU is, so that its Python, its launches and its kernels' arithmetic are
exercised on every machine (``make test-gpu-emulated``). It is not a GPU: a run on a real
one (``make test-gpu``) is still what shows the CUDA code right.

What it does as CuPy does:

- device arrays are :class:`ndarray`, a NumPy subclass in host memory; ``cupy.asarray``
  copies host arrays in, ``.get()`` and ``asnumpy`` copy out. A host (NumPy) array given to
  a kernel, a ufunc or a CuPy function other than ``asarray``/``array`` raises TypeError,
  as CuPy does. ``empty`` fills floats with NaN (and integers with a pattern): a result that
  depends on memory nobody wrote fails a test instead of passing by luck;
- ElementwiseKernel and ReductionKernel: their C bodies compiled as C++ (g++) with the
  type placeholders resolved as CuPy resolves them (a mismatch raises TypeError);
- RawKernel and RawModule: the CUDA source compiled as C++ with ``tests/unit/cuda/cuda_host.h``
  (blocks in turn, threads as threads where the kernel synchronises them); each argument is
  passed as cuLaunchKernel passes it, the bytes CuPy makes of it read as the parameter the
  kernel declares (a Python int is 8 bytes, a float a double);
- cuBLAS's sgemm/dgemm (``cupy_backends.cuda.libs.cublas``) on column-major views of the
  pointers it is given.

What it cannot show: CUDA's own math functions (the CPU's exp and log may differ in the
last bits), timing and races between blocks (blocks run one after another), the host's
implicit reads of device memory (``numpy.asarray`` of a device array works here and raises
on a GPU), NVRTC's dialect of C++.
"""
import numpy as _np

from . import cuda  # noqa: F401  (cupy.cuda)
from ._build import CompileException  # noqa: F401
from ._kernels import ElementwiseKernel, RawKernel, RawModule, ReductionKernel  # noqa: F401

__version__ = "13.0.0+emulated"
# the constructors that take host arrays (and copy them to the "device")
_FROM_HOST = {"asarray", "array", "asanyarray"}


class _Memory:
    def __init__(self, ptr):
        self.ptr = ptr


class ndarray(_np.ndarray):
    """A device array: NumPy's, in host memory, with CuPy's extra methods."""

    def get(self, stream=None, order="C", out=None):
        host = _np.array(self.view(_np.ndarray), copy=True, order=order)
        if out is None:
            return host
        out[...] = host
        return out

    def set(self, arr, stream=None):
        if isinstance(arr, ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        self.view(_np.ndarray)[...] = arr

    @property
    def data(self):
        return _Memory(self.__array_interface__["data"][0])

    @property
    def device(self):
        return cuda.Device(0)

    @property
    def __cuda_array_interface__(self):  # what tells a device array apart (aepar.comm stages these)
        c = self.flags.c_contiguous
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.__array_interface__["data"][0], False),
                "strides": None if c else self.strides, "version": 3}

    def __getitem__(self, key):  # an element is a 0-d device array, as CuPy gives it, not a host scalar
        return _on_device(super().__getitem__(key))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        _no_host(inputs + tuple(out or ()), ufunc.__name__)
        plain = [x.view(_np.ndarray) if isinstance(x, ndarray) else x for x in inputs]
        if out:
            kwargs["out"] = tuple(o.view(_np.ndarray) if isinstance(o, ndarray) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if out:
            return out[0] if len(out) == 1 else out
        return _on_device(result)

    def __array_function__(self, func, types, args, kwargs):
        # NumPy's functions given device arrays run CuPy's own: their results on the device
        _no_host(tuple(args) + tuple(kwargs.values()), func.__name__)
        out = kwargs.get("out")
        result = func._implementation(*_plain(args), **_plain(kwargs))  # on NumPy's own arrays: no dispatch within
        return out if out is not None else _on_device(result)


def _plain(values):
    """Device arrays as NumPy's (the same memory), through tuples, lists and dicts."""
    if isinstance(values, ndarray):
        return values.view(_np.ndarray)
    if isinstance(values, (tuple, list)):
        return type(values)(_plain(v) for v in values)
    if isinstance(values, dict):
        return {k: _plain(v) for k, v in values.items()}
    return values


def _no_host(values, what):
    """TypeError for a host array where CuPy takes only device arrays."""
    for v in values:
        if isinstance(v, (list, tuple)):
            _no_host(v, what)
        elif isinstance(v, _np.ndarray) and not isinstance(v, ndarray) and v.ndim > 0:
            raise TypeError(f"{what}: Unsupported type <class 'numpy.ndarray'> (a host array given to CuPy)")


def _on_device(result):
    """NumPy's results as CuPy gives them: arrays on the device, scalars as 0-d arrays."""
    if isinstance(result, ndarray):
        return result
    if isinstance(result, _np.ndarray):
        return result.view(ndarray)
    if isinstance(result, _np.generic):
        return _np.asarray(result).view(ndarray)
    if isinstance(result, tuple):
        return tuple(_on_device(r) for r in result)
    if isinstance(result, list):
        return [_on_device(r) for r in result]
    return result


def _wrap(name, fn):
    def call(*args, **kwargs):
        if name not in _FROM_HOST:
            _no_host(args + tuple(kwargs.values()), f"cupy.{name}")
        elif any(isinstance(a, _np.ndarray) and not isinstance(a, ndarray) for a in args[:1]):
            # a host array is copied to the device: later changes to it are not seen there
            return _np.array(args[0], *args[1:], **{"copy": True, **kwargs}).view(ndarray)
        return _on_device(fn(*args, **kwargs))
    call.__name__ = name
    return call


class _Namespace:
    """numpy.linalg and the like, their functions wrapped as the module's are."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        target = getattr(self._module, name)
        return _wrap(name, target) if callable(target) and not isinstance(target, type) else target


def _fill_unwritten(a):
    if a.dtype.kind == "f":
        a.fill(_np.nan)
    elif a.dtype.kind in "iu":
        a.view(_np.uint8).fill(0xA5)
    return a


def empty(shape, dtype=float, order="C"):
    return _fill_unwritten(_np.empty(shape, dtype, order).view(ndarray))


def empty_like(a, dtype=None, order="K", subok=None, shape=None):
    _no_host([a], "cupy.empty_like")
    return _fill_unwritten(_np.empty_like(a, dtype, order, shape=shape).view(ndarray))


def asnumpy(a, stream=None, order="C", out=None):
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    host = _np.asarray(a, order=order)
    if out is not None:
        out[...] = host
        return out
    return host


def get_array_module(*args):
    import sys
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


class _MemoryPool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self):
        pass

    def set_limit(self, size=None, fraction=None):
        pass


_POOL = _MemoryPool()


def get_default_memory_pool():
    return _POOL


def get_default_pinned_memory_pool():
    return _POOL


def __getattr__(name):
    target = getattr(_np, name)
    if name in ("linalg", "random", "fft"):
        return _Namespace(target)
    if callable(target) and not isinstance(target, type):
        return _wrap(name, target)
    return target
