"""Run directories: what --out may name, what is never touched, how results appear."""
import json
import os
import stat

import numpy as np
import pytest

from aepar.comm import Comm
from aepar.errors import UserError
from aepar.rundir import CHECKPOINT, MARKER, RunDir, _decide, fingerprint, resumed_args, same_data


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def open_run(out=None, resume=None, overwrite=False, scheme="demo", argv=("--x", "1")):
    return RunDir.open(Comm.serial(), scheme, out=out, resume=resume, overwrite=overwrite, argv=list(argv))


def complete_run(path, files=("result.txt",), checkpoint=False, scheme="demo"):
    run = open_run(out=path, scheme=scheme)
    if checkpoint:
        run.save_checkpoint(lambda p: p.write_text("ckpt"), "epoch 1")
    for name in files:
        run.write_text(name, f"{name}\n")
    if not checkpoint:
        run.complete()
    return run


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("name, why", [(".", "is the working directory"), ("..", "contains the working directory"),
                                       ("/", "is the root directory"), ("~", "is your home directory")])
def test_places_that_are_always_refused(cwd, name, why):
    with pytest.raises(UserError, match=why):
        _decide("demo", os.path.expanduser(name), None, False)
    with pytest.raises(UserError, match=why):  # --overwrite changes nothing
        _decide("demo", os.path.expanduser(name), None, True)


def test_a_users_directory_and_file_are_never_touched(cwd):
    (cwd / "thesis").mkdir()
    (cwd / "thesis" / "thesis.tex").write_text("my thesis")
    (cwd / "thesis" / "sub").mkdir()
    (cwd / "thesis" / "sub" / "data.csv").write_text("1,2")
    (cwd / "notes.txt").write_text("notes")
    (cwd / "empty").mkdir()
    before = tree(cwd)
    for out, overwrite in (("thesis", False), ("thesis", True), ("notes.txt", False), ("notes.txt", True),
                           ("empty", False), ("empty", True)):
        with pytest.raises(UserError, match=out):
            open_run(out=out, overwrite=overwrite)
    with pytest.raises(UserError, match="no such run directory"):
        open_run(resume="nowhere")
    with pytest.raises(UserError, match="not an aepar run"):
        open_run(resume="thesis")
    assert tree(cwd) == before and (cwd / "thesis" / "thesis.tex").read_text() == "my thesis"


def test_a_run_directory_appears_whole_when_complete_and_never_half(cwd):
    run = open_run(out="runs/a")
    run.write_text("result.txt", "42")
    assert not (cwd / "runs" / "a").exists()  # still in its hidden staging sibling
    staged = [p.name for p in (cwd / "runs").iterdir()]
    assert len(staged) == 1 and staged[0].startswith(".a.aepar-")
    run.complete()
    assert sorted(p.name for p in (cwd / "runs").iterdir()) == ["a"]
    marker = json.loads((cwd / "runs" / "a" / MARKER).read_text())
    assert marker["state"] == "complete" and marker["files"] == ["result.txt"] and marker["argv"] == ["--x", "1"]
    # a run that fails before its first checkpoint leaves nothing, staging included
    with pytest.raises(RuntimeError):
        with open_run(out="runs/b") as run:
            run.write_text("half.csv", "a,b")
            raise RuntimeError("failed mid-run")
    assert sorted(p.name for p in (cwd / "runs").iterdir()) == ["a"]


def test_a_second_run_is_refused_and_overwrite_deletes_only_aeparts_files(cwd):
    complete_run("r", files=("result.txt", "old.png"))
    (cwd / "r" / "my-notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds an aepar.demo run .complete.*--overwrite"):
        open_run(out="r")
    with pytest.raises(UserError, match="nothing to resume"):
        open_run(resume="r")
    run = open_run(out="r", overwrite=True)
    assert (cwd / "r" / "old.png").exists()  # nothing is deleted before the new run writes
    run.write_text("result.txt", "new")
    run.complete()
    assert sorted(p.name for p in (cwd / "r").iterdir()) == sorted(["my-notes.txt", MARKER, "result.txt"])
    assert (cwd / "r" / "result.txt").read_text() == "new"


