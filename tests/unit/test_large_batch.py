"""The data scheme's large-batch rules: layer-wise adaptive rates (LARS) in the layers' SGD
(each weight matrix's rate from its own norms, biases at the plain rate, the fused
one-process step, which has no gradient to measure, left out) and the rate schedule
(warm-up, cosine decay) that the layers, fine-tuning and the classifier share."""
import argparse
import math

import numpy as np
import pytest

import aepar  # noqa: F401  (threads before numpy work)
from aepar import backend
from aepar.models.rbm import RBM
from aepar.optim import SGD
from aepar.parallel.data_parallel import train_epoch
from aepar.rows import Shard
from aepar.schemes.data import schedule


def _be():
    return backend.select("cpu", "numpy", "float64")


def _params(rng):
    return {"W": rng.standard_normal((6, 4)), "b": rng.standard_normal(4)}


def test_a_weight_matrix_steps_at_the_lars_rate_and_a_bias_at_the_plain_one():
    be, rng = _be(), np.random.default_rng(0)
    params, grads = _params(rng), _params(rng)
    W0, b0 = params["W"].copy(), params["b"].copy()
    lr, trust, decay, momentum = 0.5, 0.01, 0.002, 0.9
    opt = SGD(be, params, lr, momentum, trust=trust)
    opt.step(grads, weight_decay={"W": decay})
    rate = lr * trust * np.linalg.norm(W0) / (np.linalg.norm(grads["W"]) + decay * np.linalg.norm(W0))
    np.testing.assert_allclose(params["W"], W0 - rate * (grads["W"] + decay * W0), rtol=1e-12)
    np.testing.assert_allclose(params["b"], b0 - lr * grads["b"], rtol=1e-12)


def test_the_step_is_a_fixed_fraction_of_the_norm_whatever_the_gradients_scale():
    """What makes LARS fit large batches: a gradient 100 times smaller (a batch's average
    of less noise) moves the weights as far."""
    be, rng = _be(), np.random.default_rng(1)
    start, grad = _params(rng), _params(rng)
    moved = []
    for scale in (1.0, 0.01):
        params = {k: v.copy() for k, v in start.items()}
        SGD(be, params, 0.1, 0.0, trust=0.02).step({k: scale * v for k, v in grad.items()})
        moved.append(np.linalg.norm(params["W"] - start["W"]) / np.linalg.norm(start["W"]))
    np.testing.assert_allclose(moved, [0.1 * 0.02] * 2, rtol=1e-12)


def test_without_trust_or_with_a_zero_norm_the_rate_is_the_plain_one():
    be = _be()
    W, g = np.ones((3, 2)), np.ones((3, 2))
    assert SGD(be, {"W": W}, 0.3).rate(W, g, 0.3, 0.0) == 0.3
    assert SGD(be, {"W": W}, 0.3, trust=0.1).rate(np.zeros((3, 2)), g, 0.3, 0.0) == 0.3
    assert SGD(be, {"W": W}, 0.3, trust=0.1).rate(W, np.zeros((3, 2)), 0.3, 0.0) == 0.3


@pytest.mark.parametrize("trust", [0.0, 0.05])
def test_one_process_takes_the_gradient_path_when_the_rate_needs_it(trust):
    be = backend.select("cpu", "numba", "float32")
    x = np.random.default_rng(0).random((200, 20), dtype=np.float32)
    model = RBM(be, 20, 8, hidden="bernoulli", lr=0.1, batch=50, seed=0, layer_index=0)
    model.optimizer.trust = trust
    W0 = np.array(model.params["W"])
    result = train_epoch(model, Shard.of(be, x, 1), 0)
    assert ("fused step" in result.phases) == (trust == 0.0), result.phases
    if trust:  # four steps of at most trust x lr of the norm each (momentum 0.5 adds at most 1x more)
        moved = np.linalg.norm(np.array(model.params["W"]) - W0) / np.linalg.norm(W0)
        assert 0 < moved <= 4 * 2 * 0.1 * trust * 1.01, moved


def test_the_data_scheme_gives_the_layers_the_trust(tmp_path):
    from aepar import api
    x = np.random.default_rng(0).random((300, 20))
    codes = {}
    for trust in (0.0, 0.02):
        model = api.pretrain(x, layers="20-12-6", scheme="data", epochs=1, finetune_epochs=0, lars=trust,
                             out=tmp_path / f"run{trust}", quiet=True)
        assert model.summary["lars"] == trust
        codes[trust] = model.encode(x)
    assert not np.array_equal(codes[0.0], codes[0.02])  # the option reached the layers' steps


def _rules(warmup, decay):
    return argparse.Namespace(warmup_epochs=warmup, lr_decay=decay, lr_scaling="sqrt")


def test_the_warm_up_rises_from_the_base_rate_to_the_scaled_one_then_stays():
    lr_at = schedule(_rules(2, "none"), 0.1, 0.7, 6)
    np.testing.assert_allclose([lr_at(e) for e in range(6)], [0.4, 0.7, 0.7, 0.7, 0.7, 0.7], rtol=1e-12)


