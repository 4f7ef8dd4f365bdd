"""kernels/cp/rowprod.cu's arithmetic on the CPU: its kernels compiled as C++ with
tests/unit/cuda/cuda_host.h (each thread a std::thread, __syncthreads a barrier) and
launched as kernels/cp/rowprod.py launches them. Without a GPU this is what can be shown:
the same bits as the CPU's row kernels (kernels/nb/rowprod.py, the same FMA chains in the
same order), each row's result the same whatever rows share the call, and the blocks'
tree the same as the CPU's. Whether it compiles for a GPU: nvcc, where it is installed."""
import ctypes
import importlib.util
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar.kernels.nb.rowprod import block_outer_sum, rows_times, rows_times_t
from aepar.rows import tree_merges, tree_top
from tests.conftest import HAVE_GPU

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "cp" / "rowprod.cu"
HOST = Path(__file__).resolve().parent / "cuda" / "rowprod_host.cpp"
# a kernel parameter's C type -> (what CuPy must be given for it, the ctypes type on the host)
PARAMETERS = {"const float*": (np.float32, ctypes.c_void_p), "float*": (np.float32, ctypes.c_void_p),
              "const long long*": (np.int64, ctypes.c_void_p), "long long": (np.int64, ctypes.c_longlong),
              "int": (np.int32, ctypes.c_int)}


def signatures(code: str) -> dict:
    """{kernel: [C type of each parameter]} of the extern "C" kernels in CUDA source."""
    found = {}
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', code):
        found[name] = [" ".join(p.replace("__restrict__", "").split()[:-1]).replace(" *", "*")
                       for p in params.split(",")]
    return found


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """kernels/cp/rowprod.py, loaded with a stand-in for CuPy whose RawModule runs the
    kernels on the CPU, each argument checked against the kernel's parameter types (what a
    real launch would read as another type). Arrays are NumPy's."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the kernels for the CPU")
    lib = tmp_path_factory.mktemp("cuda") / "rowprod_host.so"
    subprocess.run(["g++", "-std=c++20", "-O2", "-ffp-contract=off", "-pthread", "-shared", "-fPIC", str(HOST),
                    "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))

    class RawModule:
        def __init__(self, code, options=()):
            assert "--fmad=false" in options  # no contraction may change a rounding
            self.kernels = signatures(code)

        def get_function(self, name):
            params = self.kernels[name]
            host = getattr(so, "host_" + name)
            host.argtypes = [ctypes.c_int] * 4 + [PARAMETERS[p][1] for p in params]

            def launch(grid, block, args):
                assert len(args) == len(params), name
                values = []
                for arg, param in zip(args, params):
                    want = PARAMETERS[param][0]
                    if param.endswith("*"):
                        assert isinstance(arg, np.ndarray) and arg.dtype == want and arg.flags.c_contiguous, param
                        values.append(arg.ctypes.data)
                    else:
                        assert type(arg) is want, (name, param, type(arg))
                        values.append(int(arg))
                (gx, gy), (bx, by) = (tuple(grid) + (1,))[:2], (tuple(block) + (1,))[:2]
                host(gx, gy, bx, by, *values)
            return launch

    cupy = types.ModuleType("cupy")
    cupy.RawModule, cupy.empty, cupy.asarray = RawModule, np.empty, np.asarray
    spec = importlib.util.spec_from_file_location("aepar.kernels.cp.rowprod", ROOT / "kernels" / "cp" / "rowprod.py")
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "cupy", cupy)
        spec.loader.exec_module(module)
    return module


def gpu_rows_times(gpu, a, W, transposed=False):
    """a @ W (or a @ W.T) through kernels/cp/rowprod.py, into an output of NaNs: an element
    the launch's grid misses stays NaN."""
    out = np.full((a.shape[0], W.shape[0] if transposed else W.shape[1]), np.nan, np.float32)
    return (gpu.rows_times_t if transposed else gpu.rows_times)(a, W, out)


def gpu_block_outer_sum(gpu, A, D, starts, merges, alphas):
    return gpu.block_outer_sum(A, D, starts, merges, alphas, np.full((A.shape[1], D.shape[1]), np.nan, np.float32))


