"""CuPy's user-defined kernels on the CPU: their C/CUDA code compiled as C++ by :mod:`._build`."""
import ctypes
import re

import numpy as np

from ._build import build

# CuPy's type names -> C types
C_NAMES = {"float32": "float", "float64": "double", "float": "double", "int8": "signed char", "uint8": "unsigned char",
           "int16": "short", "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int",
           "int64": "long long", "uint64": "unsigned long long", "bool": "bool", "int": "long long",
           "double": "double"}
_C_OF_DTYPE = {np.dtype(n): c for n, c in C_NAMES.items() if n not in ("float", "int", "double")}
_RAW = """
template <typename T> struct aepar_raw {
    T* p; long long n;
    T& operator[](long long i) const { return p[i]; }
    long long size() const { return n; }
};
struct aepar_ind { long long n; long long size() const { return n; } };
"""


def _device_array():
    from . import ndarray
    return ndarray


class _Param:
    def __init__(self, text):
        words = text.split()
        self.raw = words[0] == "raw"
        words = words[1:] if self.raw else words
        if len(words) != 2:
            raise ValueError(f"cannot read the parameter {text!r}")
        self.type, self.name = words
        self.placeholder = self.type not in C_NAMES


def _params(text):
    return [_Param(p) for p in text.split(",") if p.strip()]


def _is_array(a):
    return isinstance(a, np.ndarray)


def _check_device(args, name):
    ndarray = _device_array()
    for a in args:
        if _is_array(a) and not isinstance(a, ndarray):
            raise TypeError(f"{name}: Unsupported type <class 'numpy.ndarray'> (a host array given to a kernel)")


def _scalar_dtype(v):
    if isinstance(v, (bool, np.bool_)):
        return np.dtype(bool)
    if isinstance(v, int):
        return np.dtype(np.int64)
    if isinstance(v, float):
        return np.dtype(np.float64)
    raise TypeError(f"Unsupported type {type(v)}")


def _resolve(params, args, name, reduce_type=None):
    """{placeholder: dtype}, as CuPy decides it: from the arrays (and NumPy scalars) bound to
    it, which must agree; from a Python scalar only where nothing else binds it."""
    types = {}
    for p, a in zip(params, args):
        if p.placeholder and a is not None and isinstance(a, (np.ndarray, np.generic)):
            if types.setdefault(p.type, a.dtype) != a.dtype:
                raise TypeError(f"{name}: Type is mismatched. {p.name} {a.dtype} {types[p.type]} ({p.type})")
    for p, a in zip(params, args):
        if p.placeholder and p.type not in types and a is not None:
            types[p.type] = _scalar_dtype(a)
    for p in params:
        if p.placeholder and p.type not in types:
            raise TypeError(f"{name}: the type of {p.name} ({p.type}) cannot be decided")
    return types


def _dtype(p, types):
    return types[p.type] if p.placeholder else np.dtype(p.type if p.type not in ("float", "int", "double")
                                                       else {"float": "float64", "int": "int64",
                                                             "double": "float64"}[p.type])


def _typedefs(types):
    return "".join(f"typedef {_C_OF_DTYPE[dt]} {name};\n" for name, dt in types.items())


def _c(p):
    return p.type if p.placeholder else C_NAMES[p.type]


class _PerTypes:
    """A kernel's library per set of resolved types, its source written and built once."""

    def _library(self, types):
        key = tuple(types.items())
        built = self.__dict__.setdefault("_built", {})
        if key not in built:
            built[key] = build(self._source(types))
        return built[key]


