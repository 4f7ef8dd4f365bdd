"""The classifier (dense layers + softmax cross-entropy): gradients, blocks, pre-trained
encoders, learning, the label column, checkpoints. Synthetic data only."""
import numpy as np
import pytest

import aepar  # noqa: F401
from aepar import backend
from aepar.models.classifier import CLASSIFY_STREAM, Classifier, split_labels, with_labels
from aepar.models.stacked import FINETUNE_STREAM
from aepar.optim import SGD, Adam
from aepar.parallel.data_parallel import train_epoch
from aepar.stack import make_layers
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad

from aepar.rows import Shard

ALL_SETS = [pytest.param("numpy", id="numpy")] + kernel_set_params()


def _be(kernels="numpy", dtype="float64"):
    return backend.select("gpu" if kernels == "cupy" else "cpu", kernels, dtype)


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _random_model(be, sizes, n_classes, acts=None, seed=0):
    model = Classifier(be, sizes, n_classes, acts)
    rng = np.random.default_rng(seed)
    for p in model.params.values():  # larger than the init: every unit off its linear part
        p[...] = be.asarray(0.7 * rng.standard_normal(p.shape))
    return model


def _zero_grads(model) -> dict:
    return {k: model.be.xp.zeros_like(p) for k, p in model.params.items()}


def _loss(model, x, labels):
    """Mean softmax cross-entropy from first principles (not the kernels)."""
    p = {k: _host(v) for k, v in model.params.items()}
    a = x
    for i in range(model.n_layers):
        z = a @ p[f"W{i + 1}"] + p[f"b{i + 1}"]
        act = model.acts[i]
        a = z if act == "identity" else np.maximum(z, 0) if act == "relu" else 1 / (1 + np.exp(-z))
    logp = a - a.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    return -float(logp[np.arange(len(labels)), labels].sum()) / x.shape[0]


@pytest.mark.parametrize("kernels", ALL_SETS)
@pytest.mark.parametrize("sizes, acts", [([6, 5, 4], None), ([6, 5, 3], ["sigmoid", "identity"]),
                                         ([6], None)])
def test_gradient_matches_finite_differences(kernels, sizes, acts):
    """float64 central differences of the loss, for every parameter, on each kernel set."""
    be = _be(kernels)
    rng = np.random.default_rng(1)
    x, labels = rng.random((7, 6)), np.array([0, 1, 2, 2, 1, 0, 2])
    model = _random_model(be, sizes, 3, acts)
    assert model.acts[-1] == "identity" and len(model.params) == 2 * len(sizes)
    grads = _zero_grads(model)
    loss, correct = model.loss_and_grad(be.asarray(x), be.xp.asarray(labels), grads)
    assert float(loss) == pytest.approx(_loss(model, x, labels), rel=1e-12)
    assert int(correct) == int((_host(model.predict(be.asarray(x))) == labels).sum())
    host = {k: _host(v).copy() for k, v in model.params.items()}
    probe = Classifier(_be(), sizes, 3, acts)  # the oracle perturbs host copies
    for k in probe.params:
        probe.params[k][...] = host[k]
    for name, p in probe.params.items():
        assert_grad_close(_host(grads[name]), numerical_grad(lambda: _loss(probe, x, labels), p),
                          rtol=1e-6, atol=1e-8, name=name)


