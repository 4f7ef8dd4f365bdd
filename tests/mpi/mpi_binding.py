"""Per rank: its CPUs, threads, the ranks' cores and the data-parallel ranks, as aepar sees
them under the launcher's binding (tests/mpi/test_mpi_comm.py)."""
import aepar
from aepar import _threads
from aepar.comm import world
from aepar.parallel.subset import data_parallel_ranks

comm = world()
cores = _threads.node_cores(_threads.node_layout(comm))
members = data_parallel_ranks(comm)
print(f"rank {comm.rank} cpus {_threads.usable_cores()} threads {aepar.THREADS} cores {cores} members {members}")
