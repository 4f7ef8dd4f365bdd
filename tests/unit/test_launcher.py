"""MPI is initialised only under a launcher, and Open MPI without its libfabric BTL."""
import os
import subprocess
import sys

import pytest

from aepar.comm import under_launcher


@pytest.mark.parametrize("env, expect", [
    ({}, False),
    ({"HOME": "/root", "SLURM_JOB_ID": "7"}, False),            # inside an allocation, not a task
    ({"OMPI_COMM_WORLD_SIZE": "2"}, True),                      # Open MPI's mpirun
    ({"PMI_RANK": "0"}, True),                                  # MPICH / Intel MPI (hydra)
    ({"PMIX_RANK": "1"}, True),                                 # PMIx launchers, srun --mpi=pmix
    ({"SLURM_PROCID": "0"}, True),                              # srun
    ({"OMPI_COMM_WORLD_SIZE": "2", "AEPAR_MPI": "0"}, False),   # forbidden
    ({"AEPAR_MPI": "1"}, True),                                 # forced
])
def test_under_launcher(env, expect):
    assert under_launcher(env) is expect


def _child(code, env):
    """stdout of ``python -c code`` in this environment less every launcher's variables,
    AEPAR_MPI and OMPI_MCA_btl, plus ``env``."""
    clean = {k: v for k, v in os.environ.items()
             if not under_launcher({k: v}) and k not in ("AEPAR_MPI", "OMPI_MCA_btl")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _loads_mpi(env):
    return _child("import sys, aepar.comm as c; print('mpi4py.MPI' in sys.modules, c.world().size)", env).split()


def test_single_process_does_not_initialise_mpi():
    assert _loads_mpi({}) == ["False", "1"]


def test_aepar_mpi_forces_it():
    assert _loads_mpi({"AEPAR_MPI": "1"}) == ["True", "1"]


def _btls(env):
    return _child("import os, aepar.comm; print(os.environ.get('OMPI_MCA_btl'))", {"AEPAR_MPI": "1", **env}).strip()


def test_open_mpi_leaves_out_the_libfabric_btl_unless_the_user_chose():
    # its close after a failed init costs every rank's MPI_Init about a second
    assert _btls({}) == "^ofi"
    assert _btls({"OMPI_MCA_btl": "self,tcp"}) == "self,tcp"
