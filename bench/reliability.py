"""What the schemes do when clusters misbehave: ``python -m bench.reliability``.

Runs the real commands, on this machine, and counts the outcomes of each kind of case
(bench/results/reliability.csv, one row per run; reliability.md, the counts):

- faults injected with AEPAR_FAULT into every scheme (sparse, greedy, finetune, sync) at
  2 and 4 ranks, early and late: ``raise`` must end the job with exit 1 and aepar's own
  line naming the rank, ``kill`` with exit 137 and the launcher naming the killed rank,
  ``nan`` with a divergence line (exit 3), ``stall`` within --timeout with the stalled
  rank naming itself (exit 124), all with nothing half-written; the time from the fault to
  the end of the job is measured. ``sigterm``/``sigusr1``/``sigint`` must save a
  checkpoint, say where, and exit 75, and ``--resume`` on another number of ranks must end
  with the parameters of an uninterrupted run, bit for bit;
- corrupt or foreign input files through the commands that read them, at 1 and 2 ranks:
  one line naming the broken file, exit 2, nothing written;
- impossible options at 1 and 2 ranks: one line naming the option, exit 2;
- --out pointing at things that are not a new directory, at 1 and 2 ranks: refused in one
  line giving the expected reason, without touching them.

The checks are the functions ``*_problems`` (unit-tested with planted wrong outcomes in
tests/unit/test_bench_reliability.py). The property-based tests in ``make test``
(tests/unit/test_properties_*.py) add 3,250 generated inputs to readers, checkpoints and
command lines.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import json
import os
import pickle
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine_columns, mpi_env, python_command, with_machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

SCHEMES = {
    "sparse": ("aepar.sparse", ["--limit", "2000", "--iterations", "150"]),
    "greedy": ("aepar.greedy", ["--dataset", "mnist5k", "--layers", "784-64-16", "--epochs", "3",
                                "--finetune-epochs", "2", "--limit", "800"]),
    "finetune": ("aepar.finetune", ["--dataset", "mnist5k", "--limit", "800", "--finetune-epochs", "4"]),
    "sync": ("aepar.sync", ["--dataset", "mnist5k", "--layers", "784-64-32-16-8", "--epochs", "3",
                            "--extra", "0,1,1,1", "--limit", "800", "--finetune-epochs", "1", "--no-plot"]),
}
# The exit code each kind must end the job with. A SIGKILLed rank cannot say anything, and
# Open MPI's mpirun then exits with 128 + 9, as a shell reports a process killed by signal 9
# (another launcher given in MPIRUN may say it otherwise: its kills then count as failures).
EXPECTED = {"raise": 1, "kill": 137, "nan": 3, "stall": 124, "sigterm": 75, "sigusr1": 75, "sigint": 75}


def run(module, args, ranks, env=None, timeout=300):
    full = mpi_env(**(env or {}))
    cmd = python_command(module, args, ranks)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=ROOT, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, t0, time.time()
    except subprocess.TimeoutExpired:
        return "hang", "", "", t0, time.time()


def ours(stderr, prog):
    """aepar's own lines: the injector's announcement (AEPAR_FAULT) is no message of the run."""
    return [l for l in stderr.splitlines() if l.startswith(f"{prog}:") and "AEPAR_FAULT" not in l]


def _words(*parts) -> str:
    """A regex of words that may be broken across lines anywhere (Open MPI wraps its notices)."""
    return r"\s+".join(parts)


def launcher_named_kill(stderr: str, rank: int) -> bool:
    """Whether mpirun reported ``rank`` killed by signal 9 ("prterun noticed that process rank 1
    with PID 17574 on node vm exited on signal 9 (Killed)."; Open MPI 4 says "mpirun")."""
    rest = "\n".join(l for l in stderr.splitlines() if "AEPAR_FAULT" not in l)
    return re.search(_words("noticed", "that", "process", "rank", str(rank), "with", "PID", r"\d+", "on", "node",
                            r"\S+", "exited", "on", "signal", r"9\b"), rest) is not None


def _exit_problem(rc, want) -> list[str]:
    if rc == "hang":
        return ["hang"]
    return [] if rc == want else [f"exit {rc}, not {want}"]


def fault_problems(kind: str, rc, stderr: str, prog: str, fault_rank: int, ranks: int, out=None) -> list[str]:
    """What is wrong with how a job ended after the fault ``kind`` on ``fault_rank`` of
    ``ranks``: its exit code ``rc`` ("hang" if it did not end) and its ``stderr``; ``out`` is
    the run directory (named by the stop signals' line). Empty: as documented."""
    problems = _exit_problem(rc, EXPECTED[kind])
    lines = ours(stderr, prog)
    if kind == "raise":
        # aepar.comm.run_main: an exception other than UserError, on one rank
        if f"{prog}: rank {fault_rank}/{ranks}: internal error" not in lines:
            problems.append("rank not named")
    elif kind == "stall":
        # aepar.guard's watchdog on the stalled rank; a peer's "rank R waited ..." names the
        # waiting rank, not the stalled one, and comes only after 2T + 10 s
        if not any(l.startswith(f"{prog}: error: rank {fault_rank} stalled: no progress for ") for l in lines):
            problems.append("rank not named")
    elif kind == "kill":
        # SIGKILL leaves aepar no last word: only the launcher can name the rank
        if not launcher_named_kill(stderr, fault_rank):
            problems.append("rank not named")
    elif kind == "nan":
        if not any(l.startswith(f"{prog}: error: diverged: ") for l in lines):
            problems.append("no divergence line")
    elif kind.startswith("sig"):
        if not any(l.startswith(f"{prog}: stopped: ") and (out is None or str(out) in l) for l in lines):
            problems.append("no line saying where the checkpoint is")
    return problems


def leftover_problems(kind: str, out_exists: bool, has_checkpoint: bool, left: list) -> list[str]:
    """What a failed job must not leave: a run directory without a checkpoint to resume from,
    or a staging directory (``left``: the ``.aepar-`` names found next to it)."""
    problems = []
    if not kind.startswith("sig") and out_exists and not has_checkpoint:
        problems.append("run directory without a checkpoint left")
    if left:
        problems.append(f"left {left}")
    return problems


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".aepar-" in p.name]


