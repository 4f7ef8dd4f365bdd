"""Run directories: the one place a run writes, claimed safely and never shared.

A run directory holds ``run.json`` (the marker: scheme, options, state, the files aepar
wrote there), the run's results and, while it is unfinished, ``checkpoint.h5``. The
rules, checked on rank 0 for every rank before any data is read:

- ``--out DIR`` that does not exist: a new run. It is built in a temporary hidden sibling
  (``.DIR.aepar-HOST-PID``) and renamed into place at its first checkpoint or, for a run
  that never needed one, when its results are complete: the directory appears whole.
  After that every file is replaced atomically (temporary file, then rename).
- An existing path that is not an aepar run directory is never touched: refused.
- An existing aepar run directory: continued with ``--resume DIR``, replaced with
  ``--overwrite`` (only the files its ``run.json`` lists are deleted, when the new run
  first writes; anything else in it stays), otherwise refused.
- ``--resume-or-start --out DIR`` (what a job script that may be requeued passes): DIR
  that does not exist starts the run; DIR holding this program's run with the same
  options continues it from its checkpoint, or, when that run is complete, ends at once
  with exit 0 and a line saying so (a requeued job that had finished does not run again);
  DIR holding another program's run or other options is refused.
- ``.``, ``/``, the home directory and the directories containing the working directory
  are refused always.
- No ``--out``: a new numbered directory ``runs/<scheme>/NNN``, the first free number when
  the run's directory appears: runs started together in one working directory each get
  their own. An explicit ``--out`` that another run took meanwhile is refused, and the
  results stay in the staging directory the message names.

A file that cannot be written (disk full, quota, read-only file system, I/O error) ends the
run with one line naming it and what was kept (:class:`aepar.errors.WriteFailed`, exit 74):
the previous checkpoint stays intact, a half-written file is removed.

A run that fails before its first checkpoint leaves nothing behind (its staging
directory is removed). A run with a checkpoint that fails, diverges or is interrupted
keeps the directory, its checkpoint and a ``run.json`` saying why: ``--resume`` continues
it. Directories and files follow the user's umask.

``run.json`` also says what produced the run, so that a result can be traced back to its
code and machine: the aepar version and, run from a git checkout, its commit and whether
the work tree had changes; the parsed options (every value, defaults included, not only the
command line); the machine (:func:`aepar.machine.describe`, and the GPU when CuPy is in
use); the ranks and how they were laid out over the hosts.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np

from aepar.errors import UserError, WriteFailed, one_line
from aepar.guard import FAULT_ENV, WRITE_FAULTS, Fault

__all__ = ["RunDir", "MARKER", "CHECKPOINT", "read_marker", "resumed_args", "fingerprint", "same_data",
           "parse_and_open"]

MARKER = "run.json"
CHECKPOINT = "checkpoint.h5"
FORMAT = "aepar-run"
VERSION = 1
# options a resumed run may change; everything else must be what the run started with
RUN_CONTROL = {"out", "resume", "overwrite", "resume_or_start", "quiet", "checkpoint_every", "checkpoint_minutes",
               "timeout", "plot", "dp_ranks", "data_dir"}
# run-control flags that belong to one invocation, not to the run: a resumed run takes them from
# its own command line only (a run started --quiet by a script shows its progress when a
# person resumes it at a terminal)
PER_INVOCATION = ("--quiet",)
# options holding paths: made absolute against the directory the run started in
PATH_OPTIONS = ("data_dir", "images", "weights")
# options added since runs record their options, each with the value that trains as the
# aepar before it did: a run started without the option goes on without it when resumed
ADDED_OPTIONS = {"finetune_weight_decay": 0.0}  # 0.7.0


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def read_marker(directory) -> dict | None:
    """The ``run.json`` of an aepar run directory, None if there is none.

    Raises
    ------
    UserError
        A ``run.json`` that is not aepar's or cannot be read (the directory is then not
        touched).
    """
    path = Path(directory) / MARKER
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: unreadable ({type(e).__name__}); not touching {directory}") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise UserError(f"{path} is not an aepar run marker; not touching {directory}")
    return info


def _alive(info: dict) -> bool:
    """True if the run that wrote ``info`` may still be running on this host."""
    if info.get("state") != "running" or info.get("host") != socket.gethostname():
        return False
    try:
        pid = int(info.get("pid", -1))
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError, OverflowError):
        return False
    except PermissionError:
        return True
    # a killed rank may linger as a zombie until its parent reaps it: dead, not running
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _describe(info: dict) -> str:
    ckpt = info.get("checkpoint") or {}
    when = info.get("updated") or info.get("started") or "?"
    text = f"an aepar.{info.get('scheme', '?')} run ({info.get('state', '?')}, {when}"
    if ckpt.get("progress") and info.get("state") != "complete":
        text += f", checkpoint at {ckpt['progress']}"
    return text + ")"


def _forbidden(path: Path) -> str | None:
    """Why ``path`` may never be a run directory, or None."""
    real = os.path.realpath(path)
    cwd = os.path.realpath(os.getcwd())
    home = os.path.realpath(os.path.expanduser("~"))
    if real == os.path.realpath(os.sep):
        return "is the root directory"
    if real == home:
        return "is your home directory"
    if real == cwd:
        return "is the working directory"
    if cwd.startswith(real.rstrip(os.sep) + os.sep):
        return "contains the working directory"
    return None


def _writable_ancestor(path: Path) -> str | None:
    """Why the directories above ``path`` cannot receive it, or None."""
    parent = path.parent
    while not os.path.lexists(parent):
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def _next_numbered(base: Path) -> Path:
    """``base/NNN``, the first number after every one already there."""
    used = [int(p.name) for p in base.iterdir() if p.name.isdigit()] if base.is_dir() else []
    return base / f"{max(used, default=0) + 1:03d}"


def _decide(scheme: str, out, resume, overwrite: bool) -> tuple[Path, dict | None, bool]:
    """(run directory, previous marker or None, auto-numbered) for the options, or UserError.

    No communication: rank 0 calls it and the others learn the answer.
    """
    if resume is not None and out is not None and os.path.abspath(out) != os.path.abspath(resume):
        raise UserError(f"--resume {resume} and --out {out} name different directories; give one")
    if resume is not None and overwrite:
        raise UserError("--resume and --overwrite contradict each other; give one")
    if resume is None and out is None:
        if overwrite:
            raise UserError("--overwrite needs --out DIR naming the run directory to replace")
        base = Path("runs") / scheme
        if os.path.lexists(base) and not base.is_dir():
            raise UserError(f"{base} exists and is not a directory; give --out DIR")
        path, auto = _next_numbered(base), True
    else:
        path, auto = Path(resume if resume is not None else out), False
    flag = "--resume" if resume is not None else "--out"  # the option the user gave
    why = _forbidden(path)
    if why:
        raise UserError(f"{flag} {path} {why}; name a new directory for the run")
    if not os.path.lexists(path):
        if resume is not None:
            raise UserError(f"--resume {path}: no such run directory")
        problem = _writable_ancestor(path)
        if problem:
            raise UserError(f"--out {path}: cannot be created ({problem})")
        return path, None, auto
    if os.path.islink(path) and not os.path.exists(path):
        raise UserError(f"{flag} {path} is a dangling symbolic link; not touching it")
    if not path.is_dir():
        raise UserError(f"{flag} {path} exists and is not a directory; not touching it")
    info = read_marker(path)
    if info is None and resume is not None:
        raise UserError(f"--resume {path} exists and is not an aepar run directory (no run.json of "
                        "aepar's): nothing to resume there")
    if info is None:
        raise UserError(f"--out {path} exists and is not an aepar run directory; aepar writes only "
                        "into a new directory or its own run directory: name a new one")
    if _alive(info):
        raise UserError(f"{path} is in use by a running aepar.{info.get('scheme')} "
                        f"(pid {info.get('pid')} on {info.get('host')})")
    if resume is not None:
        if info.get("scheme") != scheme:
            raise UserError(f"--resume {path} holds {_describe(info)}, not an aepar.{scheme} run")
        if info.get("state") == "complete":
            raise UserError(f"--resume {path}: the run is complete; nothing to resume "
                            "(--out DIR --overwrite runs it again)")
        if not (path / CHECKPOINT).is_file():
            raise UserError(f"--resume {path}: no {CHECKPOINT} (the run ended before its first "
                            "checkpoint); start it again with --overwrite")
        return path, info, False
    if overwrite:
        return path, info, False
    hint = ("continue it with --resume, replace it with --overwrite"
            if info.get("state") != "complete" and (path / CHECKPOINT).is_file()
            else "replace it with --overwrite")
    raise UserError(f"--out {path} holds {_describe(info)}: {hint}, or name a new directory")


def _resolved(name: str, value, start_dir: str | None):
    """A path option's value made absolute against the directory its run started in."""
    if name in PATH_OPTIONS and value and start_dir and not os.path.isabs(value):
        return os.path.normpath(os.path.join(start_dir, value))
    return value


