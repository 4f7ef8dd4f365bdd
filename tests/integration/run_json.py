"""What every program's run.json must say about the run (aepar.rundir): the aepar version
and commit, the parsed options, the machine, and the ranks' layout over the hosts."""
import json
import socket
import subprocess

import aepar
from aepar.machine import ONE_PROCESS
from tests.conftest import ROOT


def assert_run_json(run_dir, ranks: int, **options):
    """run.json in ``run_dir`` records this checkout's version and commit, ``options``
    among its parsed options, the machine, and ``ranks`` ranks on this host."""
    marker = json.loads((run_dir / "run.json").read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    info = marker["aepar"]
    assert info["version"] == aepar.__version__
    if head.returncode == 0:  # a checkout (not an unpacked release)
        assert info["commit"] == head.stdout.strip() and isinstance(info["dirty"], bool), info
    for name, value in options.items():
        assert marker["options"][name] == value, (name, marker["options"].get(name), value)
    assert marker["machine"]["cpu_model"] and marker["machine"]["isa"] is not None and "gpu" in marker["machine"]
    # the MPI library where ranks ran on one; a run alone names none (asking would start MPI)
    assert (marker["machine"]["mpi"] == ONE_PROCESS) == (ranks == 1), marker["machine"]["mpi"]
    assert marker["layout"] == {"ranks": ranks, "hosts": {socket.gethostname(): ranks}}, marker["layout"]
    return marker
