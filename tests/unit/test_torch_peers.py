"""bench/torch_rbm.py's TorchAE, the PyTorch peer of the autoencoder layer, takes the steps
aepar's AELayer takes (both styles); skipped where torch is not installed (``make bench``
installs it)."""
import numpy as np
import pytest

import aepar  # noqa: F401
from aepar import backend
from aepar.models.ae_layer import AELayer
from aepar.parallel.data_parallel import train_epoch
from aepar.rows import Shard


@pytest.mark.parametrize("code", ["sigmoid", "identity"])
@pytest.mark.parametrize("style", ["careful", "plain"])
def test_torch_ae_takes_the_steps_of_aepars_layer(style, code):
    """Sigmoid code units, and identity ones (AELayer's hidden="gaussian", a stack's top)."""
    torch = pytest.importorskip("torch")
    from bench.torch_rbm import TorchAE

    x = np.random.default_rng(0).random((64, 30))
    be = backend.select("cpu", "numpy", "float64")
    ours = AELayer(be, 30, 20, batch=64, seed=0,   # one batch: the shuffle cannot differ
                   hidden="bernoulli" if code == "sigmoid" else "gaussian")
    assert ours.code_act == code
    peer = TorchAE(30, 20, batch=64, style=style, code=code)
    peer.W.copy_(torch.from_numpy(ours.params["W"].astype(np.float32)))
    start = ours.params["W"].copy()
    for epoch in range(6, 9):   # momentum 0.9, as the peer's
        err = train_epoch(ours, Shard.of(be, x, 1), epoch).means[0]
        assert peer.train_epoch(x.astype(np.float32)) == pytest.approx(err, rel=1e-5)
    for name, got in (("W", peer.W), ("bv", peer.bv), ("bh", peer.bh)):
        np.testing.assert_allclose(got.numpy(), ours.params[name], rtol=0, atol=1e-6, err_msg=name)
    assert np.abs(ours.params["W"] - start).max() > 1e-5   # it moved
