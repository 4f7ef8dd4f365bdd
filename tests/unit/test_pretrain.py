"""Layer pre-trainers (RBM CD-1, autoencoder layer), the layer list and the global batches."""
import numpy as np
import pytest

import aepar  # noqa: F401  (threads before numpy work)
from aepar import backend
from aepar.errors import UserError
from aepar.models.ae_layer import AELayer
from aepar.models.rbm import RBM
from aepar.parallel.data_parallel import Minibatches, train_epoch
from aepar.stack import make_layers, parse_layers
from aepar.rows import Blocks, Shard
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close


def _be(kernels="numpy", dtype="float64"):
    device = "gpu" if kernels == "cupy" else "cpu"
    return backend.select(device, kernels, dtype)


def S(x, be=None, count=1):
    """The whole of ``x`` as one process's shard (``count`` fixed blocks)."""
    return Shard.of(be or _be(), x, count)


def _binary_data(n=400, d=36, seed=0):
    """Noisy copies of 4 binary prototypes: structure an RBM can learn quickly."""
    rng = np.random.default_rng(seed)
    protos = (rng.random((4, d)) < 0.4).astype(np.float64)
    x = protos[rng.integers(0, 4, n)]
    flip = rng.random((n, d)) < 0.03
    return np.where(flip, 1 - x, x)


# ---- parse_layers / make_layers ---------------------------------------------------------------

def test_parse_layers_accepts_the_paper_architecture():
    assert parse_layers("784-1000-500-250-30", 784) == [784, 1000, 500, 250, 30]
    assert parse_layers(" 64-8 ", 64) == [64, 8]


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("   ", "empty"),
    ("784-1000-x-30", "integers"),
    ("784-1000.5-30", "integers"),
    ("784", "at least one hidden"),
    ("784-0-30", "positive"),
    ("783-1000-30", "783"),
])
def test_parse_layers_rejects_bad_lists(text, fragment):
    with pytest.raises(UserError) as err:
        parse_layers(text, 784)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_make_layers_follows_the_recipe():
    be = _be()
    layers = make_layers(be, [20, 12, 8, 3], "rbm", seed=1, epochs=7)
    assert [type(l) for l in layers] == [RBM, RBM, RBM]
    assert [(l.n_in, l.n_out) for l in layers] == [(20, 12), (12, 8), (8, 3)]
    assert [l.hidden for l in layers] == ["bernoulli", "bernoulli", "gaussian"]
    assert [l.lr for l in layers] == [0.1, 0.1, 0.001]
    assert [l.epochs for l in layers] == [7, 7, 7]
    assert [l.layer_index for l in layers] == [0, 1, 2]
    for l in layers:
        assert l.weight_cost == 2e-4 and l.batch == 100 and l.momentum == (0.5, 0.9)
        assert not l.params["bv"].any() and not l.params["bh"].any()
    # W ~ 0.1 N(0, 1): the sample std of 240 draws is within 30% of 0.1
    assert 0.07 < float(layers[0].params["W"].std()) < 0.13
    ae = make_layers(be, [20, 12, 3], "ae", epochs=[2, 5])
    assert [type(l) for l in ae] == [AELayer, AELayer] and [l.epochs for l in ae] == [2, 5]
    with pytest.raises(UserError):
        make_layers(be, [20, 12, 3], "pca")


def test_momentum_switches_after_five_epochs():
    layer = RBM(_be(), 4, 3)
    assert [layer.momentum_at(e) for e in range(7)] == [0.5] * 5 + [0.9] * 2


# ---- minibatches over fixed blocks ---------------------------------------------------------------

