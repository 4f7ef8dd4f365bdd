"""What users' clusters do to runs, end to end: run directories that never touch a user's
files, interruptions resumed to the same bits (also on another number of ranks), injected
faults under mpirun -np 4, divergence.

Every case runs the real command. Interruptions come from AEPAR_FAULT's signal kinds (a
rank sends itself SIGTERM/SIGUSR1/SIGINT at a chosen step, as a scheduler would) or from
a signal sent to mpirun, which forwards SIGUSR1 to every rank.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.integration.test_outputs import assert_describes_itself
from tests.conftest import ROOT, mpirun_cmd, run_mpi

pytestmark = pytest.mark.mpi

SPARSE = ["--limit", "3000", "--iterations", "120", "--quiet"]
GREEDY = ["--dataset", "mnist5k", "--layers", "784-96-32-8", "--epochs", "3", "--finetune-epochs", "2",
          "--optimizer", "adam", "--loss", "xent", "--limit", "1200", "--quiet"]
SYNC = ["--dataset", "mnist5k", "--layers", "784-96-48-24-8", "--epochs", "3", "--extra", "0,2,2,3",
        "--limit", "1200", "--finetune-epochs", "1", "--optimizer", "adam", "--loss", "xent", "--no-plot", "--quiet"]


def cli(module, args, np_=1, env=None, timeout=300):
    """``python -m module args`` in one process (np_ = 1) or under mpirun."""
    env = dict(env or {})
    if np_ > 1:
        return run_mpi(np_, ["-m", module, *map(str, args)], timeout=timeout, env=env)
    full = dict(os.environ, **env)
    full.pop("OMPI_COMM_WORLD_LOCAL_SIZE", None)
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=ROOT)


def weights(run_dir):
    from aepar import checkpoint

    return checkpoint.load(run_dir / "weights.h5").params


def assert_same_bits(a_dir, b_dir):
    a, b = weights(a_dir), weights(b_dir)
    assert set(a) == set(b)
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not differ, differ


def marker(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def error_lines(result, prog):
    return [line for line in result.stderr.splitlines() if line.startswith(f"{prog}:")]


def leftovers(parent):
    """Hidden staging directories next to run directories (none may survive a run)."""
    return [p.name for p in parent.iterdir() if p.name.startswith(".") and ".aepar-" in p.name]


# ---- 1. never destroy a user's files --------------------------------------------------------------
@pytest.fixture
def users_dir(tmp_path):
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.tex").write_text("my thesis")
    (tmp_path / "thesis" / "sub").mkdir()
    (tmp_path / "thesis" / "sub" / "data.csv").write_text("1,2")
    (tmp_path / "notes.txt").write_text("notes")
    return tmp_path


def snapshot(path):
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("np_", [1, 2])
def test_out_refusals_touch_nothing_and_come_before_the_data(users_dir, np_):
    before = snapshot(users_dir)
    missing_data = users_dir / "no-such-data-dir"  # would fail later: the --out check comes first
    cases = [(["--out", users_dir / "thesis"], "exists and is not an aepar run directory"),
             (["--out", users_dir / "notes.txt"], "exists and is not a directory"),
             (["--out", users_dir / "thesis", "--overwrite"], "exists and is not an aepar run directory"),
             (["--out", ROOT], "is the working directory"),
             (["--out", ROOT.parent], "contains the working directory"),
             (["--resume", users_dir / "thesis"], "not an aepar run directory")]
    for args, why in cases:
        r = cli("aepar.sparse", ["--limit", "200", "--iterations", "2", "--data-dir", missing_data, *args], np_)
        assert r.returncode == 2, (args, r.stdout + r.stderr)
        lines = error_lines(r, "aepar.sparse")
        assert len(lines) == 1 and why in lines[0] and str(args[1]) in lines[0], (args, r.stderr)
        assert r.stdout == ""
    assert snapshot(users_dir) == before and leftovers(users_dir) == []


@pytest.mark.parametrize("np_", [1, 2])
def test_a_second_run_is_refused_overwrite_replaces_only_its_files(tmp_path, np_):
    out = tmp_path / "run"
    first = cli("aepar.sparse", ["--limit", "300", "--iterations", "5", "--quiet", "--out", out], np_)
    assert first.returncode == 0, first.stderr
    (out / "my-notes.txt").write_text("mine")
    produced = sorted(p.name for p in out.iterdir())
    again = cli("aepar.sparse", ["--limit", "300", "--iterations", "5", "--quiet", "--out", out], np_)
    assert again.returncode == 2 and "use --overwrite" not in again.stdout
    assert "holds an aepar.sparse run (complete" in error_lines(again, "aepar.sparse")[0]
    replaced = cli("aepar.sparse", ["--limit", "300", "--iterations", "7", "--quiet", "--out", out,
                                    "--overwrite"], np_)
    assert replaced.returncode == 0, replaced.stderr
    assert sorted(p.name for p in out.iterdir()) == produced and (out / "my-notes.txt").read_text() == "mine"
    assert json.loads((out / "summary.json").read_text())["iterations"] == 7
    assert leftovers(tmp_path) == []


def test_results_follow_the_umask(tmp_path):
    out = tmp_path / "shared"
    code = (f"import os, sys, runpy; os.umask(0o027); sys.argv = ['aepar.sparse', '--limit', '300', "
            f"'--iterations', '3', '--quiet', '--out', {str(out)!r}]; runpy.run_module('aepar.sparse', "
            f"run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert oct(out.stat().st_mode & 0o777) == oct(0o750)
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {oct(0o640)}


# ---- 2/3. interrupted and resumed: the same bits, on any number of ranks -----------------------------
@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted one-process runs (two threads) that the resumed ones must equal."""
    base = tmp_path_factory.mktemp("references")
    done = {}
    for name, module, args in (("sparse", "aepar.sparse", SPARSE), ("greedy", "aepar.greedy", GREEDY),
                               ("sync", "aepar.sync", SYNC)):
        out = base / name
        r = cli(module, [*args, "--out", out], env={"AEPAR_THREADS": "2"})
        assert r.returncode == 0, r.stderr
        done[name] = out
    return done


