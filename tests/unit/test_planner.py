"""aepar.parallel.planner: hand-computable makespans, the choice rule, the two input paths."""
import csv
import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aepar.parallel.planner import (SCHEMES, LayerCosts, allgather_s, allreduce_s, choose, data_parallel_s,
                                    format_table, greedy_dp_s, greedy_s, model_parallel_s, pipeline_s, predict,
                                    tree_sum_s, SPLIT)

FREE = dict(alpha=0.0, beta=math.inf)  # communication costs nothing
PROPS = settings(max_examples=200, deadline=None, derandomize=True, database=None)


def costs(epoch, transform=None, epochs=3, *, steps=10, nbytes=1e6, extras=None, **kw):
    n = len(epoch)
    return LayerCosts(epoch_s=epoch, transform_s=transform if transform is not None else [0.0] * n,
                      param_bytes=[nbytes] * n, steps_per_epoch=[steps] * n,
                      epochs=epochs if not isinstance(epochs, int) else [epochs] * n,
                      extras=extras or [0] * n, n_train=kw.pop("n_train", 1000), **kw)


# ---- communication model ---------------------------------------------------------------------
def test_collectives_by_hand():
    assert allreduce_s(1e6, 1) == tree_sum_s(1e6, 1) == allgather_s(1e6, 1) == 0.0
    # 4 ranks: 2 levels
    assert allreduce_s(1e6, 4, 1e-3, 1e9) == pytest.approx(2 * 2 * 1e-3 + 2 * 0.75 * 1e-3)
    assert tree_sum_s(1e6, 4, 1e-3, 1e9) == pytest.approx(2 * (1e-3 + 1e-3) + 2 * 1e-3 + 1.5 * 1e-3)
    assert allgather_s(1e6, 4, 1e-3, 1e9) == pytest.approx(2 * 1e-3 + 0.75 * 1e-3)
    # 3 ranks: the tree is ceil(log2 3) = 2 levels deep
    assert tree_sum_s(0.0, 3, 1.0, 1e9) == pytest.approx(4.0)


@pytest.mark.parametrize("ranks, blocks, halves", [(2, 8, True), (4, 8, True), (8, 8, True), (16, 16, True),
                                                    (4, 16, True), (3, 8, False), (2, 6, False), (4, 12, False),
                                                    (2, None, False)])
def test_the_tree_prices_halving_where_the_ranks_hold_a_node_each(ranks, blocks, halves):
    """aepar.parallel.blocks.TreeSum halves and doubles long vectors where a power-of-two
    number of ranks hold one node each of the blocks: then the tree costs an Allreduce."""
    long, short = 1e6, 1e3  # either side of blocks.HALVING_BYTES
    tree, old = tree_sum_s(long, ranks, blocks=blocks), tree_sum_s(long, ranks)
    assert (tree == pytest.approx(allreduce_s(long, ranks)) and tree < old) if halves else tree == old
    assert tree_sum_s(short, ranks, blocks=blocks) == tree_sum_s(short, ranks)  # latency: the tree


def test_greedy_costs_data_where_the_tree_halves():
    c = costs([2.0, 1.0], epochs=3, nbytes=4e6, batch=100, blocks=8)
    assert greedy_dp_s(c, 2) == pytest.approx(data_parallel_s(c, 2)) and greedy_dp_s(c, 3) > data_parallel_s(c, 3)


def test_epochs_measured_on_the_ranks_replace_the_division():
    """Where greedy's and data's layer epochs were measured on these ranks (sums included),
    their predictions are those epochs, split into the sums and the rest; on another rank
    count, or for the other schemes, the one-rank times as before."""
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=3, batch=100, blocks=8)
    m = dataclasses.replace(c, dp_ranks=2, dp_epoch_s={"greedy": (1.5, 0.8), "data": (1.2, 0.7)},
                            dp_reduction_s={"greedy": (0.3, 0.2), "data": (0.1, 0.1)})
    p = predict(m, 2, cores=2)
    assert p["greedy"]["seconds"] == pytest.approx(3 * (1.5 + 0.8) + 0.5 / 2)
    assert p["data"]["seconds"] == pytest.approx(3 * (1.2 + 0.7) + 0.5 / 2)
    assert p["greedy"]["split"]["reduction"] == pytest.approx(3 * 0.5)
    assert sum(p["greedy"]["split"].values()) == pytest.approx(p["greedy"]["seconds"])
    assert "measured on these ranks" in p["greedy"]["note"] and "measured on these ranks" in format_table(p)
    same = predict(c, 2, cores=2)
    assert p["model"] == same["model"] and p["sync"]["seconds"] == same["sync"]["seconds"]
    assert predict(m, 4, cores=4)["greedy"]["seconds"] == predict(c, 4, cores=4)["greedy"]["seconds"]
    assert "not measured" in format_table(same)