def same_bits(a: Path, b: Path) -> bool:
    import numpy as np

    from aepar import checkpoint

    pa, pb = checkpoint.load(a / "weights.h5").params, checkpoint.load(b / "weights.h5").params
    return set(pa) == set(pb) and all(np.array_equal(pa[k], pb[k]) for k in pa)


# ---- faults ---------------------------------------------------------------------------------
def faults(work: Path, kinds, ranks_list, steps) -> list[dict]:
    rows = []
    refs = {}
    stack = None
    for scheme, (module, args) in SCHEMES.items():
        args = list(args)
        if scheme == "finetune":
            if stack is None:
                stack = work / "stack"
                run("aepar.greedy", SCHEMES["greedy"][1] + ["--quiet", "--out", stack], 1)
            args = ["--weights", stack / "weights.h5"] + args
        ref = refs[scheme] = work / f"ref-{scheme}"
        run(module, args + ["--quiet", "--out", ref], 1)
        for kind in kinds:
            for ranks in ranks_list:
                for step in steps:
                    out = work / f"{scheme}-{kind}-{ranks}-{step}"
                    fault_rank = ranks - 1
                    rc, so, se, t0, t1 = run(module, args + ["--quiet", "--timeout", "5", "--out", out], ranks,
                                             env={"AEPAR_FAULT": f"{fault_rank}:{step}:{kind}"})
                    fired = re.search(r"AEPAR_FAULT: \w+ on rank \d+, step \d+ .* at t=([0-9.]+)", se)
                    lines = ours(se, module)
                    problems = fault_problems(kind, rc, se, module, fault_rank, ranks, out)
                    if kind.startswith("sig"):
                        resumed_ranks = 1 if ranks > 1 else 2
                        if rc == 75:
                            rc2 = run(module, ["--resume", out, "--quiet"], resumed_ranks)[0]
                            if rc2 != 0 or not same_bits(ref, out):
                                problems.append(f"resume on {resumed_ranks} rank(s): exit {rc2}, "
                                                f"{'bits differ' if rc2 == 0 else 'no result'}")
                    problems += leftover_problems(kind, out.exists(), (out / "checkpoint.h5").exists(),
                                                  leftovers(work))
                    rows.append({"category": "fault", "scheme": scheme, "case": kind, "ranks": ranks, "step": step,
                                 "fired": bool(fired), "exit": rc, "wall_s": round(t1 - t0, 2),
                                 "end_after_fault_s": round(t1 - float(fired.group(1)), 2) if fired else None,
                                 "outcome": "as documented" if not problems else "; ".join(problems),
                                 "message": (lines[-1] if lines else "")[:160]})
                    print(f"fault {scheme} {kind} np{ranks} step {step}: {rows[-1]['outcome']} "
                          f"({rows[-1]['end_after_fault_s']} s after the fault)", flush=True)
    return rows


