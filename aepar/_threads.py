"""Per-rank thread counts, set before NumPy/Numba are imported.

Oversubscribed BLAS threads made MPI peers 2-7x slower on a busy 2-core box, so every
rank gets (cores it may use) / (ranks on this node) threads unless the user chose.
This module must not import numpy.
"""
import os

_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "SLURM_NTASKS_PER_NODE", "PMI_LOCAL_SIZE")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def local_ranks() -> int:
    """Number of ranks sharing this node, from the launcher's environment (1 if unknown)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "").split("(")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank() -> int:
    chosen = os.environ.get("AEPAR_THREADS")
    if chosen:
        return max(1, int(chosen))
    return max(1, usable_cores() // local_ranks())


# The variables aepar filled in, as "n:VAR,VAR": a child process (mpirun launched from a
# Python driver that imported aepar) must recompute them for its own rank count, not
# inherit the driver's one-rank share of the cores.
_FILLED = "AEPAR_FILLED_THREADS"


def _forget_inherited():
    n, _, names = os.environ.get(_FILLED, "").partition(":")
    for var in filter(None, names.split(",")):
        if os.environ.get(var) == n:
            del os.environ[var]


def configure() -> int:
    """Fill in thread variables the user left unset; returns the thread count used."""
    _forget_inherited()
    n = threads_per_rank()
    filled = [var for var in _THREAD_VARS if var not in os.environ]
    for var in filled:
        os.environ[var] = str(n)
    os.environ[_FILLED] = f"{n}:{','.join(filled)}"
    # GNU OpenMP's idle threads (Numba's parallel loops) spin for milliseconds and starve
    # OpenBLAS's threads between a parallel loop and the next matrix product.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    return int(os.environ["OMP_NUM_THREADS"])