@pytest.mark.parametrize("kernels", kernel_set_params())
def test_compiled_kernels_give_the_reference_gradient(kernels):
    rng = np.random.default_rng(2)
    x, labels = rng.random((9, 12)), rng.integers(0, 4, 9)
    ref, other = _random_model(_be(), [12, 7, 5], 4), _random_model(_be(kernels), [12, 7, 5], 4)
    g_ref, g_other = _zero_grads(ref), _zero_grads(other)
    l_ref, c_ref = ref.loss_and_grad(x, labels, g_ref)
    l_other, c_other = other.loss_and_grad(other.be.asarray(x), other.be.xp.asarray(labels), g_other)
    assert float(l_other) == pytest.approx(l_ref, rel=1e-10) and int(c_other) == c_ref
    for name in g_ref:
        assert_close(g_other[name], g_ref[name], np.float64, work=100, name=name)


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
def test_blocks_add_up_to_the_whole_batch_gradient(kernels):
    """leaf_gradient on row blocks, each scaled by 1/global batch, sums to the batch's
    gradient; its sums are Σ loss and Σ correct of its rows."""
    be = _be(kernels)
    rng = np.random.default_rng(3)
    x, y = rng.random((11, 8)), rng.integers(0, 3, 11)
    rows = be.asarray(with_labels(x, y))
    model = _random_model(be, [8, 6, 4], 3)
    whole = _zero_grads(model)
    loss, correct = model.loss_and_grad(be.asarray(x), be.xp.asarray(y), whole)
    parts, sums = _zero_grads(model), np.zeros(2)
    for lo, hi in [(0, 4), (4, 5), (5, 11)]:
        g = _zero_grads(model)
        sums += model.leaf_gradient(rows[lo:hi], np.random.default_rng(0), 1.0 / 11, g)
        for k in g:
            parts[k] += g[k]
    assert sums[0] == pytest.approx(loss * 11, rel=1e-12) and sums[1] == correct
    for k in whole:
        assert_close(parts[k], whole[k], np.float64, work=11, name=k)


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
def test_block_sums_are_each_blocks_loss_and_count_unscaled(kernels):
    """block_factors gives the trainer each block's Σ loss and Σ correct (not scaled by the
    step's 1/batch), the bits that leaf_gradient gives the block alone."""
    be = _be(kernels)
    rng = np.random.default_rng(5)
    x, y = rng.random((11, 8)), rng.integers(0, 3, 11)
    rows = be.asarray(with_labels(x, y))
    model = _random_model(be, [8, 6, 4], 3)
    bounds = [(0, 4), (4, 5), (5, 11)]
    sums, _ = model.block_factors([rows[lo:hi] for lo, hi in bounds], [None] * 3, 1.0 / 11,
                                  [_zero_grads(model) for _ in bounds])
    for (lo, hi), got in zip(bounds, sums):
        alone = model.leaf_gradient(rows[lo:hi], None, 1.0 / 11, _zero_grads(model))
        assert [float(v).hex() for v in got] == [float(v).hex() for v in alone]
        loss, correct = model.loss_and_grad(be.asarray(x[lo:hi]), be.xp.asarray(y[lo:hi]), _zero_grads(model))
        assert got[0] == pytest.approx(float(loss) * (hi - lo), rel=1e-12) and got[1] == correct


def test_from_layers_copies_the_encoder():
    be = _be()
    layers = make_layers(be, [10, 6, 4, 3], seed=3)
    for l in layers:
        l.params["bh"][...] = -np.arange(l.n_out) * 0.1
    model = Classifier.from_layers(be, layers, 5)
    assert model.dims == [10, 6, 4, 3, 5]
    # RBM units: Bernoulli -> sigmoid, the Gaussian code layer -> linear, then the logits
    assert model.acts == ["sigmoid", "sigmoid", "identity", "identity"]
    for i, l in enumerate(layers):
        np.testing.assert_array_equal(model.params[f"W{i + 1}"], l.params["W"])
        np.testing.assert_array_equal(model.params[f"b{i + 1}"], l.params["bh"])
    assert model.params["W4"].shape == (3, 5) and np.abs(model.params["W4"]).max() < 0.1
    # the hidden layers compute the stack's transform
    x = Shard.of(be, np.random.default_rng(0).random((5, 10)), 1)
    h = x
    for l in layers:
        h = l.transform(h)
    np.testing.assert_allclose(model.forward(x.x)[3], h.x, rtol=1e-12, atol=1e-12)
    w1 = layers[0].params["W"].copy()
    model.params["W1"] += 1.0  # copies: the layers are untouched
    np.testing.assert_array_equal(layers[0].params["W"], w1)


def test_from_layers_without_unit_kinds_follows_the_stack_convention():
    from types import SimpleNamespace

    be = _be()
    layers = [SimpleNamespace(params=l.params) for l in make_layers(be, [6, 4, 2], seed=1)]
    assert Classifier.from_layers(be, layers, 3).acts == ["sigmoid", "identity", "identity"]


def test_init_is_seeded_and_scaled():
    be = _be()
    a, b, c = Classifier(be, [400, 300], 10, seed=1), Classifier(be, [400, 300], 10, seed=1), \
        Classifier(be, [400, 300], 10, seed=2)
    np.testing.assert_array_equal(a.params["W1"], b.params["W1"])
    assert not np.array_equal(a.params["W1"], c.params["W1"])
    assert a.params["W1"].std() == pytest.approx(0.1, rel=0.02)
    assert a.params["W2"].std() == pytest.approx(0.01, rel=0.05)
    assert a.key == (1, CLASSIFY_STREAM) and CLASSIFY_STREAM != FINETUNE_STREAM
    assert a.flops_per_sample() == 6.0 * (400 * 300 + 300 * 10)


@pytest.mark.parametrize("bad", [dict(sizes=[], n_classes=3), dict(sizes=[4, 0], n_classes=3),
                                 dict(sizes=[4], n_classes=1), dict(sizes=[4, 3], n_classes=3, acts=["tanh"]),
                                 dict(sizes=[4, 3], n_classes=3, acts=["sigmoid", "sigmoid"])])