def _measured(ranks, epochs, sums, other="data"):
    return dict(dp_ranks=ranks, dp_epoch_s={"data": epochs}, dp_reduction_s={other: sums})


@pytest.mark.parametrize("bad", [dict(dp_ranks=2), _measured(1, (1.0, 1.0), (0.1, 0.1)), _measured(2, (1.0,), (0.1,)),
                                 _measured(2, (1.0, 1.0), (2.0, 0.1)), _measured(2, (1.0, 1.0), (0.1, 0.1), "greedy")])
def test_measured_epochs_are_checked(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(costs([2.0, 1.0]), **bad)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 64])
def test_the_tree_is_never_cheaper_than_allreduce(n):
    for m in (0.0, 1e3, 1e7):
        assert tree_sum_s(m, n) >= allreduce_s(m, n)


# ---- the schemes by hand ---------------------------------------------------------------------
def test_greedy_is_the_sum():
    c = costs([2.0, 1.0, 0.5], [0.3, 0.2, 0.1], epochs=[3, 2, 4])
    assert greedy_s(c) == pytest.approx(3 * 2.0 + 2 * 1.0 + 4 * 0.5 + 0.3 + 0.2)  # not the code layer's transform
    assert greedy_dp_s(c, 1) == pytest.approx(greedy_s(c)) == data_parallel_s(c, 1)
    assert greedy_s(c.with_epochs(1)) == pytest.approx(2.0 + 1.0 + 0.5 + 0.3 + 0.2)
    assert c.with_epochs([1, 2, 3]).epochs == (1, 2, 3) and c.epochs == (3, 2, 4)


@pytest.mark.parametrize("p", [2, 3, 4, 7])
def test_data_with_free_allreduce_is_greedy_over_p(p):
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=[3, 2])
    assert data_parallel_s(c, p, **FREE) == pytest.approx(greedy_s(c) / p)
    assert greedy_dp_s(c, p, **FREE) == pytest.approx(greedy_s(c) / p)


def test_data_adds_one_allreduce_per_step():
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=[3, 2], steps=10, nbytes=4e6)
    comm = (3 + 2) * 10 * allreduce_s(4e6, 4, 1e-3, 1e9)
    assert data_parallel_s(c, 4, 1e-3, 1e9) == pytest.approx(greedy_s(c) / 4 + comm)
    tree = (3 + 2) * 10 * tree_sum_s(4e6, 4, 1e-3, 1e9)
    assert greedy_dp_s(c, 4, 1e-3, 1e9) == pytest.approx(greedy_s(c) / 4 + tree)


@pytest.mark.parametrize("epochs", [1, 2, 5, 10])
def test_two_equal_layers_on_two_ranks_take_one_plus_e_slots(epochs):
    c = costs([1.0, 1.0], epochs=epochs)
    m = model_parallel_s(c, 2, **FREE)
    assert m["seconds"] == pytest.approx(1 + epochs)  # not 2 E
    assert greedy_s(c) == pytest.approx(2 * epochs)
    assert m["slots"] == [1 + epochs] and m["group"] == 2


def test_model_charges_the_refresh_of_the_changed_layer_below():
    e, t, E = 1.0, 0.25, 4
    c = costs([e, e], [t, t], epochs=E)
    # slot 0: layer 1 alone; slots 1..E: layer 2 recomputes its input (layer 1 changed) and trains
    assert model_parallel_s(c, 2, **FREE)["seconds"] == pytest.approx(e + E * (e + t))


def test_model_exchanges_the_weights_every_slot():
    c = costs([1.0, 1.0], epochs=3, nbytes=2e6)
    m = model_parallel_s(c, 2, alpha=1e-3, beta=1e9)
    exchange = [allgather_s(2e6, 2, 1e-3, 1e9), *[allgather_s(4e6, 2, 1e-3, 1e9)] * 2, allgather_s(2e6, 2, 1e-3, 1e9)]
    assert m["comm_s"] == pytest.approx(sum(exchange))
    assert m["seconds"] == pytest.approx(4.0 + sum(exchange))


