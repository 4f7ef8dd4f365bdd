"""Chaos runs: ``python -m bench.chaos``. Every scheme's run is interrupted at random points
by random faults and resumed each time, on a random number of ranks, and must end with the
weights of the uninterrupted run, bit for bit.

Per scheme (sparse, greedy, data, model, sync, eager), from one seed:

1. the uninterrupted reference run, on ``reference_ranks`` (1, data: 2);
2. a chain of processes on one run directory: the first with ``--out DIR``, every later one
   with ``--resume DIR``, each on a rank count drawn from what the scheme allows and with one
   fault drawn from ``AEPAR_FAULT`` (aepar.guard): ``sigusr1`` and ``sigterm`` (the run saves a
   checkpoint and exits 75), ``kill`` (SIGKILL of one rank; periodic checkpoints forced with
   ``--checkpoint-every 1`` so that the directory keeps the last one) and ``stall`` (the rank
   sleeps; ``--timeout 5``: the watchdog ends the job with 124, the checkpoint stays). The
   fault's rank and step are drawn too; steps count from the start of each process, so the
   step is drawn relative to the resumed run;
3. after each interruption: the exit code is the documented one, ``run.json`` says the run
   is resumable and the next ``--resume`` is accepted. An interruption counts when its
   checkpoint advanced (a kill before the first periodic checkpoint of its process moves
   nothing: it is kept in the table, not counted); after ``--interruptions`` counted ones the
   run goes on without a fault to the end;
4. every ``*.h5`` of weights the reference wrote (weights.h5; eager's snapshots) must equal
   the chaos run's, array by array, with ``np.array_equal``.

Rank counts: each scheme is drawn only from the counts on which it promises the same bits
(README, "The same answer on any number of ranks"), capped by ``--max-ranks`` (on 2 cores,
more ranks only wait for each other):

- sparse: up to its blocks of 128 patches; greedy: up to ``--reduce-blocks`` (8);
  eager: up to its ``--reduce-blocks`` (4 here) - every rank needs a whole block;
- model: up to its layers, with ``--layer-group`` fixed at the layers (the weights equal one
  process with ``--layer-group P``; left to default, the group is the rank count);
- sync: up to its layers (more ranks become replicas: equal only to rounding);
- data: its rank count only - each rank is one block of the Allreduce, so another count is
  another (documented) trajectory.

Writes ``chaos.csv`` (one row per faulted process: the fault, the rank counts of the
interrupted and of the resuming process, the exit code, the checkpoint's progress, the
command) and ``chaos.md`` (per scheme: interruptions survived / attempted, bitwise equal
yes/no, the date, command, commit and machine). Exits 1 if any scheme's final weights
differ or an interruption was not survived.
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import machine_columns, mpi_env, python_command

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

FAULTS = ("sigusr1", "sigterm", "kill", "stall")
# kill: mpirun reports a rank's SIGKILL as 137; a plain process is the negative signal number
EXPECTED_EXIT = {"sigusr1": (75,), "sigterm": (75,), "kill": (137, -9), "stall": (124,)}
STALL_TIMEOUT = 5
# the other processes get a watchdog far above any step: a resumed run keeps the --timeout it
# started with unless told otherwise, and a stall run may have been the first
WATCHDOG = 300
PROCESS_LIMIT = 300  # seconds before a process counts as hung
# a stall ends within --timeout, or 2 --timeout + 10 s for the ranks waiting on it
STALL_LIMIT = 60


@dataclass(frozen=True)
class Scheme:
    """One scheme's chaos run.

    ``ranks``: the fewest and most ranks that give the reference's bits. ``steps``: the
    fewest steps (aepar.guard) any rank takes over a whole run on those counts; the faults
    of one chain then stay inside the run. ``gap``: the steps between two periodic
    checkpoints (``--checkpoint-every 1``) on most ranks and counts: a kill or stall drawn
    after it usually finds a new checkpoint behind it.
    """

    module: str
    args: tuple
    ranks: tuple
    steps: int
    gap: int
    reference_ranks: int = 1


_GREEDY = ("--dataset", "mnist5k", "--layers", "784-64-16", "--epochs", "6", "--finetune-epochs", "3",
           "--limit", "800")
SCHEMES = {
    # 156 cost evaluations; a checkpoint every iteration (an evaluation or two)
    "sparse": Scheme("aepar.sparse", ("--limit", "2000", "--iterations", "150"), (1, 16), 156, 2),
    # 8 batches an epoch, every rank steps through each: 6 * 2 + 3 epochs
    "greedy": Scheme("aepar.greedy", _GREEDY, (1, 8), 120, 8),
    "data": Scheme("aepar.pretrain", ("--scheme", "data") + _GREEDY, (2, 2), 120, 8, reference_ranks=2),
    # a rank trains its layer's epoch in each slot; one process trains every slot's layers
    "model": Scheme("aepar.pretrain", ("--scheme", "model", "--layer-group", "3", "--dataset", "mnist5k", "--layers",
                                       "784-64-32-16", "--epochs", "10", "--finetune-epochs", "2", "--limit", "800"),
                    (1, 3), 96, 8),
    # checkpoints count layer 1's epochs: on one process its epochs are far apart (not counted
    # kills there are expected), on more ranks rank 0 saves every 8 steps
    "sync": Scheme("aepar.sync", ("--dataset", "mnist5k", "--layers", "784-64-32-16-8", "--epochs", "10", "--extra",
                                  "0,1,1,1", "--limit", "800", "--finetune-epochs", "2", "--no-plot"), (1, 4), 88, 8),
    # rounds of one epoch of each model of a group; then the monolithic CAE on every rank
    "eager": Scheme("aepar.eager", ("--dataset", "mnist5k", "--limit", "300", "--filters", "2,4", "--epochs", "6",
                                    "--models", "3", "--mono-epochs", "2", "--classify-epochs", "1",
                                    "--reduce-blocks", "4", "--no-plot"), (1, 4), 80, 10),
}


# ---- drawing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Draw:
    """One process of a chain: its rank count and the fault it gets (the last process of a
    chain, after enough interruptions, keeps only the rank count)."""

    ranks: int
    kind: str
    rank: int
    step: int
    checkpoint_every: int

    @property
    def fault(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


def allowed_ranks(scheme: Scheme, max_ranks: int) -> list[int]:
    """The rank counts a chain draws from: the scheme's own, at most ``max_ranks`` (but never
    fewer than the scheme needs)."""
    lo, hi = scheme.ranks
    return list(range(lo, max(lo, min(hi, max_ranks)) + 1))


def step_window(scheme: Scheme, kind: str, interruptions: int) -> tuple[int, int]:
    """(first, last) step a fault of ``kind`` is drawn from. A signal may come at any step;
    a kill or stall comes after a periodic checkpoint's gap. Each window reaches a
    1/(interruptions + 1) share of the shortest run, so that the chain's faults fit in it."""
    reach = max(1, scheme.steps // (interruptions + 1))
    if kind in ("kill", "stall"):
        return scheme.gap + 1, scheme.gap + reach
    return 1, reach


def plan(name: str, seed: int, interruptions: int, max_ranks: int, attempts: int | None = None) -> list[Draw]:
    """The draws of one chain, a pure function of its arguments: ``attempts`` faulted
    processes (default 3 per interruption: some kills come before a new checkpoint) and one
    more rank count for the process that finishes."""
    scheme = SCHEMES[name]
    rng = random.Random(f"aepar-chaos:{seed}:{name}")
    counts = allowed_ranks(scheme, max_ranks)
    draws = []
    for _ in range((3 * interruptions if attempts is None else attempts) + 1):
        ranks = rng.choice(counts)
        kind = rng.choice(FAULTS)
        rank = rng.randrange(ranks)
        step = rng.randint(*step_window(scheme, kind, interruptions))
        # kills and stalls need periodic checkpoints; a signal saves its own, with or without
        every = 1 if kind in ("kill", "stall") else rng.choice((0, 1))
        draws.append(Draw(ranks, kind, rank, step, every))
    return draws


# ---- judging ----------------------------------------------------------------------------------
def read_run(directory: Path) -> dict | None:
    """The run's ``run.json`` (None: no run directory; {"unreadable": why} if refused)."""
    from aepar.errors import UserError
    from aepar.rundir import read_marker

    try:
        return read_marker(directory)
    except UserError as e:
        return {"unreadable": str(e)}


def not_resumable(directory: Path, info: dict | None) -> str | None:
    """Why ``--resume`` would refuse the run in ``directory`` (None: it would continue it).
    The rules of aepar.rundir, checked from outside: a run marker of aepar's, not complete,
    with its checkpoint, and no live process of it on this host."""
    import socket

    from aepar.rundir import CHECKPOINT

    if info is None:
        return "no run.json"
    if "unreadable" in info:
        return info["unreadable"]
    if info.get("state") == "complete":
        return "complete"
    if not info.get("checkpoint") or not (directory / CHECKPOINT).is_file():
        return f"no {CHECKPOINT}"
    if info.get("state") == "running" and info.get("host") == socket.gethostname():
        try:
            os.kill(int(info.get("pid", -1)), 0)
            return f"process {info.get('pid')} of the run is alive"
        except (ProcessLookupError, ValueError, OverflowError):
            pass
        except PermissionError:
            return f"process {info.get('pid')} of the run is alive"
    return None


def judge(kind: str, fired: bool, exit_code, before: dict | None, after: dict | None, resumed: bool,
          why_not: str | None) -> tuple[bool, bool, str]:
    """(survived so far, counted, outcome) of one faulted process.

    ``before``/``after``: the run's ``run.json`` before and after it (:func:`read_run`;
    None where there was no run directory). ``why_not``: :func:`not_resumable`'s
    answer afterwards. Whether the next ``--resume`` is accepted is judged on the next
    process.
    """
    state = (after or {}).get("state")
    if exit_code == "hang":
        return False, False, f"no exit within {STALL_LIMIT if kind == 'stall' else PROCESS_LIMIT} s"
    if state == "complete":
        if fired and exit_code not in (0, *EXPECTED_EXIT[kind]):
            return False, False, f"complete, but exit {exit_code}"
        if not fired and exit_code != 0:
            return False, False, f"complete, but exit {exit_code}"
        return True, False, "completed" + (" (the fault came after the last safe point)" if fired else "")
    if not fired:
        what = "--resume refused or failed" if resumed else "failed"
        return False, False, f"{what} before the fault: exit {exit_code}"
    if exit_code not in EXPECTED_EXIT[kind]:
        return False, False, f"exit {exit_code}, not {' or '.join(map(str, EXPECTED_EXIT[kind]))}"
    if after is None and not resumed and kind in ("kill", "stall"):
        return True, False, "ended before the first checkpoint: started again"
    if why_not is not None:
        return False, False, f"not resumable: {why_not}"
    if kind.startswith("sig") and state != "interrupted":
        return False, False, f"run.json says {state!r}, not 'interrupted'"
    progress = (after.get("checkpoint") or {}).get("progress")
    if (before or {}).get("checkpoint") == after.get("checkpoint"):
        return True, False, f"no new checkpoint (still {progress}): not counted"
    return True, True, f"interrupted at {progress}"


def weight_files(directory: Path) -> list[str]:
    """The weight files a run wrote: every ``*.h5`` but the checkpoint."""
    return sorted(p.name for p in directory.glob("*.h5") if p.name != "checkpoint.h5")


def differences(reference: Path, other: Path) -> list[str]:
    """Every weight file or array of ``reference`` that ``other`` lacks or holds with other
    bits (empty: the same weights)."""
    import numpy as np

    from aepar import checkpoint

    names = weight_files(reference)
    if not names:
        return [f"no weight files in {reference}"]
    found = []
    for name in names:
        if not (other / name).is_file():
            found.append(f"{name}: missing")
            continue
        a, b = checkpoint.load(reference / name).params, checkpoint.load(other / name).params
        found += [f"{name}: {k} missing" for k in sorted(set(a) - set(b))]
        found += [f"{name}: {k} extra" for k in sorted(set(b) - set(a))]
        found += [f"{name}: {k} differs" for k in sorted(set(a) & set(b)) if not np.array_equal(a[k], b[k])]
    return found


@dataclass
class Result:
    """One scheme's chain. ``rows``: one per faulted process (:func:`chain`)."""

    scheme: str
    seed: int
    counts: list
    rows: list = field(default_factory=list)
    reference_exit: object = 0
    final_state: str | None = None
    diffs: list | None = None
    seconds: float = 0.0
    work: str = ""

    @property
    def attempted(self) -> int:
        """Interruptions that happened: counted, or not survived."""
        return sum(1 for r in self.rows if r["fired"] and (r["counted"] or not r["survived"]))

    @property
    def survived(self) -> int:
        return sum(1 for r in self.rows if r["counted"] and r["survived"])

    @property
    def bitwise(self) -> bool:
        return self.diffs == []


def verdict(result: Result) -> list[str]:
    """What went wrong in a chain (empty: every interruption survived, the run completed
    and its weights are the reference's bits)."""
    problems = []
    if result.reference_exit != 0:
        problems.append(f"the reference run failed (exit {result.reference_exit})")
    for r in result.rows:
        if not r["survived"]:
            problems.append(f"process {r['index']} ({r['fault'] or 'no fault'}, {r['ranks']} ranks): {r['outcome']}"
                            f"\n    {r['command']}")
    if result.reference_exit == 0 and result.final_state != "complete":
        problems.append(f"the run did not complete (run.json: {result.final_state})")
    if result.diffs:
        problems.append(f"final weights differ from the reference: {', '.join(result.diffs[:8])}"
                        + (f" and {len(result.diffs) - 8} more" if len(result.diffs) > 8 else ""))
    elif result.diffs is None and result.final_state == "complete":
        problems.append("final weights not compared")
    return problems


# ---- running ----------------------------------------------------------------------------------
def command_line(module: str, args: list, ranks: int, env: dict) -> str:
    """The shell line that reproduces one process."""
    prefix = [f"{k}={v}" for k, v in env.items()]
    return " ".join(prefix + [shlex.join(python_command(module, args, ranks))])


def execute(module: str, args: list, ranks: int, env: dict, limit: float) -> tuple[object, str, float, int]:
    """(exit code, or "hang" past ``limit`` seconds; stderr; seconds; processes of the job
    still running 5 s after it returned) of one process, under mpirun for more than one
    rank. What is left of a job is ended with every process started under its setsid id:
    mpirun gives its ranks process groups of their own, and a stalled rank ignores
    SIGTERM as a stalled rank would."""
    full = mpi_env(**env)
    t0 = time.time()
    p = subprocess.Popen(python_command(module, args, ranks), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=full, cwd=ROOT, start_new_session=True)
    try:
        _, err = p.communicate(timeout=limit)
        code, seconds = p.returncode, time.time() - t0
    except subprocess.TimeoutExpired:
        _kill_job(p.pid)
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            err = ""
        return "hang", err, time.time() - t0, 0
    deadline = time.time() + 5
    while _job_processes(p.pid) and time.time() < deadline:
        time.sleep(0.1)
    left = len(_job_processes(p.pid))
    _kill_job(p.pid)
    return code, err, seconds, left


def _job_processes(sid: int) -> list[int]:
    """The processes started under setsid id ``sid`` that are still running (zombies are dead)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _kill_job(sid: int):
    """SIGKILL every process under setsid id ``sid`` (a job this program started)."""
    for pid in _job_processes(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def fault_fired(stderr: str, draw: Draw) -> bool:
    return re.search(rf"AEPAR_FAULT: {draw.kind} on rank {draw.rank}, step {draw.step} ", stderr) is not None


def chain(name: str, seed: int, interruptions: int, max_ranks: int, work: Path, say=print) -> Result:
    """Run one scheme's reference and its interrupted chain in ``work``."""
    scheme = SCHEMES[name]
    t_start = time.time()
    result = Result(name, seed, allowed_ranks(scheme, max_ranks), work=str(work))
    reference, out = work / f"{name}-reference", work / f"{name}-chaos"
    rc = execute(scheme.module, list(scheme.args) + ["--quiet", "--out", reference], scheme.reference_ranks, {},
                 PROCESS_LIMIT)[0]
    result.reference_exit = rc
    if rc != 0:
        say(f"chaos {name}: the reference run failed (exit {rc})")
        result.seconds = time.time() - t_start
        return result
    draws = plan(name, seed, interruptions, max_ranks)
    counted = 0
    for index, draw in enumerate(draws, 1):
        last = counted >= interruptions or index == len(draws)
        info = read_run(out)
        resumed = info is not None
        if not resumed:  # a kill before the first checkpoint leaves only its staging directory
            for stale in work.glob(f".{out.name}.aepar-*"):
                shutil.rmtree(stale, ignore_errors=True)
        args = ["--resume", out, "--quiet"] if resumed else list(scheme.args) + ["--quiet", "--out", out]
        args += ["--checkpoint-every", draw.checkpoint_every,
                 "--timeout", STALL_TIMEOUT if draw.kind == "stall" and not last else WATCHDOG]
        env = {} if last else {"AEPAR_FAULT": draw.fault}
        command = command_line(scheme.module, args, draw.ranks, env)
        stalls = draw.kind == "stall" and not last
        rc, stderr, wall, left = execute(scheme.module, args, draw.ranks, env, STALL_LIMIT if stalls else PROCESS_LIMIT)
        after = read_run(out)
        fired = not last and fault_fired(stderr, draw)
        if result.rows and result.rows[-1]["resume"] == "":  # this process answers the last one's resume
            previous = result.rows[-1]
            previous["resume"] = "accepted" if rc == 0 or fired else f"failed (exit {rc})"
            if not (rc == 0 or fired):
                previous["survived"] = False
                previous["outcome"] += f"; --resume failed: exit {rc}: {_last_line(stderr)}"
        if last:
            result.final_state = (after or {}).get("state")
            if rc != 0:
                result.rows.append(_row(name, seed, index, None, draw.ranks, rc, after, False, False,
                                        f"final process: exit {rc}: {_last_line(stderr)}", wall, command))
            break
        lingered, state = wait_gone(after) if (after or {}).get("state") == "running" else (0.0, "")
        survived, count, outcome = judge(draw.kind, fired, rc, info, after, resumed, not_resumable(out, after))
        if state:
            outcome += (f"; rank 0 (pid {after.get('pid')}) stayed {'a zombie' if state == 'Z' else 'alive'} "
                        f"{lingered:.1f} s after the job ended")
        if left:  # a rank that outlives its job holds the run ("in use") and burns a core
            survived, count = False, False
            outcome += f"; {left} process(es) of the job still running 5 s after it returned"
        if not survived and _last_line(stderr):
            outcome += f" ({_last_line(stderr)})"
        counted += count
        row = _row(name, seed, index, draw, draw.ranks, rc, after, fired, count, outcome, wall, command)
        row["survived"] = survived
        result.rows.append(row)
        say(f"chaos {name} #{index}: {draw.fault} on {draw.ranks} rank(s), every {draw.checkpoint_every}: "
            f"exit {rc}, {outcome}")
        if (after or {}).get("state") == "complete":
            result.final_state = "complete"
            break
        if not survived and (not fired or not_resumable(out, read_run(out)) is not None):
            # nothing left to resume; after an interruption that went wrong but left its
            # checkpoint (a hang, a wrong exit code) the chain goes on: do the bits still agree?
            result.final_state = (read_run(out) or {}).get("state")
            break
    if result.rows and result.rows[-1]["resume"] == "":
        result.rows[-1]["resume"] = "-"
    for r, nxt in zip(result.rows, draws[1:]):  # the rank count of the process that resumed each
        r["resume_ranks"] = nxt.ranks if r["resume"] == "accepted" else ""
    if result.final_state == "complete":
        result.diffs = differences(reference, out)
    result.seconds = time.time() - t_start
    say(f"chaos {name}: {result.survived}/{result.attempted} interruptions survived, bitwise "
        f"{'yes' if result.bitwise else 'no'} ({result.seconds:.0f} s)")
    return result


def _row(name, seed, index, draw, ranks, rc, after, fired, counted, outcome, wall, command) -> dict:
    return {"scheme": name, "seed": seed, "index": index, "fault": draw.kind if draw else "",
            "fault_rank": draw.rank if draw else "", "step": draw.step if draw else "",
            "checkpoint_every": draw.checkpoint_every if draw else "", "ranks": ranks, "resume_ranks": "",
            "exit": rc, "fired": fired, "counted": bool(counted),
            "checkpoint": ((after or {}).get("checkpoint") or {}).get("progress", ""),
            "state": (after or {}).get("state", ""), "resume": "", "survived": draw is not None,
            "outcome": outcome, "wall_s": round(wall, 2), "command": command}


def wait_gone(info: dict | None, grace: float = 30.0) -> tuple[float, str]:
    """(seconds, state) until the process ``run.json`` names (rank 0) is gone, at most
    ``grace``; ``state`` is the one /proc showed first ("" if it was gone at once).

    When mpirun returns after a rank's death, rank 0 may linger, as a zombie until it is
    reaped: aepar's "in use" check (aepar.rundir) takes it for a live run, so a --resume
    in that moment is refused. The chain waits it out and notes it in the outcome."""
    pid, first = (info or {}).get("pid"), ""
    t0 = time.time()
    while isinstance(pid, int) and time.time() - t0 < grace:
        try:
            with open(f"/proc/{pid}/stat") as f:
                first = first or f.read().rsplit(")", 1)[-1].split()[0]
        except OSError:
            break
        time.sleep(0.05)
    return time.time() - t0, first


def _last_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip("\0 \t") and not l.startswith(("-----", " "))]
    return lines[-1][:200] if lines else ""