def interrupt_and_resume(tmp_path, module, args, np_first, fault, np_then, env=None):
    out = tmp_path / "run"
    first = cli(module, [*args, "--out", out], np_first, env=dict(env or {}, AEPAR_FAULT=fault))
    assert first.returncode == 75, first.stdout + first.stderr
    lines = error_lines(first, module)
    assert any(f"{module}: stopped: checkpoint at" in l and f"--resume {out}" in l for l in lines), first.stderr
    assert marker(out)["state"] == "interrupted" and (out / "checkpoint.h5").is_file()
    then = cli(module, ["--resume", out, "--quiet"], np_then, env=env)
    assert then.returncode == 0, then.stdout + then.stderr
    assert marker(out)["state"] == "complete" and not (out / "checkpoint.h5").exists()
    return out


@pytest.mark.parametrize("np_first, fault, np_then", [(1, "0:40:sigterm", 1), (4, "1:40:sigusr1", 2)])
def test_sparse_resumes_to_the_same_bits(references, tmp_path, np_first, fault, np_then):
    out = interrupt_and_resume(tmp_path, "aepar.sparse", SPARSE, np_first, fault, np_then)
    assert_same_bits(references["sparse"], out)
    s = json.loads((out / "summary.json").read_text())
    assert s["exact_resume"] and s["resumed_from_iteration"] > 0


def test_sparse_with_aepar_lbfgs_resumes_on_other_ranks_to_one_process_bits(tmp_path):
    """--optimizer lbfgs (aepar's L-BFGS): interrupted on 2 ranks, resumed on 1, the weights
    of one uninterrupted process, bit for bit; its iterates are its own, not L-BFGS-B's."""
    args = [*SPARSE, "--optimizer", "lbfgs"]
    alone = tmp_path / "alone"
    r = cli("aepar.sparse", [*args, "--out", alone])
    assert r.returncode == 0, r.stderr
    out = interrupt_and_resume(tmp_path, "aepar.sparse", args, 2, "1:40:sigterm", 1)
    assert_same_bits(alone, out)
    s = json.loads((out / "summary.json").read_text())
    assert s["optimizer"] == "lbfgs" and s["exact_resume"] and s["resumed_from_iteration"] > 0
    assert s["iterations"] == 120 and s["optimizer_message"] == "STOP: iterations"  # L-BFGS-B says "STOP (504)"


