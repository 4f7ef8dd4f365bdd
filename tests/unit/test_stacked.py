"""The unrolled deep autoencoder, the PCA baseline and the report tables."""
import numpy as np
import pytest

import aepar  # noqa: F401
from aepar import backend
from aepar.models.stacked import StackedAutoencoder
from aepar.optim import SGD, Adam
from aepar.parallel.data_parallel import train_epoch
from aepar.stack import make_layers
from aepar.report.stacked import hms, pca_error, tables
from aepar.rows import Shard
from tests.conftest import kernel_set_params
from tests.gradcheck import assert_close, assert_grad_close, numerical_grad


def _be(kernels="numpy", dtype="float64"):
    return backend.select("gpu" if kernels == "cupy" else "cpu", kernels, dtype)


def S(x, be, count=1):
    """All of ``x`` as one process's shard (``count`` fixed blocks)."""
    return Shard.of(be, x, count)


def _zero_grads(model) -> dict:
    return {k: np.zeros_like(p) for k, p in model.params.items()}


def _random_model(be, sizes, loss, seed=0):
    model = StackedAutoencoder(be, sizes, loss=loss)
    rng = np.random.default_rng(seed)
    for p in model.params.values():  # larger than the init, so every unit is off its linear part
        p[...] = be.asarray(0.7 * rng.standard_normal(p.shape))
    return model


def _loss(model, x):
    """The objective from first principles (not the kernels): ½Σ(x̂−x)²/B or Σ xent/B."""
    a = x
    for i in range(model.n_layers):
        z = a @ model.params[f"W{i + 1}"] + model.params[f"b{i + 1}"]
        a = z if model.acts[i] == "identity" else 1 / (1 + np.exp(-z))
    if model.loss == "mse":
        return 0.5 * float(((a - x) ** 2).sum()) / x.shape[0]
    y = 1 / (1 + np.exp(-a))
    return -float((x * np.log(y) + (1 - x) * np.log(1 - y)).sum()) / x.shape[0]


@pytest.mark.parametrize("loss", ["mse", "xent"])
def test_gradient_matches_finite_differences(loss):
    be = _be()
    rng = np.random.default_rng(1)
    x = rng.random((4, 6))
    model = _random_model(be, [6, 4, 3, 2], loss)
    assert model.acts == ["sigmoid", "sigmoid", "identity", "sigmoid", "sigmoid",
                          "sigmoid" if loss == "mse" else "identity"]
    grads = _zero_grads(model)
    value, sq_err = model.loss_and_grad(x, grads)
    assert value == pytest.approx(_loss(model, x), rel=1e-12)
    assert sq_err == pytest.approx(float(((model.reconstruct(S(x, be)).x - x) ** 2).sum()), rel=1e-12)
    for name, p in model.params.items():
        assert_grad_close(grads[name], numerical_grad(lambda: _loss(model, x), p), rtol=1e-6,
                          atol=1e-8, name=name)


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("loss", ["mse", "xent"])
def test_block_sums_are_each_blocks_loss_and_error_unscaled(kernels, loss):
    """What the trainer sums: block_factors gives each block's Σ loss and Σ‖x̂ − x‖² (not
    scaled by the step's 1/batch: an epoch's means divide by its rows), the bits that
    leaf_gradient gives the block alone; loss_and_grad's loss is that sum at its scale."""
    be = _be(kernels)
    x = np.random.default_rng(4).random((11, 8))
    model = _random_model(be, [8, 5, 3], loss)
    blocks = [x[0:4], x[4:5], x[5:11]]
    sums, _ = model.block_factors([be.asarray(b) for b in blocks], [None] * 3, 1.0 / 11,
                                  [_zero_grads(model) for _ in blocks])
    for b, got in zip(blocks, sums):
        alone = model.leaf_gradient(be.asarray(b), None, 1.0 / 11, _zero_grads(model))
        assert [float(v).hex() for v in got] == [float(v).hex() for v in alone]
        assert got[0] == pytest.approx(_loss(model, b) * b.shape[0], rel=1e-12)
        assert got[1] == pytest.approx(float(((model.reconstruct(S(b, be)).x - b) ** 2).sum()), rel=1e-12)
        assert model.loss_and_grad(be.asarray(b), _zero_grads(model), scale=0.25)[0] == \
            pytest.approx(0.25 * got[0], rel=1e-12)


