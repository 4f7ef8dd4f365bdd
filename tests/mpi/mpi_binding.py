"""Per rank: its CPUs, threads, the ranks' cores and the data-parallel ranks, as aepar sees
them under the launcher's binding (tests/mpi/test_mpi_comm.py). With AEPAR_TEST_HOST_PER_RANK
set, each rank's host name is its own (as if each rank's machine had its own name, or the
ranks of one machine different ones): the grouping into nodes must not follow it."""
import os
import socket

if os.environ.get("AEPAR_TEST_HOST_PER_RANK"):
    _rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK", "0")
    socket.gethostname = lambda: f"host{_rank}"

import aepar  # noqa: E402
from aepar import _threads  # noqa: E402
from aepar.comm import world  # noqa: E402
from aepar.parallel.subset import data_parallel_ranks  # noqa: E402

comm = world()
cores = _threads.node_cores(_threads.node_layout(comm))
members = data_parallel_ranks(comm)
print(f"rank {comm.rank} cpus {_threads.usable_cores()} threads {aepar.THREADS} cores {cores} members {members}")