def _other_options(parse, argv: list, info: dict) -> str | None:
    """How ``argv`` differs from the options of the run ``info`` describes (the first
    difference, "--epochs 6 (the run has 5)"), or None when it asks for the same run."""
    old, new = parse(list(info.get("argv") or [])), parse(list(argv))
    for name, value in vars(old).items():
        if name in RUN_CONTROL:
            continue
        value = _resolved(name, value, info.get("cwd"))
        now = _resolved(name, getattr(new, name, None), os.getcwd())
        if now != value:
            return f"--{name.replace('_', '-')} {now} (the run has {value})"
    return None


def _resume_or_start(scheme: str, out, parse, argv: list) -> str:
    """What ``--resume-or-start --out DIR`` does: "start" (DIR does not exist, or is no aepar
    run: the usual checks of ``--out`` then apply), "resume" (DIR holds this run, unfinished)
    or "complete" (DIR holds this run, finished). No communication: rank 0 calls it.

    Raises
    ------
    UserError
        DIR holds another program's run, or this program's with other options.
    """
    path = Path(out)
    info = read_marker(path) if path.is_dir() else None
    if info is None:
        return "start"
    if info.get("scheme") != scheme:
        raise UserError(f"--resume-or-start --out {path} holds {_describe(info)}, not an aepar.{scheme} run; "
                        "name a new directory")
    other = _other_options(parse, argv, info)
    if other is not None:
        raise UserError(f"--resume-or-start --out {path} holds {_describe(info)} with other options: {other}; "
                        "give the run's own options, or name a new directory")
    return "complete" if info.get("state") == "complete" else "resume"