@pytest.mark.parametrize("kernels", kernel_set_params())
@pytest.mark.parametrize("loss", ["mse", "xent"])
def test_compiled_kernels_give_the_reference_gradient(kernels, loss):
    rng = np.random.default_rng(2)
    x = rng.random((9, 12))
    ref, other = _random_model(_be(), [12, 7, 3], loss), _random_model(_be(kernels), [12, 7, 3], loss)
    g_ref, g_other = _zero_grads(ref), {k: other.be.xp.zeros_like(p) for k, p in other.params.items()}
    l_ref, _ = ref.loss_and_grad(x, g_ref)
    l_other, _ = other.loss_and_grad(other.be.asarray(x), g_other)
    assert float(l_other) == pytest.approx(l_ref, rel=1e-10)
    for name in g_ref:
        assert_close(g_other[name], g_ref[name], np.float64, work=100, name=name)


def test_unrolled_from_layers_then_untied():
    be = _be()
    layers = make_layers(be, [10, 6, 4, 2], seed=3)
    for l in layers:
        l.params["bv"][...] = np.arange(l.n_in) * 0.1
        l.params["bh"][...] = -np.arange(l.n_out) * 0.1
    model = StackedAutoencoder.from_layers(be, layers, loss="mse")
    assert model.dims == [10, 6, 4, 2, 4, 6, 10]
    for i, l in enumerate(layers):
        np.testing.assert_array_equal(model.params[f"W{i + 1}"], l.params["W"])
        np.testing.assert_array_equal(model.params[f"b{i + 1}"], l.params["bh"])
        np.testing.assert_array_equal(model.params[f"W{6 - i}"], l.params["W"].T)
        np.testing.assert_array_equal(model.params[f"b{6 - i}"], l.params["bv"])
    # untied: training the decoder leaves the encoder and the layers alone
    w1 = layers[0].params["W"].copy()
    model.params["W6"] += 1.0
    np.testing.assert_array_equal(model.params["W1"], w1)
    np.testing.assert_array_equal(layers[0].params["W"], w1)
    # the code is the linear RBM's mean hidden activity pushed through the encoder
    x = S(np.random.default_rng(0).random((5, 10)), be)
    h = x
    for l in layers:
        h = l.transform(h)
    np.testing.assert_allclose(model.encode(x).x, h.x, rtol=1e-12, atol=1e-12)


def test_error_per_digit_is_the_sum_over_pixels_averaged_over_images():
    be = _be()
    model = _random_model(be, [8, 5, 2], "xent", seed=4)
    x = np.random.default_rng(5).random((7, 8))
    xh = model.reconstruct(S(x, be)).x
    assert xh.min() >= 0 and xh.max() <= 1
    want = float(((x - xh) ** 2).sum(axis=1).mean())
    assert model.error_per_digit(S(x, be)) == pytest.approx(want, rel=1e-12)
    assert model.error_per_digit(S(x, be, 3)) == pytest.approx(want, rel=1e-12)  # three blocks, one tree


@pytest.mark.parametrize("loss, opt", [("mse", "sgd"), ("xent", "adam")])
def test_fine_tuning_reduces_the_error(loss, opt):
    be = _be()
    rng = np.random.default_rng(6)
    x = (rng.random((120, 16)) < 0.3) * 1.0
    x = np.repeat(x[:4], 30, axis=0)  # four patterns to memorise
    model = StackedAutoencoder(be, [16, 6], loss=loss, seed=1)
    optimizer = SGD(be, model.params, lr=0.5, momentum=0.9) if opt == "sgd" else Adam(be, model.params, lr=0.01)
    before = model.error_per_digit(S(x, be))
    for epoch in range(10):
        train_epoch(model, S(x, be, 4), epoch, batch=20, optimizer=optimizer)
    assert model.error_per_digit(S(x, be)) < 0.2 * before


def test_fine_tuning_epoch_is_deterministic():
    be = _be()
    x = np.random.default_rng(7).random((50, 6))
    a, b = StackedAutoencoder(be, [6, 3], seed=2), StackedAutoencoder(be, [6, 3], seed=2)
    for m in (a, b):
        train_epoch(m, S(x, be, 2), 0, batch=10, optimizer=SGD(be, m.params, lr=0.1))
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])


