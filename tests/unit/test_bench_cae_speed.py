"""bench.cae_speed: its per-kernel profile runs the kernels the CAE's step calls, on the
model's own shapes (a renamed or removed kernel fails here, not on the benchmark machine)."""
import numpy as np

import aepar  # noqa: F401  (threads before numpy)
from aepar import backend
from aepar.models.cae import ConvAutoencoder
from bench import cae_speed


def test_the_kernel_profile_times_every_kernel_of_a_block_step():
    model = ConvAutoencoder(backend.select("cpu", "numba", "float32"), (1, 28, 28), seed=0, batch=4)
    rows = cae_speed.kernel_profile(model, 3, reps=1)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names))
    assert {"conv1 backward (no input gradient)", "  with its input gradient (not made)",
            "whole block step (loss_and_grad)"} <= set(names)
    assert all(np.isfinite(seconds) and seconds > 0 for _, seconds in rows)