def draw(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("M, K, N", [(13, 40, 70), (100, 33, 20), (1, 16, 64), (70, 5, 130)])
def test_rows_times_has_the_cpu_kernels_bits(gpu, M, K, N):
    rng = np.random.default_rng(M * K + N)
    a, W = draw(rng, M, K), draw(rng, K, N)
    want = rows_times(a, W, np.empty((M, N), np.float32))
    assert np.array_equal(gpu_rows_times(gpu, a, W).view(np.uint32), want.view(np.uint32))
    Wt = np.ascontiguousarray(W.T)  # (N, K): a @ Wt.T is a @ W
    want_t = rows_times_t(a, Wt, np.empty((M, N), np.float32))
    assert np.array_equal(gpu_rows_times(gpu, a, Wt, transposed=True).view(np.uint32), want_t.view(np.uint32))


def test_a_rows_result_does_not_depend_on_the_rows_beside_it(gpu):
    rng = np.random.default_rng(5)
    a, W = draw(rng, 100, 50), draw(rng, 50, 90)
    whole = gpu_rows_times(gpu, a, W)
    for lo, hi in ((0, 13), (13, 25), (87, 100), (40, 41)):
        part = gpu_rows_times(gpu, np.ascontiguousarray(a[lo:hi]), W)
        assert np.array_equal(part.view(np.uint32), whole[lo:hi].view(np.uint32))


@pytest.mark.parametrize("sizes", [(25,) * 8, (7, 6, 12, 1, 14, 10), (40,), (3, 17)])
def test_block_outer_sum_has_the_cpu_kernels_bits(gpu, sizes):
    rng = np.random.default_rng(sum(sizes))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    A, D = draw(rng, starts[-1], 70), draw(rng, starts[-1], 30)
    count = len(sizes)
    merges = tree_merges(tree_top(count), 0, count)
    alphas = [0.01] * (count - 1) + [1.0]  # one block left unscaled, as alpha 1 skips the multiply
    want = block_outer_sum(A, D, starts, merges, alphas, np.empty((70, 30), np.float32))
    got = gpu_block_outer_sum(gpu, A, D, starts, merges, alphas)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_block_outer_sum_adds_in_the_tree_given(gpu):
    # the same blocks in two trees: other sums, each the CPU's
    rng = np.random.default_rng(9)
    starts = np.arange(0, 41, 10)
    A, D = draw(rng, 40, 20), draw(rng, 40, 20)
    outs = []
    for merges in ([0, 1, 0, 2], [0, 0, 0, 3]):
        want = block_outer_sum(A, D, starts, merges, [1.0] * 4, np.empty((20, 20), np.float32))
        got = gpu_block_outer_sum(gpu, A, D, starts, merges, [1.0] * 4)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        outs.append(got)
    assert not np.array_equal(outs[0], outs[1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_kernels_compile_for_a_gpu(tmp_path):
    done = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_80", "--fmad=false", "-c", str(SOURCE), "-o",
                           str(tmp_path / "rowprod.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")
@pytest.mark.parametrize("M, K, N", [(13, 784, 1000), (100, 1000, 500), (100, 250, 30)])
def test_on_a_gpu_the_kernels_give_the_cpu_kernels_bits(M, K, N):
    import cupy as cp

    from aepar.kernels.cp import rowprod as gpu

    rng = np.random.default_rng(M + K + N)
    a, W = draw(rng, M, K), draw(rng, K, N)

    def same(got, want):
        return np.array_equal(cp.asnumpy(got).view(np.uint32), want.view(np.uint32))

    assert same(gpu.rows_times(cp.asarray(a), cp.asarray(W)), rows_times(a, W, np.empty((M, N), np.float32)))
    Wt = np.ascontiguousarray(W.T)
    assert same(gpu.rows_times_t(cp.asarray(a), cp.asarray(Wt)), rows_times_t(a, Wt, np.empty((M, N), np.float32)))
    starts = np.linspace(0, M, 9).astype(np.int64)
    merges, alphas = tree_merges(tree_top(8), 0, 8), [0.01] * 8
    D = draw(rng, M, N)
    want = block_outer_sum(a, D, starts, merges, alphas, np.empty((K, N), np.float32))
    got = gpu.block_outer_sum(cp.asarray(a), cp.asarray(D), starts, merges, alphas, cp.empty((K, N), np.float32))
    assert same(got, want)
