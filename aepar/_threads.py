"""Per-rank thread counts, set before NumPy/Numba are imported.

Every rank uses (cores it may use) / (ranks on this node) threads (``AEPAR_THREADS``
overrides): oversubscribed threads make MPI peers several times slower on a busy node.
Those threads are aepar's own, and each takes whole blocks of samples
(aepar.rows.parallel_map); BLAS and Numba run single-threaded inside them,
because OpenBLAS's results change with its thread count (it splits the products
differently) and aepar's results must not. Setting OPENBLAS_NUM_THREADS, OMP_NUM_THREADS,
MKL_NUM_THREADS or NUMBA_NUM_THREADS yourself is respected, but then the results may
depend on it. This module must not import numpy.
"""
import os
import sys

_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "SLURM_NTASKS_PER_NODE", "PMI_LOCAL_SIZE")
# each launcher's variable for this rank's index on its node (Open MPI, SLURM, Intel MPI and
# MPICH's hydra, PMI, MVAPICH2), as _LOCAL_SIZE_VARS are for the count
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                    "MV2_COMM_WORLD_LOCAL_RANK")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def local_ranks() -> int:
    """Number of ranks sharing this node, from the launcher's environment (1 if unknown)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "").split("(")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def local_rank() -> int:
    """This rank's index among the ranks of its node, from the launcher's environment (0 if unknown)."""
    for var in _LOCAL_RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def usable_cpus() -> tuple:
    """The CPUs this process may run on (its binding), by number."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux: every CPU
        return tuple(range(os.cpu_count() or 1))


def usable_cores() -> int:
    return len(usable_cpus())


def threads_per_rank() -> int:
    """The thread count at import, before MPI: this rank's CPUs divided among the ranks the
    launcher says share its node (:func:`threads_for_layout` corrects it for a bound rank)."""
    chosen = os.environ.get("AEPAR_THREADS")
    if chosen:
        return max(1, int(chosen))
    return max(1, usable_cores() // local_ranks())


def placement(comm) -> tuple:
    """(node, CPUs) of this process: its node among ``comm``'s ranks (``comm.node()``, MPI's
    shared-memory grouping; collective) and the CPUs it may run on. What :func:`node_layout`
    gathers from every rank."""
    return comm.node(), usable_cpus()


def node_layout(comm) -> list:
    """Every rank's :func:`placement`, in rank order (collective)."""
    return comm.allgather(placement(comm))


def share_of_node(layout, rank: int) -> int:
    """Threads for ``rank`` from every rank's (node, CPUs): its CPUs divided among the ranks
    on its node whose CPUs overlap its own, itself included. Unbound ranks all see the
    node's CPUs and share them; a launcher's binding (a core each, ``--map-by slot:PE=4``,
    a socket for several ranks) has already given each rank its share, which it keeps."""
    node, mine = layout[rank]
    own = set(mine)
    sharing = sum(1 for n, cpus in layout if n == node and own.intersection(cpus))
    return max(1, len(own) // max(sharing, 1))


def cores_per_node(layout) -> dict:
    """{node: the distinct CPUs that its ranks in ``layout`` may run on}: what they share,
    however the launcher bound them."""
    per_node = {}
    for node, cpus in layout:
        per_node.setdefault(node, set()).update(cpus)
    return {node: len(cpus) for node, cpus in per_node.items()}


def node_cores(layout) -> int:
    """:func:`cores_per_node` added over all the nodes of ``layout``."""
    return sum(cores_per_node(layout).values())


_FIXED = [False]  # aepar.THREADS fixed by the backend (one thread queues a GPU's work)


def fix_threads():
    """Mark aepar.THREADS as fixed by the backend: :func:`threads_for_layout` leaves it."""
    _FIXED[0] = True


def threads_for_layout(layout, rank: int) -> int | None:
    """aepar.THREADS for ``rank`` from every rank's binding (:func:`share_of_node`), once
    MPI has started: at import only this rank's CPUs and the launcher's count of ranks on
    the node were known, which leave a bound rank (``mpirun --map-by slot:PE=4``) one
    thread on its four cores. None where ``AEPAR_THREADS`` chose the count or the backend
    fixed it (:func:`fix_threads`)."""
    if os.environ.get("AEPAR_THREADS") or _FIXED[0]:
        return None
    return share_of_node(layout, rank)


def crowded_note(threads: int, cores: int) -> str | None:
    """One line when a rank is to run more of aepar's threads than it has cores (only an
    AEPAR_THREADS beyond them does that): the threads would take turns on the cores, each
    step waiting for the last. mpirun binds each rank to a core in some layouts."""
    if threads <= cores:
        return None
    return (f"aepar: note: AEPAR_THREADS={threads} on {cores} core{'s' if cores != 1 else ''} this rank may use: "
            f"the threads take turns; give mpirun --bind-to none or --map-by slot:PE={threads}, or fewer threads")


# The variables aepar filled in, as "n:VAR,VAR": a child process (mpirun launched from a
# Python driver that imported aepar) must recompute them for its own rank count, not
# inherit the driver's one-rank share of the cores.
_FILLED = "AEPAR_FILLED_THREADS"


def _forget_inherited():
    n, _, names = os.environ.get(_FILLED, "").partition(":")
    for var in filter(None, names.split(",")):
        if os.environ.get(var) == n:
            del os.environ[var]


# AEPAR_ISA=avx2 on an AVX-512 machine: the code an AVX2-only CPU would run. Numba needs
# the feature list too (NUMBA_CPU_NAME=haswell alone keeps the host's AVX-512 features),
# and OpenBLAS its Haswell kernels. The last three hold the benchmarks' PyTorch peers to
# AVX2 as well (ATen's own loops, MKL, oneDNN), so that both sides of a ratio run what
# that CPU would; aepar itself never loads them.
_ISA_EMULATION = {"avx2": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "-avx512f",
                           "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
                           "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def _emulate_isa():
    isa = os.environ.get("AEPAR_ISA", "")
    if not isa or isa == "host":
        return
    if isa not in _ISA_EMULATION:
        raise SystemExit(f"AEPAR_ISA={isa!r}: choose host or {', '.join(_ISA_EMULATION)}")
    for var, value in _ISA_EMULATION[isa].items():
        os.environ.setdefault(var, value)


def configure() -> int:
    """Single-threaded BLAS/Numba where the user left them unset; returns aepar's own
    thread count for this rank."""
    _emulate_isa()
    _forget_inherited()
    filled = [var for var in _THREAD_VARS if var not in os.environ]
    for var in filled:
        os.environ[var] = "1"
    os.environ[_FILLED] = f"1:{','.join(filled)}"
    # GNU OpenMP's idle threads (Numba's parallel loops) spin for milliseconds and starve
    # the other threads between a parallel loop and the next matrix product.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    threads = threads_per_rank()
    note = crowded_note(threads, usable_cores())
    if note is not None and local_rank() == 0:  # once per node, not once per rank
        print(note, file=sys.stderr, flush=True)
    return threads