def test_the_cosine_decay_falls_from_the_scaled_rate_toward_zero_after_the_warm_up():
    lr_at = schedule(_rules(2, "cosine"), 0.1, 0.7, 10)
    rates = [lr_at(e) for e in range(10)]
    np.testing.assert_allclose(rates[:3], [0.4, 0.7, 0.7], rtol=1e-12)
    assert all(a > b > 0 for a, b in zip(rates[2:], rates[3:]))
    np.testing.assert_allclose(rates[9], 0.7 * 0.5 * (1 + math.cos(math.pi * 7 / 8)), rtol=1e-12)
    assert schedule(_rules(0, "cosine"), 0.1, 0.7, 1)(0) == 0.7  # one epoch: nothing to decay over


def test_the_classifier_takes_the_schedule_epoch_by_epoch(tmp_path):
    from aepar import api, metrics
    rng = np.random.default_rng(0)
    x, y = rng.random((400, 20)), rng.integers(0, 10, 400)
    model = api.pretrain(x, y, layers="20-12-6", scheme="data", task="classify", epochs=1, classify_epochs=4,
                         classify_batch=200, lr_scaling="sqrt", warmup_epochs=1, lr_decay="cosine",
                         out=tmp_path / "run", quiet=True)
    lr = 1e-3 * 2 ** 0.5  # the classifier's default rate, sqrt-scaled from batch 100 to 200
    rows = [r for r in metrics.read(model.path / metrics.FILE) if r["phase"] == "classify"]
    want = [lr] + [lr * 0.5 * (1 + math.cos(math.pi * e / 3)) for e in range(3)]
    np.testing.assert_allclose([float(r["lr"]) for r in rows], want, rtol=1e-7)  # the CSV keeps 9 digits


def test_fine_tuning_decays_along_a_cosine_by_default_epoch_by_epoch(tmp_path):
    """Fine-tuning's own default (--finetune-lr-decay cosine, from --finetune-lr 0.004), in
    any scheme: here greedy's, read back from metrics.csv; and --finetune-lr-decay none keeps
    the rate."""
    from aepar import api, metrics
    rng = np.random.default_rng(0)
    x = rng.random((400, 20))

    def rates(**options):
        model = api.pretrain(x, layers="20-12-6", scheme="greedy", epochs=1, finetune_epochs=3,
                             out=tmp_path / f"run{len(list(tmp_path.iterdir()))}", quiet=True, **options)
        return [float(r["lr"]) for r in metrics.read(model.path / metrics.FILE) if r["phase"] == "finetune"]

    np.testing.assert_allclose(rates(), [4e-3 * 0.5 * (1 + math.cos(math.pi * e / 3)) for e in range(3)],
                               rtol=1e-7)
    np.testing.assert_allclose(rates(finetune_lr_decay="none", finetune_lr=0.002), [0.002] * 3, rtol=1e-7)


def test_the_data_schemes_rules_keep_fine_tunings_own_decay():
    """With a large-batch rule but no --lr-decay, the layers' rate stays after the warm-up,
    fine-tuning's still decays (its default), unless --finetune-lr-decay none."""
    from types import SimpleNamespace

    from aepar.schemes import data

    def args(decay):
        return SimpleNamespace(lr_scaling="sqrt", warmup_epochs=1, lr_decay="none", lars=0.0, finetune_lr_decay=decay,
                               finetune_lr=0.003, finetune_batch=400, finetune_epochs=5, classify_lr=0.001,
                               classify_batch=100, classify_epochs=5)

    job = SimpleNamespace(comm=SimpleNamespace(size=2), layers=[], summary={}, announce=lambda line: None)
    for decay in ("cosine", "none"):
        job.args = args(decay)
        data.setup(job)
        rates = [job.args.finetune_lr_at(e) for e in range(5)]
        np.testing.assert_allclose(rates[:2], [0.006, 0.006], rtol=1e-12)  # warm-up from 0.003 to 0.003 x 2
        assert (rates[4] < rates[2] < rates[1]) if decay == "cosine" else rates[4] == rates[1]
        assert job.args.classify_lr_at(4) == job.args.classify_lr_at(1)  # the classifier's rate stays


def test_the_data_schemes_decay_for_every_rate_decays_fine_tuning_and_says_so():
    """--lr-decay cosine lowers fine-tuning's rate too, even with --finetune-lr-decay none,
    and the run reports the decay it applies (finetune_decay decides it for both)."""
    from types import SimpleNamespace

    from aepar.schemes import data
    from aepar.tasks.finetune import finetune_rate

    args = SimpleNamespace(lr_scaling="none", warmup_epochs=0, lr_decay="cosine", lars=0.0, finetune_lr_decay="none",
                           finetune_lr=0.003, finetune_batch=100, finetune_epochs=5, classify_lr=0.001,
                           classify_batch=100, classify_epochs=5)
    data.setup(SimpleNamespace(args=args, comm=SimpleNamespace(size=2), layers=[], summary={},
                               announce=lambda line: None))
    rates = [finetune_rate(args)(e) for e in range(5)]
    assert rates[0] == 0.003 and all(a > b for a, b in zip(rates, rates[1:]))
    assert args.finetune_lr_decay == "cosine"
