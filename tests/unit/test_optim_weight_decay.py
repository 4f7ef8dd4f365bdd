"""Fine-tuning's weight decay (--finetune-weight-decay): Adam's is decoupled from the
gradient (AdamW), SGD's is in the gradient; both shrink the weight matrices only, by
1 - lr * decay a step, and the run reports the decay it applied."""
import json

import numpy as np
import pytest

import aepar  # noqa: F401  (threads before numpy work)
from aepar import backend
from aepar.optim import make_optimizer


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("kernels", ["numpy", "numba"])
def test_a_step_shrinks_the_matrices_by_one_minus_rate_times_decay_and_leaves_the_biases(kind, kernels):
    be = backend.select("cpu", kernels, "float64")
    rng = np.random.default_rng(0)
    start = {"W": rng.standard_normal((5, 3)), "b": rng.standard_normal(3)}
    params = {k: be.asarray(v.copy()) for k, v in start.items()}
    opt = make_optimizer(be, params, kind, lr=0.1, weight_decay=0.5)
    opt.step({k: be.zeros(v.shape, v.dtype) for k, v in params.items()})  # no gradient: only the decay moves W
    np.testing.assert_allclose(be.to_host(params["W"]), 0.95 * start["W"], rtol=1e-15)
    assert be.to_host(params["b"]).tobytes() == start["b"].tobytes()


def test_fine_tuning_reports_and_applies_its_weight_decay(tmp_path):
    """The default decays (smaller weights than with 0, the same steps otherwise) and
    summary.json names the decay."""
    from aepar import api
    x = np.random.default_rng(0).random((300, 20))

    def run(name, **options):
        model = api.pretrain(x, layers="20-12-6", scheme="greedy", epochs=1, finetune_epochs=2, out=tmp_path / name,
                             quiet=True, **options)
        summary = json.loads((model.path / "summary.json").read_text())
        norm = sum(float(np.linalg.norm(model.network.be.to_host(v))) for v in model.network.params.values()
                   if v.ndim == 2)
        return _weight_decay(summary), norm
    (decay, decayed), (zero, plain) = run("decayed"), run("none", finetune_weight_decay=0.0)
    assert (decay, zero) == (0.05, 0.0)
    assert decayed < plain


def _weight_decay(summary):
    found = [v["weight_decay"] for v in summary.values() if isinstance(v, dict) and "weight_decay" in v]
    assert len(found) == 1, summary.keys()
    return found[0]