class ElementwiseKernel(_PerTypes):
    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, loop_prep="", after_loop="", **kwargs):
        self.in_params, self.out_params = _params(in_params), _params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self.loop_prep, self.after_loop = loop_prep, after_loop
        self.no_return, self.return_tuple = no_return, return_tuple

    def _source(self, types):
        params = self.in_params + self.out_params
        body = []
        for k, p in enumerate(params):
            c = _c(p)
            if p.raw:
                body.append(f"aepar_raw<{c}> {p.name}{{({c}*)_args[{k}], _sizes[{k}]}};")
            elif k < len(self.in_params):
                body.append(f"const {c} {p.name} = (({c}*)_args[{k}])[i];")
            else:
                body.append(f"{c}& {p.name} = (({c}*)_args[{k}])[i];")
        source = (f"#include <cuda_host.h>\n{_typedefs(types)}{_RAW}{self.preamble}\n"
                  f'extern "C" void aepar_elementwise(long long n, void** _args, const long long* _sizes) {{\n'
                  f"    const aepar_ind _ind{{n}};\n    {self.loop_prep}\n"
                  f"    for (long long i = 0; i < n; ++i) {{\n        " + "\n        ".join(body) +
                  f"\n        {self.operation};\n    }}\n    {self.after_loop}\n}}\n")
        return source

    def __call__(self, *args, size=None, block_size=None, stream=None):
        n_in, n_out = len(self.in_params), len(self.out_params)
        if len(args) not in (n_in, n_in + n_out):
            raise TypeError(f"{self.name}: wrong number of arguments: {len(args)} (takes {n_in} or {n_in + n_out})")
        outs = list(args[n_in:]) or [None] * n_out
        args = list(args[:n_in]) + outs
        _check_device(args, self.name)
        params = self.in_params + self.out_params
        types = _resolve(params, args, self.name)
        shaped = [a.shape for p, a in zip(params, args) if not p.raw and _is_array(a)]
        if shaped:
            shape = np.broadcast_shapes(*shaped)
            if size is not None:
                raise ValueError(f"{self.name}: size given with array arguments")
        elif size is None:
            raise ValueError(f"{self.name}: loop size is undecided (no array arguments and no size)")
        else:
            shape = (int(size),)
        ndarray = _device_array()
        buffers, write_back = [], []
        for k, (p, a) in enumerate(zip(params, args)):
            dt = _dtype(p, types)
            if k >= n_in and a is None:
                if p.raw:
                    raise TypeError(f"{self.name}: the raw output {p.name} must be given")
                a = args[k] = np.empty(shape, dt).view(ndarray)
            if p.raw:
                host = a.view(np.ndarray)
                if host.dtype != dt:
                    raise TypeError(f"{self.name}: Type is mismatched. {p.name} {host.dtype} {dt}")
                buf = np.ascontiguousarray(host)
                write_back.append((host, buf))
            elif k < n_in:
                host = a.view(np.ndarray) if _is_array(a) else np.asarray(a, dt)
                buf = np.ascontiguousarray(np.broadcast_to(host.astype(dt, copy=False), shape))
            else:
                host = a.view(np.ndarray)
                if host.dtype != dt:
                    raise TypeError(f"{self.name}: Type is mismatched. {p.name} {host.dtype} {dt}")
                if host.shape != shape:
                    raise ValueError(f"{self.name}: out shape {host.shape} is not the broadcast shape {shape}")
                buf = np.ascontiguousarray(host)
                write_back.append((host, buf))
            buffers.append(buf)
        n = int(np.prod(shape))
        pointers = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        sizes = (ctypes.c_longlong * len(buffers))(*[b.size for b in buffers])
        if n:
            self._library(types).aepar_elementwise(ctypes.c_longlong(n), pointers, sizes)
        for host, buf in write_back:
            if buf is not host:  # a strided output was worked on as a contiguous copy
                host[...] = buf
        if self.no_return:
            return None
        results = args[n_in:]
        return results[0] if n_out == 1 and not self.return_tuple else tuple(results)