# ---- refusals: exit 2 and one line of aepar's saying why -------------------------------------------
# the outcome of a refusal as documented, per category (the markdown counts these)
GOOD = {"bad file": "one line naming the file, exit 2, nothing written",
        "impossible option": "one line naming it, exit 2",
        "--out": "refused in one line with the expected reason, nothing touched"}


def _one_error_line(rc, stderr: str, prog: str) -> tuple[list[str], str | None]:
    """(problems, the line) of a refusal: exit 2, no traceback, exactly one line of aepar's,
    an error (rank 0 alone prints a refusal that every rank agreed on)."""
    problems = _exit_problem(rc, 2)
    if "Traceback" in stderr:
        problems.append("traceback")
    lines = ours(stderr, prog)
    if len(lines) != 1:
        problems.append(f"{len(lines)} line(s)")
    line = lines[0] if len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") else None
    if len(lines) == 1 and line is None:
        problems.append("not an error line")
    return problems, line


def file_problems(rc, stderr: str, prog: str, path, out_exists: bool, left: list) -> list[str]:
    """What is wrong with the refusal of a broken input file ``path``: the line must name it as
    its subject ("prog: error: PATH: what is wrong"), and the run must write nothing."""
    problems, line = _one_error_line(rc, stderr, prog)
    if line is not None and not line.startswith(f"{prog}: error: {path}: "):
        problems.append("file not named")
    return problems + _written(("run directory written", out_exists), left)


def option_problems(rc, stderr: str, prog: str, option: str, out_exists: bool) -> list[str]:
    """What is wrong with the refusal of an impossible ``option``: the line must name it as a
    word of its own (``--lr`` is not named by a line about ``--finetune-lr``)."""
    problems, line = _one_error_line(rc, stderr, prog)
    if line is not None and not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", line):
        problems.append("option not named")
    if out_exists:
        problems.append("run directory written")
    return problems


def out_problems(rc, stderr: str, prog: str, reason: str, touched: bool, left: list) -> list[str]:
    """What is wrong with the refusal of an --out/--resume case: its one line must match the
    regex ``reason`` (from aepar.rundir's ``_decide``/``_forbidden``), nothing may change."""
    problems, line = _one_error_line(rc, stderr, prog)
    if line is not None and not re.search(reason, line):
        problems.append("wrong reason")
    return problems + _written(("user's files touched", touched), left)


def _written(what, left) -> list[str]:
    """What a refused run must not have done: ``what`` = (problem, whether it happened), and
    ``left``, the staging directories found."""
    problem, happened = what
    return ([problem] if happened else []) + ([f"left {left}"] if left else [])


def _names(option: str, path) -> str:
    """A regex: ``option`` followed by ``path``, the whole path (not the start of a longer one)."""
    return re.escape(f"{option} {path}") + r"(?=[\s:;,]|$)"


