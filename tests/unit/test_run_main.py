"""What aepar.comm.run_main does around a CLI's main, besides ending every rank on failure."""
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROGRAM = r"""
import gc, sys
from aepar.comm import run_main
from aepar.errors import UserError

def main(argv, comm):
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
