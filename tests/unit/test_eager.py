"""The eager scheme's pure parts: stopping rules, picking snapshots, voting, groups."""
import argparse

import numpy as np
from hypothesis import given, settings, strategies as st

from aepar.schemes.eager import pick_epoch, saved_states, stop_reason
from aepar.tasks.combine import _vote
from aepar.parallel.ensemble import group_ranks, models_of


def _record(val, seconds=1.0):
    return {"epochs": [{"epoch": i + 1, "val_loss": v, "cum_s": seconds * (i + 1)} for i, v in enumerate(val)],
            "stopped": None}


def test_stops_after_the_epochs():
    assert stop_reason(_record([5, 4]), epochs=3) is None
    assert stop_reason(_record([5, 4, 3]), epochs=3) == "3 epochs"


def test_eager_rule_stops_well_before_the_minimum():
    # 10% better over the last 2 epochs is not the 20% asked for
    assert stop_reason(_record([100, 95, 90]), epochs=10, rule=(2, 0.2)).startswith("eager rule")
    assert stop_reason(_record([100, 80, 60]), epochs=10, rule=(2, 0.2)) is None
    assert stop_reason(_record([100, 99]), epochs=10, rule=(2, 0.2)) is None  # not k epochs yet


def test_patience_waits_for_a_new_best():
    assert stop_reason(_record([10, 8, 9, 8.5]), epochs=20, patience=2).startswith("no new best")
    assert stop_reason(_record([10, 8, 9, 7]), epochs=20, patience=2) is None


def test_budget_counts_training_seconds():
    assert stop_reason(_record([3, 2], seconds=5.0), epochs=10, budget=9.0).startswith("budget")
    assert stop_reason(_record([3, 2], seconds=4.0), epochs=10, budget=9.0) is None


def _args(**kw):
    return argparse.Namespace(**{"pick_epoch": None, "pick_by_budget": None, **kw})


def test_pick_last_epoch_or_budget():
    r = _record([5, 4, 3, 2], seconds=2.0)
    assert pick_epoch(r, _args()) == 4
    assert pick_epoch(r, _args(pick_epoch=2)) == 2
    assert pick_epoch(_record([5]), _args(pick_epoch=3)) == 1  # stopped earlier: its last
    assert pick_epoch(r, _args(pick_by_budget=5.0)) == 2
    assert pick_epoch(r, _args(pick_by_budget=0.5)) == 1


def test_a_checkpoint_of_an_older_aepar_resumes_with_todays_names():
    # its epoch records name their times "seconds" and "cum_seconds"
    old = {"epochs": [{"epoch": 1, "train_loss": 2.0, "val_loss": 1.5, "seconds": 3.0, "cum_seconds": 3.0}],
           "stopped": None}
    record = saved_states(({"model0/params/W": np.zeros(2)}, {}, {"records": {"model0": old}}))["model0"]["record"]
    assert record["epochs"] == [{"epoch": 1, "train_loss": 2.0, "val_loss": 1.5, "epoch_s": 3.0, "cum_s": 3.0}]
    assert stop_reason(record, epochs=10, budget=3.0).startswith("budget")


def test_vote_majority_and_ties_by_probability():
    labels = np.array([0, 1])
    a = np.log(np.array([[0.9, 0.1], [0.6, 0.4]]))
    b = np.log(np.array([[0.2, 0.8], [0.45, 0.55]]))
    c = np.log(np.array([[0.7, 0.3], [0.4, 0.6]]))
    assert _vote([a, b, c], labels) == 1.0           # 2 of 3 each time
    assert _vote([a, b], labels) == 0.5              # ties: 0.55 < 0.6 mean prob picks class 0 for row 1


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(1, 16), st.data())
def test_groups_cover_ranks_and_models(n_ranks, n_models, data):
    n_groups = data.draw(st.integers(1, min(n_ranks, n_models)))
    groups = group_ranks(n_ranks, n_groups)
    assert [r for g in groups for r in g] == list(range(n_ranks))
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    owned = sorted(m for g in range(n_groups) for m in models_of(g, n_models, n_groups))
    assert owned == list(range(n_models))
    counts = [len(models_of(g, n_models, n_groups)) for g in range(n_groups)]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1


def test_eager_on_a_gpu_in_blocks_prints_no_hint_to_drop_them(monkeypatch, capsys):
    """The CAEs train as fast in 8 blocks as in one on a GPU (bench/results/gpu/gpu_epoch.csv),
    so eager does not tell a GPU user to give up the blocks' same bits for speed."""
    from types import SimpleNamespace

    import aepar.eager as eager

    split = SimpleNamespace(train_y=list(range(80)), val_y=[0], test_y=[0], source="test")
    monkeypatch.setattr(eager.backend, "select", lambda *a: SimpleNamespace(device="gpu"))
    monkeypatch.setattr(eager, "load_split", lambda args, images: split)
    args = SimpleNamespace(device="gpu", kernels="cupy", dtype="float32", rank_groups=0, models=4,
                           reduce_blocks=8, quiet=False)
    eager._setup(args, SimpleNamespace(size=1, is_root=True))
    assert "--reduce-blocks 1" not in capsys.readouterr().out
