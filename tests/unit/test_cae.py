"""The convolutional autoencoder: whole-model float64 gradient, kernel sets agreeing with
the reference, blocks, learning, shapes it refuses, checkpoints. Synthetic data only."""
import numpy as np
import pytest

import aepar  # noqa: F401
from aepar import backend
from aepar.models.cae import ConvAutoencoder, check_image_shape
from aepar.optim import Adam
from aepar.parallel.data_parallel import train_epoch
from aepar.rows import Shard
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad

ALL_SETS = [pytest.param("numpy", id="numpy")] + kernel_set_params()


def _be(kernels="numpy", dtype="float64"):
    return backend.select("gpu" if kernels == "cupy" else "cpu", kernels, dtype)


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _images(n, shape=(1, 8, 8), seed=0):
    return np.random.default_rng(seed).random((n, int(np.prod(shape))))


def _zero_grads(model):
    return {k: model.be.xp.zeros_like(p) for k, p in model.params.items()}


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 4, 8)])
def test_gradient_of_the_whole_model_float64(shape):
    be = _be()
    model = ConvAutoencoder(be, shape, filters=(3, 4), seed=1)
    x = _images(3, shape, seed=2)
    grads = _zero_grads(model)
    loss, sq_err = model.loss_and_grad(x, grads)
    assert loss == pytest.approx(sq_err / 3)

    def f():
        return model.loss_and_grad(x, _zero_grads(model))[0]
    for name, p in model.params.items():
        assert_grad_close(grads[name], numerical_grad(f, p), rtol=1e-5, atol=1e-8, name=name)


def test_loss_is_the_papers_mean_squared_error():
    """Eq. 1-2: Σ_pixels (x − x̂)² per image, averaged over the images."""
    be = _be()
    model = ConvAutoencoder(be, (1, 8, 8), filters=(2, 3), seed=0)
    x = _images(5)
    y = _host(model.reconstruct(x))
    expect = np.mean(np.sum((x - y) ** 2, axis=1))
    assert model.loss_and_grad(x, _zero_grads(model))[0] == pytest.approx(expect, rel=1e-12)
    assert model.recon_error(Shard.of(be, x, 2)) == pytest.approx(expect, rel=1e-12)
    assert model.encode(x).shape == (5, model.code_size) == (5, 3 * 2 * 2)


@pytest.mark.parametrize("kernels", kernel_set_params())
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_kernel_sets_agree_with_the_reference(kernels, dtype):
    ref, other = _be("numpy", dtype), _be(kernels, dtype)
    x = _images(6, (1, 12, 12), seed=3).astype(dtype)
    a = ConvAutoencoder(ref, (1, 12, 12), filters=(4, 6), seed=5)
    b = ConvAutoencoder(other, (1, 12, 12), filters=(4, 6), seed=5)
    ga, gb = _zero_grads(a), _zero_grads(b)
    la, _ = a.loss_and_grad(x, ga)
    lb, _ = b.loss_and_grad(other.asarray(x), gb)
    assert float(lb) == pytest.approx(la, rel=float(100 * np.finfo(dtype).eps ** 0.5))
    for k in ga:
        assert_close(gb[k], ga[k], np.dtype(dtype), work=6 * 144 * 9, name=k)


def test_same_seed_same_model_different_seed_different_model():
    be = _be()
    a, b, c = (ConvAutoencoder(be, (1, 8, 8), seed=s) for s in (4, 4, 5))
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["W1"], c.params["W1"])


