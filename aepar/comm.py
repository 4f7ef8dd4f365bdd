"""The one module that talks to MPI.

Everything aepar sends between ranks goes through a :class:`Comm`: buffer collectives on
NumPy arrays (and CuPy arrays, staged through host memory unless the MPI library is
CUDA-aware), sub-communicators, small Python objects for configuration, and the error
agreement that lets every rank end together with one line instead of hanging.

Names follow mpi4py's: Capitalised methods move buffers (``Bcast``, ``Allreduce``,
``Reduce``, ``Send``/``Recv``, ``Isend``/``Irecv``, in place), lower-case ones pickle Python
objects (``bcast``, ``gather``, ``allgather``, ``allreduce``).

Without mpi4py, or without a launcher (then MPI is not even initialised: see
:func:`under_launcher`), the same API runs as one process.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from aepar import _threads
from aepar.errors import UserError

# What MPI launchers (mpirun/mpiexec of Open MPI, MPICH, Intel MPI, MVAPICH; srun; Cray's
# aprun/PALS) put in every rank's environment. Without any of them this is one process, and
# MPI_Init (a noticeable part of every start-up) is skipped; AEPAR_MPI=1 forces MPI, AEPAR_MPI=0
# forbids it.
MPI_ENV = "AEPAR_MPI"
LAUNCHER_HINTS = ("OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "HYDRA_",
                  "MV2_COMM_WORLD_", "SLURM_PROCID", "ALPS_APP_", "PALS_")


def under_launcher(environ=None) -> bool:
    """Whether this process was started by an MPI launcher (or ``AEPAR_MPI`` says so)."""
    environ = os.environ if environ is None else environ
    forced = environ.get(MPI_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return any(name.startswith(LAUNCHER_HINTS) for name in environ)


MPI = None
if under_launcher():
    # Open MPI's libfabric BTL carries nothing aepar sends (point-to-point and collectives
    # go through the PML; aepar makes no one-sided calls), yet where it finds no fabric it
    # takes about a second to close again, in every rank's MPI_Init. Left out unless the
    # user chose the BTLs; other MPI libraries ignore the variable.
    os.environ.setdefault("OMPI_MCA_btl", "^ofi")
    try:  # the only import of mpi4py in aepar
        from mpi4py import MPI
    except ImportError:  # serial fallback: one process, same API
        MPI = None

_OPS = {}
if MPI is not None:
    _OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


# Which blocking communication this process is in, since when, and when it left the last
# one: the stall watchdog (aepar.guard) tells a rank that waits for its peers from one
# that stopped making progress by it.
_WAIT = {"op": None, "since": 0.0, "left": 0.0}


def waiting() -> tuple:
    """(operation or None, monotonic time it began, time the last one ended)."""
    return _WAIT["op"], _WAIT["since"], _WAIT["left"]


class _Blocking:
    __slots__ = ("op", "outer")

    def __init__(self, op):
        self.op = op

    def __enter__(self):
        self.outer = _WAIT["op"]
        if self.outer is None:
            _WAIT["op"], _WAIT["since"] = self.op, time.monotonic()

    def __exit__(self, *exc):
        if self.outer is None:
            _WAIT["op"], _WAIT["left"] = None, time.monotonic()
        return False


def blocking(op: str):
    """Mark a wait for other ranks (a context manager) for the stall watchdog."""
    return _Blocking(op)


def wait_until(ready, progress=None, first_sleep=50e-6, max_sleep=2e-3):
    """Call ``progress()`` and ``ready()`` until ``ready()`` is true (e.g. a request's
    ``test``), sleeping between tries with the sleep doubling up to ``max_sleep``: a waiting
    rank then leaves its core to the working ones, where MPI_Wait would spin on it. Returns
    the seconds waited."""
    t0 = time.perf_counter()
    sleep = first_sleep
    with blocking("pipeline wait"):
        while True:
            if progress is not None:
                progress()
            if ready():
                return time.perf_counter() - t0
            time.sleep(sleep)
            sleep = min(2 * sleep, max_sleep)


def _is_device_array(a) -> bool:
    return hasattr(a, "__cuda_array_interface__")


def cuda_aware() -> bool:
    """True if device buffers may be handed to MPI directly.

    AEPAR_CUDA_AWARE=0/1 overrides; otherwise ask Open MPI's MPIX query when mpi4py has it.
    """
    forced = os.environ.get("AEPAR_CUDA_AWARE")
    if forced is not None:
        return forced == "1"
    query = getattr(MPI, "Query_cuda_support", None) if MPI is not None else None
    try:
        return bool(query()) if query else False
    except Exception:  # an MPI without the extension
        return False


class Request:
    """A pending point-to-point transfer; copies staged host data back on completion."""

    def __init__(self, mpi_request, host=None, device=None):
        self._req, self._host, self._device = mpi_request, host, device

    def test(self) -> bool:
        done = True if self._req is None else self._req.Test()
        if done:
            self._finish()
        return done

    def wait(self):
        if self._req is not None:
            with _Blocking("wait"):
                self._req.Wait()
        self._finish()

    def cancel(self):
        if self._req is not None:
            self._req.Cancel()
            self._req.Wait()
            self._req = None
        self._host = self._device = None

    def _finish(self):
        if self._device is not None:
            self._device.set(self._host)  # staged receive into a CuPy array
        self._host = self._device = None
        self._req = None


class Comm:
    """A communicator. ``Comm()`` is MPI_COMM_WORLD, or a single process without MPI."""

    def __init__(self, mpi_comm=None):
        if mpi_comm is None and MPI is not None:
            mpi_comm = MPI.COMM_WORLD
        self._c = mpi_comm
        self.rank = mpi_comm.Get_rank() if mpi_comm is not None else 0
        self.size = mpi_comm.Get_size() if mpi_comm is not None else 1
        self._cuda_aware = cuda_aware() if mpi_comm is not None else False
        self._node = None  # node(): asked collectively once, then kept
        self.collectives = 0  # buffer collectives issued, for the reports

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1

    # ---- buffers ---------------------------------------------------------------------
    def _stage(self, buf):
        """(host array handed to MPI, device array to copy back into or None)."""
        if _is_device_array(buf) and not self._cuda_aware:
            return buf.get(), buf  # CuPy: device -> host copy; .set() copies back
        return buf, None

    @staticmethod
    def _unstage(host, device):
        if device is not None:
            device.set(host)

    def Bcast(self, buf, root: int = 0):
        """Broadcast ``buf`` in place from ``root``; returns ``buf``."""
        self.collectives += 1
        if self.size > 1:
            host, dev = self._stage(buf)
            with _Blocking("bcast"):
                self._c.Bcast(host, root=root)
            self._unstage(host, dev)
        return buf

    def Allreduce(self, buf, op: str = "sum"):
        """Reduce ``buf`` over all ranks in place; returns ``buf``."""
        self.collectives += 1
        if self.size > 1:
            host, dev = self._stage(buf)
            with _Blocking("allreduce"):
                self._c.Allreduce(MPI.IN_PLACE, host, op=_OPS[op])
            self._unstage(host, dev)
        return buf

    def Reduce(self, buf, root: int = 0, op: str = "sum"):
        """Reduce ``buf`` onto ``root`` in place there; other ranks' ``buf`` is unchanged.

        Returns ``buf`` on the root and None elsewhere.
        """
        self.collectives += 1
        if self.size > 1:
            host, dev = self._stage(buf)
            with _Blocking("reduce"):
                if self.rank == root:
                    self._c.Reduce(MPI.IN_PLACE, host, op=_OPS[op], root=root)
                else:
                    self._c.Reduce(host, None, op=_OPS[op], root=root)
            if self.rank != root:
                return None
            self._unstage(host, dev)
        return buf

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        host, _ = self._stage(buf)
        if self.size == 1:
            raise RuntimeError("Isend needs more than one rank")
        # The staged host copy must outlive the request: the Request holds it.
        req = Request(self._c.Isend(host, dest=dest, tag=tag))
        req._keepalive = host
        return req

    def Irecv(self, buf, source: int, tag: int = 0) -> Request:
        host, dev = self._stage(buf)
        if self.size == 1:
            raise RuntimeError("Irecv needs more than one rank")
        return Request(self._c.Irecv(host, source=source, tag=tag), host, dev)

    def Send(self, buf, dest: int, tag: int = 0):
        self.Isend(buf, dest, tag).wait()

    def Recv(self, buf, source: int, tag: int = 0):
        self.Irecv(buf, source, tag).wait()
        return buf

    def Iprobe(self, source: int, tag: int = 0) -> bool:
        return self.size > 1 and self._c.Iprobe(source=source, tag=tag)

    # ---- structure -------------------------------------------------------------------
    def split(self, color: int, key: int | None = None) -> "Comm":
        """Sub-communicator of the ranks that pass the same ``color`` (ordered by ``key``)."""
        if self._c is None:
            return Comm.serial()
        return Comm(self._c.Split(color, self.rank if key is None else key))

    def node(self) -> int:
        """This rank's node: the lowest rank of this communicator among those sharing its
        memory (MPI_Comm_split_type SHARED), so the same on every rank of a node and on
        no rank of another, whatever the host names say (machines cloned from one image
        may all be called "localhost"). Collective on a communicator's first call; kept."""
        if self._node is None:
            if self.size == 1:
                self._node = 0
            else:
                with _Blocking("split_type"):
                    shared = self._c.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
                    try:
                        self._node = shared.allreduce(self.rank, op=MPI.MIN)
                    finally:
                        shared.Free()
        return self._node

    def barrier(self):
        if self.size > 1:
            with _Blocking("barrier"):
                self._c.Barrier()

    def wtime(self) -> float:
        return MPI.Wtime() if MPI is not None else time.perf_counter()

    # ---- small objects (configuration, summaries: never per-step data) ---------------
    def bcast(self, obj, root: int = 0):
        if self.size == 1:
            return obj
        with _Blocking("bcast"):
            return self._c.bcast(obj, root=root)

    def gather(self, obj, root: int = 0):
        if self.size == 1:
            return [obj]
        with _Blocking("gather"):
            return self._c.gather(obj, root=root)

    def allgather(self, obj):
        if self.size == 1:
            return [obj]
        with _Blocking("allgather"):
            return self._c.allgather(obj)

    def allreduce(self, obj, op: str = "sum"):
        """``obj`` combined over the ranks (sum, max, min), returned on every rank: e.g. a
        timing as the slowest rank's, ``comm.allreduce(seconds, op="max")``."""
        if self.size == 1:
            return obj
        with _Blocking("allreduce"):
            return self._c.allreduce(obj, op=_OPS[op])

    # ---- errors ----------------------------------------------------------------------
    def agree(self, fn, *args, **kwargs):
        """Run ``fn`` on every rank; if it raised a UserError on any rank, raise it on all.

        ``fn`` must not communicate. Use around set-up (options, reading data) so that a
        bad input ends every rank with exit 2 and one message, never a hang.
        """
        error, result = None, None
        try:
            result = fn(*args, **kwargs)
        except UserError as exc:
            error = exc
        messages = self.allgather(None if error is None else str(error))
        for message in messages:
            if message is not None:
                error = error if error is not None else UserError(message)
                error.collective = True  # every rank raises it: exit 2 without MPI_Abort
                raise error
        return result

    def check(self, ok: bool, message: str):
        """Collective assertion: raise UserError(message) on every rank unless all are ok."""
        flags = self.allgather(bool(ok))
        if not all(flags):
            error = UserError(message)
            error.collective = True
            raise error

    # After a rank's last words and before MPI_Abort: the launcher forwards output
    # asynchronously, and an abort that comes at once can kill the line on its way.
    ABORT_GRACE_S = 0.5

    def abort(self, code: int = 1):
        if self._c is not None and self.size > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            time.sleep(self.ABORT_GRACE_S)
            self._c.Abort(code)
        sys.exit(code)

    def abort_now(self, code: int):
        """End the whole job from any thread (the watchdog): MPI_Abort, or _exit alone."""
        sys.stderr.flush()
        if self._c is not None and self.size > 1:
            time.sleep(self.ABORT_GRACE_S)
            MPI.COMM_WORLD.Abort(code)
        os._exit(code)

    @staticmethod
    def serial() -> "Comm":
        comm = Comm.__new__(Comm)
        comm._c, comm.rank, comm.size, comm._cuda_aware, comm.collectives, comm._node = None, 0, 1, False, 0, None
        return comm


