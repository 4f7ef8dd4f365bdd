"""bench/chaos.py without running a scheme: the draws of faults, steps and rank counts are a
function of the seed and stay within what each scheme allows, and the verdict fails on a
planted wrong behaviour (an interruption that exits 1, one element of the weights
different, a run that cannot be resumed)."""
import json
import os
import socket

import numpy as np
import pytest

from aepar import checkpoint
from bench import chaos
from bench.chaos import SCHEMES, Draw, Result, allowed_ranks, judge, plan, step_window, verdict


def _arg(scheme, name, default=None):
    args = list(scheme.args)
    return args[args.index(name) + 1] if name in args else default


def test_the_draws_are_a_function_of_the_seed():
    for name in SCHEMES:
        assert plan(name, 7, 5, 4) == plan(name, 7, 5, 4)
        assert plan(name, 7, 5, 4) != plan(name, 8, 5, 4)
    # another scheme's chain draws differently from the same seed
    assert [d.step for d in plan("greedy", 7, 5, 4)] != [d.step for d in plan("eager", 7, 5, 4)]


@pytest.mark.parametrize("max_ranks", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_draws_stay_within_the_scheme(name, max_ranks):
    scheme = SCHEMES[name]
    counts = allowed_ranks(scheme, max_ranks)
    lo, hi = scheme.ranks
    assert counts and all(lo <= c <= hi for c in counts) and (max(counts) <= max_ranks or counts == [lo])
    draws = plan(name, 3, 5, max_ranks)
    assert len(draws) == 3 * 5 + 1
    for d in draws:
        assert d.ranks in counts and 0 <= d.rank < d.ranks and d.kind in chaos.FAULTS
        first, last = step_window(scheme, d.kind, 5)
        assert 1 <= first <= d.step <= last
        if d.kind in ("kill", "stall"):
            assert d.checkpoint_every == 1 and d.step > scheme.gap
    # the faults of a whole chain stay inside the shortest run
    assert 5 * step_window(scheme, "sigusr1", 5)[1] < scheme.steps
    if max_ranks >= 4 and hi >= 4:
        assert {d.ranks for d in plan(name, 3, 5, max_ranks, attempts=60)} == set(counts)


def test_rank_limits_follow_each_scheme_options():
    # the stacked schemes: every rank needs one of the --reduce-blocks (default 8)
    assert SCHEMES["greedy"].ranks == (1, int(_arg(SCHEMES["greedy"], "--reduce-blocks", 8)))
    assert SCHEMES["eager"].ranks == (1, int(_arg(SCHEMES["eager"], "--reduce-blocks")))
    # sparse: blocks of 128 patches
    assert SCHEMES["sparse"].ranks == (1, -(-int(_arg(SCHEMES["sparse"], "--limit")) // 128))
    # model and sync: at most a rank per layer; model's group pinned to the layers
    for name in ("model", "sync"):
        layers = len(_arg(SCHEMES[name], "--layers").split("-")) - 1
        assert SCHEMES[name].ranks == (1, layers)
    assert int(_arg(SCHEMES["model"], "--layer-group")) == SCHEMES["model"].ranks[1]
    # data: each rank is a block of its Allreduce, so only the reference's count
    assert SCHEMES["data"].ranks == (SCHEMES["data"].reference_ranks,) * 2
    assert allowed_ranks(SCHEMES["data"], 1) == [2]


RUN = {"state": "interrupted", "checkpoint": {"progress": "layer 1 epoch 2 batch 3", "saved": "t1"}}
BEFORE = {"state": "interrupted", "checkpoint": {"progress": "layer 1 epoch 1 batch 2", "saved": "t0"}}


@pytest.mark.parametrize("kind, code", [("sigusr1", 75), ("sigterm", 75), ("kill", 137), ("kill", -9),
                                        ("stall", 124)])
def test_an_interruption_with_its_documented_exit_counts(kind, code):
    after = dict(RUN, state="interrupted" if kind.startswith("sig") else "running")
    assert judge(kind, True, code, BEFORE, after, True, None) == (True, True, "interrupted at layer 1 epoch 2 batch 3")


@pytest.mark.parametrize("kind, fired, code, after, resumed, why, fragment", [
    ("sigterm", True, 1, RUN, True, None, "exit 1, not 75"),
    ("sigusr1", True, 0, RUN, True, None, "exit 0, not 75"),
    ("stall", True, 1, RUN, True, None, "exit 1, not 124"),
    ("kill", True, 75, RUN, True, None, "exit 75, not 137 or -9"),
    ("sigterm", True, 75, RUN, True, "no checkpoint.h5", "not resumable: no checkpoint.h5"),
    ("sigterm", True, 75, dict(RUN, state="failed"), True, None, "not 'interrupted'"),
    ("sigterm", False, 2, RUN, True, None, "--resume refused or failed before the fault: exit 2"),
    ("kill", True, 137, None, True, "no run.json", "not resumable: no run.json"),
    ("stall", True, "hang", RUN, True, None, "no exit within"),
    ("sigterm", True, 1, dict(RUN, state="complete"), True, None, "complete, but exit 1"),
])
def test_a_wrong_interruption_is_not_survived(kind, fired, code, after, resumed, why, fragment):
    survived, counted, outcome = judge(kind, fired, code, BEFORE, after, resumed, why)
    assert not survived and not counted and fragment in outcome


def test_interruptions_that_moved_no_checkpoint_are_survived_but_not_counted():
    assert judge("kill", True, 137, RUN, RUN, True, None)[:2] == (True, False)
    assert judge("kill", True, 137, None, None, False, "no run.json") == (
        True, False, "ended before the first checkpoint: started again")
    assert judge("sigterm", False, 0, BEFORE, dict(RUN, state="complete"), True, None) == (True, False, "completed")


def _weights(directory, params, name="weights.h5"):
    directory.mkdir(exist_ok=True)
    checkpoint.save(directory / name, scheme="greedy", params=params)
    return directory


def _result(rows, diffs, state="complete"):
    return Result("greedy", 0, [1, 2], rows=rows, final_state=state, diffs=diffs)


def _row(index, survived=True, counted=True, fault="sigterm", code=75):
    return {"index": index, "fault": fault, "ranks": 2, "fired": True, "counted": counted, "survived": survived,
            "outcome": "planted", "command": "python -m aepar.greedy", "exit": code}


def test_one_element_of_the_weights_different_fails_the_verdict(tmp_path):
    rng = np.random.default_rng(0)
    params = {"layer1/W": rng.standard_normal((6, 4)).astype(np.float32), "layer1/bh": np.zeros(4, np.float32)}
    ref = _weights(tmp_path / "ref", params)
    same = _weights(tmp_path / "same", {k: v.copy() for k, v in params.items()})
    planted = {k: v.copy() for k, v in params.items()}
    planted["layer1/W"][2, 3] = np.nextafter(planted["layer1/W"][2, 3], np.float32(np.inf))
    other = _weights(tmp_path / "other", planted)
    assert chaos.differences(ref, same) == []
    assert chaos.differences(ref, other) == ["weights.h5: layer1/W differs"]
    rows = [_row(i) for i in range(1, 6)]
    assert verdict(_result(rows, chaos.differences(ref, same))) == []
    problems = verdict(_result(rows, chaos.differences(ref, other)))
    assert len(problems) == 1 and "layer1/W differs" in problems[0]
    # eager's snapshots: every weight file of the reference is compared, a missing one too
    _weights(ref, params, "model0_epoch001.h5")
    assert chaos.differences(ref, same) == ["model0_epoch001.h5: missing"]
    assert chaos.differences(tmp_path / "empty", same) == [f"no weight files in {tmp_path / 'empty'}"]


def test_the_verdict_fails_on_an_interruption_that_exits_1():
    survived, counted, outcome = judge("sigterm", True, 1, BEFORE, RUN, True, None)
    rows = [_row(1), _row(2), dict(_row(3, survived, counted, code=1), outcome=outcome)]
    r = _result(rows, [])
    problems = verdict(r)
    assert len(problems) == 1 and "process 3 (sigterm, 2 ranks): exit 1, not 75" in problems[0]
    assert (r.survived, r.attempted) == (2, 3)
    assert verdict(_result(rows[:2], [])) == []


def test_the_verdict_fails_on_a_run_that_did_not_complete_or_was_not_compared():
    assert any("did not complete" in p for p in verdict(_result([_row(1)], None, state="interrupted")))
    assert verdict(_result([_row(1)], None)) == ["final weights not compared"]
    assert any("reference run failed" in p for p in verdict(Result("greedy", 0, [1], reference_exit=1)))


def test_resumable_follows_the_run_directory_rules(tmp_path):
    def planted(**info):
        d = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        with_checkpoint = info.pop("with_checkpoint", True)
        marker = {"format": "aepar-run", "state": "interrupted", "checkpoint": {"progress": "p"},
                  "host": socket.gethostname(), "pid": 2 ** 22 + 1, **info}
        (d / "run.json").write_text(json.dumps(marker))
        if with_checkpoint:
            (d / "checkpoint.h5").write_bytes(b"")
        return d, chaos.read_run(d)

    assert chaos.not_resumable(*planted()) is None
    assert chaos.not_resumable(*planted(state="running")) is None  # a killed run: its process is gone
    assert "alive" in chaos.not_resumable(*planted(state="running", pid=os.getpid()))
    assert chaos.not_resumable(*planted(state="complete")) == "complete"
    assert chaos.not_resumable(*planted(checkpoint=None)) == "no checkpoint.h5"
    assert chaos.not_resumable(*planted(with_checkpoint=False)) == "no checkpoint.h5"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "run.json").write_text("{}")
    assert "not an aepar run marker" in chaos.not_resumable(foreign, chaos.read_run(foreign))
    assert chaos.not_resumable(tmp_path / "none", chaos.read_run(tmp_path / "none")) == "no run.json"


def test_a_draw_names_its_fault_as_aepar_fault_reads_it():
    from aepar.guard import Fault

    d = Draw(ranks=3, kind="stall", rank=2, step=14, checkpoint_every=1)
    assert Fault.parse(d.fault) == [Fault(2, 14, "stall")]
    assert chaos.fault_fired("aepar.greedy: AEPAR_FAULT: stall on rank 2, step 14 (pre-training layer 1) at t=1.0", d)
    assert not chaos.fault_fired("aepar.greedy: AEPAR_FAULT: stall on rank 2, step 140 (x) at t=1.0", d)
