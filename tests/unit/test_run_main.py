"""What aepar.comm.run_main does around a CLI's main, besides ending every rank on failure: a
lean start and end of the process."""
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROGRAM = r"""
import gc, sys
from aepar.comm import run_main
from aepar.errors import UserError

def main(argv, comm):
    import numpy as np
    import aepar.backend
    be = aepar.backend.select("cpu", "numba")
    x = np.linspace(0, 1, 72).reshape(2, 1, 6, 6)
    be.K.conv2d_forward(x, np.ones((2, 1, 3, 3)), np.zeros(2))  # its products call BLAS
    print("LINALG", "scipy.linalg" in sys.modules, "scipy.linalg.cython_blas" in sys.modules, flush=True)
    if argv == ["fail"]:
        raise UserError("planted")

code = run_main(main, "t", sys.argv[1:])
print("FROZEN", gc.get_freeze_count(), flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("argv, code", [([], 0), (["fail"], 2)])
def test_the_objects_left_at_the_end_are_frozen_out_of_the_last_collections(argv, code):
    """The interpreter's collections at exit would walk every object Numba keeps: run_main
    freezes them when main returns, however it returns."""
    result = subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == code, result.stdout + result.stderr
    frozen = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("FROZEN")]
    assert frozen and frozen[0] > 1000, result.stdout + result.stderr


def test_a_cli_loads_numbas_blas_table_without_the_rest_of_scipy_linalg():
    """A kernel's first BLAS call (and Numba's compiler) imports scipy.linalg.cython_blas;
    run_main loads that extension alone first (aepar.extensions.preload_numba_blas)."""
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0 and "LINALG False True" in result.stdout, result.stdout + result.stderr


COLLECTOR = r"""
import gc, sys
from aepar.comm import run_main

def main(argv, comm):
    print("IMPORTING", gc.isenabled(), flush=True)
    if argv == ["select"]:
        import aepar.backend
        aepar.backend.select("cpu", "numba")
        print("CHOSEN", gc.isenabled(), gc.get_freeze_count() > 10000, flush=True)

run_main(main, "t", sys.argv[1:])
print("AFTER", gc.isenabled(), flush=True)
gc.disable()
import aepar.backend
aepar.backend.select("cpu", "numba")  # outside run_main: the collector left as the caller set it
print("OUTSIDE", gc.isenabled(), flush=True)
"""


@pytest.mark.parametrize("argv, lines", [(["select"], ["IMPORTING False", "CHOSEN True True", "AFTER True"]),
                                         ([], ["IMPORTING False", "AFTER True"])])
def test_the_collector_waits_for_a_commands_imports(argv, lines):
    """The cyclic collector's passes over the objects that Numba's and the kernels' imports
    make are skipped: off while a command imports, on (those objects frozen) once its
    backend is chosen, and on again when main ends without choosing one."""
    result = subprocess.run([sys.executable, "-c", COLLECTOR, *argv], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:-1] == lines + ["OUTSIDE False"]
