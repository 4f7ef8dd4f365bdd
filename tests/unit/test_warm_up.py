"""Warm-ups: every kernel a run's first timed epoch takes is loaded (or compiled) before it,
on a throw-away copy of the run's own network: pre-training's layers (aepar.stack.warm_up:
on every rank at once, where in a pipeline each later stage would otherwise load them in
its first epoch, one after the other), aepar.eager's CAEs, fine-tuning's and the
classifier's networks. Each probe runs in a fresh process (cached kernels load once per
process): it warms up, or not, notes every kernel's compiled signatures, trains one epoch
and prints what that epoch loaded."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# each probe's start and end: every compiled signature of the set's kernels, before and after
HEAD = """
import sys
from types import SimpleNamespace
import aepar, numpy as np
from aepar import backend
from aepar.parallel.data_parallel import train_epoch
from aepar.rows import Shard
from numba.core.dispatcher import Dispatcher
be = backend.select("cpu", "numba", "float32")
def loaded():
    kernels = {(m, n): f for m, mod in list(sys.modules.items()) if m.startswith(("aepar.kernels.nb", "kernels.nb"))
               for n, f in vars(mod).items() if isinstance(f, Dispatcher)}
    return {(k, str(s)) for k, f in kernels.items() for s in f.signatures}
"""
# pre-training: the run's shapes, or the tiny layer alone
PRETRAIN = """
from aepar.stack import make_layers, warm_up
sizes = [784, 64, 8]
def layers():
    return make_layers(be, sizes, sys.argv[1], 0, 1, batch=100)
warm_up(be, sys.argv[1], layers() if sys.argv[2] == "shapes" else (), 8)
before = loaded()
h = Shard.of(be, np.random.default_rng(1).random((300, sizes[0])), 8)
for layer in layers():
    train_epoch(layer, h, 0)
    layer.recon_error(h)
    h = layer.transform(h)
print(sorted(loaded() - before))
"""
# aepar.eager: its warm-up (a copy of the run's CAE, one step), or none
EAGER = """
from aepar.models.cae import ConvAutoencoder
from aepar.optim import Adam
from aepar.schemes.eager import warm_up
rows = np.random.default_rng(1).random((300, 784)).astype(np.float32)
def cae():
    return "model0", ConvAutoencoder(be, (1, 28, 28), (4, 8), seed=0, batch=50)
if sys.argv[1] == "warm":
    warm_up(be, cae(), rows, 8, SimpleNamespace(cae_lr=1e-3))
before = loaded()
model = cae()[1]
x = Shard.of(be, rows, 8)
train_epoch(model, x, 0, optimizer=Adam(be, model.params, lr=1e-3))
model.recon_error(x)
print(sorted(loaded() - before))
"""
# fine-tuning's and the classifier's warm-ups (a copy of the run's network, one step), or none
TASK = """
from aepar.models.classifier import Classifier, with_labels
from aepar.models.stacked import StackedAutoencoder
from aepar.tasks import classify, finetune
args = SimpleNamespace(loss="xent", optimizer="adam", finetune_lr=0.004, finetune_momentum=0.9,
                       finetune_weight_decay=0.05, finetune_batch=100, classify_optimizer="adam", classify_lr=1e-3,
                       classify_momentum=0.9, classify_batch=100)
rng = np.random.default_rng(1)
if sys.argv[1] == "finetune":
    def network():
        return StackedAutoencoder(be, [784, 256, 64, 8], loss="xent")
    rows, task, optimizer, evaluate = rng.random((300, 784)), finetune, finetune.finetune_optimizer, "error_per_digit"
else:
    def network():
        return Classifier(be, [784, 256, 64], 10)
    rows = with_labels(rng.random((300, 784)), np.arange(300) % 10, be.dtype)
    task, optimizer, evaluate = classify, classify.classify_optimizer, "evaluate"
if sys.argv[2] == "warm":
    task._warm_up(be, args, network(), 8)
before = loaded()
model = network()
x = Shard.of(be, rows, 8)
train_epoch(model, x, 0, batch=100, optimizer=optimizer(be, model.params, args))
getattr(model, evaluate)(x)
print(sorted(loaded() - before))
"""


def _first_epoch_loads(probe, *argv) -> str:
    """What the probe's first epoch loaded, as it printed it, from a fresh process."""
    p = subprocess.run([sys.executable, "-c", HEAD + probe, *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "AEPAR_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("pretrainer", ["ae", "rbm"])
def test_after_the_warm_up_a_runs_first_epoch_loads_no_kernel(pretrainer):
    """The warm-up with the run's own layers (copies, one step each) leaves nothing to load;
    the tiny layer alone leaves the wide layers' kernels (the check can fail)."""
    assert _first_epoch_loads(PRETRAIN, pretrainer, "shapes") == "[]"
    assert _first_epoch_loads(PRETRAIN, pretrainer, "tiny") != "[]"


def test_after_the_eager_warm_up_a_caes_first_epoch_loads_no_kernel():
    """aepar.eager's warm-up (a copy of the run's CAE, one step) leaves nothing for the first
    timed epoch to load; without it that epoch loads the CAE's kernels (the check can fail)."""
    assert _first_epoch_loads(EAGER, "warm") == "[]"
    assert _first_epoch_loads(EAGER, "none") != "[]"


@pytest.mark.parametrize("task", ["finetune", "classify"])
def test_after_a_tasks_warm_up_its_first_epoch_loads_no_kernel(task):
    """Fine-tuning's and the classifier's warm-ups (a copy of the run's network, one step in
    the run's blocks) leave nothing for the first timed epoch to load; without one that
    epoch loads the network's kernels (the check can fail)."""
    assert _first_epoch_loads(TASK, task, "warm") == "[]"
    assert _first_epoch_loads(TASK, task, "none") != "[]"