class ReductionKernel(_PerTypes):
    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name="reduce_kernel",
                 reduce_type=None, reduce_dims=True, preamble="", options=(), **kwargs):
        self.in_params, self.out_params = _params(in_params), _params(out_params)
        self.map_expr, self.reduce_expr, self.post_map_expr = map_expr, reduce_expr, post_map_expr
        self.identity, self.name, self.reduce_type, self.preamble = identity, name, reduce_type, preamble

    def _source(self, types):
        n_in = len(self.in_params)
        reduce_c = C_NAMES[self.reduce_type] if self.reduce_type else _c(self.out_params[0])
        loads = "\n            ".join(f"const {_c(p)} {p.name} = (({_c(p)}*)_args[{k}])[_o * _nred + _r];"
                                       for k, p in enumerate(self.in_params))
        # the post-map sees the inputs too (CuPy's macros read them at the last index loaded)
        stores = "\n        ".join(
            [f"const {_c(p)} {p.name} = _nred ? (({_c(p)}*)_args[{k}])[_o * _nred + _nred - 1] : {_c(p)}();"
             for k, p in enumerate(self.in_params)] +
            [f"{_c(p)}& {p.name} = (({_c(p)}*)_args[{n_in + k}])[_o];" for k, p in enumerate(self.out_params)])
        source = (f"#include <cuda_host.h>\n{_typedefs(types)}typedef {reduce_c} _type_reduce;\n{self.preamble}\n"
                  f'extern "C" void aepar_reduction(long long _nout, long long _nred, void** _args) {{\n'
                  f"    for (long long _o = 0; _o < _nout; ++_o) {{\n"
                  f"        _type_reduce _acc = (_type_reduce)({self.identity});\n"
                  f"        for (long long _r = 0; _r < _nred; ++_r) {{\n            {loads}\n"
                  f"            const _type_reduce _mapped = (_type_reduce)({self.map_expr});\n"
                  f"            {{ const _type_reduce a = _acc, b = _mapped; _acc = ({self.reduce_expr}); }}\n"
                  f"        }}\n        {stores}\n"
                  f"        {{ const _type_reduce a = _acc; {self.post_map_expr}; }}\n    }}\n}}\n")
        return source

    def __call__(self, *args, out=None, axis=None, keepdims=False, stream=None):
        n_in = len(self.in_params)
        if len(args) != n_in:
            raise TypeError(f"{self.name}: wrong number of arguments: {len(args)} (takes {n_in})")
        _check_device(list(args) + [out], self.name)
        params = self.in_params + self.out_params
        types = _resolve(params, list(args) + [out], self.name)
        shaped = [a.shape for a in args if _is_array(a)]
        shape = np.broadcast_shapes(*shaped) if shaped else ()
        axes = tuple(range(len(shape))) if axis is None else tuple(
            a % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,)))
        kept = [d for d in range(len(shape)) if d not in axes]
        out_shape = tuple(1 if d in axes else shape[d] for d in range(len(shape))) if keepdims else \
            tuple(shape[d] for d in kept)
        nout, nred = int(np.prod([shape[d] for d in kept])), int(np.prod([shape[d] for d in axes]))
        buffers = []
        for p, a in zip(self.in_params, args):
            dt = _dtype(p, types)
            host = a.view(np.ndarray) if _is_array(a) else np.asarray(a, dt)
            full = np.broadcast_to(host.astype(dt, copy=False), shape)
            buffers.append(np.ascontiguousarray(np.moveaxis(full, axes, range(len(kept), len(shape)))
                                                if shape else full).reshape(nout, nred))
        ndarray = _device_array()
        dt = _dtype(self.out_params[0], types)
        if out is None:
            out = np.empty(out_shape, dt).view(ndarray)
        elif out.shape != out_shape or out.dtype != dt:
            raise ValueError(f"{self.name}: out {out.shape} {out.dtype} is not {out_shape} {dt}")
        result = np.empty(nout, dt)
        buffers.append(result)
        pointers = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        self._library(types).aepar_reduction(ctypes.c_longlong(nout), ctypes.c_longlong(nred), pointers)
        out.view(np.ndarray)[...] = result.reshape(out_shape)
        return out