def test_groups_when_layers_outnumber_ranks():
    e, t, E = 1.0, 0.25, 3
    one_group = e + E * (e + t)
    c = costs([e] * 4, [t] * 4, epochs=E)
    m = model_parallel_s(c, 2, **FREE)
    assert m["group"] == 2 and m["slots"] == [1 + E, 1 + E]
    # group 2 starts on group 1's output: every rank passes the rows through layers 1 and 2 once
    assert m["seconds"] == pytest.approx(2 * one_group + 2 * t)
    c3 = costs([e] * 3, [t] * 3, epochs=E)
    m3 = model_parallel_s(c3, 2, **FREE)
    assert m3["slots"] == [1 + E, E] and m3["seconds"] == pytest.approx(one_group + 2 * t + E * e)


def test_model_slot_lasts_as_long_as_the_slowest_rank():
    c = costs([3.0, 1.0], [0.5, 0.0], epochs=2)
    # slot 0: layer 1 (3); slot 1: max(layer 1: 3, layer 2: 0.5 + 1); slot 2: layer 2: 0.5 + 1
    assert model_parallel_s(c, 2, **FREE)["seconds"] == pytest.approx(3 + 3 + 1.5)


def test_sync_with_more_ranks_than_layers_leaves_them_idle():
    c = costs([2.0, 1.0, 0.5], [0.2, 0.1, 0.0], epochs=3, extras=[0, 1, 2], batch=100)
    three = pipeline_s(c, 3, replicas=False, **FREE)
    assert pipeline_s(c, 8, replicas=False, **FREE)["seconds"] == three["seconds"]
    assert pipeline_s(c, 8, replicas=True, **FREE)["seconds"] < three["seconds"]
    assert pipeline_s(c, 1, replicas=False, **FREE)["layout"] == "layers 1-3: rank 0"


# ---- predict ---------------------------------------------------------------------------------
def test_predict_names_every_scheme_and_says_why_one_cannot_run():
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=3, batch=100)
    for p in (1, 2):
        pred = predict(c, p)
        assert tuple(pred) == SCHEMES
        assert pred["hybrid"]["seconds"] is None and "more ranks than layers" in pred["hybrid"]["note"]
    assert predict(c, 1)["model"]["seconds"] is None
    assert predict(c, 2)["model"]["seconds"] is not None
    assert predict(c, 3)["hybrid"]["seconds"] is not None
    assert predict(c, 1)["greedy"]["ratio"] == pytest.approx(1.0)


def test_predict_refuses_what_the_data_cannot_feed():
    c = costs([2.0, 1.0], epochs=3, batch=4, blocks=8)
    pred = predict(c, 6)
    assert pred["data"]["seconds"] is None and "batch 4" in pred["data"]["note"]
    assert pred["greedy"]["seconds"] is None
    # greedy's fixed blocks limit its ranks; data cuts one block per rank
    wide = predict(costs([2.0, 1.0], epochs=3, batch=100, blocks=8), 16)
    assert "blocks" in wide["greedy"]["note"] and wide["data"]["seconds"] is not None
    assert choose(pred) not in ("data", "greedy")


def test_oversubscribed_cores_slow_compute_and_say_so():
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=3)
    pred = predict(c, 4, cores=2, **FREE)
    assert pred["data"]["seconds"] == pytest.approx(greedy_s(c) / 2)
    assert "oversubscribed" in pred["data"]["note"]
    assert "oversubscribed" not in predict(c, 2, cores=2)["data"]["note"]
    # model uses 2 ranks of the 4: they have a core each
    assert pred["model"]["seconds"] == pytest.approx(predict(c, 4, **FREE)["model"]["seconds"])
    # 2 ranks on 1 core: each slot's work shared (layer 1 trains while layer 2 refreshes its
    # input through layer 1, 0.5 s, and trains, 1.0 s): 2 + 3.5 + 3.5 + 1.5 s, where a core
    # each takes 2 + 2 + 2 + 1.5 s, not twice that
    assert predict(c, 2, **FREE)["model"]["seconds"] == pytest.approx(7.5)
    one_core = predict(c, 2, cores=1, **FREE)["model"]
    assert one_core["seconds"] == pytest.approx(10.5)
    assert sum(one_core["split"].values()) == pytest.approx(10.5)


