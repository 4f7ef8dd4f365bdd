"""What every benchmark shares: launching ``python -m ...`` on N ranks, the one timing loop
and its one statistic, and CSV rows that carry the machine they were measured on.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["PY", "ONE_PROCESS", "mpirun", "mpi_env", "python_command", "fastest", "fastest_run", "Timing",
           "time_calls", "time_call", "across_ranks", "machine_columns", "with_machine", "read_rows",
           "write_rows", "merge_rows", "KEY", "Records", "dates_text"]

PY = sys.executable


# ==== launching ==================================================================================
def mpirun() -> list[str]:
    """The launcher and its options: ``MPIRUN`` (split on spaces, as jobs/lib.sh takes it),
    else the mpirun next to this Python, else the first on PATH, with ``--oversubscribe``
    (a 2-core machine runs the 4-rank points too; such rows say ``oversubscribed``)."""
    if os.environ.get("MPIRUN"):
        return os.environ["MPIRUN"].split()
    here = Path(PY).parent / "mpirun"
    exe = str(here) if here.exists() else shutil.which("mpirun")
    if exe is None:
        raise SystemExit("bench: no mpirun found (not next to this Python, not on PATH; MPIRUN unset)")
    return [exe, "--oversubscribe"]


def mpi_env(**changes) -> dict:
    """This process's environment for a launched command: Open MPI allowed to run as root
    (containers, CI), then ``changes`` (a value None removes the variable)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def python_command(module: str, args=(), ranks: int = 1, threads: int = 1) -> list[str]:
    """``python -m module args`` in one process, under :func:`mpirun` ``-np ranks`` for more.
    Ranks of several ``threads`` run unbound (``--bind-to none``, as jobs/lib.sh runs them),
    unless the launcher's options place them already: mpirun binds each of 2 ranks or
    fewer to one core, where its threads would take turns."""
    cmd = [PY, "-m", module, *map(str, args)]
    if ranks <= 1:
        return cmd
    launcher = mpirun()
    placed = any(o.startswith(("--bind-to", "--map-by")) for o in launcher)
    return launcher + (["--bind-to", "none"] if threads > 1 and not placed else []) + ["-np", str(ranks)] + cmd


def run_to_end(prog: str, name: str, cmd: list, out: Path, env: dict, cwd) -> None:
    """Run the aepar command ``cmd``, which writes the run directory ``out`` with
    ``--resume-or-start``, to its end, passing each line it prints on as "  name | line" (its
    epochs' progress with the time left: benchmarks of hours would say nothing otherwise). A
    run stopped by a signal (exit 75, after its checkpoint), or by the terminal's Ctrl-C, which
    reaches this process and the run alike (waited for, so that it saves its checkpoint rather
    than being killed half-way; a second Ctrl-C stops the wait), ends the benchmark in one line
    saying that the same command continues it, exit 75."""
    def relay(lines):
        for line in lines:
            print(f"  {name} | {line.rstrip()}", flush=True)

    interrupted = False
    with tempfile.TemporaryFile("w+") as errors:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=cwd) as child:
            try:
                relay(child.stdout)
            except KeyboardInterrupt:
                interrupted = True
                relay(child.stdout)
        errors.seek(0)
        stderr = errors.read()
    if child.returncode == 0 and interrupted:  # Ctrl-C as the run was finishing: it is complete
        print(f"{prog}: stopped after {name}, which is complete: the same command goes on from there",
              file=sys.stderr, flush=True)
        raise SystemExit(75)
    if child.returncode == 75 or interrupted:  # 75: aepar's exit on a signal, after its checkpoint
        where = (f"with a checkpoint in {out}" if child.returncode == 75 else
                 f"before its first checkpoint in {out}" if out.exists() else "before it had started")
        print(f"{prog}: {name} stopped {where}: the same command continues it", file=sys.stderr, flush=True)
        raise SystemExit(75)
    if child.returncode != 0:
        reason = stderr.strip()[-800:] or "no message on stderr"
        raise SystemExit(f"{prog}: {name} failed (exit {child.returncode}): {reason}")


def dates_text(dates) -> str:
    """The days the runs were measured on: "on 2026-11-24" or "from 2026-11-22 to 2026-11-24"."""
    days = sorted({d[:10] for d in dates if d})
    if not days:
        return "on unknown dates"
    return f"on {days[0]}" if len(days) == 1 else f"from {days[0]} to {days[-1]}"


