"""What a long run does between steps: signals, periodic checkpoints, the stall watchdog,
divergence checks and injected faults.

A **step** is the unit every scheme counts: one minibatch (pre-training, fine-tuning,
every pipeline stage) or one evaluation of the cost (the sparse autoencoder's L-BFGS).
Each step calls :meth:`Guard.step`, which beats the watchdog's heart and fires an
injected fault when one is due. At a **safe point** (the end of a step whose reduction
carried every rank's :meth:`Guard.flags`) the ranks agree on the same answer to "save a
checkpoint now?" and "stop now?":

- SIGTERM, SIGUSR1, SIGINT on any rank: save a checkpoint at the next step and exit with
  75 (``Interrupted``); a second SIGINT stops at once. (``mpirun`` forwards SIGUSR1 to the
  ranks but kills them on its own SIGTERM: under mpirun use USR1, e.g. SLURM's
  ``--signal=B:USR1@120``; ``srun`` and a plain process take all three.)
- every ``--checkpoint-minutes`` (rank 0's clock) and every ``--checkpoint-every`` epochs.

The watchdog (``--timeout T``) ends the job when a rank makes no step for T seconds
outside communication (that rank names itself), or has waited for the other ranks in one
communication for 2T + 10 seconds (a peer that cannot even report itself), exit 124.

Injected faults, for the tests and for users trying their cluster:
``AEPAR_FAULT=RANK:STEP:KIND[,...]`` with KIND ``raise`` (an exception), ``kill``
(SIGKILL), ``nan`` (the step's gradient or partial sums become NaN), ``stall`` (the
rank sleeps forever without dying), or ``sigterm``/``sigusr1``/``sigint`` (the rank sends
itself that signal, as a scheduler would). The write kinds ``enospc``, ``edquot``, ``erofs`` and
``eio`` count files instead of steps: ``0:3:enospc`` makes the third file rank 0 writes into
its run directory (checkpoint, weights, report) fail with that error after it was partly
written, as a full disk would (aepar.rundir).
"""
from __future__ import annotations

import errno
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from aepar.comm import early_signal, waiting
from aepar.errors import EXIT_STALLED, Diverged, UserError

__all__ = ["Guard", "StepsOnly", "Fault", "FAULT_ENV", "WRITE_FAULTS", "STOP", "CHECKPOINT"]

FAULT_ENV = "AEPAR_FAULT"
# kinds that fail the Nth file written into the run directory (aepar.rundir), not a step
WRITE_FAULTS = {"enospc": errno.ENOSPC, "edquot": errno.EDQUOT, "erofs": errno.EROFS, "eio": errno.EIO}
FAULT_KINDS = ("raise", "kill", "nan", "stall", "sigterm", "sigusr1", "sigint", *WRITE_FAULTS)
# flag values summed over the ranks: any STOP means stop (fewer than 2**20 ranks asking for a
# checkpoint cannot add up to it), anything else a checkpoint
CHECKPOINT, STOP = 1.0, float(2 ** 20)
SIGNAL_NAMES = ("SIGTERM", "SIGUSR1", "SIGINT")


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    @staticmethod
    def parse(text: str | None) -> list["Fault"]:
        """``"3:40:nan,0:10:stall"`` -> faults; UserError naming the variable if malformed."""
        faults = []
        for item in filter(None, (t.strip() for t in (text or "").split(","))):
            parts = item.split(":")
            ok = len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and parts[2] in FAULT_KINDS
            if not ok or int(parts[1]) < 1:
                raise UserError(f"{FAULT_ENV}={text!r}: each fault is RANK:STEP:KIND with STEP >= 1 and KIND "
                                f"one of {', '.join(FAULT_KINDS)}")
            faults.append(Fault(int(parts[0]), int(parts[1]), parts[2]))
        return faults