def test_pca_error_matches_a_direct_projection():
    rng = np.random.default_rng(8)
    train = rng.random((60, 10)) @ np.diag(np.linspace(1, 0.1, 10))
    test = rng.random((20, 10))
    got = pca_error(train, test, k=3)
    mean = train.mean(axis=0)
    cov = np.cov(train - mean, rowvar=False)
    vecs = np.linalg.eigh(cov)[1][:, ::-1][:, :3]
    r = (test - mean) - (test - mean) @ vecs @ vecs.T
    assert got["k"] == 3
    assert got["test"] == pytest.approx(float((r ** 2).sum(axis=1).mean()), rel=1e-9)
    assert pca_error(train, test, k=10)["test"] == pytest.approx(0.0, abs=1e-20)
    # more components never reconstruct the training set worse
    assert pca_error(train, test, k=5)["train"] < got["train"]


def test_tables_put_schemes_side_by_side(tmp_path):
    def summary(scheme, train, test, pre_s, fine_s):
        return {"scheme": scheme, "error": {"pretrained": {"train": 18.5, "test": 18.81},
                                            "finetuned": {"train": train, "test": test}},
                "pca": {"k": 30, "train": 13.0, "test": 14.14}, "pretrain_time_s": pre_s,
                "finetune_time_s": fine_s, "ranks": 4, "device": "cpu", "dtype": "float32",
                "finetune": {"n_epochs": 10, "optimizer": "sgd", "lr": 0.001, "loss": "mse"},
                "source": "mnist5k: test data"}

    text = tables({"greedy": summary("greedy", 8.0, 8.19, 11683.0, 8219.0),
                   "sync": summary("sync", 8.39, 8.57, 6551.0, 8142.0)})
    assert "| greedy pre-training | 8.00 | 8.19 | 18.50 / 18.81 | 0.58x | sgd lr 0.001 / mse, 10 epochs |" in text
    assert "| sync pre-training | 8.39 | 8.57 |" in text
    assert "| PCA-30 (same data) | 13.00 | 14.14 |" in text
    assert "| greedy pre-training | 3h 14m 43s | 2h 16m 59s | 4 | cpu / float32 |" in text
    assert "mnist5k: test data" in text
    decayed = summary("greedy", 8.0, 8.19, 1.0, 1.0)
    decayed["finetune"].update(optimizer="adam", lr=0.003, lr_decay="cosine", loss="xent")
    assert "| adam lr 0.003, cosine decay / xent, 10 epochs |" in tables({"greedy": decayed})
    decayed["finetune"]["n_epochs"] = 1
    assert "| adam lr 0.003, cosine decay / xent, 1 epoch |" in tables({"greedy": decayed})
    decayed["finetune"]["weight_decay"] = 0.05
    assert "| adam lr 0.003, cosine decay, weight decay 0.05 / xent, 1 epoch |" in tables({"greedy": decayed})
    no_ft = summary("greedy", None, None, 3.5, 0.0)
    no_ft["error"]["finetuned"], no_ft["finetune"] = None, {"n_epochs": 0}
    assert "| greedy pre-training (no fine-tuning) | – | – | 18.50 / 18.81 | 1.33x | none |" in tables({"greedy": no_ft})


def test_no_ratio_against_a_pca_as_wide_as_the_input():
    """A code layer at least as wide as the input gives PCA every component: its error is
    rounding (1e-29), and dividing by it printed ratios of 1e29."""
    rng = np.random.default_rng(3)
    train, test = rng.random((50, 6)), rng.random((10, 6))
    exact = pca_error(train, test, k=8)
    assert exact["k"] == exact["features"] == 6
    s = {"scheme": "greedy", "error": {"pretrained": {"train": 18.5, "test": 18.81}, "finetuned": None},
         "pca": exact, "pretrain_time_s": 1.0, "finetune_time_s": 0.0, "finetune": {"n_epochs": 0}}
    text = tables({"greedy": s})
    assert "| greedy pre-training (no fine-tuning) | – | – | 18.50 / 18.81 | – | none |" in text
    assert "| PCA-6 (same data, exact: as wide as the input) |" in text
    s["pca"] = pca_error(train, test, k=3)
    assert "| 18.50 / 18.81 | – |" not in tables({"greedy": s})


def test_hms():
    assert hms(4.214) == "4.21s"
    assert hms(125) == "2m 05s"
    assert hms(3 * 3600 + 14 * 60 + 43) == "3h 14m 43s"
    assert hms(None) == "–"