_PLAIN = (str, int, float, bool, type(None))


def _as_json(value):
    """``value`` as started_options records it (tuples as lists), or None where JSON would
    not hold it as it is."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value):
        return list(value)
    return None


def started_options(args) -> dict:
    """The options a run starts with, as parsed (before any scheme changes one), where JSON
    holds them as they are: what a resumed run keeps when a later aepar has other defaults."""
    return {k: _as_json(v) for k, v in vars(args).items() if v is None or _as_json(v) is not None}


def resumed_args(parse, argv: list, info: dict):
    """The options of a resumed run: the ones it started with, then ``argv`` on top.

    ``parse(list) -> namespace`` is the scheme's parser. Options other than the run
    controls (:data:`RUN_CONTROL`) must not change; relative paths are taken from the
    directory the run started in. An option the run left at its default keeps the value it
    started with (run.json's ``started_options``) where this aepar's default differs, and an
    option it did not have yet (:data:`ADDED_OPTIONS`) takes the value that trains as before:
    a run resumed after an upgrade trains on as it began.

    Raises
    ------
    UserError
        An option that differs from the run being resumed.
    """
    old_argv = list(info.get("argv") or [])
    carried = [a for a in old_argv if a not in PER_INVOCATION]
    old, new = parse(old_argv), parse(carried + list(argv))
    for name, value in {**ADDED_OPTIONS, **(info.get("started_options") or {})}.items():
        now = getattr(old, name, None)
        if name in RUN_CONTROL or not hasattr(old, name) or _as_json(now) == value:
            continue  # a run control, an option gone, or a default that did not move
        was = tuple(value) if isinstance(now, tuple) and isinstance(value, list) else value
        if getattr(new, name, None) == now:  # not given anew on this command line
            setattr(new, name, was)
        setattr(old, name, was)
    for name, value in vars(old).items():
        if name not in RUN_CONTROL and getattr(new, name, value) != value:
            raise UserError(f"--{name.replace('_', '-')} {getattr(new, name)} differs from the run being "
                            f"resumed ({value}); a resumed run keeps its options")
    start_dir = info.get("cwd")
    for name in PATH_OPTIONS:
        value = getattr(new, name, None)
        if start_dir and value and not os.path.isabs(value) and value == getattr(old, name, None):
            setattr(new, name, os.path.join(start_dir, value))
    return new


def fingerprint(*arrays) -> str:
    """A short hash of arrays' shapes, dtypes and bytes: is a resumed run's data the same?"""
    h = hashlib.blake2b(digest_size=12)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.shape}{a.dtype.str}".encode())
        h.update(a.data)
    return h.hexdigest()


def same_data(saved: str | None, now: str, path):
    """UserError if the data a resumed run found are not those it started with."""
    if saved is not None and saved != now:
        raise UserError(f"{path}: the data differ from the run being resumed (fingerprint {now}, "
                        f"saved {saved}): resume with the same data files and options")


def parse_and_open(comm, scheme: str, prog: str, parse, argv):
    """A scheme's options and its run directory, checked on every rank (collective).

    ``parse(list) -> namespace`` is the scheme's parser. A new run parses ``argv``; a
    resumed one (``--resume DIR``) parses the options the run started with, ``argv`` on
    top (:func:`resumed_args`), so ``--resume DIR`` alone is enough.

    Returns
    -------
    (args, RunDir)
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--out")
    pre.add_argument("--resume")
    pre.add_argument("--overwrite", action="store_true")
    pre.add_argument("--resume-or-start", action="store_true")
    known, _ = pre.parse_known_args(argv)
    resume = known.resume
    if known.resume_or_start:
        def decide():
            if known.out is None:
                raise UserError("--resume-or-start needs --out DIR: the run directory to start or continue")
            if known.resume is not None or known.overwrite:
                raise UserError(f"--resume-or-start contradicts --{'resume' if known.resume else 'overwrite'}; "
                                "give one")
            return _resume_or_start(scheme, known.out, parse, argv) if comm.is_root else None

        action = comm.bcast(comm.agree(decide))
        if action == "complete":
            if comm.is_root:
                print(f"{prog}: {known.out} holds this run, complete: nothing to do", flush=True)
            raise SystemExit(0)
        resume = known.out if action == "resume" else None
    args = parse(argv) if resume is None else None
    run = RunDir.open(comm, scheme, out=known.out, resume=resume, overwrite=known.overwrite,
                      argv=argv, prog=prog)
    if run.resumed:
        args = comm.agree(resumed_args, parse, argv, run.previous)
    run.describe_job(args, comm.allgather(socket.gethostname()))
    return args, run


def _rename_noreplace(src: Path, dst: Path):
    """rename(2) that fails with FileExistsError instead of replacing an (empty) ``dst``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):  # else: the file system cannot do it
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another run's directory won the race
            raise FileExistsError(errno.EEXIST, "exists", str(dst)) from None
        raise


class RunDir:
    """This run's directory (see the module docstring). Make it with :meth:`open`.

    Only the root rank touches the file system; on the other ranks every method is a
    no-op and :meth:`output` yields None.

    Attributes
    ----------
    path : Path
        The run directory (it may not exist yet).
    previous : dict or None
        The ``run.json`` found there (a resumed or overwritten run).
    resumed : bool
    """

    def __init__(self, comm, scheme: str, path: Path, previous: dict | None, resumed: bool, auto: bool,
                 argv: list, prog: str):
        self.comm, self.scheme, self.path = comm, scheme, Path(path)
        self.previous, self.resumed, self.auto = previous, resumed, auto
        self.argv, self.prog = list(argv), prog
        self.is_root = comm.is_root
        self._staging: Path | None = None
        self._published = resumed
        self._with_checkpoint: list = []  # writers of the files kept in step with each checkpoint
        self._files: list[str] = []
        self._checkpoint: dict | None = None
        self._history: list = []
        self._started = _now()
        self._id = uuid.uuid4().hex  # tells this run from any other that takes the same directory
        self._args = None  # the parsed options, the hosts of the ranks: see describe_job
        self._started_options: dict | None = None
        self._hosts: list[str] = []
        self._machine: dict | None = None
        self._writes = 0  # files written through output(), counted for injected write faults
        self._write_faults = [f for f in Fault.parse(os.environ.get(FAULT_ENV))
                              if f.kind in WRITE_FAULTS and f.rank == comm.rank]
        if resumed:
            self._checkpoint = previous.get("checkpoint")
            # the run's own options, whatever this resuming command line said (a run may be
            # interrupted and resumed again and again)
            self.argv = list(previous.get("argv") or [])
        if resumed and self.is_root:
            self._files = [f for f in previous.get("files", []) if isinstance(f, str)]
            self._history = list(previous.get("history", []))
            self._started = previous.get("started", self._started)
            self._started_options = previous.get("started_options")
            self._id = previous.get("id", self._id)
            self._remove_stale_temporaries()
            self._write_marker("running")

    # ---- claiming -----------------------------------------------------------------------
    @classmethod
    def open(cls, comm, scheme: str, *, out=None, resume=None, overwrite=False, argv=(), prog=None) -> "RunDir":
        """Check ``--out``/``--resume``/``--overwrite`` on the root for every rank.

        Collective. Nothing is written here. Raises UserError on every rank when the
        options are refused.
        """
        decision = comm.agree(lambda: _decide(scheme, out, resume, overwrite) if comm.is_root else None)
        path, previous, auto = comm.bcast(decision)
        return cls(comm, scheme, path, previous, resume is not None, auto, list(argv),
                   prog or f"aepar.{scheme}")

    def describe_job(self, args, hosts: list):
        """What run.json records of this job besides its argv: the parsed options ``args``
        (read when the marker is written: a value set after parsing, auto's chosen scheme,
        is the one recorded) and the host of every rank (``hosts[rank]``)."""
        self._args, self._hosts = args, list(hosts)
        if self._started_options is None:  # a new run (a resumed one keeps its first's)
            self._started_options = started_options(args)

    # ---- writing --------------------------------------------------------------------------
    @contextlib.contextmanager
    def output(self, name: str):
        """Yield a path to write ``name`` to (root; None elsewhere); it appears in the run
        directory, atomically, when the block ends without an exception."""
        if not self.is_root:
            yield None
            return
        self._writes += 1
        if self._published:
            final = self.path / name
            tmp = self.path / f".{name}.{os.getpid()}.tmp"
            try:
                with self._writing(final):
                    yield tmp
                    self._injected_write_fault(tmp)
                    os.replace(tmp, final)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            staged = self._stage() / name
            with self._writing(self.path / name):
                yield staged
                self._injected_write_fault(staged)
        if name not in self._files:
            self._files.append(name)

    def write_text(self, name: str, text: str):
        with self.output(name) as path:
            if path is not None:
                path.write_text(text)

    def write_json(self, name: str, obj):
        self.write_text(name, json.dumps(obj, indent=2, default=_jsonable) + "\n")

    def written(self, name: str) -> Path:
        """Where the file ``name`` this run wrote lies now (root): in the run directory, or
        in its staging directory before the run is published."""
        return (self.path if self._published else self._stage()) / name

    def save_checkpoint(self, write, progress: str):
        """``write(path)`` the checkpoint (root), record ``progress`` (e.g. "layer 2 epoch
        5"), and make sure the directory exists under its final name from now on. Not
        collective: call it on the root alone or on every rank."""
        with self.output(CHECKPOINT) as path:
            if path is not None:
                write(path)
        self._checkpoint = {"file": CHECKPOINT, "progress": progress, "saved": _now(),
                            "ranks": self.comm.size}
        if self.is_root:
            if self._published:
                self._write_marker("running")
            else:
                self._publish("running")
            for write in self._with_checkpoint:
                write()

    def with_checkpoint(self, write):
        """Call ``write()`` (root) after every checkpoint: a file that goes with it, such as
        metrics.csv, which a run that ends before its first checkpoint never writes."""
        self._with_checkpoint.append(write)

    @property
    def published(self) -> bool:
        """Whether the run directory exists under its final name (from the first checkpoint,
        or the results, on)."""
        return self._published

    def complete(self):
        """All results are written: mark the run complete (publishing it if need be) and
        drop its checkpoint."""
        if not self.is_root:
            return
        had_checkpoint = CHECKPOINT in self._files
        if had_checkpoint:
            self._files.remove(CHECKPOINT)
        self._checkpoint = None
        if self._published:  # the marker first: it never lists a checkpoint that is gone
            self._write_marker("complete")
        if had_checkpoint:
            with contextlib.suppress(FileNotFoundError):
                os.unlink((self.path if self._published else self._stage()) / CHECKPOINT)
        if not self._published:
            self._publish("complete")

    def abandon(self, state: str, reason: str):
        """The run ends without results: keep a checkpoint (and say why), else leave nothing."""
        if not self.is_root:
            return
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        if self._published and (self.path / CHECKPOINT).is_file():
            # on a full disk this may fail too: the marker then still says "running", which
            # --resume accepts once the process is gone
            with contextlib.suppress(WriteFailed):
                self._write_marker(state, reason=reason)

    @property
    def has_checkpoint(self) -> bool:
        return self._checkpoint is not None

    @property
    def checkpoint_progress(self) -> str | None:
        return None if self._checkpoint is None else self._checkpoint.get("progress")

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            state = getattr(exc, "run_state", "failed")
            self.abandon(state, one_line(exc))
        return False

    # ---- internals ------------------------------------------------------------------------
    def _stage(self) -> Path:
        if self._staging is None:
            parent = self.path.parent
            parent.mkdir(parents=True, exist_ok=True)
            name = f".{self.path.name}.aepar-{socket.gethostname()}-{os.getpid()}"
            self._staging = parent / name
            if self._staging.exists():  # a previous attempt of this very process
                shutil.rmtree(self._staging)
            with self._writing(self._staging):
                os.mkdir(self._staging)  # mode 0777 & ~umask
        return self._staging

    def _marker(self, state: str, reason: str | None = None) -> dict:
        entry = {"state": state, "at": _now(), "ranks": self.comm.size}
        if reason:
            entry["reason"] = reason
        if not self._history or self._history[-1].get("state") != state or reason:
            self._history.append(entry)
        cwd = (self.previous or {}).get("cwd") if self.resumed else None
        if self._machine is None:  # once, when the backend (and CuPy, on a GPU) is loaded
            self._machine = _machine(self.comm.size)
        return {"format": FORMAT, "version": VERSION, "id": self._id, "scheme": self.scheme, "prog": self.prog,
                "state": state, "reason": reason, "argv": self.argv, "cwd": cwd or os.getcwd(),
                "ranks": self.comm.size, "host": socket.gethostname(), "pid": os.getpid(),
                "started": self._started, "updated": _now(), "checkpoint": self._checkpoint,
                "files": list(self._files), "history": self._history, "aepar": _provenance(),
                "options": None if self._args is None else vars(self._args),
                "started_options": self._started_options,
                "layout": _layout(self._hosts or [socket.gethostname()] * self.comm.size),
                "machine": self._machine}

    def _write_marker(self, state: str, reason: str | None = None, directory: Path | None = None):
        directory = directory or (self.path if self._published else self._stage())
        tmp = directory / f".{MARKER}.{os.getpid()}.tmp"
        try:
            with self._writing(directory / MARKER):
                tmp.write_text(json.dumps(self._marker(state, reason), indent=2, default=_jsonable) + "\n")
                os.replace(tmp, directory / MARKER)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _publish(self, state: str):
        """Give the staged directory its final name: a new name by an atomic rename that never
        replaces anything, or (``--overwrite``) the replaced run's own files swapped for ours."""
        staging = self._stage()
        replacing = self.previous is not None and not self.resumed and os.path.lexists(self.path)
        if replacing:
            now = read_marker(self.path)
            if now is None or (now.get("id"), now.get("started")) != (self.previous.get("id"),
                                                                       self.previous.get("started")):
                self._keep_staged(f"{self.path} changed while this run was working (it is no longer the "
                                  "run --overwrite was to replace)")
            with self._writing(self.path):
                for name in set(now.get("files", [])) | {MARKER, CHECKPOINT}:
                    target = self.path / name
                    if isinstance(name, str) and "/" not in name and target.is_file():
                        target.unlink()
                for name in self._files:
                    os.replace(staging / name, self.path / name)
            self._published = True
            self._write_marker(state)
            shutil.rmtree(staging, ignore_errors=True)
        else:
            self._write_marker(state, directory=staging)
            while True:
                try:
                    with self._writing(self.path):
                        _rename_noreplace(staging, self.path)
                    break
                except FileExistsError:
                    if not self.auto:
                        self._keep_staged(f"{self.path} appeared while this run was working")
                    # another run took this number first: the next free one is ours
                    self.path = _next_numbered(self.path.parent)
            self._published = True
        self._staging = None

    def _keep_staged(self, why: str):
        """Refuse to publish: the complete results stay in the staging directory, which the
        run's failure then leaves alone."""
        staging, self._staging = self._staging, None
        raise UserError(f"{why}; this run's results stay in {staging}")

    @contextlib.contextmanager
    def _writing(self, target: Path):
        """Turn a failed write of ``target`` into :class:`WriteFailed`: one line naming the
        file, the reason and what is kept."""
        try:
            yield
        except FileExistsError:
            raise
        except OSError as e:
            code = _errno_of(e)
            reason = os.strerror(code) if code else str(e).splitlines()[0]
            raise WriteFailed(f"cannot write {target}: {reason}; {self._what_is_kept()}") from None

    def _what_is_kept(self) -> str:
        if self._published and self._checkpoint is not None and (self.path / CHECKPOINT).is_file():
            return (f"the last checkpoint ({self._checkpoint.get('progress')}) in {self.path} is intact: "
                    f"make room, then --resume {self.path}")
        if self._published:
            return f"{self.path} keeps what it held before this write"
        return "the run had no checkpoint yet, so nothing is kept (its staging directory is removed)"

    def _injected_write_fault(self, written: Path):
        """AEPAR_FAULT's write kinds (aepar.guard): fail as a full disk would, after writing."""
        for f in self._write_faults:
            if f.step == self._writes:
                print(f"{self.prog}: {FAULT_ENV}: {f.kind} on rank {self.comm.rank}, file {self._writes} "
                      f"({written.name})", file=sys.stderr, flush=True)
                code = WRITE_FAULTS[f.kind]
                raise OSError(code, os.strerror(code), str(written))

    def _remove_stale_temporaries(self):
        """Temporary files a killed writer of this run left behind (aepar's own)."""
        for p in self.path.glob(".*.tmp"):
            if p.is_file():
                with contextlib.suppress(OSError):
                    p.unlink()


def _git(directory: Path, *args: str) -> str | None:
    """``git -C directory ARGS``'s output, None when git is missing or says no."""
    try:
        out = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _provenance() -> dict:
    """The aepar that runs: its version and, when the package is a git checkout's own
    ``aepar/`` (not an installed copy inside some other work tree), the commit and whether
    tracked files differ from it."""
    import aepar

    package = Path(aepar.__file__).resolve().parent
    info = {"version": aepar.__version__, "commit": None, "dirty": None}
    top = _git(package, "rev-parse", "--show-toplevel")
    if top and Path(top).resolve() / "aepar" == package:
        info["commit"] = _git(package, "rev-parse", "HEAD")
        status = _git(package, "status", "--porcelain", "--untracked-files=no")
        info["dirty"] = None if status is None else bool(status)
    return info


def _layout(hosts: list) -> dict:
    """The ranks per host, in the order of their first rank: {"ranks": 4, "hosts": {"n1": 2, "n2": 2}}."""
    per_host: dict[str, int] = {}
    for host in hosts:
        per_host[host] = per_host.get(host, 0) + 1
    return {"ranks": len(hosts), "hosts": per_host}


def _machine(ranks: int) -> dict:
    """:func:`aepar.machine.describe_run` of the root's machine, and its GPU when CuPy is loaded."""
    from aepar import machine

    try:
        info = machine.describe_run(ranks)
    except Exception as e:  # a record of the run, never a reason for it to fail
        info = {"error": f"{type(e).__name__}: {e}"}
    info["gpu"] = None
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with contextlib.suppress(Exception):
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"]
            info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    return info


def _errno_of(exc: OSError) -> int | None:
    """The errno of an OSError; h5py leaves it out of some and names it in the text."""
    if exc.errno:
        return exc.errno
    found = re.search(r"errno = (\d+)", str(exc))
    return int(found.group(1)) if found else None


def _jsonable(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)