def test_sparse_without_scipys_private_driver_restarts_its_memory(references, tmp_path):
    """Where L-BFGS-B's memory cannot be saved (a scipy without the setulb interface aepar
    drives) the resumed run restarts it from the saved θ: it says so, completes its
    iterations and never ends above the cost it was interrupted at. (Its path then differs
    from an uninterrupted run's: 0.3-2.3% apart in the final cost here; README, Reliability.)"""
    from aepar import checkpoint

    env = {"AEPAR_LBFGS_PUBLIC": "1", "AEPAR_FAULT": "0:60:sigterm"}
    out = tmp_path / "run"
    first = cli("aepar.sparse", [*SPARSE, "--out", out], env=env)
    assert first.returncode == 75, first.stderr
    saved = checkpoint.load(out / "checkpoint.h5").opt_state
    assert int(saved["exact"]) == 0 and int(saved["counts"][0]) > 0
    then = cli("aepar.sparse", ["--resume", out, "--quiet"], env={"AEPAR_LBFGS_PUBLIC": "1"})
    assert then.returncode == 0, then.stderr
    got = json.loads((out / "summary.json").read_text())
    assert not got["exact_resume"] and got["iterations"] == 120
    assert got["final_cost"] <= float(saved["f"])
    want = json.loads((references["sparse"] / "summary.json").read_text())["final_cost"]
    assert abs(got["final_cost"] - want) <= 0.05 * want, (got["final_cost"], want)


@pytest.mark.parametrize("np_first, fault, np_then", [(2, "1:40:sigusr1", 1), (4, "1:115:sigterm", 2)])
def test_greedy_and_its_fine_tuning_resume_to_the_same_bits(references, tmp_path, np_first, fault, np_then):
    # 12 steps an epoch, 3 epochs a layer: step 40 is in layer 2, step 115 in fine-tuning, which runs on
    # one rank per core (rank 1 is one of them on 2 cores; ranks 2 and 3 wait)
    out = interrupt_and_resume(tmp_path, "aepar.greedy", GREEDY, np_first, fault, np_then)
    assert_same_bits(references["greedy"], out)


@pytest.mark.parametrize("np_first, fault, np_then", [(4, "3:12:sigterm", 2), (2, "0:30:sigint", 4)])
def test_sync_resumes_mid_pipeline_to_the_same_bits(references, tmp_path, np_first, fault, np_then):
    out = interrupt_and_resume(tmp_path, "aepar.sync", SYNC, np_first, fault, np_then)
    assert_same_bits(references["sync"], out)