def test_sync_on_shared_cores_lasts_its_ranks_work_not_the_dedicated_run_times_ranks_per_core():
    """sync's 2 ranks on 1 core: the core runs whichever stage can run, and a rank waiting
    for its input sleeps, so the run lasts both ranks' work (epochs and hand-overs), less
    than the run on a core each slowed twice (its waits slept through, not stretched)."""
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=3)
    own = pipeline_s(c, 2, replicas=False, mode="data", **FREE)
    one_core = pipeline_s(c, 2, replicas=False, mode="data", cores=1, **FREE)
    assert one_core["seconds"] == pytest.approx(sum(own["busy"]))
    assert own["seconds"] < one_core["seconds"] < 2 * own["seconds"]
    assert predict(c, 2, cores=1, **FREE)["sync"]["seconds"] == pytest.approx(one_core["seconds"])
    # hybrid's replicas sum every step, waiting for each other's turns on the cores: every
    # rank busy, each cost slowed by ranks / cores
    tripled = dataclasses.replace(c, epoch_s=[3 * t for t in c.epoch_s], transform_s=[3 * t for t in c.transform_s])
    assert predict(c, 3, cores=1, **FREE)["hybrid"]["seconds"] == pytest.approx(
        pipeline_s(tripled, 3, replicas=True, mode="data", **FREE)["seconds"])


def test_sync_trains_the_rows_not_held_out_and_validates_the_rest_every_epoch():
    """sync and hybrid hold out 100 of the 1,000 rows the one-rank epochs were timed on:
    their stages train 900 rows (9 steps) and reconstruct the 100 every epoch, which is the
    same prediction as epochs timed on 900 rows with the reconstruction added; the other
    schemes keep every row."""
    held = costs([2.0, 1.0, 0.5], [0.2, 0.1, 0.0], epochs=3, extras=[0, 1, 2], batch=100, steps=10, held_out=100,
                 validation_s=[0.1, 0.05, 0.02])
    by_hand = costs([2.0 * 0.9 + 0.1, 1.0 * 0.9 + 0.05, 0.5 * 0.9 + 0.02], [0.2, 0.1, 0.0], epochs=3,
                    extras=[0, 1, 2], batch=100, steps=9)
    every_row = costs([2.0, 1.0, 0.5], [0.2, 0.1, 0.0], epochs=3, extras=[0, 1, 2], batch=100, steps=10)
    for ranks, replicas in ((1, False), (2, False), (3, False), (5, True), (8, True)):
        for cores in (None, 2):
            a, b = (pipeline_s(c, ranks, replicas=replicas, cores=cores) for c in (held, by_hand))
            assert (a["layout"], a["mode"], a["epochs"]) == (b["layout"], b["mode"], b["epochs"])
            assert a["seconds"] == pytest.approx(b["seconds"]) and a["busy"] == pytest.approx(b["busy"])
            assert a["split"] == pytest.approx(b["split"])
            assert a["seconds"] != pipeline_s(every_row, ranks, replicas=replicas, cores=cores)["seconds"]
    for scheme in ("greedy", "data", "model"):
        assert predict(held, 4)[scheme] == predict(every_row, 4)[scheme]


def test_the_schemes_that_train_in_the_fixed_blocks_are_priced_with_the_blocked_epochs():
    """greedy and sync's and hybrid's stages train the rows in the fixed blocks: their
    predictions are those of costs whose one-block epochs were the blocked ones; model, and
    data on one rank, train one block; greedy measured on the ranks keeps its measured
    epochs."""
    one, blocked = [2.0, 1.0, 0.5], [2.1, 1.2, 0.9]
    common = dict(transform=[0.2, 0.1, 0.0], epochs=3, extras=[0, 1, 2], batch=100, blocks=8, held_out=100,
                  validation_s=[0.1, 0.05, 0.02])
    both, as_blocked, as_one = (costs(one, blocked_epoch_s=blocked, **common), costs(blocked, **common),
                                costs(one, **common))
    assert both.blocked == tuple(blocked) and as_one.blocked == tuple(one)
    assert greedy_s(both) == pytest.approx(greedy_s(as_blocked))
    for ranks in (1, 2, 3, 5, 8):
        for cores in (None, 2):
            got, want, other = (predict(c, ranks, cores=cores) for c in (both, as_blocked, as_one))
            for scheme in ("sync", "hybrid", "greedy"):
                assert got[scheme]["seconds"] == want[scheme]["seconds"], (scheme, ranks)
                assert got[scheme].get("split") == want[scheme].get("split")
                assert got[scheme]["seconds"] is None or got[scheme]["seconds"] != other[scheme]["seconds"]
            for scheme in ("model", "data"):
                assert got[scheme]["seconds"] == other[scheme]["seconds"], (scheme, ranks)
    measured = dict(dp_ranks=2, dp_epoch_s={"greedy": [1.5, 0.7, 0.3]}, dp_reduction_s={"greedy": [0.1, 0.1, 0.1]})
    got, want = (predict(costs(one, **common, **measured, **more), 2)["greedy"]
                 for more in ({"blocked_epoch_s": blocked}, {}))
    assert (got["seconds"], got["split"]) == (want["seconds"], want["split"])
    with pytest.raises(ValueError, match="blocked_epoch_s"):
        costs(one, blocked_epoch_s=[1.0, 0.0, 1.0])


