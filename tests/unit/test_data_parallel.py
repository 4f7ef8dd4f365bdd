"""The rows' fixed decomposition (aepar.rows) and the data-parallel trainer on one process:
local sums, the reducer handed to models, train_epoch's defaults and its allreduce mode."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import aepar  # noqa: F401  (threads before numpy work)
from aepar import backend
from aepar.comm import Comm
from aepar.kernels import memory
from aepar.models.ae_layer import AELayer
from aepar.models.cae import ConvAutoencoder
from aepar.models.classifier import Classifier
from aepar.models.rbm import RBM
from aepar.models.stacked import StackedAutoencoder
from aepar.optim import Adam
from tests.conftest import kernel_set_params
from tests.gradcheck import to_host
from aepar.parallel.data_parallel import blockwise_sums, reducer, train_epoch
from aepar.kernels.ref.blocksum import interleaved
from aepar.rows import (BlockFactor, BlockRows, Blocks, Shard, factor_rows, factor_starts, local_sums, stacked_rows,
                        tree_sum, tree_sum_rows, weighted_ranges)


@pytest.fixture(autouse=True)
def _steps_shared_however_small(monkeypatch):
    """These tests' models are small: their steps would run on one thread
    (data_parallel.SHARED_STEP_FLOPS), and the threads' paths are what they test."""
    import aepar.parallel.data_parallel as dp
    monkeypatch.setattr(dp, "SHARED_STEP_FLOPS", 0)


def _be(kernels="numpy", dtype="float64"):
    return backend.select("cpu", kernels, dtype)


def _data(n=230, d=12, seed=0):
    return np.random.default_rng(seed).random((n, d))


def _sums(rows):
    """Three sums whose rounding depends on the order of addition."""
    return [float((rows ** 2).sum()), float(np.sin(rows).sum()), float(rows[:, 0].sum()) * 1e-3]


# ---- local sums -------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 13])
def test_local_sums_equal_the_serial_blockwise_sums_bitwise(count):
    be, x = _be(), _data(n=9000)  # more than CHUNK rows: blocks are summed in chunks too
    shard = Shard.of(be, x, count)
    got, want = local_sums(shard, _sums), blockwise_sums(shard, _sums, None)
    assert got.dtype == want.dtype == np.float64
    assert got.tobytes() == want.tobytes()
    assert got.tobytes() == reducer(None)(shard, _sums).tobytes()
    np.testing.assert_allclose(got, np.sum([_sums(x[i:i + 1]) for i in range(0, 9000, 1)], axis=0), rtol=1e-9)


def test_local_sums_are_the_fixed_tree_over_the_blocks():
    be, x = _be(), _data(n=50)
    shard = Shard.of(be, x, 5)
    leaves = [np.asarray(_sums(x[shard.blocks.local(b)]), dtype=np.float64) for b in range(5)]
    want = (leaves[0] + leaves[1]) + (leaves[2] + leaves[3]) + leaves[4]
    assert local_sums(shard, _sums).tobytes() == want.tobytes()
    assert tree_sum([v.copy() for v in leaves]).tobytes() == want.tobytes()


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 140), width=st.integers(1, 9), seed=st.integers(0, 2 ** 31))
def test_tree_sum_rows_is_tree_sum_bit_for_bit(count, width, seed):
    """A level at a time over the rows of one array: the same additions as the recursion
    (values of mixed magnitudes, so that another order would round differently)."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((count, width)) * 10.0 ** rng.integers(-8, 8, (count, 1))
    want = tree_sum([r.copy() for r in rows])
    got = tree_sum_rows(rows)
    assert got.tobytes() == want.tobytes()
    assert np.shares_memory(got, rows) and got.shape == (width,)  # into the first row, as tree_sum


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 100), ranks=st.integers(1, 16), seed=st.integers(0, 2 ** 31))
def test_tree_nodes_from_rows_are_those_from_a_list(count, ranks, seed):
    """Every rank's node values (what it adds before any message) from the rows of one
    array are, bit for bit, those from a list of its block vectors."""
    from aepar.parallel.blocks import TreeSum

    class Rank:  # all TreeSum needs before a message
        def __init__(self, rank, size):
            self.rank, self.size = rank, size

    ranks = min(ranks, count)
    rng = np.random.default_rng(seed)
    every = rng.standard_normal((count, 5)) * 10.0 ** rng.integers(-8, 8, (count, 1))
    for r in range(ranks):
        tree = TreeSum(Rank(r, ranks), count)
        mine = every[tree.first:tree.stop]
        want = tree.node_values([v.copy() for v in mine])
        got = tree.node_values(mine.copy())
        assert list(got) == list(want) == tree.nodes
        assert all(got[n].tobytes() == want[n].tobytes() for n in want)


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 200), cuts=st.lists(st.integers(0, 200), max_size=4), ranks=st.integers(1, 16),
       seed=st.integers(0, 2 ** 31))
def test_a_rank_nodes_from_its_threads_nodes(count, cuts, ranks, seed):
    """Each thread's run of a rank's blocks added into its cover nodes (cover_merges, the
    postfix order a kernel follows), then the rank's nodes from those (node_values_from):
    bit for bit the rank's nodes from its blocks (node_values), and the tree's top node
    from every rank's cover the one-process tree_sum."""
    from aepar.parallel.blocks import TreeSum
    from aepar.rows import cover_merges, tree_node_from, tree_top

    class Rank:
        def __init__(self, rank, size):
            self.rank, self.size = rank, size

    ranks = min(ranks, count)
    rng = np.random.default_rng(seed)
    every = rng.standard_normal((count, 4)) * 10.0 ** rng.integers(-8, 8, (count, 1))
    known_all = {}
    for r in range(ranks):
        tree = TreeSum(Rank(r, ranks), count)
        bounds = sorted({tree.first, tree.stop, *(c for c in cuts if tree.first < c < tree.stop)})
        known = {}
        for a, b in zip(bounds[:-1], bounds[1:]):  # a thread's run: merges as a kernel takes them
            nodes, merges = cover_merges(a, b, count)
            stack = []
            for block, m in zip(range(a, b), merges):
                stack.append(every[block].copy())
                for _ in range(m):
                    right = stack.pop()
                    stack[-1] += right
            assert len(stack) == len(nodes)
            known.update(zip(nodes, stack))
        want = tree.node_values([v.copy() for v in every[tree.first:tree.stop]])
        got = tree.node_values_from(known)
        assert list(got) == list(want)
        assert all(got[n].tobytes() == want[n].tobytes() for n in want)
        known_all.update(got)
    top = tree_node_from(tree_top(count), 0, known_all, count)
    assert top.tobytes() == tree_sum([v.copy() for v in every]).tobytes()


def test_local_sums_need_every_block():
    be, x = _be(), _data(n=40)
    part = Shard.of(be, x, 4, rank=1, size=2)
    assert not part.blocks.whole and Blocks.of(40, 4).whole
    with pytest.raises(ValueError, match="every block"):
        local_sums(part, _sums)


