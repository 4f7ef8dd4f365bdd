"""15-618's model-parallel pre-training: its schedule, and what it equals in one process."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (threads before numpy work)
from aepar import backend
from aepar.comm import Comm
from aepar.parallel.layerwise import train_layer_by_layer
from aepar.parallel.model_parallel import owner, pretrain_model_parallel, schedule
from aepar.stack import make_layers
from aepar.rows import Shard


def test_schedule_starts_each_layer_one_epoch_after_the_one_below():
    assert schedule([2, 2, 2], 3) == [[[(0, 0)], [(0, 1), (1, 0)], [(1, 1), (2, 0)], [(2, 1)]]]


def test_schedule_groups_layers_when_they_outnumber_the_group():
    assert schedule([2, 2, 2], 2) == [[[(0, 0)], [(0, 1), (1, 0)], [(1, 1)]], [[(2, 0)], [(2, 1)]]]


def test_group_of_one_is_greedy_order():
    assert schedule([2, 1], 1) == [[[(0, 0)], [(0, 1)]], [[(1, 0)]]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=7), st.integers(1, 8))
def test_schedule_trains_every_epoch_once_in_order(epochs, group):
    groups = schedule(epochs, group)
    seen = {j: [] for j in range(len(epochs))}
    for g, slots in enumerate(groups):
        first = g * group
        # no extra epochs: G - 1 + max epochs slots, not the sum
        members = range(first, min(first + group, len(epochs)))
        assert len(slots) == max(j - first + epochs[j] for j in members)
        for t, slot in enumerate(slots):
            assert len({j for j, _ in slot}) == len(slot)
            for j, e in slot:
                assert j in members and e == t - (j - first)
                seen[j].append(e)
    assert all(seen[j] == list(range(epochs[j])) for j in seen)


def test_owner_spreads_a_group_over_the_ranks():
    assert [owner(j, 4, 4) for j in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [owner(j, 4, 2) for j in range(4)] == [0, 1, 0, 1]
    assert [owner(j, 4, 1) for j in range(4)] == [0, 0, 0, 0]


def _stack(seed=0):
    be = backend.select("cpu", "numba", "float64")
    rng = np.random.default_rng(seed)
    protos = (rng.random((4, 24)) < 0.4).astype(np.float64)
    x = protos[rng.integers(0, 4, 240)]
    x = np.where(rng.random(x.shape) < 0.05, 1 - x, x)
    layers = make_layers(be, [24, 12, 8, 4], "rbm", seed=seed, epochs=[3, 2, 2], batch=20)
    return be, layers, Shard.of(be, x[:200], 4), Shard.of(be, x[200:], 4)


def _weights(layers):
    return [np.array(l.params[k]) for l in layers for k in ("W", "bv", "bh")]


def test_group_of_one_equals_greedy_pretraining_bitwise():
    be, layers, train, test = _stack()
    train_layer_by_layer(be, Comm.serial(), layers, train, test, quiet=True)
    be, mp_layers, train, test = _stack()
    record = pretrain_model_parallel(be, Comm.serial(), mp_layers, train, test, group=1)
    for a, b in zip(_weights(layers), _weights(mp_layers)):
        assert np.array_equal(a, b)
    assert [len(e["epoch_times_s"]) for e in record["layers"]] == [3, 2, 2]
    assert len(record["slots"]) == 7


def test_layers_train_on_copies_refreshed_once_per_epoch():
    """Group 3: layer 2's first epoch sees layer 1 after exactly one epoch (not its final
    weights), so the result differs from greedy; layer 1 itself is trained as in greedy."""
    be, greedy_layers, train, test = _stack()
    train_layer_by_layer(be, Comm.serial(), greedy_layers, train, test, quiet=True)
    be, layers, train, test = _stack()
    record = pretrain_model_parallel(be, Comm.serial(), layers, train, test, group=3)
    assert len(record["slots"]) == max(j + e for j, e in enumerate([3, 2, 2]))  # G - 1 + ... per layer
    w = _weights(layers), _weights(greedy_layers)
    assert all(np.array_equal(a, b) for a, b in zip(w[0][:3], w[1][:3]))
    assert not np.array_equal(w[0][3], w[1][3])
    assert all(np.isfinite(e["train_error"]).all() for e in record["layers"])


def test_model_parallel_learns():
    be, layers, train, test = _stack()
    record = pretrain_model_parallel(be, Comm.serial(), layers, train, test, group=3)
    first = record["layers"][0]["train_error"]
    assert first[-1] < first[0]


@pytest.mark.parametrize("group", [0, -1])
def test_schedule_rejects_empty_groups(group):
    with pytest.raises(ValueError):
        schedule([1, 1], group)