def out_cases(users: Path, done: Path, home: str) -> list[tuple[str, list, str]]:
    """(case, options, the reason its refusal must give) of the --out runs: ``users`` holds a
    user's files (thesis/, notes.txt, empty/), ``done`` a complete aepar.sparse run."""
    thesis, not_ours = users / "thesis", "exists and is not an aepar run directory"
    return [
        ("a user's directory", ["--out", thesis], _names("--out", thesis) + f" {not_ours}"),
        ("the same with --overwrite", ["--out", thesis, "--overwrite"], _names("--out", thesis) + f" {not_ours}"),
        ("a user's file", ["--out", users / "notes.txt"],
         _names("--out", users / "notes.txt") + " exists and is not a directory"),
        ("an empty directory", ["--out", users / "empty"], _names("--out", users / "empty") + f" {not_ours}"),
        ("the working directory", ["--out", "."], _names("--out", ".") + " is the working directory"),
        ("an ancestor of it", ["--out", ".."], _names("--out", "..") + " contains the working directory"),
        ("the root", ["--out", "/"], _names("--out", "/") + " is the root directory"),
        ("the home directory", ["--out", home], _names("--out", home) + " is your home directory"),
        ("a complete run, no flag", ["--out", done], _names("--out", done) + r" holds an aepar\.sparse run \(complete"),
        ("--resume of a complete run", ["--resume", done], _names("--resume", done) + ": the run is complete"),
        # the user gave --resume: a line about --out would send them to an option they never used
        ("--resume of a user's directory", ["--resume", thesis],
         _names("--resume", thesis) + ".*not an aepar run directory"),
    ]


# ---- bad files ---------------------------------------------------------------------------------
def _idx(path, dims, data, magic=None, gz=False):
    header = struct.pack(">I", magic if magic is not None else (0x08 << 8 | len(dims))) + b"".join(
        struct.pack(">I", d) for d in dims)
    body = header + data
    (gzip.open if gz else open)(path, "wb").write(body)


def _mnist_dir(d: Path, **broken):
    """A valid small IDX set in ``d`` with one part replaced by ``broken``."""
    import numpy as np

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, n in (("train", 300), ("t10k", 100)):
        imgs = broken.get(f"{stem}_images")
        if imgs is None:
            _idx(d / f"{stem}-images-idx3-ubyte", (n, 28, 28), rng.integers(0, 256, (n, 28, 28), dtype=np.uint8).tobytes())
        else:
            imgs(d / f"{stem}-images-idx3-ubyte")
        labs = broken.get(f"{stem}_labels")
        if labs is None:
            _idx(d / f"{stem}-labels-idx1-ubyte", (n,), rng.integers(0, 10, n, dtype=np.uint8).tobytes())
        else:
            labs(d / f"{stem}-labels-idx1-ubyte")
    return d