@pytest.mark.parametrize("cores", [None, 1, 2, 4])
def test_more_ranks_never_slow_data_when_communication_is_free(cores):
    c = costs([2.0, 1.0, 0.3], [0.5, 0.1, 0.0], epochs=3, batch=64)
    times = [predict(c, p, cores=cores, **FREE)["data"]["seconds"] for p in range(1, 65)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:]))


def test_json_path_equals_measured_path(tmp_path):
    sizes = [784, 1000, 500, 30]
    epoch, transform = [0.27, 0.18, 0.01], [0.058, 0.034, 0.001]
    n_train, n_val, batch = 3599, 401, 100
    rbm_flops = [10.0 * a * b + 12.0 * (a + b) for a, b in zip(sizes, sizes[1:])]
    layers = [SimpleNamespace(n_in=a, n_out=b, epochs=e, flops_per_sample=lambda f=f: f)
              for a, b, e, f in zip(sizes, sizes[1:], [10, 10, 12], rbm_flops)]
    measured = LayerCosts.measured(layers, epoch, transform, n_train, batch, [0, 5, 20], n_val=n_val)
    stage_times = {"n_train": n_train, "n_val": n_val, "batch": batch, "epochs": [10, 10, 12], "extras": [0, 5, 20],
                   "layers": [{"n_in": a, "n_out": b, "flops_per_sample": f, "epoch_s": es, "transform_s": ts,
                               "steps": -(-n_train // batch), "param_bytes": 4 * (a * b + a + b)}
                              for a, b, f, es, ts in zip(sizes, sizes[1:], rbm_flops, epoch, transform)]}
    path = tmp_path / "stage_times.json"
    path.write_text(json.dumps(stage_times))
    assert LayerCosts.from_stage_times(path) == LayerCosts.from_stage_times(stage_times) == measured
    for p in (1, 2, 3, 5, 8):
        assert predict(LayerCosts.from_stage_times(path), p) == predict(measured, p)


def test_measured_param_bytes_follow_the_dtype():
    layers = [SimpleNamespace(n_in=4, n_out=3, epochs=2)]
    c = LayerCosts.measured(layers, [1.0], [0.1], 250, 100, dtype="float64")
    assert c.param_bytes == (8 * (12 + 4 + 3),) and c.steps_per_epoch == (3,) and c.extras == (0,)
    assert c.plan_epoch is None  # no FLOP count: the sync plan runs on the measured costs
    assert predict(c, 2)["sync"]["seconds"] > 0


@pytest.mark.parametrize("bad", [dict(epoch_s=[0.0]), dict(transform_s=[-1.0]), dict(epochs=[0]),
                                 dict(extras=[-1]), dict(steps_per_epoch=[1, 2]), dict(n_train=0),
                                 dict(epoch_s=[math.nan]), dict(batch=0)])
def test_layer_costs_refuse_nonsense(bad):
    good = dict(epoch_s=[1.0], transform_s=[0.1], param_bytes=[10], steps_per_epoch=[1], epochs=[1],
                extras=[0], n_train=10)
    with pytest.raises(ValueError):
        LayerCosts(**{**good, **bad})


# ---- choose and the table --------------------------------------------------------------------
def _pred(**seconds):
    return {k: {"seconds": seconds.get(k), "note": ""} for k in SCHEMES}


def test_choose_prefers_data_unless_strictly_faster():
    assert choose(_pred(greedy=2.0, data=2.0, model=2.0, sync=2.0)) == "data"
    assert choose(_pred(greedy=3.0, data=2.0, model=1.999, sync=2.5)) == "model"
    assert choose(_pred(greedy=3.0, data=2.0, hybrid=1.9), margin=0.1) == "data"
    assert choose(_pred(greedy=3.0, data=None, model=2.0, sync=2.0)) == "model"  # tie: SCHEMES order
    with pytest.raises(ValueError, match="no scheme"):
        choose(_pred())


def test_format_table_marks_auto_and_says_lower_is_better():
    c = costs([2.0, 1.0], [0.5, 0.1], epochs=3, batch=100)
    text = format_table(predict(c, 4, cores=2))
    assert "lower is better" in text and "not measured" in text and "on 2 core(s)" in text
    rows = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith(("| scheme", "| ---"))]
    assert len(rows) == len(SCHEMES)
    assert sum("(auto)" in r for r in rows) == 1
    assert all(r.count("|") == 5 for r in rows)  # no note splits its cell


# ---- properties over random costs ------------------------------------------------------------
layer_counts = st.integers(1, 5)


@st.composite
def random_costs(draw):
    n = draw(layer_counts)
    pos = st.floats(1e-3, 10.0)
    return LayerCosts(epoch_s=draw(st.lists(pos, min_size=n, max_size=n)),
                      transform_s=draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n)),
                      param_bytes=draw(st.lists(st.floats(0.0, 1e8), min_size=n, max_size=n)),
                      steps_per_epoch=draw(st.lists(st.integers(1, 600), min_size=n, max_size=n)),
                      epochs=draw(st.lists(st.integers(1, 8), min_size=n, max_size=n)),
                      extras=draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)),
                      n_train=draw(st.integers(1, 10_000)), batch=draw(st.sampled_from([None, 1, 8, 100])),
                      blocks=draw(st.sampled_from([None, 2, 8, 16])))