class Guard:
    """The safe points of one run (see the module docstring).

    Parameters
    ----------
    comm : aepar.comm.Comm
    prog : str
        The program's name for messages ("aepar.greedy").
    every : int
        Checkpoint every that many epochs (iterations for L-BFGS); 0: never by count.
    minutes : float
        Checkpoint every that many minutes; 0: never by time.
    timeout : float or None
        Watchdog seconds; None: no watchdog.
    """

    def __init__(self, comm, prog: str, *, every: int = 0, minutes: float = 0.0, timeout: float | None = None,
                 faults=None, quiet: bool = False):
        self.comm, self.prog, self.quiet = comm, prog, quiet
        self._acknowledged = False  # the one line a stop signal gets has been said
        self.every, self.seconds = int(every), 60.0 * float(minutes)
        self.timeout = None if timeout is None else float(timeout)
        self.faults = Fault.parse(os.environ.get(FAULT_ENV)) if faults is None else list(faults)
        self.steps = 0
        self.run = None  # the run directory, named in divergence messages
        self.signum = None
        self.where = "setting up"
        self._beat = time.monotonic()
        self._armed = False
        self._last_save = time.monotonic()
        self._poison_pending = False
        self._remote = 0.0
        self._asked = False
        self._old = {}
        self._stop = threading.Event()
        self._thread = None

    @classmethod
    def from_args(cls, comm, prog, args, run=None) -> "Guard":
        guard = cls(comm, prog, every=args.checkpoint_every, minutes=args.checkpoint_minutes, timeout=args.timeout,
                    quiet=getattr(args, "quiet", False))
        guard.run = run
        return guard

    # ---- lifetime ---------------------------------------------------------------------------
    def __enter__(self):
        early = early_signal()  # a stop signal that came while the CLI set up (aepar.comm.run_main)
        if early is not None and self.signum is None:
            self.signum = early
        if threading.current_thread() is threading.main_thread():
            for name in SIGNAL_NAMES:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._old[sig] = signal.signal(sig, self._on_signal)
        if self.timeout is not None:
            self._thread = threading.Thread(target=self._watch, name="aepar-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        return False

    def _on_signal(self, signum, frame):
        if signum == signal.SIGINT and self.signum is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self.signum is None:  # the safe point reports what it saved
            self.signum = signum

    # ---- steps ------------------------------------------------------------------------------
    def training(self, where: str):
        """Arm the watchdog for a training phase named ``where`` (a context manager)."""
        return _Armed(self, where)

    def step(self, poison=None, safe_point: str = "the next step"):
        """One step done (or begun): beat the heart; fire a fault due now. ``poison``: the
        array a ``nan`` fault fills (the step's gradient or partial sums); ``safe_point``:
        where a stop signal takes effect, said when one has come (:meth:`acknowledge`)."""
        self.steps += 1
        self._beat = time.monotonic()
        self.acknowledge(safe_point)
        if self._poison_pending and poison is not None:
            self._poison(poison)
        for f in self.faults:
            if f.rank == self.comm.rank and f.step == self.steps and f.kind not in WRITE_FAULTS:
                self._fire(f, poison)

    def acknowledge(self, safe_point: str = "the next step"):
        """Once a stop signal has come to this rank, one line (rank 0): where the run will
        stop. Called at every step: a scheme whose steps are not safe points (StepsOnly)
        stops only at its own boundaries, which can be minutes away."""
        if self.signum is not None:
            self._say_stopping(f"{signal.Signals(self.signum).name} received", f"stopping at {safe_point}")

    def _say_stopping(self, what: str, where: str):
        if self._acknowledged:
            return
        self._acknowledged = True
        if self.comm.is_root and not self.quiet:
            print(f"{self.prog}: {what}: {where} with a checkpoint (exit 75)", flush=True)

    def _fire(self, fault: Fault, poison):
        where = f"rank {self.comm.rank}, step {self.steps} ({self.where})"
        # the wall-clock time, so that a harness can measure how long the job takes to end
        print(f"{self.prog}: {FAULT_ENV}: {fault.kind} on {where} at t={time.time():.3f}", file=sys.stderr, flush=True)
        if fault.kind == "raise":
            raise RuntimeError(f"fault injected by {FAULT_ENV} at {where}")
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "stall":
            while True:
                time.sleep(3600)
        if fault.kind.startswith("sig"):
            os.kill(os.getpid(), getattr(signal, fault.kind.upper()))
            return
        if fault.kind == "nan":
            if poison is None:
                self._poison_pending = True
            else:
                self._poison(poison)

    def _poison(self, array):
        self._poison_pending = False
        array[...] = np.nan

    # ---- requests and agreement ---------------------------------------------------------------
    def local_request(self) -> float:
        """What this rank asks for itself: STOP after a signal, CHECKPOINT when rank 0's
        clock says so, else 0."""
        if self.signum is not None:
            return STOP
        if self._asked or (self.comm.is_root and self.seconds > 0 and
                           time.monotonic() - self._last_save >= self.seconds):
            return CHECKPOINT
        return 0.0

    def ask_checkpoint(self):
        """This rank asks for a checkpoint at the next safe point (e.g. after N epochs)."""
        self._asked = True

    def request(self, value: float):
        """A request another rank announced (the pipeline's control messages)."""
        self._remote = max(self._remote, float(value))

    def flags(self) -> float:
        """This rank's request, to be summed over the ranks with the step's reduction."""
        return max(self.local_request(), self._remote)

    def decide(self, summed: float) -> tuple[bool, bool]:
        """(checkpoint, stop) from the flags summed over the ranks. A stop that rank 0 has
        not yet announced (the signal reached another rank first, or only) is announced now."""
        summed = float(summed)
        if summed >= STOP:
            self._say_stopping(f"{signal.Signals(self.signum).name} received" if self.signum is not None
                               else "a stop signal reached another rank", "stopping here")
        return summed >= CHECKPOINT, summed >= STOP

    def epoch_due(self, epochs_done: int) -> bool:
        """A checkpoint by count after ``epochs_done`` epochs (iterations)."""
        return self.every > 0 and epochs_done > 0 and epochs_done % self.every == 0

    def saved(self):
        """A checkpoint was written: the clock starts again, announced checkpoint requests are
        served (a stop stays)."""
        self._last_save = time.monotonic()
        self._asked = False
        if self._remote < STOP:
            self._remote = 0.0

    # ---- divergence -------------------------------------------------------------------------
    def check(self, value, what: str, where: str, run=None, comm=None):
        """Raise :class:`Diverged` unless ``value`` (a number or array) is all finite.

        ``comm``: the ranks that hold the same value (a data-parallel group); when that is
        every rank of the job the error is collective (one line, every rank exits 3).
        """
        finite = math.isfinite(value) if np.ndim(value) == 0 else bool(np.isfinite(np.sum(value)))
        if not finite:
            err = Diverged(f"diverged: {where}: {what} is {_show(value)}{_checkpoint_note(run or self.run)}")
            err.collective = comm is not None and comm.size == self.comm.size
            raise err

    def check_params(self, params: dict, where: str, run=None, comm=None):
        """:meth:`check` every array of ``params`` (NumPy or CuPy), naming the first bad one.

        Beyond √(largest float) a parameter's products overflow: that is divergence too,
        caught before the NaNs it is about to make.
        """
        for name, value in params.items():
            top = float(abs(value).max()) if value.size else 0.0
            if not math.isfinite(top):
                self.check(np.asarray(_host(value)), f"parameter {name}", where, run, comm)
            limit = float(np.finfo(value.dtype).max) ** 0.5
            if top > limit:
                err = Diverged(f"diverged: {where}: parameter {name} reached {top:.3g}, beyond {limit:.3g} where "
                               f"its products overflow (learning rate too high?){_checkpoint_note(run or self.run)}")
                err.collective = comm is not None and comm.size == self.comm.size
                raise err

    # ---- the watchdog -------------------------------------------------------------------------
    def _watch(self):
        period = max(0.05, min(1.0, self.timeout / 10.0))
        while not self._stop.wait(period):
            if not self._armed:
                continue
            op, since, left = waiting()
            now = time.monotonic()
            if op is None:
                idle = now - max(self._beat, left)
                if idle > self.timeout:
                    self._end(f"rank {self.comm.rank} stalled: no progress for {idle:.0f} s "
                              f"(last step {self.steps}, {self.where})")
            elif now - since > 2 * self.timeout + 10:
                self._end(f"rank {self.comm.rank} waited {now - since:.0f} s in {op} for the other ranks "
                          f"(step {self.steps}, {self.where}): a rank stopped responding")

    def _end(self, message: str):
        print(f"{self.prog}: error: {message}; ending the job (exit {EXIT_STALLED})", file=sys.stderr, flush=True)
        self.comm.abort_now(EXIT_STALLED)


class StepsOnly:
    """A :class:`Guard` as seen by steps that are not safe points: heartbeat and injected
    faults at every step, but no agreement inside an epoch. The scheme's own boundaries are
    the safe points, where every rank's flags are summed: the ends of an ensemble's rounds
    (groups train different models at their own pace), a model-parallel slot."""

    def __init__(self, guard: Guard, safe_point: str):
        self.guard = guard
        self.safe_point = safe_point  # what a stop signal waits for, said when one comes

    @property
    def faults(self) -> list:
        return self.guard.faults

    def step(self, poison=None):
        self.guard.step(poison, self.safe_point)

    @staticmethod
    def flags() -> float:
        return 0.0

    @staticmethod
    def decide(summed: float) -> tuple[bool, bool]:
        return False, False


class _Armed:
    def __init__(self, guard, where):
        self.guard, self.where = guard, where

    def __enter__(self):
        g = self.guard
        self._before = (g.where, g._armed)
        g.where, g._armed, g._beat = self.where, True, time.monotonic()
        return g

    def __exit__(self, *exc):
        self.guard.where, self.guard._armed = self._before
        return False


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


def _show(value) -> str:
    if np.ndim(value) == 0:
        return str(float(value))
    a = np.asarray(value)
    bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
    return f"not finite ({bad} of {a.size} values NaN or Inf)"


def _checkpoint_note(run) -> str:
    if run is None or not getattr(run, "has_checkpoint", False):
        return "; no checkpoint had been saved"
    progress = run.checkpoint_progress or "?"
    return f"; the last good checkpoint ({progress}) stays in {run.checkpoint_path}"
