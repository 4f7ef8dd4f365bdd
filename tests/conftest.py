"""Shared fixtures: fixed seeds, the kernel sets to compare, an mpirun launcher."""
import aepar  # noqa: F401  (first: BLAS/Numba threads per process before numpy loads)
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# no metrics.png/reconstructions.png in the suite's many short runs (matplotlib's import alone
# is about half a second); tests/integration/test_outputs.py turns them on
os.environ.setdefault("AEPAR_PLOTS", "0")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# AEPAR_EMULATED_GPU=1: `import cupy` finds tests/unit/cuda/emulated's CPU stand-in for CuPy,
# so that the GPU tests run aepar's GPU kernel set where there is no GPU (make test-gpu-emulated)
EMULATED_GPU = os.environ.get("AEPAR_EMULATED_GPU", "") == "1"
EMULATED_CUPY = str(ROOT / "tests" / "unit" / "cuda" / "emulated")
if EMULATED_GPU:
    sys.path.insert(0, EMULATED_CUPY)
    # the commands the tests start (mpirun's ranks) import it too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EMULATED_CUPY, os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="module")
def emulated_cupy():
    """The CPU stand-in for CuPy (tests/unit/cuda/emulated), imported as ``cupy`` for one
    module's tests and forgotten afterwards, with any of aepar's GPU set imported against it
    (unless the whole run uses it)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the emulated GPU's kernels")

    def ours(name):
        return name.split(".")[0] in ("cupy", "cupy_backends") or name.startswith("aepar.kernels.cp")
    before = {name: mod for name, mod in sys.modules.items() if ours(name)}
    sys.path.insert(0, EMULATED_CUPY)
    try:
        for name in before:
            del sys.modules[name]
        yield importlib.import_module("cupy")
    finally:
        sys.path.remove(EMULATED_CUPY)
        for name in [n for n in sys.modules if ours(n)]:
            del sys.modules[name]
        sys.modules.update(before)


def _have_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()


def _cpu_fma() -> bool:
    from aepar.kernels.nb.simd import hardware_fma

    return hardware_fma()


# the CPU kernels' bits are the GPU's (the same FMA chains) only where the CPU has FMA:
# without it each product is rounded before its sum (kernels.nb.simd.hardware_fma)
CPU_FMA = _cpu_fma()
needs_cpu_fma = pytest.mark.skipif(not CPU_FMA, reason="this CPU has no FMA: its kernels round each product "
                                                      "before its sum, the GPU's do not")


def is_note(line: str) -> bool:
    """Whether a line of a command's output is aepar's note on the machine (crowded threads,
    a CPU without FMA): not one of the lines a refusal of bad input is counted by."""
    return line.startswith("aepar: note:")

# The kernel sets checked against the NumPy oracle; cupy only where a GPU is present.
COMPARED_SETS = ["numba"] + (["cupy"] if HAVE_GPU else [])


def gpu_rows(sizes) -> tuple[list[int], int]:
    """Block sizes written about a bound of 64 rows, scaled to the GPU set's bound
    (``kernels.cp.rowprod.MAX_ROWS``: up to it a block takes the row kernels), so that they
    still fall on either side of it; and the bound. Imports the GPU set (CuPy or its
    emulated stand-in)."""
    bound = importlib.import_module("aepar.kernels.cp.rowprod").MAX_ROWS
    return [n * bound // 64 for n in sizes], bound


def kernel_set_params():
    """pytest params for every non-reference kernel set; cupy is skipped with a reason."""
    return [pytest.param("numba", id="numba"),
            pytest.param("cupy", id="cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")])]


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def mpirun_cmd():
    """The launcher the Makefile exported, else mpirun next to this Python or on PATH.

    None (the caller skips) only for a plain ``pytest``: no MPIRUN, not CI, and no mpirun
    anywhere. Where a launcher was expected (MPIRUN set, or CI=true) and none runs, the
    test fails: a skipped MPI test would pass ``make test`` without testing MPI at all.
    """
    launcher = os.environ.get("MPIRUN", "").split()
    if launcher:
        if shutil.which(launcher[0]) is None:
            pytest.fail(f"MPIRUN={os.environ['MPIRUN']!r}: {launcher[0]} is not an executable program "
                        "(make venv installs .venv/bin/mpirun; MPI=system needs mpirun on PATH)", pytrace=False)
        return launcher
    here = Path(sys.executable).parent / "mpirun"
    exe = shutil.which(str(here)) or shutil.which("mpirun")
    if exe:
        return [exe, "--oversubscribe"]
    if _ci():
        pytest.fail(f"CI={os.environ['CI']!r} but no mpirun was found (not next to {sys.executable}, not on "
                    "PATH): the MPI tests must run in CI", pytrace=False)
    return None


# what Open MPI's launcher prints, now and then, when it fails to start (before any rank)
LAUNCH_FAILED = "The PMIx server's listener thread failed to start"


def run_mpi(np_, args, timeout=300, env=None, launcher_args=()):
    """Run ``python args...`` under ``mpirun -np np_ launcher_args``; returns CompletedProcess."""
    launcher = mpirun_cmd()
    if launcher is None:
        pytest.skip("no mpirun found (not next to this Python, not on PATH; MPIRUN unset)")
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    **(env or {}))
    # one BLAS/Numba thread per rank: ranks x threads must not exceed the 2 cores
    full_env.setdefault("AEPAR_THREADS", "1")
    cmd = launcher + ["-np", str(np_), *launcher_args, sys.executable] + [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
    if proc.returncode != 0 and LAUNCH_FAILED in proc.stdout + proc.stderr:
        # Open MPI's launcher failed before any rank ran: not the test's subject, so once more
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
    return proc


def host_and_avx2_runs(script, tmp_path):
    """Run ``python -c script OUT.npz`` twice, with this CPU's own build and with an AVX2
    one, and return both saved dicts, ``isa`` checked and dropped: what the tests of "the
    same bits on either kind of CPU" compare. Where this CPU's own build is AVX-512's, the
    second is the AVX2 build (AEPAR_ISA=avx2); where it is already AVX2's, the second is
    compiled for another CPU model (NUMBA_CPU_NAME, this CPU's features): LLVM then
    schedules and picks instructions as for that CPU, which must not change a bit either.
    Skipped where the target is not x86-64."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 build is an x86-64 target")
    own = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "AEPAR_ISA")}
    host = _saved_run(script, tmp_path / "host.npz", own)
    avx2 = _saved_run(script, tmp_path / "avx2.npz", {**own, **_another_avx2_build(str(host.pop("isa")))})
    assert str(avx2.pop("isa")) == "avx2"
    assert host.keys() == avx2.keys()
    return host, avx2