# ==== a long study in pieces =====================================================================
class Records:
    """The finished runs of a study of many hours, one JSON file each in ``folder`` (kept in
    bench/results and committed as they come): the run's summary.json with its options,
    ranks, command, date and commit. A run whose record has the same options and ranks is
    read back instead of repeated, so such a study can be done in pieces (jobs of a few
    hours, one seed per job or machine, a clone on another day) and each row keeps the
    machine and date of its own run. ``folder`` None: no records (every run is done here)."""

    def __init__(self, prog: str, folder=None):
        self.prog, self.folder = prog, None if folder is None else Path(folder)

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def read(self, name: str, args, ranks: int, say: bool = True) -> dict | None:
        """The record of run ``name`` made with ``args`` on ``ranks`` ranks ({"summary",
        "launch", ...}), or None (no folder, no record, or one made with other options);
        ``say``: one line on what was found."""
        if self.folder is None or not self._path(name).exists():
            return None
        path = self._path(name)
        try:
            record = json.loads(path.read_text())
            same = record["args"] == [str(a) for a in args] and int(record["ranks"]) == int(ranks)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{self.prog}: {path}: not a run record ({exc}); move it away to run {name} again")
        if not same:
            if say:
                print(f"{self.prog}: {name}: {path} was made with other options or ranks: running it again",
                      flush=True)
            return None
        if say:
            machine = (record["summary"].get("machine") or {}).get("cpu_model") or "an unrecorded machine"
            print(f"{self.prog}: {name}: read back from {path} (run {record['launch'].get('date')} on {machine})",
                  flush=True)
        return record

    def keep_if_new(self, name: str, args, ranks: int, summary: dict, launch: dict) -> None:
        """:meth:`keep` a run found finished elsewhere (in the work directory) unless it is
        recorded already (a record is not rewritten: its commit is that of the run)."""
        if self.folder is not None and self.read(name, args, ranks, say=False) is None:
            self.keep(name, args, ranks, summary, launch)

    def keep(self, name: str, args, ranks: int, summary: dict, launch: dict) -> None:
        """Record a finished run (written whole or not at all)."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"name": name, "args": [str(a) for a in args], "ranks": int(ranks), "launch": launch,
                  "commit": _commit(), "summary": summary}
        tmp = self._path(name).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, self._path(name))


def _commit() -> str | None:
    """The checkout's commit (with "+" when it has uncommitted changes), or None."""
    here = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


# ==== timing =====================================================================================
def fastest(samples) -> float:
    """The one statistic of repeated timings: the fastest sample (after warm-up).

    Not the median: on the shared machines these benchmarks run on, interference only ever
    adds time (other jobs' time slices, a descheduled rank, a host's slow spell of seconds),
    so the fastest sample is the one least disturbed, the figure a rerun reproduces, and a
    comparison of two codes timed in turns compares the codes, not the moments. The spread
    is not hidden: rows that record every sample keep them (``all_seconds``)."""
    return min(samples)


def fastest_run(runs, seconds: Callable = lambda run: run["seconds"]):
    """The run :func:`fastest` picks among whole runs timed once each (commands, scheme runs
    read back from their summaries): the one of least ``seconds(run)``."""
    return min(runs, key=seconds)


def in_rounds(keys, repeats: int, run: Callable) -> dict:
    """Every one of ``keys`` run ``repeats`` times, ``run(key, k)`` for round k, all the keys
    once per round: a slow minute of a shared machine then hits one round, not every run of
    one key. key -> the runs' results in round order (for :func:`fastest_run`)."""
    runs: dict = {}
    for k in range(repeats):
        for key in keys:
            runs.setdefault(key, []).append(run(key, k))
    return runs


@dataclass(frozen=True)
class Timing:
    """Seconds per call of every timed sample, ``calls`` calls in each."""

    samples: tuple
    calls: int = 1

    @property
    def seconds(self) -> float:
        """:func:`fastest` of the samples."""
        return fastest(self.samples)

    @property
    def fastest_index(self) -> int:
        """Which sample :attr:`seconds` is (to pick what that call produced)."""
        return self.samples.index(self.seconds)


def _sample(fn, calls, sync, between) -> float:
    between()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls


def time_calls(fns: dict, repeats: int, *, warmup: int = 1, calls: int = 1, min_time: float = 0.0,
               sync: Callable | None = None, between: Callable | None = None) -> dict:
    """The one timing loop: {name: :class:`Timing`} of every callable in ``fns``, taken in
    turns (a round times one sample of each). A shared VM changed its speed by up to 2x for
    seconds at a time: timed one after the other, the products of one table landed in
    different phases (aepar's weight gradient at 0.50x torch.mm, 0.81x in turns); in turns,
    each phase is seen by all of them.

    Parameters
    ----------
    repeats : int
        Timed samples of each (>= 1); :attr:`Timing.seconds` is their :func:`fastest`.
    warmup : int
        Untimed calls of each first (compilation, thread pools, caches, pages).
    calls : int
        Calls per sample, at least; with ``min_time`` the first sample of each doubles them
        until it lasts that long (short kernels), and that sample counts as the first.
    sync : callable, optional
        Waits for queued device work: untimed before a sample, timed at its end.
    between : callable, optional
        Untimed before every sample (restore state a call changed, a barrier).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    sync, between = sync or (lambda: None), between or (lambda: None)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
        sync()
    counts, samples = {}, {name: [] for name in fns}
    for name, fn in fns.items():
        n = max(1, int(calls))
        t = _sample(fn, n, sync, between)
        while t * n < min_time and n < 1 << 20:
            n = min(1 << 20, max(2 * n, int(n * 1.2 * min_time / max(t * n, 1e-9))))
            t = _sample(fn, n, sync, between)
        counts[name] = n
        samples[name].append(t)
    for _ in range(repeats - 1):
        for name, fn in fns.items():
            samples[name].append(_sample(fn, counts[name], sync, between))
    return {name: Timing(tuple(samples[name]), counts[name]) for name in fns}


def time_call(fn, repeats: int, **options) -> Timing:
    """:func:`time_calls` of one callable."""
    return time_calls({"fn": fn}, repeats, **options)["fn"]


def across_ranks(comm, timing: Timing) -> Timing:
    """Sample by sample, the slowest rank's time (a collective is done when its last rank
    is): every rank must have timed the same number of samples."""
    import numpy as np

    slowest = np.asarray(timing.samples, dtype=np.float64)
    comm.Allreduce(slowest, op="max")
    return Timing(tuple(float(t) for t in slowest), timing.calls)


# ==== rows that carry the machine ================================================================
#: The ``mpi`` column of a benchmark that runs in one process and never starts MPI: the words
#: of aepar.machine.ONE_PROCESS (not imported from there: importing aepar fixes the thread
#: counts, which a benchmark sets from its options first).
ONE_PROCESS = "not used (one process)"


def machine_columns(mpi: str | None = None, threads: int | None = None) -> dict:
    """The machine columns of a row (:func:`aepar.machine.describe`: host, cores, CPU, ISA,
    BLAS, threads, MPI, versions) and, when this process loaded PyTorch for a peer, the
    ``torch`` it ran on. ``mpi``: the MPI line (default: the library's, which imports
    mpi4py); :data:`ONE_PROCESS` for a benchmark without MPI."""
    from aepar.machine import describe, torch_peer

    columns = describe(mpi=mpi, threads=threads)
    if "torch" in sys.modules:
        columns["torch"] = torch_peer()
    return columns


def with_machine(rows, machine: dict) -> list[dict]:
    """Each row followed by the machine columns it does not set itself (a row's own values
    win: a run that recorded its own threads or machine keeps them)."""
    return [{**row, **{k: v for k, v in machine.items() if k not in row}} for row in rows]


# ==== CSV files ==================================================================================
#: What makes two rows of one benchmark the same measurement: host, CPU and code path (the
#: ISA Numba compiled for, the OpenBLAS core type).
KEY = ("hostname", "cpu_model", "isa", "blas_coretype")


def read_rows(path) -> list[dict]:
    """The rows of the CSV at ``path`` ([] if there is none)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path, rows: list[dict], *, digits: int = 6) -> Path:
    """``rows`` to the CSV at ``path``, replacing it: every key as a column, in the order
    they first appear; floats to ``digits`` significant digits."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.{digits}g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def merge_rows(rows: list[dict], path, benchmark: str, *, legacy: bool = False, key=KEY) -> None:
    """Write ``rows`` (each gets ``benchmark``) into the CSV at ``path``, replacing that
    benchmark's earlier rows from the same machine and code path (:data:`KEY`, or the
    columns ``key`` names: a benchmark of several shapes adds them) and keeping everything
    else, the columns of all benchmarks included (a row lacking one leaves it empty).
    ``legacy``: rows with no benchmark name (written before the column existed) count as
    this benchmark's."""
    path = Path(path)
    rows = [{"benchmark": benchmark, **r} for r in rows]
    old, fields = [], ["benchmark"]
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields += [k for k in (reader.fieldnames or []) if k not in fields]
            old = list(reader)
    mine = {tuple(str(r.get(k) or "") for k in key) for r in rows}
    ours = {benchmark, ""} if legacy else {benchmark}
    old = [r for r in old if not ((r.get("benchmark") or "") in ours and tuple(r.get(k) or "" for k in key) in mine)]
    for r in rows:
        fields += [k for k in r if k not in fields]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        w.writeheader()
        for r in old + rows:
            w.writerow(r)
    os.replace(tmp, path)


def over_seeds(rows, keys, by="model"):
    """One row per value of ``by``, in first-seen order: the mean of ``keys`` over its seeds
    and, as ``key_spread``, half the min-max range (None stays None)."""
    out = {}
    for r in rows:
        out.setdefault(r[by], []).append(r)
    table = []
    for group, mine in out.items():
        row = {k: v for k, v in mine[0].items() if k not in keys}
        for k in keys:
            values = [m[k] for m in mine if m[k] is not None]
            row[k] = sum(values) / len(values) if values else None
            row[k + "_spread"] = (max(values) - min(values)) / 2 if values else None
        table.append(row)
    return table