class _Function:
    """One kernel of a compiled module, launched as cuLaunchKernel would launch it."""

    def __init__(self, library, index, name, threaded):
        self.name, self.threaded = name, threaded
        self._launch = getattr(library, f"aepar_launch_{index}")
        sizes = (ctypes.c_longlong * 256)()
        count = getattr(library, f"aepar_params_{index}")(sizes)
        self.sizes = list(sizes[:count])

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        if shared_mem:
            raise NotImplementedError("dynamic shared memory is not emulated")
        dims = [int(d) for d in _dim3(grid) + _dim3(block)]
        if not isinstance(args, tuple):
            raise TypeError(f"{self.name}: args must be a tuple, got {type(args).__name__}")
        if len(args) != len(self.sizes):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.sizes)} parameters")
        _check_device(args, self.name)
        keep = []
        for k, (a, size) in enumerate(zip(args, self.sizes)):
            if _is_array(a):
                if size != -1:
                    raise TypeError(f"{self.name}: argument {k} is an array, the parameter a {size}-byte value")
                keep.append(ctypes.c_void_p(a.__array_interface__["data"][0]))
                continue
            if size == -1:
                raise TypeError(f"{self.name}: argument {k} ({type(a).__name__}) is a value, the parameter a pointer")
            value = np.asarray(a, a.dtype if isinstance(a, np.generic) else _scalar_dtype(a)).tobytes()
            if len(value) < size:  # the kernel would read past what was passed
                raise TypeError(f"{self.name}: argument {k} has {len(value)} bytes, the parameter {size}")
            keep.append(ctypes.create_string_buffer(value, max(len(value), 8)))
        pointers = (ctypes.c_void_p * max(1, len(keep)))(*[ctypes.addressof(b) for b in keep])
        self._launch(ctypes.c_int(self.threaded), (ctypes.c_int * 6)(*dims), pointers)


def _dim3(d):
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    if not 1 <= len(d) <= 3 or any(int(x) < 1 for x in d):
        raise ValueError(f"invalid grid or block {d}")
    return d + (1,) * (3 - len(d))


def _module(code, names):
    """The library of ``code`` with a launcher and a parameter table per kernel name."""
    parts = [f"#include <cuda_host.h>\n{code}\n"]
    for i, name in enumerate(names):
        grid_block = "{d[0], d[1], d[2]}, {d[3], d[4], d[5]}"
        parts.append(f'extern "C" void aepar_launch_{i}(int threaded, const int* d, void** args) {{\n'
                     f"    aepar_launch_from(threaded != 0, &{name}, {grid_block}, args);\n}}\n"
                     f'extern "C" int aepar_params_{i}(long long* sizes) {{ return aepar_params(&{name}, sizes); }}\n')
    return build("".join(parts))


def _bodies(code):
    """{function name: its body's text} of the source's functions (a brace-matched scan)."""
    bodies = {}
    for m in re.finditer(r"\b(\w+)\s*\([^;{)]*(?:\([^)]*\)[^;{)]*)*\)\s*\{", code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        bodies.setdefault(m.group(1), code[m.end():i])
    return bodies


def _synchronises(code, kernel):
    """Whether the kernel (or a function it calls) has __syncthreads: only then must its
    threads run as fibers. True where the scan cannot tell."""
    bodies = _bodies(code)
    syncing = {name for name, body in bodies.items() if "__syncthreads" in body}
    while True:  # and whatever calls a function that synchronises
        more = {name for name, body in bodies.items()
                if name not in syncing and any(re.search(rf"\b{s}\s*[<(]", body) for s in syncing)}
        if not more:
            break
        syncing |= more
    name = kernel.split("<")[0].strip()
    return name in syncing or name not in bodies


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if code is None:
            with open(path) as f:
                code = f.read()
        self.code, self.options = code, tuple(options)
        self.names = list(name_expressions or re.findall(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(', code))
        self._library, self._functions = None, {}

    def get_function(self, name):
        if name not in self.names:
            raise KeyError(f"{name} is not a kernel of this module (kernels: {', '.join(self.names)})")
        if self._library is None:
            self._library = _module(self.code, self.names)
        if name not in self._functions:  # kept: scanning the source for barriers costs more than a launch
            self._functions[name] = _Function(self._library, self.names.index(name), name,
                                               _synchronises(self.code, name))
        return self._functions[name]


class RawKernel:
    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False):
        self.code, self.name, self.options = code, name, tuple(options)
        self._module = RawModule(code=code, options=options, name_expressions=[name])

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        self._module.get_function(self.name)(grid, block, args, shared_mem=shared_mem)