def _saved_run(script, path, env) -> dict:
    done = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(np.load(path))


def _another_avx2_build(own_isa: str) -> dict:
    """The environment of an AVX2 build other than this CPU's own (``own_isa``, its
    ``target_isa()``): AEPAR_ISA=avx2 where that is AVX-512; else Numba compiling for
    another CPU model's tuning with this CPU's own features (Haswell's, or Zen 3's on a
    Haswell)."""
    from llvmlite import binding as ll

    if own_isa == "avx512":
        return {"AEPAR_ISA": "avx2"}
    return {"NUMBA_CPU_NAME": "znver3" if ll.get_host_cpu_name() == "haswell" else "haswell"}


# ---- a per-family table of kernel checks at the end of the run -----------------------
_KERNEL_CHECKS = {}


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1]
    for kind in ("gradcheck", "matches_reference", "adjoint"):
        prefix = f"test_{kind}_"
        if name.startswith(prefix) and (report.when == "call" or report.skipped):
            family = name[len(prefix):].split("[")[0].split("_")[0]
            counts = _KERNEL_CHECKS.setdefault(family, {}).setdefault(kind, [0, 0, 0])
            counts[0 if report.passed else 1 if report.failed else 2] += 1


def pytest_terminal_summary(terminalreporter):
    if not _KERNEL_CHECKS:
        return
    tr = terminalreporter
    tr.section("kernel checks per family (passed/failed/skipped)")
    kinds = ("gradcheck", "matches_reference", "adjoint")
    tr.write_line(f"{'family':<18}" + "".join(f"{k:>22}" for k in kinds))
    for family in sorted(_KERNEL_CHECKS):
        row = _KERNEL_CHECKS[family]
        cells = ["/".join(map(str, row[k])) if k in row else "-" for k in kinds]
        tr.write_line(f"{family:<18}" + "".join(f"{c:>22}" for c in cells))
