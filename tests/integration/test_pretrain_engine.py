"""``python -m aepar.pretrain --scheme S`` at 1, 2 and 4 ranks: what holds for each scheme at
every size, checked on the weights it writes; its checkpoints and bad input.

- greedy: the same weights on any number of ranks (the fixed tree).
- data: one block per rank and an Allreduce: on P ranks it equals greedy in one process with
  --reduce-blocks P (the same blocks and random streams; sums of two are exact either way, so
  bit for bit at 2 ranks, to rounding at 4).
- model: on P ranks it equals one process with --layer-group P, bit for bit; --layer-group 1 is greedy
  (on one block, as model trains a layer on one rank).
- sync: the planned schedule gives the same weights on 1 and 2 ranks (3 layers).
- hybrid: replicas on 4 ranks give sync's weights bit for bit (a stage's replicas add its fixed
  blocks in the fixed tree, as one process does).
- auto: runs what the planner predicts fastest, never slower than data.
"""
import json

import numpy as np
import pytest

from tests.integration.test_reliability import assert_same_bits, cli, weights
from tests.integration.run_json import assert_run_json

pytestmark = pytest.mark.mpi

BASE = ["--dataset", "mnist5k", "--layers", "784-48-24-8", "--epochs", "3", "--limit", "600",
        "--finetune-epochs", "1", "--quiet"]
SYNC_EXTRA = ["--extra", "0,1,2", "--no-plot"]


def run(tmp_path, name, scheme, np_=1, extra=(), env=None, expect=0):
    out = tmp_path / name
    r = cli("aepar.pretrain", ["--scheme", scheme, *BASE, *extra, "--out", out], np_=np_, env=env)
    assert r.returncode == expect, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def pretrained(run_dir):
    return {k: v for k, v in weights(run_dir).items() if k.startswith("layer")}


def close(a_dir, b_dir, rtol):
    """The pre-trained layers agree to ``rtol`` (0: bit for bit)."""
    a, b = pretrained(a_dir), pretrained(b_dir)
    assert set(a) == set(b) and a
    for k in a:
        if rtol == 0.0:
            assert np.array_equal(a[k], b[k]), k
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=rtol, err_msg=k)


def test_help_lists_the_six_schemes():
    r = cli("aepar.pretrain", ["--help"])
    assert r.returncode == 0
    for scheme in ("greedy", "data", "model", "sync", "hybrid", "auto"):
        assert f"  {scheme} " in r.stdout


@pytest.mark.parametrize("np_, batch", [(2, 100), (4, 100), (2, 400)])
def test_greedy_same_weights_on_any_number_of_ranks(tmp_path, np_, batch):
    """Also at a batch of 400: 8 blocks of 50 rows, which the AVX2 path's row kernels take
    (kernels.nb.rowprod.MAX_ROWS), a rank's blocks in one call."""
    one = run(tmp_path, "one", "greedy", 1, ["--batch", batch])
    many = run(tmp_path, "many", "greedy", np_, ["--batch", batch])
    assert_same_bits(one, many)
    s = json.loads((many / "summary.json").read_text())
    assert s["scheme"] == "greedy" and s["ranks"] == np_ and s["machine"]["cpu_model"]
    assert s["machine"]["mpi"] not in ("", "not used (one process)")  # the library the ranks ran on
    assert json.loads((one / "summary.json").read_text())["machine"]["mpi"] == "not used (one process)"


@pytest.mark.parametrize("np_, exact", [(1, True), (2, True), (4, False)])
def test_data_equals_greedy_on_the_same_blocks(tmp_path, np_, exact):
    data = run(tmp_path, "data", "data", np_)
    greedy = run(tmp_path, "greedy", "greedy", 1, ["--reduce-blocks", np_])
    # pre-training only: the greedy run also fine-tunes on its --reduce-blocks P
    close(data, greedy, 0.0 if exact else 1e-4)
    assert json.loads((data / "summary.json").read_text())["blocks"] == np_


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_model_equals_one_process_with_the_same_group(tmp_path, np_):
    ranks = run(tmp_path, "ranks", "model", np_)
    serial = run(tmp_path, "serial", "model", 1, ["--layer-group", np_])
    assert_same_bits(ranks, serial)
    s = json.loads((ranks / "summary.json").read_text())
    assert s["group"] == np_
    # no extra epochs: a group takes G - 1 + epochs slots
    assert len(s["pretrain"]["slots"]) == sum(min(3 - g, np_) - 1 + 3 for g in range(0, 3, np_))