def bad_files(work: Path, ranks_list) -> list[dict]:
    import numpy as np

    from aepar import checkpoint

    cases = {}  # name -> (module, args, the path the line must name)

    def idx_case(name, broken_file="train-images-idx3-ubyte", **broken):
        d = _mnist_dir(work / "files" / name, **broken)
        cases[name] = ("aepar.greedy", ["--data-dir", d, "--layers", "784-16-4", "--epochs", "1",
                                        "--finetune-epochs", "0"], d / broken_file)

    idx_case("idx truncated images", train_images=lambda p: _idx(p, (300, 28, 28), b"\0" * 1000))
    idx_case("idx zero images", train_images=lambda p: _idx(p, (0, 28, 28), b""))
    idx_case("idx header overflows", train_images=lambda p: _idx(p, (2 ** 31, 2 ** 31, 2 ** 30), b"\0" * 64))
    idx_case("idx wrong magic", train_images=lambda p: _idx(p, (300, 28, 28), b"\0" * 300 * 784, magic=0x1234))
    idx_case("idx labels out of range", "train-labels-idx1-ubyte",
             train_labels=lambda p: _idx(p, (300,), bytes([12] * 300)))
    idx_case("idx label count mismatch", "train-labels-idx1-ubyte", train_labels=lambda p: _idx(p, (299,), bytes(299)))
    idx_case("idx garbage", train_images=lambda p: p.write_bytes(b"not an idx file at all" * 10))
    idx_case("idx corrupt gzip", "train-images-idx3-ubyte.gz",
             train_images=lambda p: Path(str(p) + ".gz").write_bytes(b"\x1f\x8b\x08" + b"x" * 50))
    idx_case("idx empty file", train_images=lambda p: p.write_bytes(b""))
    idx_case("idx is a directory", train_images=lambda p: p.mkdir())
    empty = work / "files" / "empty dir"
    empty.mkdir(parents=True)
    cases["data dir with nothing usable"] = ("aepar.greedy", ["--data-dir", empty, "--layers", "784-16-4"], empty)

    def cifar_case(name, batch):
        d = work / "files" / name
        d.mkdir(parents=True)
        for b in ("data_batch_1", "test_batch"):
            (d / b).write_bytes(pickle.dumps(batch, protocol=2) if not isinstance(batch, bytes) else batch)
        cases[name] = ("aepar.greedy", ["--dataset", "cifar10", "--data-dir", d, "--layers", "3072-16-4",
                                        "--epochs", "1", "--finetune-epochs", "0"], d / "data_batch_1")

    good = np.zeros((20, 3072), np.uint8)
    cifar_case("cifar wrong shape", {b"data": np.zeros((20, 100), np.uint8), b"labels": [0] * 20})
    cifar_case("cifar labels out of range", {b"data": good, b"labels": [11] * 20})
    cifar_case("cifar missing labels", {b"data": good})
    cifar_case("cifar not a pickle", b"\x80\x02garbage")
    cifar_case("cifar float labels", {b"data": good, b"labels": [0.5] * 20})

    def mat_case(name, write):
        p = work / "files" / f"{name}.mat"
        write(p)
        cases[name] = ("aepar.sparse", ["--images", p, "--limit", "200", "--iterations", "2"], p)

    from scipy.io import savemat

    mat_case("mat truncated", lambda p: p.write_bytes(b"MATLAB 5.0 MAT-file" + bytes(100)))
    mat_case("mat wrong variable", lambda p: savemat(p, {"OTHER": np.zeros((64, 64, 2))}))
    mat_case("mat 2-d images", lambda p: savemat(p, {"IMAGES": np.zeros((64, 64))}))
    mat_case("mat too small for the patch", lambda p: savemat(p, {"IMAGES": np.zeros((4, 4, 3))}))

    stack = work / "stack" / "weights.h5"
    if not stack.exists():
        run("aepar.greedy", SCHEMES["greedy"][1] + ["--quiet", "--out", stack.parent], 1)
    good_ck = checkpoint.load(stack)

    def ck_case(name, params=None, scheme="greedy", raw=None):
        p = work / "files" / f"{name}.h5"
        if raw is not None:
            p.write_bytes(raw)
        else:
            checkpoint.save(p, scheme=scheme, params=params if params is not None else good_ck.params)
        cases[name] = ("aepar.finetune", ["--weights", p, "--dataset", "mnist5k", "--limit", "300", "--epochs", "1"], p)

    nan_params = dict(good_ck.params)
    nan_params["layer1/W"] = np.full_like(nan_params["layer1/W"], np.nan)
    int_params = dict(good_ck.params)
    int_params["layer1/W"] = np.zeros(int_params["layer1/W"].shape, np.int32)
    ck_case("checkpoint with NaN weights", nan_params)
    ck_case("checkpoint with integer weights", int_params)
    ck_case("checkpoint of another scheme", scheme="sparse")
    ck_case("checkpoint truncated", raw=stack.read_bytes()[:2000])
    ck_case("checkpoint not HDF5", raw=b"hello")
    missing = {k: v for k, v in good_ck.params.items() if not k.startswith("layer2/")}
    ck_case("checkpoint lacking a layer's biases", dict(missing, **{"layer2/W": good_ck.params["layer2/W"]}))

    rows = []
    for name, (module, args, path) in cases.items():
        for ranks in ranks_list:
            out = work / "outs" / f"{name}-{ranks}".replace(" ", "_")
            rc, so, se, t0, t1 = run(module, [*args, "--quiet", "--out", out], ranks, timeout=120)
            lines = ours(se, module)
            problems = file_problems(rc, se, module, path, out.exists(),
                                     leftovers(out.parent if out.parent.exists() else work))
            rows.append({"category": "bad file", "scheme": module, "case": name, "ranks": ranks, "exit": rc,
                         "wall_s": round(t1 - t0, 2), "outcome": "; ".join(problems) or GOOD["bad file"],
                         "message": (lines[0] if lines else se[-160:])[:200]})
            print(f"bad file {name} np{ranks}: {rows[-1]['outcome']}", flush=True)
    return rows