def test_checkpoint_publishes_the_directory_and_resume_continues_it(cwd):
    run = complete_run("r", checkpoint=True)
    assert (cwd / "r" / CHECKPOINT).read_text() == "ckpt"
    run.abandon("interrupted", "a signal")
    marker = json.loads((cwd / "r" / MARKER).read_text())
    assert marker["state"] == "interrupted" and marker["checkpoint"]["progress"] == "epoch 1"
    with pytest.raises(UserError, match="continue it with --resume"):
        open_run(out="r")
    with pytest.raises(UserError, match="not an aepar.other run"):
        open_run(resume="r", scheme="other")
    with pytest.raises(UserError, match="contradict"):
        open_run(resume="r", overwrite=True)
    with pytest.raises(UserError, match="different directories"):
        open_run(resume="r", out="elsewhere")
    again = open_run(resume="r")
    assert again.resumed and again.has_checkpoint and again.checkpoint_progress == "epoch 1"
    again.write_text("result.txt", "done")
    again.complete()
    assert sorted(p.name for p in (cwd / "r").iterdir()) == sorted([MARKER, "result.txt"])  # checkpoint dropped


def test_files_follow_the_users_umask(cwd):
    old = os.umask(0o027)
    try:
        complete_run("shared", checkpoint=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE((cwd / "shared").stat().st_mode) == 0o750
    for name in ("result.txt", CHECKPOINT, MARKER):
        assert stat.S_IMODE((cwd / "shared" / name).stat().st_mode) == 0o640, name


def test_default_directories_are_numbered(cwd):
    for _ in range(2):
        run = open_run()
        run.write_text("x", "1")
        run.complete()
    assert sorted(p.name for p in (cwd / "runs" / "demo").iterdir()) == ["001", "002"]
    with pytest.raises(UserError, match="not an aepar run directory"):
        open_run(out="runs/demo")


def test_a_directory_in_use_is_refused_even_with_overwrite(cwd):
    run = complete_run("busy", checkpoint=True)  # its marker says running, by this live process
    with pytest.raises(UserError, match="in use by a running"):
        open_run(out="busy", overwrite=True)
    run.abandon("failed", "x")


def test_resumed_options_must_be_the_runs_own():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--resume")
    p.add_argument("--data-dir")
    p.add_argument("--weights", required=True)  # as aepar.finetune's: --resume alone does not parse
    info = {"argv": ["--epochs", "5", "--data-dir", "data", "--weights", "w.h5"], "cwd": "/start"}
    args = resumed_args(p.parse_args, ["--resume", "r", "--quiet"], info)
    assert args.epochs == 5 and args.quiet and args.data_dir == "/start/data"
    with pytest.raises(UserError, match="--epochs 6 differs from the run being resumed"):
        resumed_args(p.parse_args, ["--resume", "r", "--epochs", "6"], info)
    # --quiet is the invocation's: a run started quiet by a script talks when resumed without it
    quiet_start = dict(info, argv=["--epochs", "5", "--quiet", "--weights", "w.h5"])
    assert not resumed_args(p.parse_args, ["--resume", "r"], quiet_start).quiet
    assert resumed_args(p.parse_args, ["--resume", "r", "--quiet"], quiet_start).quiet


def test_a_resumed_run_keeps_the_defaults_it_started_with(cwd):
    """A run started by an aepar with other defaults (0.6.0 changed fine-tuning's rate) goes
    on with the values it started with, not this aepar's defaults; the options it set, and
    the ones whose default did not move, parse as before."""
    import argparse

    def parser(lr_default):
        p = argparse.ArgumentParser()
        p.add_argument("--epochs", type=int, default=3)
        p.add_argument("--finetune-lr", type=float, default=lr_default)
        p.add_argument("--layers", type=lambda s: tuple(int(v) for v in s.split("-")), default=(4, 2))
        p.add_argument("--quiet", action="store_true")
        p.add_argument("--resume")
        return p.parse_args

    run = open_run(out="r", argv=["--epochs", "5"])
    run.describe_job(parser(0.001)(["--epochs", "5"]), ["host"])
    run.save_checkpoint(lambda p: p.write_text("ckpt"), "epoch 1")
    info = json.loads((cwd / "r" / MARKER).read_text())
    assert info["started_options"] == {"epochs": 5, "finetune_lr": 0.001, "layers": [4, 2], "quiet": False,
                                       "resume": None}
    info["started_options"]["layers"] = [4, 3]  # as if --layers' default had moved too
    args = resumed_args(parser(0.003), ["--resume", "r"], info)
    assert (args.epochs, args.finetune_lr, args.layers) == (5, 0.001, (4, 3))
    with pytest.raises(UserError, match="--finetune-lr 0.002 differs from the run being resumed"):
        resumed_args(parser(0.003), ["--resume", "r", "--finetune-lr", "0.002"], info)
    # a run from before run.json kept its started options takes the defaults as it always did
    assert resumed_args(parser(0.003), ["--resume", "r"], dict(info, started_options=None)).finetune_lr == 0.003


def test_a_resumed_run_does_without_an_option_added_since_it_started(cwd):
    """An option added after a run started (0.7.0's --finetune-weight-decay, default 0.05)
    takes the value that trains as before (none) when that run is resumed, unless it is given
    anew; a run started with the option keeps its own value."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--finetune-weight-decay", type=float, default=0.05)
    p.add_argument("--resume")
    before = {"argv": ["--epochs", "5"], "started_options": {"epochs": 5, "resume": None}}
    assert resumed_args(p.parse_args, ["--resume", "r"], before).finetune_weight_decay == 0.0
    assert resumed_args(p.parse_args, ["--resume", "r"], dict(before, started_options=None)).finetune_weight_decay == 0
    with pytest.raises(UserError, match="--finetune-weight-decay 0.1 differs from the run being resumed"):
        resumed_args(p.parse_args, ["--resume", "r", "--finetune-weight-decay", "0.1"], before)
    since = dict(before, started_options={"epochs": 5, "finetune_weight_decay": 0.05, "resume": None})
    assert resumed_args(p.parse_args, ["--resume", "r"], since).finetune_weight_decay == 0.05


def test_a_resumed_run_must_find_the_same_data():
    a = np.arange(12.0).reshape(3, 4)
    same_data(fingerprint(a), fingerprint(a.copy()), "x")
    with pytest.raises(UserError, match="the data differ"):
        same_data(fingerprint(a), fingerprint(a[:2]), "ckpt.h5")


def test_auto_numbered_runs_started_together_each_get_their_own(cwd):
    # all three decide on runs/demo/001 before any of them has a directory
    runs = [open_run(argv=("--seed", str(i))) for i in range(3)]
    assert {str(r.path) for r in runs} == {os.path.join("runs", "demo", "001")}
    for i, run in enumerate(runs):
        run.write_text("result.txt", f"run {i}")
        run.complete()
    assert sorted(p.name for p in (cwd / "runs" / "demo").iterdir()) == ["001", "002", "003"]
    for i, run in enumerate(runs):
        assert (run.path / "result.txt").read_text() == f"run {i}"
        assert json.loads((run.path / MARKER).read_text())["argv"] == ["--seed", str(i)]


def test_an_explicit_out_taken_meanwhile_is_refused_and_its_results_kept(cwd):
    first, second = open_run(out="r", argv=("--seed", "1")), open_run(out="r", argv=("--seed", "2"))
    first.write_text("result.txt", "first")
    first.complete()
    with pytest.raises(UserError, match=r"r appeared while this run was working; this run's results stay in "):
        with second:
            second.write_text("result.txt", "second")
            second.complete()
    assert (cwd / "r" / "result.txt").read_text() == "first"
    kept = [p for p in cwd.iterdir() if p.name.startswith(".r.aepar-")]
    assert len(kept) == 1 and (kept[0] / "result.txt").read_text() == "second"


def test_overwrite_never_replaces_a_run_that_took_the_directory_meanwhile(cwd):
    complete_run("r")
    mine, theirs = open_run(out="r", overwrite=True), open_run(out="r", overwrite=True, argv=("--y",))
    theirs.write_text("result.txt", "theirs")
    theirs.complete()
    mine.write_text("result.txt", "mine")
    with pytest.raises(UserError, match="no longer the run --overwrite was to replace"):
        mine.complete()
    assert (cwd / "r" / "result.txt").read_text() == "theirs"


def test_a_failed_write_names_the_file_and_keeps_the_last_checkpoint(cwd, monkeypatch):
    from aepar.errors import WriteFailed

    monkeypatch.setenv("AEPAR_FAULT", "0:2:enospc")  # the second file written fails
    run = open_run(out="r")
    run.save_checkpoint(lambda p: p.write_text("epoch 1"), "epoch 1")
    with pytest.raises(WriteFailed, match=r"cannot write r/checkpoint.h5: No space left on device; the last "
                                          r"checkpoint \(epoch 1\) in r is intact: make room, then --resume r"):
        with run:
            run.save_checkpoint(lambda p: p.write_text("epoch 2, half"), "epoch 2")
    assert WriteFailed.exit_code == 74
    assert sorted(p.name for p in (cwd / "r").iterdir()) == [CHECKPOINT, MARKER]  # no half-written file
    assert (cwd / "r" / CHECKPOINT).read_text() == "epoch 1"
    assert open_run(resume="r").checkpoint_progress == "epoch 1"


def test_a_failed_write_before_any_checkpoint_leaves_nothing(cwd, monkeypatch):
    from aepar.errors import WriteFailed

    monkeypatch.setenv("AEPAR_FAULT", "0:1:erofs")
    with pytest.raises(WriteFailed, match="cannot write r/weights.h5: Read-only file system; the run had no "
                                          "checkpoint yet, so nothing is kept"):
        with open_run(out="r") as run:
            run.write_text("weights.h5", "w")
    assert list(cwd.iterdir()) == []


def test_a_killed_run_lingering_as_a_zombie_is_not_running():
    import socket
    import subprocess
    import time

    from aepar.rundir import _alive

    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10  # exited but not reaped: a zombie, as a killed rank waits for mpirun
    while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    info = {"state": "running", "host": socket.gethostname(), "pid": child.pid}
    try:
        assert not _alive(info)
        assert _alive(dict(info, pid=os.getpid()))
    finally:
        child.wait()


def _parser():
    import argparse

    p = argparse.ArgumentParser()
    for name in ("--out", "--resume", "--weights"):
        p.add_argument(name)
    for name in ("--overwrite", "--resume-or-start", "--quiet"):
        p.add_argument(name, action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    return p.parse_args


def start_or_resume(*argv, scheme="demo"):
    from aepar.rundir import parse_and_open

    return parse_and_open(Comm.serial(), scheme, f"aepar.{scheme}", _parser(), list(argv))


def test_resume_or_start_starts_continues_and_ends_a_complete_run(cwd, capsys):
    args, run = start_or_resume("--out", "r", "--resume-or-start", "--epochs", "5")
    assert not run.resumed and args.epochs == 5
    run.save_checkpoint(lambda p: p.write_text("ckpt"), "epoch 1")
    run.abandon("interrupted", "a signal")  # a requeued job finds it so
    # the same command again continues it: a run control (--quiet) may change, a default
    # the first command left out compares as the default
    args, run = start_or_resume("--epochs", "5", "--out", "r", "--resume-or-start", "--quiet")
    assert run.resumed and run.checkpoint_progress == "epoch 1" and args.epochs == 5
    run.write_text("result.txt", "done")
    run.complete()
    marker = json.loads((cwd / "r" / MARKER).read_text())
    assert marker["state"] == "complete" and marker["options"]["epochs"] == 5
    assert marker["layout"] == {"ranks": 1, "hosts": {marker["host"]: 1}}
    # complete: exit 0 and one line, nothing touched
    before = (cwd / "r" / MARKER).read_text()
    with pytest.raises(SystemExit) as stop:
        start_or_resume("--out", "r", "--resume-or-start", "--epochs", "5")
    assert stop.value.code == 0 and "r holds this run, complete: nothing to do" in capsys.readouterr().out
    assert (cwd / "r" / MARKER).read_text() == before


def test_resume_or_start_refuses_other_options_or_another_program(cwd):
    _, run = start_or_resume("--out", "r", "--resume-or-start", "--epochs", "5", "--weights", "w")
    run.save_checkpoint(lambda p: p.write_text("ckpt"), "epoch 1")
    run.abandon("interrupted", "a signal")
    before = tree(cwd)
    with pytest.raises(UserError, match=r"with other options: --epochs 6 \(the run has 5\)"):
        start_or_resume("--out", "r", "--resume-or-start", "--epochs", "6", "--weights", "w")
    with pytest.raises(UserError, match=r"other options: --epochs 3 \(the run has 5\)"):  # left out: the default
        start_or_resume("--out", "r", "--resume-or-start", "--weights", "w")
    with pytest.raises(UserError, match=r"other options: --weights .*/elsewhere/w"):  # same words, other place
        (cwd / "elsewhere").mkdir()
        os.chdir(cwd / "elsewhere")
        start_or_resume("--out", "../r", "--resume-or-start", "--epochs", "5", "--weights", "w")
    os.chdir(cwd)
    with pytest.raises(UserError, match="not an aepar.other run"):
        start_or_resume("--out", "r", "--resume-or-start", "--epochs", "5", "--weights", "w", scheme="other")
    with pytest.raises(UserError, match="needs --out DIR"):
        start_or_resume("--resume-or-start")
    with pytest.raises(UserError, match="contradicts --overwrite"):
        start_or_resume("--out", "r", "--resume-or-start", "--overwrite")
    (cwd / "mine").mkdir()
    (cwd / "mine" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="not an aepar run directory"):  # the usual --out rules
        start_or_resume("--out", "mine", "--resume-or-start")
    assert tree(cwd) == sorted(before + ["elsewhere", "mine", "mine/notes.txt"])