def test_models_take_a_reducer_and_default_to_local_sums():
    be, x = _be(), _data(n=60)
    rbm = RBM(be, 12, 5, seed=1)
    net = StackedAutoencoder(be, [12, 4], seed=1)
    calls = []

    def reduce(shard, fn):
        calls.append(shard.blocks.count)
        return local_sums(shard, fn)
    for count in (1, 4):
        shard = Shard.of(be, x, count)
        assert rbm.recon_error(shard) == rbm.recon_error(shard, reduce) == rbm.recon_error(shard, reducer(None))
        assert net.error_per_digit(shard) == net.error_per_digit(shard, reduce)
    assert calls == [1, 1, 4, 4]


# ---- train_epoch ------------------------------------------------------------------------------
def test_train_epoch_defaults_come_from_the_model():
    be, x = _be(), _data()
    a, b = (RBM(be, 12, 5, batch=30, seed=2, layer_index=1) for _ in range(2))
    ra = train_epoch(a, Shard.of(be, x, 3), 0)
    rb = train_epoch(b, Shard.of(be, x, 3), 0, batch=30, key=(2, 1))
    assert ra.means == rb.means and a.epochs_done == b.epochs_done == 1
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    c = RBM(be, 12, 5, batch=30, seed=2, layer_index=1)
    train_epoch(c, Shard.of(be, x, 3), 0, batch=20)  # another batch size: other steps
    assert not np.array_equal(a.params["W"], c.params["W"])


def test_train_epoch_counts_complete_epochs_only():
    from aepar.guard import CHECKPOINT, Guard

    class PauseAt2(Guard):
        def local_request(self):
            return CHECKPOINT if self.steps == 2 else 0.0

    be, x = _be(), _data()
    layer = AELayer(be, 12, 5, batch=40, seed=3)
    train_epoch(layer, Shard.of(be, x, 2), 4)
    assert layer.epochs_done == 5
    paused = train_epoch(layer, Shard.of(be, x, 2), 7, guard=PauseAt2(Comm.serial(), "t", faults=[]))
    assert not paused.complete and layer.epochs_done == 5
    train_epoch(layer, Shard.of(be, x, 2), 7, resume=paused.state)
    assert layer.epochs_done == 8
    train_epoch(layer, Shard.of(be, x, 2), 1)
    assert layer.epochs_done == 8  # never goes back


def test_train_epoch_sets_the_optimizer_given():
    be, x = _be(), _data(d=8)
    net = StackedAutoencoder(be, [8, 3], seed=4)
    assert net.batch == 100
    opt = Adam(be, net.params, lr=0.01)
    before = net.params["W1"].copy()
    result = train_epoch(net, Shard.of(be, x, 2), 0, batch=50, optimizer=opt)
    assert net.optimizer is opt and opt.t == 5 and result.complete  # ceil(230 / 50) steps
    assert not np.array_equal(before, net.params["W1"])
    assert not hasattr(net, "epochs_done")


class _Recording(Comm):
    """One process that records the collectives it is asked for."""

    def __init__(self):
        serial = Comm.serial()
        self.__dict__.update(serial.__dict__)
        self.calls = []

    def Allreduce(self, buf, op="sum"):
        self.calls.append("allreduce")
        return super().Allreduce(buf, op)

    def Bcast(self, buf, root=0):
        self.calls.append("bcast")
        return super().Bcast(buf, root)


@pytest.mark.parametrize("make", [lambda be: RBM(be, 12, 5, batch=40, seed=5),
                                  lambda be: StackedAutoencoder(be, [12, 4], seed=5, batch=40)],
                         ids=["rbm", "stacked"])
