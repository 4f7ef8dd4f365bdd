"""``metrics.csv``, the one record of training progress every program writes, and the
time-left estimate of its progress lines.

One row per epoch (per stage or layer for the layer-wise schemes and per model for
``aepar.eager``; per :data:`aepar.schemes.sparse.PROGRESS_EVERY` L-BFGS iterations for
``aepar.sparse``), written by rank 0 as training goes: once the run directory exists (its
first checkpoint) the whole file is replaced atomically after each row; before, the rows
wait for that checkpoint or the results, so a run that fails before either leaves nothing. A resumed run continues the file:
the rows before its checkpoint are kept, and the rows an interrupted process wrote after
its checkpoint are replaced by the same epochs trained again: a row is known by its
phase, stage and epoch, a resumed run repeats the epochs after its checkpoint, and a row
trained again replaces the old one and every old row after it (pipeline stages on other
ranks report in no fixed order: a row trained again also replaces an old one further up).
``elapsed_s`` goes on from the last row kept, so it only grows.

Every program gets its recorder with :func:`of` (one per run directory).
"""
from __future__ import annotations

import csv
import io
import time
import weakref
from datetime import datetime

__all__ = ["FIELDS", "FILE", "Metrics", "Eta", "of", "read", "left_text"]

FILE = "metrics.csv"
FIELDS = ("phase", "stage", "epoch", "time", "elapsed_s", "train_loss", "val_loss", "train_error", "val_error", "lr")

_recorders: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def of(run) -> "Metrics":
    """The recorder of run directory ``run`` (made on the first call, whose time is
    ``elapsed_s`` 0 of this process); a recorder that writes nothing when ``run`` is None."""
    if run is None:
        return Metrics(None)
    if run not in _recorders:
        _recorders[run] = Metrics(run)
    return _recorders[run]


def read(path) -> list[dict]:
    """The rows of a ``metrics.csv`` (strings; empty cells are empty strings)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.9g}"
    return str(value)  # as read back from the file: a resumed run's rows compare equal


class Metrics:
    """Rows of ``metrics.csv`` for one run (rank 0 writes; elsewhere every call does nothing)."""

    def __init__(self, run):
        self.run = run
        self.writes = run is not None and run.is_root
        self.t0 = time.monotonic()
        self.offset = 0.0
        self.rows: list[dict] = []
        self._old: list[dict] | None = None  # a resumed run's rows, until its first new one
        if self.writes and run.resumed:
            path = run.path / FILE
            self._old = read(path) if path.is_file() else []
        self._unwritten = False  # rows kept back until the run directory exists
        if self.writes:  # before the first checkpoint the rows stay here: a failed run leaves nothing
            run.with_checkpoint(lambda: self._unwritten and self.write())

    def elapsed(self) -> float:
        """Seconds since this run began (a resumed run: its last kept row's plus this process's)."""
        if self._old is not None:  # before the first new row, the rows a resumed run keeps are all
            self._join(None)
        return self.offset + time.monotonic() - self.t0

    def _join(self, key):
        """Keep a resumed run's rows before ``key`` (all when None or absent), and go on from them."""
        old, self._old = self._old, None
        old = [{k: r.get(k) or "" for k in FIELDS} for r in old]
        keys = [(r["phase"], r["stage"], r["epoch"]) for r in old]
        cut = keys.index(key) if key in keys else len(old)
        self.rows = old[:cut]
        if self.rows:
            try:
                self.offset = float(self.rows[-1]["elapsed_s"])
            except (KeyError, ValueError):
                self.offset = 0.0
        self.t0 = time.monotonic()

    def add(self, phase: str, epoch, *, stage="", elapsed_s: float | None = None, stamp: float | None = None,
            **values):
        """One row: ``phase`` (pretrain, finetune, classify, lbfgs, ...), ``stage`` (the layer,
        model or pipeline stage; empty where there is one), ``epoch`` (the L-BFGS iteration
        for lbfgs), and any of ``train_loss``, ``val_loss``, ``train_error``, ``val_error``,
        ``lr``. ``elapsed_s`` and ``stamp`` (seconds since the epoch of the clock) default to now;
        rows recorded after the fact (pipeline stages on other ranks) give their own."""
        if not self.writes:
            return
        unknown = set(values) - set(FIELDS)
        if unknown:
            raise TypeError(f"metrics.csv has no column {sorted(unknown)[0]}")
        key = (str(phase), str(stage), str(epoch))
        if self._old is not None:
            self._join(key)
        self.rows = [r for r in self.rows if (r["phase"], r["stage"], r["epoch"]) != key]
        now = self.elapsed()
        elapsed = now if elapsed_s is None else float(elapsed_s)
        when = time.time() - (now - elapsed) if stamp is None else stamp
        row = {"phase": phase, "stage": stage, "epoch": epoch,
               "time": datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds"),
               "elapsed_s": round(elapsed, 3), **values}
        self.rows.append({k: _cell(row.get(k)) for k in FIELDS})
        self._unwritten = True
        if self.run.published:
            self.write()

    def write(self):
        """Replace ``metrics.csv`` with the rows so far (root)."""
        if not self.writes:
            return
        if self._old is not None:
            self._join(None)
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        self.run.write_text(FILE, out.getvalue())
        self._unwritten = False


class Eta:
    """Time left of a phase, from the pace of the work done in it by this process.

    ``total``: the phase's work in any unit (epochs, or epochs weighted by their cost);
    ``done``: what was done before this process began it (a resumed run).
    """

    def __init__(self, total: float, done: float = 0.0):
        self.total, self.first, self.t0 = float(total), float(done), time.monotonic()

    def left(self, done: float) -> float | None:
        """Seconds left after ``done`` units (None before any was timed)."""
        if done <= self.first:
            return None
        pace = (time.monotonic() - self.t0) / (done - self.first)
        return max(0.0, pace * (self.total - done))


def left_text(seconds: float | None) -> str:
    """"1m20s left", "2h05m left", "4s left"; "? left" when not known yet."""
    if seconds is None:
        return "? left"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s left"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s left"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m left"