# ---- options and --out ---------------------------------------------------------------------------
OPTIONS = [
    ("aepar.greedy", ["--lr", "nan"], "--lr"), ("aepar.greedy", ["--lr", "-1"], "--lr"),
    ("aepar.greedy", ["--momentum", "1"], "--momentum"), ("aepar.greedy", ["--seed", "-1"], "--seed"),
    ("aepar.greedy", ["--layers", "783-64"], "--layers"), ("aepar.greedy", ["--epochs", "0"], "--epochs"),
    ("aepar.greedy", ["--reduce-blocks", "1"], "--reduce-blocks"), ("aepar.greedy", ["--batch", "x"], "--batch"),
    ("aepar.sparse", ["--rho", "1"], "--rho"), ("aepar.sparse", ["--weight-cost", "inf"], "--weight-cost"),
    ("aepar.sparse", ["--limit", "100"], "--limit"), ("aepar.sparse", ["--hidden", "0"], "--hidden"),
    ("aepar.sync", ["--extra", "1,1,1,1"], "--extra"), ("aepar.sync", ["--val-fraction", "0.9"], "--val-fraction"),
    ("aepar.sync", ["--finetune-lr", "inf"], "--finetune-lr"), ("aepar.sync", ["--timeout", "0"], "--timeout"),
    ("aepar.finetune", ["--weights", "nowhere.h5"], "nowhere.h5"),
    ("aepar.sparse", ["--checkpoint-minutes", "-1"], "--checkpoint-minutes"),
]


def options(work: Path, ranks_list) -> list[dict]:
    rows = []
    for module, args, name in OPTIONS:
        for ranks in ranks_list:
            if ranks == 1 and name in ("--reduce-blocks", "--limit"):
                continue  # these are impossible for the ranks only
            out = work / "opts" / f"{module}-{name.strip('-')}-{ranks}"
            extra = ["--dataset", "mnist5k", "--limit", "300"] if module != "aepar.sparse" else []
            rc, so, se, t0, t1 = run(module, [*extra, *args, "--quiet", "--out", out], ranks, timeout=120)
            lines = ours(se, module)
            problems = option_problems(rc, se, module, name, out.exists())
            rows.append({"category": "impossible option", "scheme": module, "case": " ".join(args), "ranks": ranks,
                         "exit": rc, "wall_s": round(t1 - t0, 2),
                         "outcome": "; ".join(problems) or GOOD["impossible option"],
                         "message": (lines[0] if lines else se[-160:])[:200]})
            print(f"option {module} {' '.join(args)} np{ranks}: {rows[-1]['outcome']}", flush=True)
    return rows


def outs(work: Path, ranks_list) -> list[dict]:
    users = work / "user"
    (users / "thesis" / "sub").mkdir(parents=True)
    (users / "thesis" / "thesis.tex").write_text("thesis")
    (users / "thesis" / "sub" / "data.csv").write_text("1,2")
    (users / "notes.txt").write_text("notes")
    (users / "empty").mkdir()
    done = work / "done"
    run("aepar.sparse", ["--limit", "200", "--iterations", "3", "--quiet", "--out", done], 1)

    def snapshot():
        return sorted((str(p), p.read_bytes() if p.is_file() else None) for p in users.rglob("*"))
    before = snapshot()
    rows = []
    for name, args, reason in out_cases(users, done, os.path.expanduser("~")):
        for ranks in ranks_list:
            rc, so, se, t0, t1 = run("aepar.sparse", ["--limit", "200", "--iterations", "3", *args], ranks)
            lines = ours(se, "aepar.sparse")
            problems = out_problems(rc, se, "aepar.sparse", reason, snapshot() != before, leftovers(users))
            rows.append({"category": "--out", "scheme": "aepar.sparse", "case": name, "ranks": ranks, "exit": rc,
                         "wall_s": round(t1 - t0, 2), "outcome": "; ".join(problems) or GOOD["--out"],
                         "message": (lines[0] if lines else se[-160:])[:200]})
            print(f"--out {name} np{ranks}: {rows[-1]['outcome']}", flush=True)
    return rows