@PROPS
@given(random_costs(), st.integers(1, 20), st.sampled_from([None, 1, 2, 16]),
       st.sampled_from([(5e-6, 5e9), (0.0, math.inf), (1e-3, 1e8)]))
def test_predictions_are_non_negative_and_choose_never_loses_to_data(c, ranks, cores, ab):
    pred = predict(c, ranks, cores=cores, alpha=ab[0], beta=ab[1])
    assert tuple(pred) == SCHEMES
    for k, v in pred.items():
        assert v["note"]
        if v["seconds"] is not None:
            assert math.isfinite(v["seconds"]) and v["seconds"] >= 0 and v["ratio"] >= 0
    pick = choose(pred)
    assert pred[pick]["seconds"] is not None
    runnable = [v["seconds"] for v in pred.values() if v["seconds"] is not None]
    assert pred[pick]["seconds"] == min(runnable) or pick == "data"
    if pred["data"]["seconds"] is not None:
        assert pred[pick]["seconds"] <= pred["data"]["seconds"]
        if pred["greedy"]["seconds"] is not None:  # greedy's blocks may not feed these ranks
            assert pred["data"]["seconds"] <= pred["greedy"]["seconds"] * (1 + 1e-12)  # Allreduce <= tree
    if ranks <= c.n_layers:
        assert pred["hybrid"]["seconds"] is None


@PROPS
@given(st.dictionaries(st.sampled_from(SCHEMES), st.one_of(st.none(), st.floats(0.0, 100.0)), min_size=1))
def test_choose_rule_on_any_predictions(seconds):
    pred = {k: {"seconds": v, "note": ""} for k, v in seconds.items()}
    if all(v is None for v in seconds.values()):
        with pytest.raises(ValueError):
            choose(pred)
        return
    pick = choose(pred)
    assert seconds[pick] is not None
    if seconds.get("data") is not None:
        assert seconds[pick] <= seconds["data"]
        assert pick == "data" or seconds[pick] < seconds["data"]
    else:
        assert seconds[pick] == min(v for v in seconds.values() if v is not None)


@PROPS
@given(random_costs())
def test_one_rank_model_free_of_communication_bounds(c):
    """Model-parallel on min(P, L) ranks: at least the slowest layer's epochs, at most greedy
    plus every refresh (one rank per layer never loses work, it only overlaps it)."""
    n = c.n_layers
    if n < 2:
        return
    m = model_parallel_s(c, n, **FREE)["seconds"]
    assert m >= max(e * t for e, t in zip(c.epochs, c.epoch_s)) * (1 - 1e-12)
    refresh = sum(c.epochs[j] * sum(c.transform_s[:j]) for j in range(n))
    assert m <= (greedy_s(c) + refresh) * (1 + 1e-12)


