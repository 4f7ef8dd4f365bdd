"""bench.reliability's checks, fed the stderr and exit codes real runs give (Open MPI 5's
mpirun, at 2 ranks): each documented outcome passes, and each planted wrong outcome (the
rank named by the fault injector alone, a kill ending with exit 1, a refusal giving the
wrong reason, ...) fails its check. Nothing is run."""
from pathlib import Path

import pytest

from bench import reliability as rel

INJECTED = "aepar.greedy: AEPAR_FAULT: {kind} on rank 1, step 3 (pre-training layer 1) at t=1795863017.147"
ABORT_NOTICE = """--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
  Proc: [[51680,1],1]
  Errorcode: {code}

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
You may or may not see output from other processes, depending on
exactly when Open MPI kills them.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
prterun has exited due to process rank 1 with PID 0 on node vm calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
--------------------------------------------------------------------------
"""
# mpirun wraps its notice: "exited on" ends one line, "signal 9" begins the next
KILL_NOTICE = """--------------------------------------------------------------------------
prterun noticed that process rank {rank} with PID 17574 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
TRACEBACK = """Traceback (most recent call last):
  File "/work/main/aepar/comm.py", line 391, in run_main
    main(argv, comm)
RuntimeError: fault injected by AEPAR_FAULT at rank 1, step 3 (pre-training layer 1)
"""


def stderr(kind, *lines, notice=""):
    return "\n".join([INJECTED.format(kind=kind), *lines]) + "\n" + notice


RAISED = stderr("raise", "aepar.greedy: rank 1/2: internal error", TRACEBACK.rstrip(),
                notice=ABORT_NOTICE.format(code=1))
KILLED = stderr("kill", notice=KILL_NOTICE.format(rank=1))
STALLED = stderr("stall", "aepar.greedy: error: rank 1 stalled: no progress for 5 s (last step 3, pre-training "
                 "layer 1); ending the job (exit 124)", notice=ABORT_NOTICE.format(code=124))
DIVERGED = stderr("nan", "aepar.greedy: error: diverged: greedy pre-training, layer 1 (784-64), epoch 1: parameter "
                  "W is not finite (50176 of 50176 values NaN or Inf); no checkpoint had been saved")
OUT = Path("/tmp/aepar-reliability-x/greedy-sigusr1-2-3")
STOPPED = stderr("sigusr1", f"aepar.greedy: stopped: checkpoint at layer 1 epoch 1 batch 4 saved in {OUT} after a "
                 f"stop signal; continue with --resume {OUT}")


def fault(kind, rc, text, out=None):
    return rel.fault_problems(kind, rc, text, "aepar.greedy", 1, 2, out)


# ---- faults -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, rc, text", [("raise", 1, RAISED), ("kill", 137, KILLED), ("stall", 124, STALLED),
                                            ("nan", 3, DIVERGED), ("sigusr1", 75, STOPPED)])
def test_the_documented_end_of_each_fault_passes(kind, rc, text):
    assert fault(kind, rc, text, OUT) == []


@pytest.mark.parametrize("kind, rc", [("raise", 1), ("kill", 137), ("stall", 124)])
def test_a_rank_named_only_by_the_fault_injector_is_not_named(kind, rc):
    only_injected = stderr(kind, notice=ABORT_NOTICE.format(code=rc) if kind != "kill" else "")
    assert "rank 1" in only_injected  # what the old check accepted
    assert fault(kind, rc, only_injected) == ["rank not named"]


def test_an_internal_error_on_another_rank_does_not_name_the_faulty_one():
    assert fault("raise", 1, RAISED.replace("rank 1/2:", "rank 0/2:")) == ["rank not named"]


def test_a_peer_waiting_for_the_stalled_rank_does_not_name_it():
    waited = stderr("stall", "aepar.greedy: error: rank 0 waited 20 s in allreduce for the other ranks (step 3, "
                    "pre-training layer 1): a rank stopped responding; ending the job (exit 124)")
    assert fault("stall", 124, waited) == ["rank not named"]


def test_a_kill_reported_for_another_rank_or_another_signal_does_not_name_the_killed_one():
    assert fault("kill", 137, stderr("kill", notice=KILL_NOTICE.format(rank=0))) == ["rank not named"]
    assert fault("kill", 137, KILLED.replace("signal 9", "signal 15")) == ["rank not named"]


def test_the_launchers_notice_is_read_across_its_line_breaks_and_in_open_mpi_4s_words():
    assert rel.launcher_named_kill(KILLED, 1)
    one_line = "mpirun noticed that process rank 1 with PID 12 on node n01 exited on signal 9 (Killed).\n"
    assert rel.launcher_named_kill(one_line, 1) and not rel.launcher_named_kill(one_line, 11)


@pytest.mark.parametrize("rc", [1, 0, 124, -9, "hang"])
def test_a_kill_must_end_the_job_with_137(rc):
    assert fault("kill", rc, KILLED) == (["hang"] if rc == "hang" else [f"exit {rc}, not 137"])


@pytest.mark.parametrize("kind, text, wrong", [("raise", RAISED, 2), ("stall", STALLED, 1), ("nan", DIVERGED, 1),
                                               ("sigusr1", STOPPED, 1)])
def test_each_fault_must_end_with_its_own_exit_code(kind, text, wrong):
    assert fault(kind, wrong, text, OUT) == [f"exit {wrong}, not {rel.EXPECTED[kind]}"]


def test_a_nan_without_a_divergence_line_fails():
    assert fault("nan", 3, stderr("nan")) == ["no divergence line"]


def test_a_stop_must_say_where_the_checkpoint_is():
    assert fault("sigusr1", 75, stderr("sigusr1"), OUT) == ["no line saying where the checkpoint is"]
    assert fault("sigusr1", 75, STOPPED, OUT.with_name("elsewhere")) == ["no line saying where the checkpoint is"]


def test_what_a_fault_leaves_behind():
    assert rel.leftover_problems("kill", False, False, []) == []
    assert rel.leftover_problems("raise", True, True, []) == []  # a checkpoint to resume from
    assert rel.leftover_problems("raise", True, False, []) == ["run directory without a checkpoint left"]
    assert rel.leftover_problems("stall", False, False, [".run.aepar-vm-1"]) == ["left ['.run.aepar-vm-1']"]


# ---- bad files ----------------------------------------------------------------------------------
IDX = Path("/tmp/aepar-reliability-x/files/idx label count mismatch")
LABELS, IMAGES = IDX / "train-labels-idx1-ubyte", IDX / "train-images-idx3-ubyte"
MISMATCH = (f"aepar.greedy: error: {LABELS}: shape mismatch: 299 labels but {IMAGES} has 300 images\n")


def test_a_bad_file_refused_in_one_line_naming_it_passes():
    assert rel.file_problems(2, MISMATCH, "aepar.greedy", LABELS, False, []) == []


def test_a_bad_file_line_must_name_that_file_as_its_subject():
    # named, but only as the other file of the message
    assert rel.file_problems(2, MISMATCH, "aepar.greedy", IMAGES, False, []) == ["file not named"]
    other = f"aepar.greedy: error: {IDX}: no usable images\n"  # the directory, not the file
    assert rel.file_problems(2, other, "aepar.greedy", LABELS, False, []) == ["file not named"]


def test_a_bad_file_with_a_traceback_another_exit_or_a_written_run_fails():
    assert rel.file_problems(2, MISMATCH + TRACEBACK, "aepar.greedy", LABELS, False, []) == ["traceback"]
    assert rel.file_problems(1, MISMATCH, "aepar.greedy", LABELS, False, []) == ["exit 1, not 2"]
    assert rel.file_problems(2, MISMATCH * 2, "aepar.greedy", LABELS, False, []) == ["2 line(s)"]
    assert rel.file_problems(2, MISMATCH, "aepar.greedy", LABELS, True, []) == ["run directory written"]


# ---- options ------------------------------------------------------------------------------------
LR = "aepar.greedy: error: argument --lr: invalid learning rate (a finite number >= 0) value: 'nan'\n"


def test_an_impossible_option_refused_in_one_line_naming_it_passes():
    assert rel.option_problems(2, LR, "aepar.greedy", "--lr", False) == []
    missing = "aepar.finetune: error: nowhere.h5: missing (no such file)\n"
    assert rel.option_problems(2, missing, "aepar.finetune", "nowhere.h5", False) == []


def test_a_line_about_a_longer_option_does_not_name_the_option():
    other = "aepar.greedy: error: argument --finetune-lr: invalid learning rate value: 'nan'\n"
    assert rel.option_problems(2, other, "aepar.greedy", "--lr", False) == ["option not named"]
    assert rel.option_problems(2, LR.replace("--lr", "--lr-decay"), "aepar.greedy", "--lr", False) == [
        "option not named"]


def test_an_option_refusal_that_is_no_error_line_or_exits_otherwise_fails():
    assert rel.option_problems(2, LR.replace(": error:", ":"), "aepar.greedy", "--lr", False) == [
        "not an error line"]
    assert rel.option_problems(0, "", "aepar.greedy", "--lr", True) == ["exit 0, not 2", "0 line(s)",
                                                                      "run directory written"]


# ---- --out --------------------------------------------------------------------------------------
USERS, DONE, HOME = Path("/tmp/aepar-reliability-x/user"), Path("/tmp/aepar-reliability-x/done"), "/root"
CASES = {name: (args, reason) for name, args, reason in rel.out_cases(USERS, DONE, HOME)}
NOT_OURS = "exists and is not an aepar run directory; aepar writes only into a new directory or its own run " \
           "directory: name a new one"
# what aepar.rundir says for each case (the --resume of a user's directory as it should)
SAID = {
    "a user's directory": f"--out {USERS}/thesis {NOT_OURS}",
    "the same with --overwrite": f"--out {USERS}/thesis {NOT_OURS}",
    "a user's file": f"--out {USERS}/notes.txt exists and is not a directory; not touching it",
    "an empty directory": f"--out {USERS}/empty {NOT_OURS}",
    "the working directory": "--out . is the working directory; name a new directory for the run",
    "an ancestor of it": "--out .. contains the working directory; name a new directory for the run",
    "the root": "--out / is the root directory; name a new directory for the run",
    "the home directory": "--out /root is your home directory; name a new directory for the run",
    "a complete run, no flag": f"--out {DONE} holds an aepar.sparse run (complete, 2026-11-24T07:28:28+00:00): "
                               "replace it with --overwrite, or name a new directory",
    "--resume of a complete run": f"--resume {DONE}: the run is complete; nothing to resume (--out DIR --overwrite "
                                  "runs it again)",
    "--resume of a user's directory": f"--resume {USERS}/thesis {NOT_OURS}",
}


def refused(message):
    return f"aepar.sparse: error: {message}\n"


def out(name, message, rc=2, touched=False, left=()):
    return rel.out_problems(rc, refused(message), "aepar.sparse", CASES[name][1], touched, list(left))


def test_every_out_case_has_its_expected_reason():
    assert sorted(CASES) == sorted(SAID)


@pytest.mark.parametrize("name", list(SAID))
def test_each_out_case_refused_for_its_reason_passes(name):
    assert out(name, SAID[name]) == []


def test_a_resume_of_a_users_directory_refused_with_a_line_about_out_has_the_wrong_reason():
    # the line aepar gives today: it sends a user who typed --resume to --out
    assert out("--resume of a user's directory", f"--out {USERS}/thesis {NOT_OURS}") == ["wrong reason"]


@pytest.mark.parametrize("name, other", [
    ("a user's directory", "the working directory"), ("a user's file", "a user's directory"),
    ("the working directory", "an ancestor of it"), ("an ancestor of it", "the working directory"),
    ("the root", "the home directory"), ("the home directory", "the root"),
    ("a complete run, no flag", "--resume of a complete run"), ("--resume of a complete run", "a complete run, no flag"),
    ("an empty directory", "a user's directory")])
def test_each_out_case_refused_for_another_cases_reason_fails(name, other):
    assert out(name, SAID[other]) == ["wrong reason"]


def test_a_path_that_only_begins_like_the_one_given_is_not_it():
    assert out("a user's directory", f"--out {USERS}/thesis-old {NOT_OURS}") == ["wrong reason"]
    assert out("--resume of a user's directory", f"--resume {USERS}/thesis-old {NOT_OURS}") == ["wrong reason"]


def test_an_out_refusal_that_touches_files_leaves_staging_or_exits_otherwise_fails():
    name, said = "a user's directory", SAID["a user's directory"]
    assert out(name, said, touched=True) == ["user's files touched"]
    assert out(name, said, left=[".thesis.aepar-vm-7"]) == ["left ['.thesis.aepar-vm-7']"]
    assert out(name, said, rc=0) == ["exit 0, not 2"]
    two = rel.out_problems(2, refused(said) * 2, "aepar.sparse", CASES[name][1], False, [])
    assert two == ["2 line(s)"]


# ---- the report ---------------------------------------------------------------------------------
MACHINE = {"cpu_model": "AMD EPYC", "cores": 2, "mpi": "Open MPI v5.0.11"}


def test_the_report_is_dated_with_its_command_line_and_commit():
    command = rel.command_line(["--parts", "out", "--out", "/tmp/a b"])
    assert command == "python -m bench.reliability --parts out --out '/tmp/a b'"
    assert rel.command_line([]) == "python -m bench.reliability"
    top = rel.header(MACHINE, command, "ea91845", "2026-11-24")
    assert top[2] == "2026-11-24, `python -m bench.reliability --parts out --out '/tmp/a b'`, commit ea91845."
    assert rel.header(MACHINE, command, None, "2026-11-24")[2].endswith("'/tmp/a b'`.")  # no git: no commit


def test_the_table_counts_the_documented_outcomes_and_names_the_others():
    rows = [{"category": "fault", "scheme": "greedy", "case": "kill", "outcome": "as documented",
             "end_after_fault_s": 0.4},
            {"category": "fault", "scheme": "sync", "case": "kill", "outcome": "exit 1, not 137",
             "end_after_fault_s": 0.6},
            {"category": "--out", "scheme": "aepar.sparse", "case": "the root", "outcome": rel.GOOD["--out"]},
            {"category": "--out", "scheme": "aepar.sparse", "case": "--resume of a user's directory",
             "outcome": "wrong reason"}]
    assert rel.table(rows)[2:] == [
        "| fault | kill | 2 | 1 | sync: exit 1, not 137 | 0.6 |",
        "| --out | all | 2 | 1 | --resume of a user's directory: wrong reason | - |"]