def test_allreduce_mode_is_one_allreduce_per_step_of_the_rank_s_own_sum(make):
    be, x = _be(), _data()
    steps = -(-230 // 40)
    results, models = {}, {}
    for mode, count in (("tree", 2), ("allreduce", 2), ("tree", 4), ("allreduce", 4)):
        model = make(be)
        if isinstance(model, StackedAutoencoder):
            model.optimizer = Adam(be, model.params, lr=0.01)
        comm = _Recording()
        results[mode, count] = train_epoch(model, Shard.of(be, x, count), 0, comm, allreduce=mode == "allreduce")
        models[mode, count] = model
        # tree mode on one process: its one tree node is the whole sum, nothing to send
        assert comm.calls == (["allreduce"] * steps if mode == "allreduce" else [])
    # two blocks: a + b either way, the same bits
    assert results["tree", 2].means == results["allreduce", 2].means
    for k, v in models["tree", 2].params.items():
        np.testing.assert_array_equal(models["allreduce", 2].params[k], v)
    # four blocks: ((a + b) + c) + d against (a + b) + (c + d): the same steps up to rounding
    for k, v in models["tree", 4].params.items():
        np.testing.assert_allclose(models["allreduce", 4].params[k], v, rtol=1e-9, atol=1e-12)


def test_allreduce_mode_keeps_the_guard_flags_and_the_fused_path():
    from aepar.guard import CHECKPOINT, Guard

    class PauseAt3(Guard):
        def local_request(self):
            return CHECKPOINT if self.steps == 3 else 0.0

    be, x = _be(), _data()
    for count in (1, 3):
        whole, first, second = (RBM(be, 12, 5, batch=40, seed=6) for _ in range(3))
        train_epoch(whole, Shard.of(be, x, count), 0, allreduce=True)
        paused = train_epoch(first, Shard.of(be, x, count), 0, guard=PauseAt3(Comm.serial(), "t", faults=[]),
                             allreduce=True)
        assert not paused.complete and paused.state.batch == 4 and paused.checkpoint
        second.load_state(first.state())
        train_epoch(second, Shard.of(be, x, count), 0, resume=paused.state, allreduce=True)
        for k in whole.params:
            np.testing.assert_array_equal(second.params[k], whole.params[k])
        if count == 1:  # one block, one process: the fused step, whichever mode
            tree = RBM(be, 12, 5, batch=40, seed=6)
            train_epoch(tree, Shard.of(be, x, 1), 0)
            for k in whole.params:
                np.testing.assert_array_equal(tree.params[k], whole.params[k])


@pytest.mark.parametrize("kernels,dtype,tol", [("numpy", "float64", 1e-12), ("numba", "float32", 1e-5)])
@pytest.mark.parametrize("kind", ["rbm", "stacked", "classifier"])
def test_factored_gradients_take_the_steps_of_the_blocks_own_gradients(kind, kernels, dtype, tol):
    """Weight gradients added from the blocks' factors in one call per tree node (and in
    order, with allreduce) against each block's own gradient added by NumPy."""
    be = _be(kernels, dtype)
    x = _data(n=300, d=40).astype(dtype)

    if kind == "classifier":  # the last column: labels 0-2
        x[:, -1] = np.floor(3 * x[:, 0])

    def make():
        if kind == "rbm":
            return RBM(be, 40, 24, batch=100, seed=3)
        if kind == "classifier":
            model = Classifier(be, [39, 16], 3, seed=3, batch=100)
        else:
            model = StackedAutoencoder(be, [40, 24, 6], seed=3, batch=100)
        model.optimizer = Adam(be, model.params, lr=0.01)
        return model
    for allreduce in (False, True):
        factored, plain = make(), make()
        plain.block_factors = None
        for model in (factored, plain):
            train_epoch(model, Shard.of(be, x, 8), 0, allreduce=allreduce)
        assert factored._dp_buffers.factored == list(factored.factored) and plain._dp_buffers.factored == []
        for k, v in plain.params.items():
            np.testing.assert_allclose(factored.params[k], v, rtol=tol, atol=tol)
        assert not np.array_equal(plain.params[k], make().params[k])


@pytest.mark.parametrize("given_as", ["list", "rows of one array"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernels,dtype", [("numpy", "float64"), ("numba", "float32")])
@pytest.mark.parametrize("kind", ["rbm", "ae", "stacked", "classifier"])
def test_block_factors_of_several_blocks_are_each_blocks_own_bits(kind, kernels, dtype, threads, given_as,
                                                                   monkeypatch):
    """A rank's blocks go through the model together (layer by layer, over the threads):
    every block's sums, bias gradients and factors are the bits of that block alone,
    whether the blocks come as a list of arrays or as the trainer gives them (BlockRows)."""
    monkeypatch.setattr(aepar, "THREADS", threads)
    be = _be(kernels, dtype)
    x = _data(n=60, d=40, seed=4).astype(dtype)
    if kind == "classifier":
        x[:, -1] = np.floor(3 * x[:, 0])
        model = Classifier(be, [39, 16, 8], 3, seed=3, batch=60)
    elif kind == "rbm":
        model = RBM(be, 40, 24, batch=60, seed=3)
    elif kind == "ae":
        model = AELayer(be, 40, 24, batch=60, seed=3)
    else:
        model = StackedAutoencoder(be, [40, 24, 6], loss="xent", seed=3, batch=60)
    blocks = [x[0:13], x[13:26], x[26:38], x[38:39], x[39:60]]
    if given_as != "list":
        blocks = BlockRows(x, [0, 13, 26, 38, 39, 60])

    def grads():
        return {k: be.xp.zeros(s, dtype) for k, s in model.grad_shapes().items()}

    def streams():
        return [np.random.default_rng((5, b)) for b in range(len(blocks))]
    together = [grads() for _ in blocks]
    sums, factors = model.block_factors(blocks, streams(), 1 / 60, together)
    for b, rng in enumerate(streams()):
        alone = grads()
        (s,), (f,) = model.block_factors([blocks[b]], [rng], 1 / 60, [alone])
        assert np.asarray(sums[b]).tobytes() == np.asarray(s).tobytes()
        for k in alone:
            assert be.to_host(together[b][k]).tobytes() == be.to_host(alone[k]).tobytes(), k
        assert sorted(f) == sorted(factors[b]) == sorted(model.factored)
        for k in f:
            for mine, own in zip(factors[b][k][:2], f[k][:2]):
                assert be.to_host(mine).tobytes() == be.to_host(own).tobytes(), k
            assert factors[b][k][2] == f[k][2]


@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 784])
def test_thread_bands_are_one_band_per_thread_at_most_one_per_item(monkeypatch, n, n_threads):
    """rows.thread_bands: block_bounds of n items over min(threads, n) bands (one at least),
    as plain ints, whatever the thread count."""
    from aepar.rows import block_bounds, thread_bands
    monkeypatch.setattr(aepar, "THREADS", n_threads)
    bands = thread_bands(n)
    assert bands == block_bounds(n, max(1, min(n_threads, n))).tolist()
    assert all(type(b) is int for b in bands) and bands[0] == 0 and bands[-1] == n


FINE_TUNING_WEIGHTS = [(784, 1000), (1000, 500), (500, 250), (250, 30), (30, 250), (250, 500), (500, 1000),
                       (1000, 784)]


def test_threads_take_whole_weights_where_they_share_them_evenly(monkeypatch):
    """rows.weight_bands: the unrolled stack's eight weights pair up, so two threads take
    them whole; one weight, a stack whose shares would be uneven (a classifier's layers,
    the stack on four threads: 11% over an even share), or fewer weights than threads,
    a band of each weight per thread, as thread_bands cuts it; one thread, each whole."""
    from aepar.rows import thread_bands, weight_bands
    classifier = [(784, 1000), (1000, 500), (500, 250), (250, 10)]
    for n_threads, shapes, whole in ((2, FINE_TUNING_WEIGHTS, True), (3, FINE_TUNING_WEIGHTS, False),
                                     (4, FINE_TUNING_WEIGHTS, False), (2, classifier, False),
                                     (2, [(784, 1000)], False), (2, [(40, 24), (24, 6), (6, 24), (24, 40)], True),
                                     (4, [(9, 5), (9, 5), (9, 5)], False), (1, classifier, True)):
        monkeypatch.setattr(aepar, "THREADS", n_threads)
        want = [[0, r] for r, _ in shapes] if whole else [thread_bands(r) for r, _ in shapes]
        assert weight_bands(shapes) == want, (n_threads, shapes)


@settings(max_examples=40, deadline=None)
@given(sizes=st.one_of(st.lists(st.integers(1, 1000), min_size=0, max_size=12),
                      st.lists(st.integers(1, 1000), min_size=1, max_size=6).map(lambda h: h + h[::-1])),
       n_threads=st.integers(1, 4))
def test_calls_in_turns_give_each_thread_the_least_loaded_share(sizes, n_threads):
    """rows.calls_in_turns: through parallel_map (thread k takes items k, k + n, ...) every
    call runs once, and each thread's share is the one of the largest-first rule: the
    no thread over the least loaded one by more than its smallest call, and a stack's
    pairs of layers (each size twice) in even shares on two threads."""
    import threading

    from aepar.rows import calls_in_turns, parallel_map
    old = aepar.THREADS
    aepar.THREADS = n_threads
    try:
        ran, loads = [], {}

        def call(i):
            def run():
                ran.append(i)
                name = threading.current_thread().name
                loads[name] = loads.get(name, []) + [sizes[i]]
            return run
        parallel_map(lambda c: c(), calls_in_turns([call(i) for i in range(len(sizes))], sizes))
    finally:
        aepar.THREADS = old
    assert sorted(ran) == list(range(len(sizes)))
    shares = sorted(loads.values(), key=sum)
    assert len(shares) == min(n_threads, len(sizes))
    if len(shares) > 1:  # the most loaded share's last (smallest) call came while it was the least loaded
        assert sum(shares[-1]) - sum(shares[0]) <= min(shares[-1])
    if n_threads == 2 and sizes and all(sizes.count(v) % 2 == 0 for v in sizes):  # in pairs: even shares
        assert sum(shares[0]) == sum(shares[-1])


@pytest.mark.parametrize("make", ["stacked", "classifier"])
def test_whole_weights_on_the_threads_give_one_threads_bits(make, monkeypatch):
    """A stack whose weights pair up (each thread takes whole weights) and a classifier's
    (bands of each weight), 8 blocks, Adam and SGD: the weights of one thread, bit for bit,
    on two and three threads."""
    import aepar.parallel.data_parallel as dp
    from aepar.optim import SGD
    from aepar.rows import thread_bands
    be = _be("numba", "float32")
    x = _data(n=300, d=40, seed=8).astype(np.float32)
    if make == "classifier":
        x[:, -1] = np.floor(3 * x[:, 0])
    taken = []
    real = dp.weight_bands
    monkeypatch.setattr(dp, "weight_bands", lambda shapes: taken.append(real(shapes)) or taken[-1])
    results = {}
    for n_threads in (1, 2, 3):
        monkeypatch.setattr(aepar, "THREADS", n_threads)
        for adam in (True, False):
            model = StackedAutoencoder(be, [40, 24, 6], loss="xent", seed=3, batch=60) if make == "stacked" else \
                Classifier(be, [39, 24, 6], 3, seed=3, batch=60)
            model.optimizer = Adam(be, model.params, lr=0.01) if adam else SGD(be, model.params, 0.1, 0.9)
            for epoch in range(2):
                train_epoch(model, Shard.of(be, x, 8), epoch)
            results[n_threads, adam] = [be.to_host(p).tobytes() for p in model.params.values()]
        shapes = [model.grad_shapes()[k] for k in model.factored]
        if n_threads > 1:  # (one thread takes every weight whole, in _Epoch.whole_batch)
            assert taken[-1] == ([[0, r] for r, _ in shapes] if make == "stacked" and n_threads == 2
                                 else [thread_bands(r) for r, _ in shapes])
    for adam in (True, False):
        assert results[2, adam] == results[1, adam] == results[3, adam]


@settings(max_examples=30, deadline=None)
@given(n_items=st.integers(0, 11), n_threads=st.integers(1, 4))
def test_parallel_map_is_the_list_in_order_on_any_number_of_threads(n_items, n_threads):
    import threading

    from aepar.rows import parallel_map
    old = aepar.THREADS
    aepar.THREADS = n_threads
    try:
        names = set()

        def square(x):
            names.add(threading.current_thread().name)
            return x * x
        assert parallel_map(square, range(n_items)) == [x * x for x in range(n_items)]
        assert threading.current_thread().name in names or n_items == 0  # the caller takes a share
    finally:
        aepar.THREADS = old


def test_parallel_map_waits_for_its_helpers_before_an_error_goes_up(monkeypatch):
    """An item failing in the calling thread must not leave a helper still writing."""
    import threading
    import time

    from aepar.rows import parallel_map
    monkeypatch.setattr(aepar, "THREADS", 2)
    done = []
    caller = threading.current_thread()

    def item(x):
        if threading.current_thread() is caller:
            raise RuntimeError("item failed")
        time.sleep(0.2)
        done.append(x)
    with pytest.raises(RuntimeError, match="item failed"):
        parallel_map(item, range(4))
    assert sorted(done) == [1, 3]  # the helper's items, finished before the error came up


def test_parallel_map_raises_a_helpers_error_after_the_callers_share(monkeypatch):
    """A helper's failure comes up in the caller, once the caller's own items are done, and
    the next call finds the helpers ready again."""
    import threading

    from aepar.rows import parallel_map
    monkeypatch.setattr(aepar, "THREADS", 3)
    caller, done = threading.current_thread(), []

    def item(x):
        if x == 2:
            raise ValueError("helper's item failed")
        done.append(x)
        return x
    with pytest.raises(ValueError, match="helper's item failed"):
        parallel_map(item, range(6))
    assert {0, 3} <= set(done)  # the caller's items ran to the end
    assert parallel_map(lambda x: threading.current_thread() is caller, range(6)) == [True, False, False] * 2


def test_parallel_map_inside_an_item_or_beside_another_call_takes_its_items_alone(monkeypatch):
    """A call from inside an item (its helpers are busy) or from a second thread while one
    runs must neither wait for itself nor mix its items with the other call's."""
    import threading

    from aepar.rows import parallel_map
    monkeypatch.setattr(aepar, "THREADS", 2)

    def nested(x):
        return parallel_map(lambda y: 10 * x + y, range(3))
    worker = threading.Thread(target=lambda: results.append(parallel_map(nested, range(4))), daemon=True)
    results = []
    worker.start()
    mine = [parallel_map(lambda y: -y, range(5)) for _ in range(200)]
    worker.join(timeout=60)
    assert not worker.is_alive(), "a nested parallel_map waited for itself"
    assert results == [[[10 * x + y for y in range(3)] for x in range(4)]]
    assert mine == [[-y for y in range(5)]] * 200


@settings(max_examples=20, deadline=None)
@given(shapes=st.lists(st.sampled_from([(1,), (7,), (40,), (3, 5), (33, 17)]), min_size=1, max_size=4),
       n_threads=st.integers(2, 4), adam=st.booleans(), seed=st.integers(0, 2**16))
def test_optimiser_steps_over_the_threads_give_one_threads_bits(shapes, n_threads, adam, seed):
    """SGD (with a weight decay on one parameter) and Adam (with AdamW's on the matrices)
    give each thread whole parameters or a band of each parameter's rows: the step's bits
    are those of the whole arrays on one thread (these small steps handed off all the same)."""
    import aepar.optim as optim
    from aepar.optim import SGD
    be = _be("numba", "float32")
    # these small steps handed off, and every parameter cut into bands
    old_small, old_band = optim.HAND_OFF_ELEMENTS, optim.BAND_ELEMENTS
    optim.HAND_OFF_ELEMENTS = optim.BAND_ELEMENTS = 0
    rng = np.random.default_rng(seed)
    start = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    grads = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in start.items()} for _ in range(2)]
    old = aepar.THREADS
    results = []
    try:
        for threads in (1, n_threads):
            aepar.THREADS = threads
            params = {k: be.asarray(v.copy()) for k, v in start.items()}
            opt = Adam(be, params, lr=1e-2, weight_decay=0.3) if adam else SGD(be, params, 0.1, 0.9)
            for g in grads:
                opt.step(g) if adam else opt.step(g, weight_decay={"p0": 0.01})
            results.append({k: be.to_host(v).tobytes() for k, v in params.items()})
    finally:
        aepar.THREADS, optim.HAND_OFF_ELEMENTS, optim.BAND_ELEMENTS = old, old_small, old_band
    assert results[0] == results[1]
    assert any(results[0][k] != start[k].tobytes() for k in start)