def test_blocks_do_not_change_a_step_up_to_rounding():
    """The gradient summed over blocks is the batch gradient (1 block vs 4)."""
    be = _be()
    x = _images(40, (1, 8, 8))
    out = []
    for count in (1, 4):
        model = ConvAutoencoder(be, (1, 8, 8), filters=(2, 3), seed=0, batch=20)
        train_epoch(model, Shard.of(be, x, count), 0, optimizer=Adam(be, model.params, lr=1e-2))
        out.append(model.params["W2"].copy())
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kernels", ["numpy"] + kernel_set_params())
def test_blocks_at_once_are_each_blocks_own_bits(kernels, threads, monkeypatch):
    """block_factors (the trainer's path for several blocks: a group of blocks per thread,
    one kernel call per layer) gives every block the gradients and loss of its
    leaf_gradient alone, bit for bit, however the threads group the blocks."""
    monkeypatch.setattr(aepar, "THREADS", threads)
    be = _be(kernels, "float32")
    model = ConvAutoencoder(be, (1, 8, 8), filters=(3, 4), seed=1, batch=20)
    x = be.asarray(_images(20, (1, 8, 8), seed=2).astype(np.float32))
    starts = [0, 3, 6, 10, 13, 17, 20]
    xs = [x[lo:hi] for lo, hi in zip(starts[:-1], starts[1:])]
    grads = [_zero_grads(model) for _ in xs]
    sums, factors = model.block_factors(xs, [None] * len(xs), 1 / 20, grads)
    assert factors == [{}] * len(xs)
    for xb, g, (sq_err,) in zip(xs, grads, sums):
        alone = _zero_grads(model)
        (want,) = model.leaf_gradient(xb, None, 1 / 20, alone)
        assert float(sq_err) == float(want)
        for k in alone:
            np.testing.assert_array_equal(be.to_host(g[k]), be.to_host(alone[k]), err_msg=k)


def test_learns_to_reconstruct():
    be = _be("numba", "float32")
    rng = np.random.default_rng(0)
    # blobs: smooth images a CAE can rebuild
    yy, xx = np.mgrid[:12, :12]
    x = np.stack([np.exp(-((yy - rng.uniform(2, 10)) ** 2 + (xx - rng.uniform(2, 10)) ** 2) / 8).ravel()
                  for _ in range(200)]).astype(np.float32)
    model = ConvAutoencoder(be, (1, 12, 12), filters=(4, 8), seed=0, batch=20)
    shard = Shard.of(be, x, 2)
    before = model.recon_error(shard)
    opt = Adam(be, model.params, lr=1e-2)
    for epoch in range(10):
        result = train_epoch(model, shard, epoch, optimizer=opt)
    assert model.epochs_done == 10
    after = model.recon_error(shard)
    assert after < 0.5 * before
    # an epoch's mean is taken before each step, while the weights move: against the error
    # after training it can only be compared once they stand still (lr 0)
    still = {k: p.copy() for k, p in model.params.items()}
    result = train_epoch(model, shard, 10, optimizer=Adam(be, model.params, lr=0.0))
    assert all(np.array_equal(still[k], model.params[k]) for k in still)
    # training sums: the same loss. Both take the same float32 reconstructions and sum their
    # squared errors in float64; training also rounds each block's sum of a step to float32
    # and adds the step's 2 blocks in float32: at most 2 roundings of u = eps/2 relative to
    # each step's (non-negative) total, so float32's eps relative to the epoch's (float64's
    # own roundings are 9 orders smaller)
    assert result.means[0] == pytest.approx(after, rel=float(np.finfo(np.float32).eps), abs=0)


@pytest.mark.parametrize("shape", [(1, 2, 2), (1, 6, 8), (1, 30, 30), (3, 32, 31), (0, 8, 8), (8, 8)])
def test_refuses_images_it_cannot_take(shape):
    with pytest.raises(ValueError, match="multiples of 4|channels, height, width"):
        check_image_shape(shape)
    with pytest.raises(ValueError):
        ConvAutoencoder(_be(), shape)


def test_state_round_trip_with_the_optimiser():
    be = _be()
    x = _images(20, (1, 8, 8))
    a = ConvAutoencoder(be, (1, 8, 8), filters=(2, 3), seed=0, batch=10)
    a.optimizer = Adam(be, a.params, lr=1e-2)
    train_epoch(a, Shard.of(be, x, 1), 0)
    b = ConvAutoencoder(be, (1, 8, 8), filters=(2, 3), seed=0, batch=10)  # same shuffles
    for p in b.params.values():
        p[...] = 0.5
    b.optimizer = Adam(be, b.params, lr=1e-2)
    b.load_state(a.state())
    assert b.optimizer.t == a.optimizer.t
    for model in (a, b):
        train_epoch(model, Shard.of(be, x, 1), 1)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)


def test_flops_count_the_convolutions():
    m = ConvAutoencoder(_be(), (1, 28, 28), filters=(16, 32))
    macs = 16 * 9 * 784 + 16 * 32 * 9 * 196 + 32 * 16 * 4 * 49 + 16 * 4 * 196
    assert m.flops_per_sample() == 6.0 * macs - 2.0 * 16 * 9 * 784  # no input gradient of the data
    assert m.code_size == 32 * 7 * 7