def test_model_group_one_is_greedy(tmp_path):
    """model trains each layer's epochs on one rank as one block: greedy on one block."""
    close(run(tmp_path, "model", "model", 1, ["--layer-group", 1]),
          run(tmp_path, "greedy", "greedy", 1, ["--reduce-blocks", 1]), 0.0)


def test_sync_same_weights_on_one_and_two_ranks(tmp_path):
    assert_same_bits(run(tmp_path, "one", "sync", 1, SYNC_EXTRA), run(tmp_path, "two", "sync", 2, SYNC_EXTRA))


def test_hybrid_replicas_give_syncs_weights_bit_for_bit(tmp_path):
    hybrid = run(tmp_path, "hybrid", "hybrid", 4, SYNC_EXTRA)
    # the replicas sum fixed blocks in the fixed tree: the same additions in the same order as
    # one process, so every array (fine-tuned too) is the same bit for bit
    assert_same_bits(hybrid, run(tmp_path, "sync", "sync", 1, SYNC_EXTRA))
    s = json.loads((hybrid / "summary.json").read_text())
    assert s["scheme"] == "hybrid", s["scheme"]
    # replicas: some stage runs on more than one rank, and the layout line says so
    assert any(len(ranks) > 1 for ranks in s["layout"]["ranks"]), s["layout"]
    assert "ranks " in s["layout"]["text"], s["layout"]["text"]


@pytest.mark.parametrize("np_", [1, 2, 4])
def test_auto_never_picks_a_scheme_predicted_slower_than_data(tmp_path, np_):
    out = run(tmp_path, "auto", "auto", np_, SYNC_EXTRA)
    s = json.loads((out / "summary.json").read_text())
    auto = s["auto"]
    chosen = auto["predicted"][auto["chosen"]]["time_s"]
    assert s["scheme"] == auto["chosen"] and chosen is not None
    assert chosen <= auto["predicted"]["data"]["time_s"]
    assert "lower is better" in auto["table"]


@pytest.mark.parametrize("np_", [1, 2])
def test_classify_task_reports_accuracy(tmp_path, np_):
    out = run(tmp_path, "cls", "model" if np_ > 1 else "greedy", np_,
              ["--task", "classify", "--classify-epochs", "2"])
    s = json.loads((out / "summary.json").read_text())
    acc = s["accuracy"]["finetuned"]["test"]
    assert 0.0 <= acc <= 1.0 and s["task"] == "classify"
    assert_run_json(out, np_, task="classify", scheme="model" if np_ > 1 else "greedy")
    assert "higher is better" in (out / "tables.md").read_text()


@pytest.mark.parametrize("scheme, np_", [("model", 2), ("data", 2)])
def test_interrupted_scheme_resumes_to_the_same_weights(tmp_path, scheme, np_):
    whole = run(tmp_path, "whole", scheme, np_)
    part = run(tmp_path, "part", scheme, np_, env={"AEPAR_FAULT": "0:4:sigterm"}, expect=75)
    r = cli("aepar.pretrain", ["--resume", part], np_=np_)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert_same_bits(whole, part)


@pytest.mark.parametrize("scheme, np_, args, fragment", [
    ("model", 4, [], "one layer per rank"),
    ("sync", 4, [], "--scheme hybrid"),
    ("hybrid", 2, [], "more ranks than layers"),
    ("data", 2, ["--batch", "1"], "splits each batch"),
    ("greedy", 1, ["--preset", "15618-large"], "does not fit"),
])
def test_impossible_options_end_every_rank_with_one_line(tmp_path, scheme, np_, args, fragment):
    if scheme == "model":
        args = ["--layers", "784-48-24"]
    r = cli("aepar.pretrain", ["--scheme", scheme, *BASE, *args, "--out", tmp_path / "x"], np_=np_)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [l for l in r.stderr.splitlines() if fragment in l]
    assert lines, r.stderr
    assert not (tmp_path / "x").exists()