def test_a_small_parameter_is_stepped_whole_by_one_thread(monkeypatch):
    """On two threads a parameter of at least BAND_ELEMENTS elements is cut into a band of
    rows per thread and a smaller one (a layer's biases) is one call on one thread: the
    calls of one SGD step, and their bits, which are the one-thread step's."""
    import aepar.optim as optim
    from aepar.optim import SGD
    be = _be("numba", "float32")
    monkeypatch.setattr(optim, "HAND_OFF_ELEMENTS", 0)
    monkeypatch.setattr(optim, "BAND_ELEMENTS", 600)
    rng = np.random.default_rng(5)
    start = {"W": rng.standard_normal((40, 15)).astype(np.float32), "b": rng.standard_normal(599).astype(np.float32)}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in start.items()}
    results, calls, real = [], [], optim.parallel_map
    monkeypatch.setattr(optim, "parallel_map", lambda fn, items: calls.extend(items) or real(fn, items))
    for threads in (1, 2):
        monkeypatch.setattr(aepar, "THREADS", threads)
        params = {k: v.copy() for k, v in start.items()}
        SGD(be, params, 0.1, 0.9).step(grads)
        results.append({k: v.tobytes() for k, v in params.items()})
    stepped = sorted((c.args[0].shape, c.args[0].base is params["W"]) for c in calls if hasattr(c, "args"))
    assert stepped == [((20, 15), True), ((20, 15), True), ((599,), False)], stepped
    assert results[0] == results[1]