# Every point-to-point tag aepar uses, in one place (on aepar's own duplicate of the world
# communicator, so user code on MPI_COMM_WORLD cannot match them).
TAG_HDR, TAG_PAY, TAG_PROGRESS, TAG_DECIDE, TAG_CTRL = 4101, 4102, 4103, 4104, 4105  # the sync pipeline
TAG_IDLE_DONE, TAG_IDLE_NOTE = 4201, 4202  # a data-parallel subset tells the idle ranks it is done (and why)
TAG_TREE = 5001  # the fixed-tree sums (aepar.parallel.blocks)

_WORLD = None


def world() -> Comm:
    """aepar's duplicate of MPI_COMM_WORLD (made once, collectively, by every rank's first
    call): the same ranks, a separate message space."""
    global _WORLD
    if _WORLD is None:
        _WORLD = Comm(MPI.COMM_WORLD.Dup()) if MPI is not None else Comm()
        if _WORLD.size > 1:  # the thread count, now that every rank's binding can be seen
            threads = _threads.threads_for_layout(_threads.node_layout(_WORLD), _WORLD.rank)
            if threads is not None:
                import aepar
                aepar.THREADS = threads
    return _WORLD


def library() -> str:
    """The MPI library in one line, for benchmark rows: the one in use, or in a single
    process the one a launcher would use (MPI_Get_library_version needs no MPI_Init)."""
    mpi = MPI
    if mpi is None:
        try:
            import mpi4py
            mpi4py.rc.initialize = mpi4py.rc.finalize = False  # this process stays serial
            from mpi4py import MPI as mpi
        except ImportError:
            return "none (serial)"
    return mpi.Get_library_version().splitlines()[0].split(",")[0].strip()