# ---- bench.makespan is a thin CLI over the planner -------------------------------------------
def test_bench_makespan_rows_come_from_the_planner(tmp_path, capsys):
    from bench import makespan

    c = costs([2.0, 1.0, 0.4], [0.2, 0.1, 0.0], epochs=3, extras=[0, 1, 2], batch=100)
    rows = makespan.simulate_grid(c, ranks=(1, 2, 5))
    for r in rows:
        pred = predict(c, r["ranks"])
        assert r["data_s"] == pred["data"]["seconds"]
        assert r["model_s"] == (pred["model"]["seconds"] if pred["model"]["seconds"] is not None else "")
        assert r["greedy_same_ranks_s"] == pred["greedy"]["seconds"]
        assert r["scenario"] == ("hybrid" if r["ranks"] > 3 else "sync")
    path = tmp_path / "st.json"
    path.write_text(json.dumps({"n_train": 1000, "batch": 100, "epochs": [2, 2], "extras": [0, 1],
                                "layers": [{"epoch_s": 1.0, "transform_s": 0.1, "steps": 10, "param_bytes": 1e6},
                                           {"epoch_s": 0.5, "transform_s": 0.0, "steps": 10, "param_bytes": 1e5}]}))
    out = tmp_path / "rows.csv"
    md = tmp_path / "tables.md"
    assert makespan.main([str(path), "--ranks", "1,2,3", "--out", str(out), "--tables", str(md), "--cores", "2"]) == 0
    header = out.read_text().splitlines()[0].split(",")
    assert header[:len(makespan.FIELDS)] == list(makespan.FIELDS)
    text = capsys.readouterr().out
    assert "SIMULATED" in text and text.count("lower is better") == 3
    assert "SIMULATED" in md.read_text() and md.read_text().count("lower is better") == 3
    # the rows name the machine the layer times were measured on, where the file says
    rows = list(csv.DictReader(open(out)))
    assert rows and all(r["cpu_model"] for r in rows)
    data = json.loads(path.read_text())
    data["machine"] = {"cpu_model": "the measuring CPU", "hostname": "elsewhere"}
    path.write_text(json.dumps(data))
    assert makespan.main([str(path), "--ranks", "1,2", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert {(r["cpu_model"], r["hostname"]) for r in rows} == {("the measuring CPU", "elsewhere")}


@PROPS
@given(random_costs(), st.integers(1, 20), st.sampled_from([None, 1, 2, 16]),
       st.sampled_from([(5e-6, 5e9), (0.0, math.inf), (1e-3, 1e8)]))
def test_each_prediction_splits_into_parts_that_add_up_to_it(c, ranks, cores, ab):
    """The split the profile figure draws beside the measured one: a rank's training,
    reduction, hand-over and waiting, none negative, adding up to the predicted seconds."""
    for name, v in predict(c, ranks, cores=cores, alpha=ab[0], beta=ab[1]).items():
        if v["seconds"] is None:
            continue
        split = v["split"]
        assert tuple(split) == SPLIT and all(x >= 0 for x in split.values()), (name, split)
        assert math.isclose(sum(split.values()), v["seconds"], rel_tol=1e-9, abs_tol=1e-9), (name, split, v)


def test_the_split_by_hand():
    c = costs([4.0, 2.0], [1.0, 0.5], epochs=2, steps=10, nbytes=1e6)
    data = predict(c, 2, alpha=1e-3, beta=1e9)["data"]["split"]
    assert data["training"] == pytest.approx(2 * 4.0 / 2 + 2 * 2.0 / 2)  # each rank half of every epoch
    assert data["reduction"] == pytest.approx(2 * 2 * 10 * allreduce_s(1e6, 2, 1e-3, 1e9))
    assert data["handover"] == pytest.approx(1.0 / 2) and data["wait"] == 0.0  # layer 1's transform, split
    sync = predict(c, 2, **FREE)["sync"]["split"]
    assert sync["wait"] > 0  # layer 2's rank waits for layer 1's first output
    assert sync["training"] >= (2 * 4.0 + 2 * 2.0) / 2  # at least each layer's own epochs, over two ranks