def _optimiser_handoffs(monkeypatch) -> list:
    """Two threads, and a list that grows by one at each hand-off the optimisers make."""
    import aepar.optim as optim
    monkeypatch.setattr(aepar, "THREADS", 2)
    handoffs, real = [], optim.parallel_map
    monkeypatch.setattr(optim, "parallel_map", lambda fn, items: handoffs.append(1) or real(fn, items))
    return handoffs


@pytest.mark.parametrize("adam", [False, True])
def test_a_small_step_stays_on_the_calling_thread(adam, monkeypatch):
    """A step of fewer than HAND_OFF_ELEMENTS elements with no factored gradient runs on
    the calling thread (no hand-off: it would cost more than it saves); a larger one, or one
    with a factored gradient, is one hand-off to the threads; the same bits each way."""
    import aepar.optim as optim
    from aepar.optim import SGD, FactoredGradient
    from aepar.rows import tree_merges, tree_top
    handoffs = _optimiser_handoffs(monkeypatch)
    be = _be("numba", "float32")
    rng = np.random.default_rng(3)
    start = {"W": rng.standard_normal((60, 50)).astype(np.float32), "b": rng.standard_normal(50).astype(np.float32)}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in start.items()}
    A, D = rng.standard_normal((26, 60)).astype(np.float32), rng.standard_normal((26, 50)).astype(np.float32)
    results = []
    for limit, factored in ((3051, False), (3050, False), (10**9, True)):  # 3,050 elements
        monkeypatch.setattr(optim, "HAND_OFF_ELEMENTS", limit)
        params = {k: v.copy() for k, v in start.items()}
        opt = Adam(be, params, lr=1e-2) if adam else SGD(be, params, 0.1, 0.9)
        step = dict(grads)
        if factored:
            step["W"] = FactoredGradient(be.K, [(A, D, [0, 13, 26], [1.0, 1.0], 0, 60)], tree_merges(tree_top(2), 0, 2),
                                         np.full((60, 50), np.nan, np.float32))
        handoffs.clear()
        opt.step(step)
        results.append([params[k].tobytes() for k in params])
        assert len(handoffs) == (0 if limit > 3050 and not factored else 1), (limit, factored)
    assert results[0] == results[1]


@pytest.mark.parametrize("kind", ["stacked", "classifier"])
def test_a_pass_through_the_layers_is_one_hand_off_to_the_threads(kind, monkeypatch):
    """Each thread takes its group of blocks through all the layers, forward, the loss and
    backward: one hand-off per step, whatever the depth (a hand-off per layer left 2
    threads no faster than one: ~90 us each on a 2-vCPU VM; one per pass cost ~200 us
    each on another)."""
    import aepar.rows as rows
    monkeypatch.setattr(aepar, "THREADS", 2)
    calls = []
    real = rows.parallel_map
    monkeypatch.setattr(rows, "parallel_map", lambda fn, items: calls.append(1) or real(fn, items))
    be = _be("numba", "float32")
    x = _data(n=60, d=40, seed=4).astype(np.float32)
    if kind == "classifier":
        x[:, -1] = np.floor(3 * x[:, 0])
        model = Classifier(be, [39, 16, 12, 8], 3, seed=3, batch=60)
    else:
        model = StackedAutoencoder(be, [40, 24, 12, 6], loss="xent", seed=3, batch=60)
    blocks = [x[0:13], x[13:26], x[26:38], x[38:60]]
    model.block_factors(blocks, [np.random.default_rng((5, b)) for b in range(4)], 1 / 60,
                        [{k: be.xp.zeros(s, np.float32) for k, s in model.grad_shapes().items()} for _ in blocks])
    assert len(calls) == 1


@pytest.mark.parametrize("blocks", [1, 8])
@pytest.mark.parametrize("kind", ["rbm", "stacked"])
def test_a_blocks_row_fills_one_slice_after_its_factored_gradients(kind, blocks):
    """What the blocks fill, clear and add each step is one slice: every gradient that is not
    factored, the step's sums and the flag, and no factored weight (those block_outer_sum
    writes); a row's views are made once and handed out in a new dict each time."""
    from aepar.parallel.data_parallel import _Buffers

    be = _be()
    model = RBM(be, 40, 24, batch=100, seed=3) if kind == "rbm" else StackedAutoencoder(be, [40, 24, 6], seed=3)
    buf = _Buffers(model, Shard.of(be, _data(n=300, d=40), blocks), None, be, allreduce=False)
    assert buf.factored == ([] if blocks == 1 else list(model.factored))
    row = buf.rows[0]
    assert buf.filled.stop == row.shape[0] > buf.n_grad + buf.n_extra
    views = buf.views(row)
    for name, grad in views.items():
        start = (grad.__array_interface__["data"][0] - row.__array_interface__["data"][0]) // row.itemsize
        inside = buf.filled.start <= start and start + grad.size <= buf.filled.stop
        assert inside == (name not in buf.factored), name
    again = buf.views(row)
    assert again is not views and all(again[k] is views[k] for k in views)
    assert not any(buf.views(row.copy())[k] is views[k] for k in views)