# ---- the report ------------------------------------------------------------------------------------
def commit() -> str | None:
    """The checked-out commit, marked when tracked files have changed; None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def command_line(argv: list) -> str:
    return " ".join(["python -m bench.reliability", *([shlex.join(map(str, argv))] if argv else [])])


def header(machine: dict, command: str, revision: str | None, date: str) -> list[str]:
    """The top of reliability.md: what ran, when, on which commit and machine."""
    return ["# Reliability: faults, bad files, impossible options, --out (bench/reliability.py)", "",
            f"{date}, `{command}`" + (f", commit {revision}" if revision else "") + ".",
            f"Machine: {machine['cpu_model']}, {machine['cores']} cores, {machine['mpi']}", ""]


def table(rows: list[dict]) -> list[str]:
    """Counts per fault kind, and per category of the other cases; an outcome other than the
    documented one is shown with the scheme (faults) or the case it came from."""
    md = ["| category | case | runs | as documented | other outcomes | end after the fault (s, max) |",
          "| --- | --- | --- | --- | --- | --- |"]
    groups = {}
    for r in rows:
        groups.setdefault((r["category"], r["case"] if r["category"] == "fault" else "all"), []).append(r)
    for (cat, case), rs in groups.items():
        good = [r for r in rs if r["outcome"] == GOOD.get(cat, "as documented")]
        ends = [r["end_after_fault_s"] for r in rs if r.get("end_after_fault_s") is not None]
        other = sorted({f"{r['scheme'] if cat == 'fault' else r['case']}: {r['outcome']}"
                        for r in rs if r not in good})
        md.append(f"| {cat} | {case} | {len(rs)} | {len(good)} | {'; '.join(other) or '-'} | "
                  f"{f'{max(ends):.1f}' if ends else '-'} |")
    return md


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m bench.reliability", description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="faults,files,options,out",
                   help="which checks, comma-separated (default faults,files,options,out)")
    p.add_argument("--kinds", default=",".join(EXPECTED),
                   help="the faults part's injected kinds, comma-separated (default every kind)")
    p.add_argument("--ranks", default="2,4", help="ranks of the fault runs (default 2,4)")
    p.add_argument("--steps", default="3,15", help="steps the faults fire at (default 3,15)")
    p.add_argument("--out", default=str(RESULTS), help="directory of reliability.md (default bench/results)")
    args = p.parse_args(argv)
    if any(int(r) < 2 for r in args.ranks.split(",")):
        p.error("--ranks: 2 or more (a fault must end a job of several ranks, under the launcher)")
    parts = set(args.parts.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="aepar-reliability-") as tmp:
        work = Path(tmp)
        if "faults" in parts:
            rows += faults(work, args.kinds.split(","), [int(r) for r in args.ranks.split(",")],
                           [int(s) for s in args.steps.split(",")])
        if "files" in parts:
            rows += bad_files(work, [1, 2])
        if "options" in parts:
            rows += options(work, [1, 2])
        if "out" in parts:
            rows += outs(work, [1, 2])
    machine = machine_columns()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    keys += list(machine)
    with open(out / "reliability.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(with_machine(rows, machine))
    md = header(machine, command_line(argv), commit(), datetime.date.today().isoformat()) + table(rows)
    (out / "reliability.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    print(json.dumps({"runs": len(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