def test_bad_shapes_are_refused(bad):
    with pytest.raises(ValueError):
        Classifier(_be(), **bad)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_label_column_round_trip(dtype):
    rng = np.random.default_rng(4)
    x, y = rng.random((6, 3)).astype(dtype), np.array([0, 9, 3, 3, 7, 1])
    rows = with_labels(x, y)
    assert rows.dtype == np.dtype(dtype) and rows.shape == (6, 4)
    feats, labels = split_labels(rows)
    np.testing.assert_array_equal(feats, x)
    np.testing.assert_array_equal(labels, y)
    assert labels.dtype == np.int64 and feats.flags.c_contiguous
    # the largest label float32 holds exactly
    big = np.array([(1 << 24) - 1])
    assert split_labels(with_labels(np.zeros((1, 2), np.float32), big))[1][0] == (1 << 24) - 1
    # integer features become float64 rows; float labels that are whole numbers are accepted
    assert with_labels(np.ones((2, 2), np.uint8), np.array([1.0, 2.0])).dtype == np.float64


@pytest.mark.parametrize("x, y, fragment", [
    (np.zeros((3, 2)), np.array([0, 1]), "labels of shape"),
    (np.zeros(3), np.array([0, 1, 2]), "(rows, features)"),
    (np.zeros((2, 2)), np.array([0, -1]), "must lie in"),
    (np.zeros((2, 2)), np.array([0, 1 << 24]), "must lie in"),
    (np.zeros((2, 2)), np.array([0.5, 1.0]), "integers"),
    (np.zeros((2, 2)), np.array([np.nan, 1.0]), "integers")])
def test_bad_labels_are_refused(x, y, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        with_labels(x, y)


def _separable(n, d, k, seed):
    """Gaussian clouds around k well-separated centres."""
    rng = np.random.default_rng(seed)
    centres = 3.0 * rng.standard_normal((k, d))
    y = rng.integers(0, k, n)
    return centres[y] + 0.5 * rng.standard_normal((n, d)), y


@pytest.mark.parametrize("kernels, opt", [("numpy", "adam"), ("numba", "sgd")])
def test_softmax_regression_learns_a_separable_problem(kernels, opt):
    be = _be(kernels)
    x, y = _separable(400, 5, 4, seed=5)
    xt, yt = _separable(200, 5, 4, seed=5)  # same centres (same seed), fresh noise below
    xt = xt + 0.1 * np.random.default_rng(9).standard_normal(xt.shape)
    train, test = Shard.of(be, with_labels(x, y), 4), Shard.of(be, with_labels(xt, yt), 2)
    model = Classifier(be, [5], 4, seed=1)
    optimizer = Adam(be, model.params, lr=0.05) if opt == "adam" else SGD(be, model.params, lr=0.1, momentum=0.9)
    before = model.accuracy(test)
    assert before < 0.6
    sums = []
    for epoch in range(15):
        result = train_epoch(model, train, epoch, batch=40, optimizer=optimizer)
        sums.append(result.means)
    assert sums[-1][0] < 0.3 * sums[0][0]  # mean loss while training
    assert sums[-1][1] > 0.97  # accuracy seen while training
    acc, loss = model.evaluate(test)
    assert acc > 0.97 and loss < 0.2
    assert model.accuracy(Shard.of(be, with_labels(xt, yt), 1)) == acc  # any blocks, same count


def test_a_hidden_layer_learns_xor():
    """Not linearly separable: softmax regression cannot, one sigmoid layer can."""
    be = _be()
    rng = np.random.default_rng(6)
    x = rng.integers(0, 2, (400, 2)).astype(float)
    y = (x[:, 0] != x[:, 1]).astype(int)
    x = x + 0.1 * rng.standard_normal(x.shape)
    shard = Shard.of(be, with_labels(x, y), 2)
    accs = {}
    for sizes in ([2], [2, 8]):
        model = Classifier(be, sizes, 2, seed=3)
        opt = Adam(be, model.params, lr=0.05)
        for epoch in range(40):
            train_epoch(model, shard, epoch, batch=50, optimizer=opt)
        accs[len(sizes)] = model.accuracy(shard)
    assert accs[1] < 0.8 and accs[2] > 0.97, accs


def test_training_is_deterministic_and_state_round_trips():
    be = _be()
    x, y = _separable(90, 4, 3, seed=7)
    shard = Shard.of(be, with_labels(x, y), 3)

    def make():
        m = Classifier(be, [4, 5], 3, seed=2)
        m.optimizer = Adam(be, m.params, lr=0.01)
        return m

    a, b = make(), make()
    for m in (a, b):
        train_epoch(m, shard, 0, batch=20)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    state = a.state()
    assert {k for k in state if k.startswith("opt/")} >= {"opt/m/W1", "opt/v/b2", "opt/t"}
    c = make()
    c.load_state(state)
    for m in (a, c):
        train_epoch(m, shard, 1, batch=20)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], c.params[k])
    with pytest.raises(ValueError, match="shape"):
        Classifier(be, [4, 6], 3).load_state(state)