def test_stacked_rows_take_consecutive_blocks_as_they_lie_and_copy_the_rest():
    """The blocks' factors, sliced from the array a kernel stacked them in, are that array's
    rows (no copy); parts from elsewhere, with a gap, or out of order are copied together.
    Either way the rows are the parts' one after another."""
    buffer = np.zeros(120, np.float32)
    a = buffer[10:70].reshape(12, 5)  # a view, as a kernel's cached buffer gives
    a[:] = np.arange(60).reshape(12, 5)
    together = stacked_rows(np, [a[0:3], None, a[3:3], a[3:7], a[7:12]], 5, np.float32)
    assert np.shares_memory(together, buffer) and np.array_equal(together, a)
    other = a.copy()
    for parts in ([a[0:3], other[3:7]], [a[0:3], a[4:7]], [a[3:7], a[0:3]], [a[:, :4], a[3:7, :4]]):
        copied = stacked_rows(np, parts, parts[0].shape[1], np.float32)
        assert not np.shares_memory(copied, buffer) and np.array_equal(copied, np.concatenate(parts))
    assert stacked_rows(np, [None, a[0:0]], 5, np.float32).shape == (0, 5)
    # the CPU kernels' arrays: aligned views of a byte buffer (kernels.memory), as the
    # factors of rbm_cd_factors_blocks come
    aligned = memory.empty((12, 5), np.float32)
    aligned[:] = a
    together = stacked_rows(np, [aligned[0:3], aligned[3:7], aligned[7:12]], 5, np.float32)
    assert np.shares_memory(together, aligned) and np.array_equal(together, a)
    assert together.__array_interface__["data"][0] == aligned.__array_interface__["data"][0]


def test_block_rows_stack_consecutive_blocks_as_views_of_their_array():
    """Blocks known to lie in one array (BlockRows) stack as a view of it, a slice of them
    too; their factors (BlockFactor) are views where they are consecutive blocks of the
    same arrays, several such runs (each thread's blocks) are read where they lie as parts
    with a row of starts each, and anything else is copied together: the same chain of
    rows for every block either way (what block_outer_sum reads: ``interleaved``)."""
    a = memory.empty((12, 5), np.float32)
    a[:] = np.arange(60).reshape(12, 5)
    rows = BlockRows(a, [0, 3, 3, 7, 12])
    assert len(rows) == 4 and [r.shape[0] for r in rows] == [3, 0, 4, 5]
    for part in (rows, rows[1:], rows[2:3], rows[4:]):
        together = stacked_rows(np, part, 5, np.float32)
        assert np.shares_memory(together, a) or together.size == 0
        assert np.array_equal(together, np.concatenate([np.empty((0, 5), np.float32)] + list(part)))
    d = memory.empty((12, 2), np.float32)
    d[:] = np.arange(24).reshape(12, 2)
    d_rows = BlockRows(d, rows.starts)
    factors = [BlockFactor(rows, d_rows, k, 0.5) for k in range(4)]
    assert factors[3][2] == 0.5 and np.array_equal(factors[3][0], a[7:12])
    va, vd, vstarts = factor_rows(np, factors[1:], (5, 2), np.float32)
    assert np.shares_memory(va, a) and np.shares_memory(vd, d) and list(vstarts) == [0, 0, 4, 9]
    assert np.array_equal(va, a[3:12]) and np.array_equal(vd, d[3:12])
    other = BlockFactor(BlockRows(a.copy(), rows.starts), d_rows, 3, 0.5)  # the same rows, another array
    for parts, apart in (([factors[0], factors[3]], True), ([factors[2], factors[0]], True),
                         ([factors[2], other], True), ([factors[0], None, factors[3]], False)):
        # a gap, out of order, another array: runs where they lie; a block with no factors: copied
        got = factor_rows(np, parts, (5, 2), np.float32)
        assert (np.ndim(got[2]) == 2) == apart and np.shares_memory(got[0][0] if apart else got[0], a) == apart
        chain_a, chain_d, chain = interleaved(*got)
        assert list(chain) == factor_starts(parts)
        for got_rows, j in ((chain_a, 0), (chain_d, 1)):
            assert np.array_equal(got_rows, np.concatenate([p[j] for p in parts if p is not None]))


def test_factors_of_two_parts_stack_part_by_part():
    """A factor given as parts (the tied autoencoder's A = (x, dz2), D = (dz1, h)): an item
    of BlockRows over a tuple is the tuple of each part's rows; consecutive blocks are
    views of each part, several runs of them each part's runs side by side (part after
    part), anything else is copied together part by part, into a tuple of as many parts:
    each block's chain its rows of x, then of dz2, every way."""
    x, dz2 = (memory.empty((12, 5), np.float32) for _ in range(2))
    dz1, h = (memory.empty((12, 2), np.float32) for _ in range(2))
    for i, arr in enumerate((x, dz2, dz1, h)):
        arr[:] = np.arange(arr.size).reshape(arr.shape) + 100 * i
    a_rows, d_rows = BlockRows((x, dz2), [0, 3, 3, 7, 12]), BlockRows((dz1, h), [0, 3, 3, 7, 12])
    assert [tuple(p.shape[0] for p in item) for item in a_rows] == [(3, 3), (0, 0), (4, 4), (5, 5)]
    factors = [BlockFactor(a_rows, d_rows, k, 1.0) for k in range(4)]
    (fx, fdz2), (fdz1, fh), _ = factors[2]
    assert np.array_equal(fx, x[3:7]) and np.array_equal(fdz2, dz2[3:7]) and np.array_equal(fh, h[3:7])
    (vx, vdz2), (vdz1, vh), _ = factor_rows(np, factors[1:], (5, 2), np.float32)
    assert all(np.shares_memory(v, w) for v, w in ((vx, x), (vdz2, dz2), (vdz1, dz1), (vh, h)))
    assert np.array_equal(vx, x[3:12]) and np.array_equal(vh, h[3:12])
    (cx, cdz2), (cdz1, ch), _ = factor_rows(np, [factors[3], None, factors[0]], (5, 2), np.float32)
    assert not np.shares_memory(cx, x)
    for got, arr in ((cx, x), (cdz2, dz2), (cdz1, dz1), (ch, h)):
        assert np.array_equal(got, np.concatenate([arr[7:12], arr[0:3]]))
    runs = factor_rows(np, [factors[3], factors[0]], (5, 2), np.float32)  # two runs: four parts, x's then dz2's
    assert [p.base is None or np.shares_memory(p, w) for p, w in zip(runs[0], (x, x, dz2, dz2))] == [True] * 4
    assert np.asarray(runs[2]).tolist() == [[0, 5, 5], [0, 0, 3]] * 2
    chain_a, chain_d, _ = interleaved(*runs)
    want_a = np.concatenate([x[7:12], dz2[7:12], x[0:3], dz2[0:3]])
    want_d = np.concatenate([dz1[7:12], h[7:12], dz1[0:3], h[0:3]])
    assert np.array_equal(chain_a, want_a) and np.array_equal(chain_d, want_d)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.05, 20.0), min_size=1, max_size=16), st.integers(0, 200))
def test_weighted_ranges_share_every_block_in_order_by_speed(speeds, extra):
    """Contiguous runs in rank order covering every block, a block at least each, and a
    faster rank never holds fewer blocks than a slower one by more than the rounding."""
    count = len(speeds) + extra
    ranges = weighted_ranges(count, speeds)
    assert ranges[0][0] == 0 and ranges[-1][1] == count and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [stop - first for first, stop in ranges]
    assert min(sizes) >= 1
    total = sum(speeds)
    for size, speed in zip(sizes, speeds):  # near the proportional share; the floor of one block aside
        assert size <= max(1, count * speed / total) + len(speeds) + 1