_EARLY = []  # stop signals that came before the run's Guard existed


def remember_early_signal(signum, frame):
    """Signal handler of a CLI's first moments (:func:`run_main`): keep the signal for the
    run's Guard (aepar.guard) to act on at its first safe point."""
    _EARLY.append(signum)


def early_signal():
    """The first stop signal :func:`remember_early_signal` kept, or None."""
    return _EARLY[0] if _EARLY else None


_collector_paused = False  # run_main's: the cyclic collector off until resume_collector


def resume_collector():
    """Turn the cyclic garbage collector back on once a command has imported what it runs
    on (:func:`aepar.backend.select` calls this), every object so far frozen out of its
    passes. The imports of Numba and the kernels make about a hundred thousand objects,
    which its passes walked again and again while they were made, to free next to
    nothing. Outside :func:`run_main` it does nothing."""
    global _collector_paused
    if _collector_paused:
        import gc

        _collector_paused = False
        gc.freeze()
        gc.enable()


def run_main(main, prog: str, argv=None) -> int:
    """Run a CLI's ``main(argv, comm)`` so that failures end every rank.

    - UserError raised on all ranks (set-up wrapped in ``comm.agree``): rank 0 prints
      ``prog: error: message``, every rank exits with its code (2; 3 diverged; 75
      interrupted, printed as ``prog: stopped: ...``).
    - UserError on some ranks only: that rank prints the line and aborts the job with its code.
    - Any other exception: the rank and traceback are printed and the job aborts with 1.

    The process is the CLI's own, so its start and end are made lean: the BLAS table that
    the kernels' products import is loaded without the rest of scipy.linalg
    (:func:`aepar.extensions.preload_numba_blas`); the cyclic garbage collector is off
    until the command has imported its backend (:func:`resume_collector`); and when
    ``main`` returns, every object left is frozen out of the collector, whose last passes
    at exit would otherwise walk the hundred thousand or so that Numba and the kernels
    keep alive, to free nothing the operating system would not free anyway (objects are
    still released as their last reference goes).
    """
    import gc
    import signal

    from aepar.extensions import preload_numba_blas

    global _collector_paused
    if gc.isenabled():
        gc.disable()
        _collector_paused = True

    # until the run's Guard takes over, SIGTERM/SIGUSR1 are remembered rather than fatal
    # (SIGINT keeps stopping at once while a run sets up)
    for name in ("SIGTERM", "SIGUSR1"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), remember_early_signal)
    preload_numba_blas()
    comm = world()
    try:
        main(argv, comm)
        return 0
    except SystemExit as exc:  # argparse: same on every rank
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        return code
    except UserError as exc:
        label = "stopped" if exc.run_state == "interrupted" else "error"
        if getattr(exc, "collective", False) or comm.size == 1:
            if comm.is_root:
                print(f"{prog}: {label}: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        print(f"{prog}: {label}: {exc}" + (f" (rank {comm.rank})" if comm.parallel else ""),
              file=sys.stderr, flush=True)
        comm.abort(exc.exit_code)
    except KeyboardInterrupt:
        comm.abort(130)
    except BaseException:
        where = f"rank {comm.rank}/{comm.size}: " if comm.parallel else ""
        print(f"{prog}: {where}internal error\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        comm.abort(1)
    finally:
        resume_collector()  # on again if main ended before choosing a backend
        gc.freeze()