def test_sync_stopped_by_the_launchers_sigusr1_resumes_to_the_same_bits(references, tmp_path):
    """mpirun forwards SIGUSR1 to every rank (SLURM: --signal=B:USR1@120)."""
    out = tmp_path / "run"
    launcher = mpirun_cmd()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", AEPAR_THREADS="1")
    args = [a for a in SYNC if a != "--quiet"]
    proc = subprocess.Popen(launcher + ["-np", "4", sys.executable, "-m", "aepar.sync", *args, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    for line in proc.stdout:
        if line.split("] ", 1)[-1].startswith("sync  L1") and " epoch   2 " in line:
            proc.send_signal(signal.SIGUSR1)
            break
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    then = cli("aepar.sync", ["--resume", out, "--quiet"], 4)
    assert then.returncode == 0, then.stderr
    assert_same_bits(references["sync"], out)
    rows = assert_describes_itself(out, None, figures=False)  # every stage's epochs once, across the resume
    ran = json.loads((out / "summary.json").read_text())["pretrain"]["epochs"]
    assert sorted((int(r["stage"]), int(r["epoch"])) for r in rows if r["phase"] == "pretrain") == sorted(
        (e["stage"] + 1, e["epoch"] + 1) for e in ran)


def test_a_run_interrupted_twice_resumes_twice_to_the_same_bits(references, tmp_path):
    """The second resume reads the run's own options from run.json, not the first resume's."""
    out = tmp_path / "run"
    first = cli("aepar.greedy", [*GREEDY, "--out", out], 2, env={"AEPAR_FAULT": "0:20:sigterm"})
    assert first.returncode == 75, first.stderr
    second = cli("aepar.greedy", ["--resume", out, "--quiet"], 2, env={"AEPAR_FAULT": "1:30:sigusr1"})
    assert second.returncode == 75, second.stderr
    assert marker(out)["argv"][:2] == GREEDY[:2]
    third = cli("aepar.greedy", ["--resume", out, "--quiet"], 1)
    assert third.returncode == 0, third.stderr
    assert_same_bits(references["greedy"], out)
    states = [h["state"] for h in marker(out)["history"]]
    assert states.count("interrupted") == 2 and states[-1] == "complete"
    # metrics.csv went on through both resumes: every epoch once, in order, elapsed_s growing
    rows = assert_describes_itself(out, None, figures=False)
    assert [(r["phase"], r["stage"], r["epoch"]) for r in rows] == (
        [("pretrain", str(l), str(e)) for l in (1, 2, 3) for e in (1, 2, 3)] + [("finetune", "", "1"), ("finetune", "", "2")])


def test_periodic_checkpoints_change_nothing(references, tmp_path):
    out = tmp_path / "run"
    r = cli("aepar.greedy", [*GREEDY, "--checkpoint-every", "1", "--out", out], 2)
    assert r.returncode == 0, r.stderr
    assert_same_bits(references["greedy"], out)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv", "profile.csv", "run.json", "summary.json",
                                                     "tables.md", "trace.json", "weights.h5"]


def test_fine_tuning_resumes_and_continues_a_fine_tuned_network(references, tmp_path):
    args = ["--weights", references["greedy"] / "weights.h5", "--dataset", "mnist5k", "--limit", "1200",
            "--finetune-epochs", "3", "--optimizer", "adam", "--loss", "xent", "--quiet"]
    whole = tmp_path / "whole"
    r = cli("aepar.finetune", [*args, "--out", whole])
    assert r.returncode == 0, r.stderr
    out = interrupt_and_resume(tmp_path, "aepar.finetune", args, 1, "0:20:sigint", 2)
    assert_same_bits(whole, out)


# ---- 4/5. faults under mpirun -np 4 --------------------------------------------------------------------
FAULT_RUNS = {
    "sparse": ("aepar.sparse", ["--limit", "2000", "--iterations", "200", "--quiet"]),
    "greedy": ("aepar.greedy", ["--dataset", "mnist5k", "--layers", "784-64-8", "--epochs", "3",
                                "--finetune-epochs", "1", "--limit", "800", "--quiet"]),
    "finetune": ("aepar.finetune", ["--dataset", "mnist5k", "--limit", "800", "--finetune-epochs", "3", "--quiet"]),
    "sync": ("aepar.sync", ["--dataset", "mnist5k", "--layers", "784-64-32-16-8", "--epochs", "3", "--extra",
                            "0,1,1,1", "--limit", "800", "--finetune-epochs", "1", "--no-plot", "--quiet"]),
}
EXPECT = {"raise": (1, "rank 2/4: internal error"), "kill": (None, "AEPAR_FAULT: kill on rank 2"),
          "nan": (3, "diverged:"), "stall": (124, "rank 2 stalled: no progress for")}


@pytest.fixture(scope="module")
def stack(references):
    return references["greedy"] / "weights.h5"


# every fault in the stacked and the pipeline programs; in the others the two whose handling
# is their own loop's (the divergence named in its words, the watchdog's heartbeat): an
# exception or a killed rank ends every program through the same abort of aepar.comm
FAULTS = [(scheme, kind) for scheme in FAULT_RUNS for kind in EXPECT
          if scheme in ("greedy", "sync") or kind in ("nan", "stall")]


@pytest.mark.parametrize("scheme, kind", FAULTS)
def test_a_fault_ends_the_job_in_time_naming_the_rank_with_nothing_half_written(stack, tmp_path, scheme, kind):
    module, args = FAULT_RUNS[scheme]
    if scheme == "finetune":
        args = ["--weights", stack, *args]
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = cli(module, [*args, "--timeout", "4", "--out", out], 4, env={"AEPAR_FAULT": f"2:5:{kind}"}, timeout=120)
    seconds = time.monotonic() - t0
    code, text = EXPECT[kind]
    assert r.returncode != 0 and (code is None or r.returncode == code), (r.returncode, r.stderr[-3000:])
    assert text in r.stderr, r.stderr[-3000:]
    if kind == "nan":
        named = [l for l in r.stderr.splitlines() if "diverged:" in l]
        where = {"sparse": "iteration", "greedy": "layer 1", "finetune": "fine-tuning epoch",
                 "sync": "layer"}[scheme]
        assert where in named[0] and "no checkpoint had been saved" in named[0], named
    assert seconds < (4 + 60 if kind == "stall" else 60), seconds
    assert not out.exists() and leftovers(tmp_path) == []  # no checkpoint was due: nothing at all


def test_divergence_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    module, args = FAULT_RUNS["greedy"]
    # 8 steps an epoch; step 20 is in layer 1's third epoch: its checkpoint after epoch 2 stays
    r = cli(module, [*args, "--checkpoint-every", "1", "--out", out], 2, env={"AEPAR_FAULT": "1:20:nan"})
    assert r.returncode == 3, r.stderr
    line = [l for l in error_lines(r, module) if "diverged" in l]
    assert len(line) == 1 and "layer 1 (784-64), epoch 3" in line[0], r.stderr
    assert f"the last good checkpoint (layer 1, 2 epochs done) stays in {out / 'checkpoint.h5'}" in line[0]
    assert marker(out)["state"] == "diverged" and (out / "checkpoint.h5").is_file()
    from aepar import checkpoint

    saved = checkpoint.load(out / "checkpoint.h5")
    assert all(np.isfinite(v).all() for v in saved.params.values())
    again = cli(module, ["--resume", out, "--quiet"], 1)  # the fault is gone: the run completes
    assert again.returncode == 0, again.stderr


def test_a_huge_learning_rate_stops_with_exit_3_naming_the_layer(tmp_path):
    out = tmp_path / "run"
    r = cli("aepar.greedy", ["--dataset", "mnist5k", "--layers", "784-64-8", "--epochs", "3", "--limit", "500",
                             "--lr", "1e6", "--quiet", "--out", out])
    assert r.returncode == 3, r.stderr
    lines = error_lines(r, "aepar.greedy")
    assert len(lines) == 1 and "diverged: greedy pre-training, layer 1 (784-64), epoch" in lines[0], r.stderr
    assert not out.exists()


def test_a_stalled_rank_of_the_model_scheme_is_caught_by_the_watchdog(tmp_path):
    """Model parallelism's slots were trained with the watchdog unarmed: a stalled rank hung
    the job (found by bench.chaos)."""
    args = ["--scheme", "model", "--layer-group", "2", "--dataset", "mnist5k", "--layers", "784-32-16", "--epochs", "6",
            "--finetune-epochs", "1", "--limit", "800", "--quiet", "--timeout", "4", "--out", tmp_path / "run"]
    r = cli("aepar.pretrain", args, 2, env={"AEPAR_FAULT": "1:10:stall"}, timeout=120)
    assert r.returncode == 124, (r.returncode, r.stderr[-3000:])
    assert "rank 1 stalled: no progress for" in r.stderr and "model-parallel pre-training" in r.stderr, r.stderr[-3000:]


MODEL = ["--scheme", "model", "--dataset", "mnist5k", "--layers", "784-32-16-8", "--epochs", "4",
         "--finetune-epochs", "1", "--limit", "800", "--quiet"]


def test_model_resumed_on_fewer_ranks_keeps_its_group_and_its_bits(tmp_path):
    """Without --layer-group, model's group is the ranks it started on; a resume on another count
    keeps that group (it had taken the new count and ended with other weights)."""
    whole = tmp_path / "whole"
    assert cli("aepar.pretrain", [*MODEL, "--out", whole], 3).returncode == 0
    out = interrupt_and_resume(tmp_path, "aepar.pretrain", MODEL, 3, "0:14:sigusr1", 1)
    assert_same_bits(whole, out)


def test_data_resumes_only_on_the_rank_count_it_started_on(tmp_path):
    args = ["--scheme", "data", "--dataset", "mnist5k", "--layers", "784-32-8", "--epochs", "3",
            "--finetune-epochs", "1", "--limit", "800", "--quiet"]
    out = tmp_path / "run"
    assert cli("aepar.pretrain", [*args, "--out", out], 2, env={"AEPAR_FAULT": "0:12:sigusr1"}).returncode == 75
    refused = cli("aepar.pretrain", ["--resume", out, "--quiet"], 1)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert error_lines(refused, "aepar.pretrain") == [
        f"aepar.pretrain: error: --resume {out}: --scheme data gives the same result only on the rank count it "
        "started on (2 ranks, not 1): resume with mpirun -np 2"]
    assert cli("aepar.pretrain", ["--resume", out, "--quiet"], 2).returncode == 0