def test_weighted_ranges_follow_the_speeds_and_refuse_what_cannot_be_shared():
    assert weighted_ranges(8, [1, 1]) == [(0, 4), (4, 8)]
    assert weighted_ranges(8, [3, 1]) == [(0, 6), (6, 8)]
    assert weighted_ranges(4, [1, 1, 1, 100]) == [(0, 1), (1, 2), (2, 3), (3, 4)]  # a block each at least
    for count, speeds in ((1, [1, 1]), (8, [1, 0]), (8, [1, float("nan")]), (8, [])):
        with pytest.raises(ValueError):
            weighted_ranges(count, speeds)


def test_a_tree_sum_takes_any_share_of_the_blocks_in_order_and_refuses_others():
    from aepar.parallel.blocks import TreeSum

    class TwoRanks:  # the plan is made from the ranges alone: no messages here
        size, rank = 2, 0
    for bad in ([(0, 5), (6, 8)], [(0, 8), (8, 8)], [(0, 4)], [(4, 8), (0, 4)]):
        with pytest.raises(ValueError, match="do not share"):
            TreeSum(TwoRanks(), 8, bad)
    tree = TreeSum(TwoRanks(), 8, [(0, 7), (7, 8)])
    assert (tree.first, tree.stop) == (0, 7) and tree.nodes == [(2, 0), (1, 4), (0, 6)]


@settings(max_examples=15, deadline=None)
@given(n_threads=st.integers(1, 3), adam=st.booleans(), trust=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 2**16))
def test_a_gradient_left_as_factors_steps_as_the_written_one(n_threads, adam, trust, seed):
    """aepar.optim.FactoredGradient: SGD takes it inside its step (block_outer_sum_sgd, one
    call per band of rows), Adam writes and steps each band in one call, LARS writes it
    out first (its rates need the norms): the bits of the step with
    the gradient written out, on any number of threads."""
    from aepar.optim import SGD, FactoredGradient
    from aepar.rows import block_bounds, tree_merges, tree_top
    be = _be("numba", "float32")
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((60, 33)).astype(np.float32)
    D = rng.standard_normal((60, 21)).astype(np.float32)
    starts, merges, alphas = [0, 13, 26, 38, 39, 60], tree_merges(tree_top(5), 0, 5), [1.0, -0.5, 1.0, 2.0, 1.0]
    start = {"W": rng.standard_normal((33, 21)).astype(np.float32), "b": rng.standard_normal(21).astype(np.float32)}
    gb = rng.standard_normal(21).astype(np.float32)
    old = aepar.THREADS
    results = []
    try:
        aepar.THREADS = n_threads
        for factored in (False, True):
            params = {k: v.copy() for k, v in start.items()}
            opt = Adam(be, params, lr=1e-2, weight_decay=0.3) if adam else SGD(be, params, 0.1, 0.9, trust=trust)
            for _ in range(2):
                out = np.full((33, 21), np.nan, np.float32)
                if factored:
                    bounds = block_bounds(33, n_threads)
                    W = FactoredGradient(be.K, [(A[:, lo:hi], D, starts, alphas, lo, hi)
                                                for lo, hi in zip(bounds[:-1], bounds[1:])], merges, out)
                else:
                    W = be.K.block_outer_sum(A, D, starts, merges, alphas, out)
                opt.step({"W": W, "b": gb}) if adam else opt.step({"W": W, "b": gb}, weight_decay={"W": 2e-4})
            state = opt.m if adam else opt.velocity
            results.append([params[k].tobytes() for k in params] + [state[k].tobytes() for k in state])
    finally:
        aepar.THREADS = old
    assert results[0] == results[1]


@pytest.mark.parametrize("adam", [False, True])
def test_a_step_on_factored_gradients_is_one_hand_off_to_the_threads(adam, monkeypatch):
    """SGD and Adam take a factored weight gradient band by band, each band written and
    stepped by the same call, with the other parameters' bands: one hand-off a step (Adam
    wrote every band out in a hand-off of its own, then stepped in another)."""
    from aepar.optim import SGD, FactoredGradient
    from aepar.rows import block_bounds, tree_merges, tree_top
    calls = _optimiser_handoffs(monkeypatch)
    be = _be("numba", "float32")
    rng = np.random.default_rng(7)
    A, D = rng.standard_normal((26, 9)).astype(np.float32), rng.standard_normal((26, 5)).astype(np.float32)
    params = {"W": rng.standard_normal((9, 5)).astype(np.float32), "b": np.zeros(5, np.float32)}
    opt = Adam(be, params, lr=1e-2) if adam else SGD(be, params, 0.1, 0.9)
    bounds = block_bounds(9, 2)
    W = FactoredGradient(be.K, [(A[:, lo:hi], D, [0, 13, 26], [1.0, 1.0], lo, hi)
                                for lo, hi in zip(bounds[:-1], bounds[1:])], tree_merges(tree_top(2), 0, 2),
                         np.full((9, 5), np.nan, np.float32))
    before = params["W"].copy()
    opt.step({"W": W, "b": np.ones(5, np.float32)})
    assert len(calls) == 1 and not (params["W"] == before).any()
    assert np.isfinite(W.out).all() == adam  # Adam writes the gradient out; SGD steps inside the sum


class Planted:
    """A guard with a fault planted that never fires: the trainer then writes every sum out
    (a fault may poison it) and takes each block's own path, as it does on several ranks."""
    faults = ["never"]

    def flags(self):
        return 0.0

    def step(self, poison=None):
        pass

    def decide(self, flags):
        return False, False


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["rbm", "ae"])
def test_one_process_steps_its_weights_inside_the_sum(kind, threads, monkeypatch):
    """One process holding every block: the layers' weights take their SGD step inside the
    blocks' sum (block_outer_sum_sgd), with the weights of the step on the written sum;
    on one thread each step is one call of the layer's fused blocks step (its kernel
    ``*_update_blocks``), with those bits too."""
    import aepar.kernels.nb as nb
    monkeypatch.setattr(aepar, "THREADS", threads)
    be = _be("numba", "float32")
    x = _data(n=300, d=40, seed=2).astype(np.float32)

    def trained(guard=None, fused=True):
        model = (RBM if kind == "rbm" else AELayer)(be, 40, 24, batch=100, seed=3)
        if not fused:
            model.fused_blocks_step = None
        train_epoch(model, Shard.of(be, x, 8), 0, guard=guard)
        return {k: be.to_host(v).tobytes() for k, v in model.params.items()}
    calls, fused_calls = [], []
    real, step = nb.block_outer_sum_sgd, "rbm_cd_update_blocks" if kind == "rbm" else "tied_ae_update_blocks"
    monkeypatch.setattr(nb, "block_outer_sum_sgd", lambda *a: calls.append(1) or real(*a))
    real_step = getattr(nb, step)
    monkeypatch.setattr(nb, step, lambda *a: fused_calls.append(1) or real_step(*a))
    inside = trained(fused=False)
    assert len(calls) == 3 * threads and not fused_calls  # a call per step and band
    assert trained() == inside and len(fused_calls) == (3 if threads == 1 else 0)
    calls.clear()
    assert trained(Planted()) == inside and not calls  # the sum written out, then the step