@pytest.mark.parametrize("n, count, batch", [(23, 1, 5), (23, 4, 5), (100, 8, 100), (37, 3, 10), (5, 8, 2)])
def test_minibatches_cover_every_row_once_and_do_not_depend_on_the_ranks(n, count, batch):
    serial = Minibatches(Blocks.of(n, count), batch, (7, 1), epoch=2)
    assert serial.n_batches == -(-n // batch) and int(serial.sizes.sum()) == n
    seen = np.concatenate([serial.rows(b, k) for k in range(serial.n_batches) for b in range(count)])
    assert sorted(seen.tolist()) == list(range(n))
    for size in range(1, count + 1):  # the same rows of every block in every batch, whoever holds it
        for rank in range(size):
            part = Minibatches(Blocks.of(n, count, rank, size), batch, (7, 1), epoch=2)
            offset = part.blocks.rows.start
            for b in part.blocks.mine:
                for k in range(part.n_batches):
                    np.testing.assert_array_equal(part.rows(b, k) + offset, serial.rows(b, k))
    other = Minibatches(Blocks.of(n, count), batch, (7, 1), epoch=3)
    if n > count:
        assert any(not np.array_equal(other.rows(b, 0), serial.rows(b, 0)) for b in range(count))


# ---- RBM ---------------------------------------------------------------------------------------

def test_rbm_epoch_is_deterministic_for_a_seed():
    be, x = _be(), _binary_data()
    a, b, c = (RBM(be, 36, 10, seed=s, layer_index=1) for s in (5, 5, 6))
    x_before = x.copy()
    errs = [train_epoch(l, S(x, be), 0).means[0] for l in (a, b, c)]
    np.testing.assert_array_equal(x, x_before)  # the data is not touched
    assert errs[0] == errs[1]
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert not np.allclose(a.params["W"], c.params["W"])
    # another epoch number draws another shuffle and other noise
    d = RBM(be, 36, 10, seed=5, layer_index=1)
    train_epoch(d, S(x, be), 1)
    assert not np.allclose(a.params["W"], d.params["W"])


def test_cd1_reduces_reconstruction_error():
    be, x = _be(), _binary_data()
    rbm = RBM(be, 36, 16, batch=20, seed=0)
    before = rbm.recon_error(S(x, be))
    errs = [train_epoch(rbm, S(x, be, 4), e).means[0] for e in range(8)]
    after = rbm.recon_error(S(x, be))
    assert errs[-1] < 0.5 * errs[0], errs
    assert after < 0.5 * before, (before, after)
    h = rbm.transform(S(x, be)).x
    assert h.shape == (400, 16) and h.min() >= 0 and h.max() <= 1
    r = rbm.reconstruct(S(x, be)).x
    assert r.shape == x.shape and r.min() >= 0 and r.max() <= 1


def test_gaussian_code_layer_learns_real_valued_input():
    be = _be()
    rng = np.random.default_rng(1)
    # inputs in (0, 1) that lie near a 3-dimensional subspace: hidden probabilities of a layer below
    z = rng.standard_normal((300, 3))
    x = 1 / (1 + np.exp(-(z @ rng.standard_normal((3, 12)))))
    rbm = RBM(be, 12, 3, hidden="gaussian", lr=0.01, batch=20, seed=2)
    before = rbm.recon_error(S(x, be))
    for e in range(15):
        train_epoch(rbm, S(x, be), e)
    assert rbm.recon_error(S(x, be)) < 0.7 * before
    codes = rbm.transform(S(x, be)).x
    assert codes.shape == (300, 3) and (codes < 0).any()  # linear units: not squashed


@pytest.mark.parametrize("count", [1, 4])
def test_an_epoch_paused_and_resumed_equals_one_run(count):
    """A checkpoint request made after the 3rd step pauses the epoch after the next one; the
    rest, from its state in another model (parameters, momenta, streams), ends where one
    uninterrupted epoch does: the fused one-block path (count 1) and the blocked one alike."""
    from aepar.comm import Comm
    from aepar.guard import CHECKPOINT, Guard

    class PauseAt3(Guard):
        def local_request(self):
            return CHECKPOINT if self.steps == 3 else 0.0

    be, x = _be("numba", "float32"), _binary_data(n=500, d=20)
    whole, first, second = (RBM(be, 20, 8, batch=50, seed=2) for _ in range(3))
    for layer in (whole, first):
        train_epoch(layer, S(x, be, count), 0)
    train_epoch(whole, S(x, be, count), 6)
    paused = train_epoch(first, S(x, be, count), 6, guard=PauseAt3(Comm.serial(), "t", faults=[]))
    assert not paused.complete and paused.state.batch == 4
    second.load_state(first.state())
    train_epoch(second, S(x, be, count), 6, resume=paused.state)
    for k in whole.params:
        np.testing.assert_array_equal(second.params[k], whole.params[k])


def test_weight_cost_shrinks_weights_without_data_gradient():
    be = _be()
    x = np.full((10, 4), 0.5)
    plain, decayed = (RBM(be, 4, 3, weight_cost=wc, seed=1, lr=0.1, batch=10) for wc in (0.0, 0.5))
    train_epoch(plain, S(x, be), 0)
    train_epoch(decayed, S(x, be), 0)
    assert np.abs(decayed.params["W"]).sum() < np.abs(plain.params["W"]).sum()
    # biases carry no weight cost
    np.testing.assert_allclose(decayed.params["bv"], plain.params["bv"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernels", kernel_set_params())
@pytest.mark.parametrize("layer", [RBM, AELayer])
@pytest.mark.parametrize("hidden", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("count", [1, 3])
def test_layer_epoch_matches_the_reference_kernels(kernels, layer, hidden, count):
    """Blocked steps (3 blocks) and, for the RBM, fused ones (1 block), their error sums
    included (on the GPU the steps' sums stay there until the epoch ends)."""
    x = _binary_data(n=120, d=20)
    ref, other = (layer(_be(k), 20, 7, hidden=hidden, lr=0.05, batch=30, seed=3) for k in ("numpy", kernels))
    e_ref, e_other = (train_epoch(r, S(x, r.be, count), 0).means[0] for r in (ref, other))
    assert abs(e_ref - e_other) <= 1e-9 * max(1.0, e_ref)
    for k in ref.params:
        assert_close(other.params[k], ref.params[k], np.float64, work=120, name=k)


def test_rbm_float32_tracks_float64():
    x = _binary_data(n=200, d=20)
    r64, r32 = (RBM(_be("numpy", dt), 20, 8, batch=25, seed=4) for dt in ("float64", "float32"))
    for e in range(3):
        e64, e32 = (train_epoch(r, S(x, r.be, 2), e).means[0] for r in (r64, r32))
    assert r32.params["W"].dtype == np.float32
    assert abs(e64 - e32) < 1e-3 * e64
    np.testing.assert_allclose(r32.params["W"], r64.params["W"], atol=1e-4)


def test_flops_per_sample_scales_with_the_weights():
    be = _be()
    small, big = RBM(be, 784, 1000), RBM(be, 250, 30)
    assert small.flops_per_sample() > 100 * big.flops_per_sample()
    assert small.flops_per_sample() >= 10 * 784 * 1000


# ---- autoencoder layer -----------------------------------------------------------------------

@pytest.mark.parametrize("hidden", ["bernoulli", "gaussian"])
def test_ae_layer_reduces_its_error(hidden):
    be, x = _be(), _binary_data()
    layer = AELayer(be, 36, 8, hidden=hidden, lr=0.1 if hidden == "bernoulli" else 0.02, batch=20, seed=0)
    before = layer.recon_error(S(x, be))
    errs = [train_epoch(layer, S(x, be, 4), e).means[0] for e in range(10)]
    assert errs[-1] < 0.6 * errs[0], errs
    assert layer.recon_error(S(x, be)) < 0.6 * before
    assert set(layer.params) == {"W", "bv", "bh"} and layer.params["W"].shape == (36, 8)
    assert layer.transform(S(x, be)).x.shape == (400, 8)


def test_ae_layer_gradient_is_exact():
    """One full-batch step without momentum or weight cost moves W by -lr * dJ/dW."""
    from tests.gradcheck import assert_grad_close, numerical_grad

    be = _be()
    x = _binary_data(n=6, d=5)
    layer = AELayer(be, 5, 3, lr=1.0, momentum=(0.0, 0.0), weight_cost=0.0, batch=6, seed=1)
    p0 = {k: v.copy() for k, v in layer.params.items()}

    def loss():
        y = layer._reconstruct(x)
        return 0.5 * float(((y - x) ** 2).sum()) / 6

    num = {k: numerical_grad(loss, layer.params[k]) for k in layer.params}
    train_epoch(layer, S(x, be), 0)
    for k in layer.params:
        assert_grad_close(p0[k] - layer.params[k], num[k], name=k)


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("hidden", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("threads", [1, 2])
def test_ae_layer_one_block_step_is_one_kernel_call_with_the_blocked_bits(kernels, hidden, threads, monkeypatch):
    """One block on one process: a step is ``tied_ae_update``, with the bits of the blocked
    path (on any number of threads)."""

    class Blocked(AELayer):
        fused_step = None

    import aepar.parallel.data_parallel as dp
    x = _binary_data(n=120, d=20).astype(np.float32)
    monkeypatch.setattr(aepar, "THREADS", threads)
    monkeypatch.setattr(dp, "SHARED_STEP_FLOPS", 0)  # the threads' path, small as this layer is
    fused, blocked = (cls(_be(kernels, "float32"), 20, 7, hidden=hidden, batch=30, seed=3)
                      for cls in (AELayer, Blocked))
    for epoch in range(2):
        e_fused, e_blocked = (train_epoch(m, S(x, m.be), epoch).means[0] for m in (fused, blocked))
        assert e_fused == pytest.approx(e_blocked, rel=1e-6)  # the blocked path keeps a step's error in float32
    for k in fused.params:
        assert np.array_equal(fused.params[k], blocked.params[k]), k
        assert np.array_equal(fused.optimizer.velocity[k], blocked.optimizer.velocity[k]), k


def _probes_on_a_fake_clock(monkeypatch, seconds, blocks=None):
    """(aepar.pretrain, a backend, the options) with measure_costs' clock stepping by
    ``seconds`` in turn, its epochs and warm-up doing nothing (a 20-8-4 stack, batch 100);
    each epoch's count of blocks appended to ``blocks``."""
    from aepar import pretrain

    clock = iter(np.cumsum(seconds))
    monkeypatch.setattr(pretrain, "be_time", lambda be: next(clock))
    monkeypatch.setattr(pretrain, "train_epoch",
                        lambda layer, h, epoch, batch: (blocks if blocks is not None else []).append(h.blocks.count))
    monkeypatch.setattr(pretrain, "warm_up", lambda be, kind: None)
    args = pretrain.parse_args(["--layers", "20-8-4", "--pretrainer", "ae", "--batch", "100", "--epochs", "1"])
    return pretrain, backend.select("cpu", "numpy", "float32"), args


def test_the_planners_layer_epoch_is_the_faster_of_two_probes_as_one_block_and_in_the_fixed_blocks(monkeypatch):
    """measure_costs times each probe layer's epoch twice and keeps the faster: a process's
    first epoch of a shape also loads its compiled tiles (here the first takes 3 s, the
    second 1 s, on 600 of 2000 rows); once as one block (model's, data's on one rank),
    once in the --reduce-blocks fixed blocks (greedy's, sync's, hybrid's: here 2 s)."""
    blocks = []
    pretrain, be, args = _probes_on_a_fake_clock(monkeypatch, [0.0, 3.0, 0.0, 1.0, 0.0, 2.5, 0.0, 2.0, 0.0, 0.5] * 2,
                                                 blocks)
    costs = pretrain.measure_costs(be, args, np.random.default_rng(0).random((2000, 20)), 2)
    assert costs.epoch_s == pytest.approx((1.0 * 2000 / 600,) * 2)
    assert costs.blocked_epoch_s == pytest.approx((2.0 * 2000 / 600,) * 2)
    assert costs.transform_s == pytest.approx((0.5 * 2000 / 600,) * 2)
    assert blocks == [1, 1, args.reduce_blocks, args.reduce_blocks] * 2 and args.reduce_blocks == 8
    # --reduce-blocks 1: the blocked epoch is the one-block epoch, timed once
    blocks.clear()
    pretrain, be, args = _probes_on_a_fake_clock(monkeypatch, [0.0, 3.0, 0.0, 1.0, 0.0, 0.5] * 2, blocks)
    args.reduce_blocks = 1
    costs = pretrain.measure_costs(be, args, np.random.default_rng(0).random((2000, 20)), 2)
    assert blocks == [1, 1] * 2 and costs.blocked_epoch_s is None
    assert costs.blocked == costs.epoch_s == pytest.approx((1.0 * 2000 / 600,) * 2)


def test_the_planner_times_syncs_validation_on_the_rows_it_holds_out(monkeypatch):
    """With rows held out (sync's and hybrid's validation), measure_costs also times the
    reconstruction of the probe rows and scales it to the held-out rows (here 0.25 s on
    600 rows, for 200 held out); auto asks for the rows sync's own split holds out."""
    from aepar.comm import Comm
    from aepar.data.sources import Digits
    from aepar.parallel import synchronized

    pretrain, be, args = _probes_on_a_fake_clock(monkeypatch,
                                                 [0.0, 3.0, 0.0, 1.0, 0.0, 2.5, 0.0, 2.0, 0.0, 0.5, 0.0, 0.25] * 2)
    x = np.random.default_rng(0).random((2000, 20)).astype(np.float32)
    costs = pretrain.measure_costs(be, args, x, 2, held_out=200)
    assert costs.epoch_s == pytest.approx((1.0 * 2000 / 600,) * 2)
    assert costs.validation_s == pytest.approx((0.25 * 200 / 600,) * 2)
    assert costs.transform_s == pytest.approx((0.5 * 2000 / 600,) * 2)
    assert (costs.held_out, costs.n_train) == (200, 2000)

    labels = np.arange(2000) % 10
    digits = Digits(x, labels, x[:10], labels[:10], "test", "test")
    asked = []

    def measure(be, args, x, ranks, held_out=0):
        asked.append(held_out)
        return costs
    monkeypatch.setattr(pretrain, "measure_costs", measure)
    pretrain.choose_scheme(be, Comm(None), args, digits)
    assert asked == [synchronized.prepare(digits, args)[1].shape[0]] == [200]
