"""Every CUDA source of the GPU set compiles with NVRTC, the compiler CuPy hands a RawKernel
or RawModule to: the dialect the emulated GPU (which compiles them as C++) cannot check.
NVRTC comes from NVIDIA's ``nvidia-cuda-nvrtc`` wheel (the test extra, on Linux) and needs
no GPU; the sources are collected from the set as imported against the emulated CuPy."""
import ctypes
import gc
import importlib.util
from pathlib import Path

import pytest

# the GPUs aepar's GPU set was run on or is meant for: A100 (8.0), H100/H200 (9.0)
ARCHS = ("compute_80", "compute_90")


def _nvrtc():
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(Path(root).glob("cu*/lib/libnvrtc.so.*")):
            return ctypes.CDLL(str(lib))
    pytest.skip("no NVRTC (pip install nvidia-cuda-nvrtc: part of aepar's test extra on Linux)")


def compile_log(nvrtc, code: str, name: str, options, kernels=()) -> tuple[int, str]:
    """(NVRTC's result, its log) for ``code``, each of ``kernels`` named as CuPy names a
    RawModule's name expressions (so that a template's instances are compiled: a template
    alone is not, and an error in its body passed unseen)."""
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None) == 0
    try:
        for kernel in kernels:
            assert nvrtc.nvrtcAddNameExpression(prog, kernel.encode()) == 0
        opts = [o.encode() for o in options]
        rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        return rc, log.value.decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def test_every_cuda_source_of_the_set_compiles(emulated_cupy):
    nvrtc = _nvrtc()
    import importlib

    from cupy import _kernels
    importlib.import_module("aepar.kernels.cp")
    sources = {}  # code -> (its kernels' names, options): kernels of one source compile once
    for obj in gc.get_objects():
        if type(obj) in (_kernels.RawKernel, _kernels.RawModule):  # (type(): a dead weak proxy raises in isinstance)
            named = [obj.name] if type(obj) is _kernels.RawKernel else obj.names
            sources.setdefault(obj.code, (set(), obj.options))[0].update(named)
    names = " ".join(" ".join(sorted(kernels)) for kernels, _ in sources.values())
    for kernel in ("rows_times_f32", "aepar_rbm_stack_blocks_float", "aepar_dense_dz_blocks_float",
                   "aepar_rows_tree_sum_float", "aepar_total_blocks_sq_diff_float", "aepar_sum_partials_blocks"):
        assert kernel in names, f"{kernel} not among the set's sources"
    failed = []
    for code, (kernels, options) in sources.items():
        name = ",".join(sorted(kernels))
        for arch in ARCHS:
            rc, log = compile_log(nvrtc, code, name[:60], (f"-arch={arch}", *options), sorted(kernels))
            if rc != 0:
                failed.append(f"{name} ({arch}): {log.strip()[:800]}")
    assert not failed, "\n".join(failed)
    bad = compile_log(nvrtc, 'extern "C" __global__ void f(float *x) { x[0] = undefined_name; }', "f", ())
    assert bad[0] != 0 and "undefined_name" in bad[1]  # the check can fail
    bad = compile_log(nvrtc, "template <typename T> __global__ void g(T *x) { x[0] = 1 }", "g", (), ["g<float>"])
    assert bad[0] != 0  # in a template's instance too