@pytest.mark.parametrize("rows, batch", [(530, 60), (50, 5)], ids=["uneven batches", "empty blocks"])
@pytest.mark.parametrize("kind", ["rbm", "gaussian rbm", "ae", "linear ae", "stack, Adam", "stack, mse",
                                  "classifier", "cae"])
@pytest.mark.parametrize("kernels", ["numpy"] + kernel_set_params())
def test_one_process_on_one_thread_takes_a_batch_s_blocks_in_one_call(kernels, kind, rows, batch, monkeypatch):
    """One process and one thread holding every block: each batch whose blocks all have
    rows is one call of the model's group_factors (_Epoch.whole_batch), or of its
    fused_blocks_step where it has one (the layers: gradients, tree and step in one kernel
    call), with the weights, optimiser state and step sums of the per-block path bit for
    bit (that path taken where a fault is planted, and for a batch with an empty block); a
    batch without rows is no step."""
    import aepar.parallel.data_parallel as dp
    from aepar.optim import SGD
    monkeypatch.setattr(aepar, "THREADS", 1)
    be = backend.select("gpu" if kernels == "cupy" else "cpu", kernels, "float32")
    x = _data(n=rows, d=48 if kind == "cae" else 40, seed=4).astype(np.float32)

    whole, fused = [], []
    real, real_fused = dp._Epoch.whole_batch, dp._Epoch.fused_blocks_step
    monkeypatch.setattr(dp._Epoch, "whole_batch", lambda self, k, scale: whole.append(k) or real(self, k, scale))
    monkeypatch.setattr(dp._Epoch, "fused_blocks_step",
                        lambda self, k, scale: fused.append(k) or real_fused(self, k, scale))

    if kind == "classifier":
        x[:, -1] = np.floor(3 * x[:, 0])

    def trained(guard=None):
        hidden = "gaussian" if kind.split()[0] in ("gaussian", "linear") else "bernoulli"
        if kind.startswith("stack"):
            model = StackedAutoencoder(be, [40, 24, 6], loss="xent" if "Adam" in kind else "mse", seed=3, batch=batch)
            model.optimizer = Adam(be, model.params, lr=0.01) if "Adam" in kind else SGD(be, model.params, 0.1, 0.9)
        elif kind == "classifier":
            model = Classifier(be, [39, 24, 6], 3, seed=3, batch=batch)
            model.optimizer = SGD(be, model.params, 0.1, 0.9)
        elif kind == "cae":
            model = ConvAutoencoder(be, (1, 4, 12), filters=(2, 3), seed=3, batch=batch)
            model.optimizer = Adam(be, model.params, lr=0.01)
        else:
            model = (RBM if kind.endswith("rbm") else AELayer)(be, 40, 24, hidden=hidden, batch=batch, seed=3)
        sums = [list(train_epoch(model, Shard.of(be, x, 8), epoch, guard=guard).sums) for epoch in range(2)]
        return [be.to_host(v).tobytes() for v in (*model.params.values(), *model.optimizer.state().values())], sums
    per_block = trained(Planted())
    assert not whole and not fused
    assert trained() == per_block
    # 50 rows in blocks of 6 or 7 and 10 batches: batches 0-5 take a row of every block, 6
    # of two blocks (per block), 7-9 of none (no step)
    layer = kind in ("rbm", "gaussian rbm", "ae", "linear ae")
    assert (fused if layer else whole) == 2 * list(range(9 if batch == 60 else 6)) and not (whole if layer else fused)


def test_steps_too_small_to_share_stay_on_the_calling_thread(monkeypatch):
    """A rank's step of fewer than SHARED_STEP_FLOPS (its share of a batch's rows times the
    model's FLOPs a row) runs on the calling thread: no hand-off to the other threads; one
    of that many hands its blocks to them; the same bits either way."""
    import aepar.parallel.data_parallel as dp
    from aepar import rows
    monkeypatch.setattr(aepar, "THREADS", 2)
    handed = []
    real = rows._Crew.start
    monkeypatch.setattr(rows._Crew, "start", lambda self, fn, shares: handed.append(1) or real(self, fn, shares))
    be = _be("numba", "float32")
    x = _data(n=300, d=40, seed=5).astype(np.float32)
    step = RBM(be, 40, 24, batch=100, seed=3).flops_per_sample() * 100
    results = []
    for limit, shared in ((step + 1, False), (step, True)):
        monkeypatch.setattr(dp, "SHARED_STEP_FLOPS", limit)
        model = RBM(be, 40, 24, batch=100, seed=3)
        handed.clear()
        train_epoch(model, Shard.of(be, x, 8), 0)
        assert bool(handed) == shared, limit
        assert rows.threads() == 2  # the calling thread's count given back after the epoch
        results.append([be.to_host(p).tobytes() for p in model.params.values()])
    assert results[0] == results[1]
    monkeypatch.setattr(dp, "SHARED_STEP_FLOPS", step / 2 + 1)  # a rank of two holds half of each batch's rows
    assert dp._small_steps(model, Shard.of(be, x, 8, 0, 2), 100) and not dp._small_steps(model, Shard.of(be, x, 8), 100)


@pytest.mark.parametrize("live", [[1, 2, 3], [0, 2, 3]], ids=["consecutive", "a gap"])
@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("kind", ["arrays", "floats"])
@pytest.mark.parametrize("kernels", ["numpy"] + kernel_set_params()[1:])
def test_step_sums_go_to_their_blocks_columns(kernels, kind, width, live):
    """Each live block's step sums land in its own row, sum j in column n_grad + j: stacked
    into each sum's column where the values are (0-d) arrays and the rows consecutive (a
    GPU's step), else one by one; nothing else in the rows is written."""
    from types import SimpleNamespace

    from aepar.parallel.data_parallel import _write_sums

    xp = backend.select("gpu" if kernels == "cupy" else "cpu", kernels, "float32").xp
    leaves = xp.asarray(np.full((5, 8), -1.0, np.float32))
    buf = SimpleNamespace(leaves=leaves, rows=[leaves[i] for i in range(5)], n_grad=3)
    extras = [tuple((xp.asarray if kind == "arrays" else float)(10.0 * b + j) for j in range(width)) for b in live]
    _write_sums(xp, buf, live, extras)
    want = np.full((5, 8), -1.0, np.float32)
    for b in live:
        want[b, 3:3 + width] = [10.0 * b + j for j in range(width)]
    assert np.array_equal(to_host(leaves), want)