# ---- reporting --------------------------------------------------------------------------------
CSV_FIELDS = ("scheme", "seed", "index", "fault", "fault_rank", "step", "checkpoint_every", "ranks", "resume_ranks",
              "exit", "fired", "counted", "checkpoint", "state", "resume", "survived", "outcome", "wall_s", "command")


def commit() -> str:
    """The checked-out commit, marked when the tree has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" with uncommitted changes" if dirty else "")


def report(results: list[Result], interruptions: int, command: str) -> str:
    m = machine_columns()
    lines = ["# Chaos: interrupted, resumed runs end with the uninterrupted weights (bench/chaos.py)", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}, `{command}`, commit {commit()}.",
             f"Machine: {m['cpu_model']}, {m['cores']} cores, {m['mpi']}, {m['hostname']}.", "",
             f"Each scheme's run is interrupted {interruptions} times by faults drawn from "
             f"{', '.join(FAULTS)} (AEPAR_FAULT, aepar/guard.py) and resumed each time on a rank count drawn "
             "from those listed; a fault that came before a new checkpoint is not counted. One row per faulted "
             "process in chaos.csv. The counts are those on which a scheme promises the same bits: model with "
             "--layer-group fixed at its layers, sync at most a rank per layer, data only on its reference's ranks "
             "(each rank is a block of its Allreduce).", "",
             "| scheme | ranks drawn from | interruptions survived / attempted | not counted | faults counted "
             "| final weights bitwise equal | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        kinds = {}
        for row in r.rows:
            if row["counted"]:
                kinds[row["fault"]] = kinds.get(row["fault"], 0) + 1
        uncounted = sum(1 for row in r.rows if row["fired"] and not row["counted"] and row["survived"])
        span = f"{r.counts[0]}" if len(r.counts) == 1 else f"{r.counts[0]}-{r.counts[-1]}"
        lines.append(f"| {r.scheme} | {span} | {r.survived} / {r.attempted} | {uncounted} | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or '-'} | "
                     f"{'yes' if r.bitwise else 'no'} | {r.seconds:.0f} |")
    failed = [(r, verdict(r)) for r in results if verdict(r)]
    if failed:
        lines += ["", "## Problems", ""]
        for r, problems in failed:
            lines += [f"- {r.scheme} (seed {r.seed}, runs in {r.work}):"] + [f"  - {p}" for p in problems]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated (default {','.join(SCHEMES)})")
    p.add_argument("--seed", type=int, default=0, help="draws the faults, their steps and the rank counts")
    p.add_argument("--interruptions", type=int, default=5, help="counted interruptions per scheme (default 5)")
    p.add_argument("--max-ranks", type=int, default=4, help="most ranks a process is drawn (default 4)")
    p.add_argument("--out", default=str(RESULTS), help="where chaos.csv and chaos.md go (default bench/results)")
    p.add_argument("--work", help="the run directories (default a temporary directory, kept if anything failed)")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.schemes.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCHEMES]
    if unknown or args.interruptions < 1 or args.max_ranks < 1:
        p.error(f"unknown scheme(s) {', '.join(unknown)}" if unknown else "--interruptions and --max-ranks are >= 1")
    command = shlex.join(["python", "-m", "bench.chaos", *(sys.argv[1:] if argv is None else argv)])
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="aepar-chaos-"))
    results = []
    for name in names:
        place = work / name
        place.mkdir(parents=True, exist_ok=True)
        results.append(chain(name, args.seed, args.interruptions, args.max_ranks, place,
                             say=lambda m: print(m, flush=True)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "chaos.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in results:
            w.writerows(r.rows)
    text = report(results, args.interruptions, command)
    (out / "chaos.md").write_text(text)
    print(text, flush=True)
    bad = any(verdict(r) for r in results)
    if args.work is None and not bad:
        shutil.rmtree(work, ignore_errors=True)
    elif bad:
        print(f"chaos: the run directories stay in {work}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