# ---- the driver (aepar.classify) in one process ----------------------------------------------
def _digits(n_train=120, n_test=60, d=6, k=3, seed=8):
    from aepar.data.sources import Digits

    x, y = _separable(n_train + n_test, d, k, seed)
    return Digits(x[:n_train], y[:n_train], x[n_train:], y[n_train:], "synthetic")


def _args(**kw):
    from types import SimpleNamespace

    base = dict(classify_epochs=6, classify_lr=0.05, classify_batch=30, classify_optimizer="adam",
                classify_momentum=0.9, reduce_blocks=3, seed=0, quiet=True, layers=[6, 8])
    return SimpleNamespace(**dict(base, **kw))


def _serial():
    from aepar.comm import Comm

    return Comm.serial()


@pytest.mark.parametrize("pretrained", [False, True])
def test_classify_and_evaluate_trains_and_reports(pretrained):
    from aepar.tasks.classify import classify_and_evaluate

    be, digits = _be(), _digits()
    layers = make_layers(be, [6, 8, 4], seed=1) if pretrained else None
    r = classify_and_evaluate(be, _serial(), layers, digits, _args(classify_epochs=20))
    model = r.pop("model")
    assert r["init"] == ("pretrained" if pretrained else "random")
    assert r["sizes"] == ([6, 8, 4, 10] if pretrained else [6, 8, 10]) and r["blocks"] == 3
    assert len(r["epochs"]) == 20 and r["time_s"] > 0 and r["ranks"] == 1
    assert r["after"]["test"] > 0.9 > r["before"]["test"]
    assert r["after"]["test"] == model.accuracy(Shard.of(be, with_labels(digits.test_x, digits.test_y), 2))
    # another run with the same settings: the same bits
    again = classify_and_evaluate(be, _serial(), layers, digits, _args(classify_epochs=20))["model"]
    for k in model.params:
        np.testing.assert_array_equal(model.params[k], again.params[k])


def test_classify_refuses_bad_labels_and_layers():
    from aepar.tasks.classify import check_labels, classify_and_evaluate
    from aepar.errors import UserError

    be, digits = _be(), _digits()
    with pytest.raises(UserError, match="first layer takes 5 inputs but the data have 6"):
        classify_and_evaluate(be, _serial(), make_layers(be, [5, 3], seed=0), digits, _args())
    bad = _digits()
    bad.train_y = bad.train_y[:-1]
    with pytest.raises(UserError, match="120 train images but 119 labels"):
        check_labels(bad)
    bad = _digits()
    bad.test_y = bad.test_y + 10
    with pytest.raises(UserError, match=r"test labels must be integers in \[0, 10\)"):
        check_labels(bad)
    bad = _digits()
    bad.train_y = None
    with pytest.raises(UserError, match="no train labels"):
        check_labels(bad)


def test_floors_train_softmax_regression_on_pixels_and_pca():
    from aepar.tasks.classify import floors

    be, digits = _be(), _digits()
    f = floors(be, _serial(), digits, _args(), k=3)
    assert f["raw"]["sizes"] == [6, 10] and f["pca"]["sizes"] == [3, 10] and f["pca"]["k"] == 3
    for part in ("raw", "pca"):
        assert f[part]["after"]["test"] > 0.9 and "model" not in f[part]


def test_pca_features_are_the_projections_pca_error_measures():
    from aepar.tasks.classify import pca_features
    from aepar.report.stacked import pca_error

    rng = np.random.default_rng(10)
    train = rng.random((50, 8)) @ np.diag(np.linspace(1, 0.1, 8))
    test = rng.random((20, 8))
    p_train, p_test = pca_features(train, test, k=3)
    assert p_train.shape == (50, 3) and p_test.shape == (20, 3)
    mean = train.mean(axis=0)
    for x, p, key in ((train, p_train, "train"), (test, p_test, "test")):
        # orthonormal directions: the residual's energy is the centred energy minus the projection's
        residual = (((x - mean) ** 2).sum() - (p ** 2).sum()) / len(x)
        assert residual == pytest.approx(pca_error(train, test, k=3)[key], rel=1e-10)
