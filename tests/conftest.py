"""Shared fixtures: fixed seeds, the kernel sets to compare, an mpirun launcher."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def _have_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()
# The kernel sets checked against the NumPy oracle; cupy only where a GPU is present.
COMPARED_SETS = ["numba"] + (["cupy"] if HAVE_GPU else [])


def kernel_set_params():
    """pytest params for every non-reference kernel set; cupy is skipped with a reason."""
    return [pytest.param("numba", id="numba"),
            pytest.param("cupy", id="cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")])]


def mpirun_cmd():
    """The launcher the Makefile exported, else mpirun next to this Python."""
    launcher = os.environ.get("MPIRUN")
    if launcher:
        return launcher.split()
    here = Path(sys.executable).parent / "mpirun"
    exe = str(here) if here.exists() else shutil.which("mpirun")
    return [exe, "--oversubscribe"] if exe else None


def run_mpi(np_, args, timeout=300, env=None):
    """Run ``python args...`` under ``mpirun -np np_``; returns CompletedProcess."""
    launcher = mpirun_cmd()
    if launcher is None:
        pytest.skip("no mpirun found")
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    **(env or {}))
    # one BLAS/Numba thread per rank: ranks x threads must not exceed the 2 cores
    full_env.setdefault("AEPAR_THREADS", "1")
    cmd = launcher + ["-np", str(np_), sys.executable] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
