"""Python API: pre-train a stacked autoencoder on your own arrays, from a notebook or a script.

    import numpy as np
    import aepar.api as ae

    x = np.random.default_rng(0).random((2000, 100))       # rows of values in [0, 1]
    model = ae.pretrain(x, layers="100-50-10", scheme="greedy", epochs=5, finetune_epochs=2)
    codes = model.encode(x)                                  # (2000, 10)
    again = ae.Autoencoder.load(model.path / "weights.h5")

It is the engine of ``python -m aepar.pretrain``, so it writes the same run directory
(summary.json, tables.md, weights.h5, trace.json) and gives the same weights for the same
data and options. In one process it needs no MPI launcher; under ``mpirun -np P python
script.py`` every rank calls it alike and the ranks share the work, as the command's do.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from aepar import backend, checkpoint, schemes
from aepar.comm import world
from aepar.data.sources import Digits
from aepar.errors import UserError
from aepar.models.stacked import StackedAutoencoder
from aepar.pretrain import PROG, parse_args, run_program
from aepar.rows import Shard

__all__ = ["pretrain", "Autoencoder"]


class Autoencoder:
    """A trained stack: its encoder gives the codes, the unrolled network the reconstructions
    (the fine-tuned one where there was fine-tuning). ``summary``: the run's summary.json
    (rank 0; None elsewhere and after :meth:`load`); ``path``: its run directory."""

    def __init__(self, network: StackedAutoencoder, be, summary=None, path=None):
        self.network, self.be, self.summary = network, be, summary
        self.path = Path(path) if path is not None else None

    @property
    def sizes(self) -> list:
        """Input, hidden and code sizes of the encoder."""
        return list(self.network.sizes)

    def _rows(self, x) -> Shard:
        x = _matrix(x, "x")
        if x.shape[1] != self.sizes[0]:
            raise UserError(f"x has {x.shape[1]} columns but the network takes {self.sizes[0]}")
        return Shard.of(self.be, x.astype(self.be.dtype, copy=False), 1)

    def encode(self, x) -> np.ndarray:
        """The codes (the middle layer's linear units) of the rows of ``x``."""
        return self.be.to_host(self.network.encode(self._rows(x)).x)

    def reconstruct(self, x) -> np.ndarray:
        """The network's reconstructions of the rows of ``x``, in [0, 1]."""
        return self.be.to_host(self.network.reconstruct(self._rows(x)).x)

    def save(self, path):
        """The network as a weights.h5 that :meth:`load` (and ``aepar.finetune``) reads."""
        params = {f"finetuned/{k}": self.be.to_host(v) for k, v in self.network.params.items()}
        n = len(self.sizes) - 1
        for i in range(n):  # the encoder layers, as a scheme saves its pre-trained ones
            params[f"layer{i + 1}/W"] = params[f"finetuned/W{i + 1}"]
            params[f"layer{i + 1}/bh"] = params[f"finetuned/b{i + 1}"]
            params[f"layer{i + 1}/bv"] = params[f"finetuned/b{2 * n - i}"]
        checkpoint.save(path, scheme="finetune", params=params,
                        config={"sizes": self.sizes, "loss": self.network.loss})
        return Path(path)

    @classmethod
    def load(cls, path, *, device="cpu", dtype=None, loss="xent"):
        """The network in a weights.h5 of any stacked scheme, of aepar.finetune or of :meth:`save`:
        the fine-tuned one where it holds one, else its pre-trained layers unrolled; in the
        precision it was trained in unless ``dtype`` says otherwise."""
        saved = checkpoint.load(path, scheme=tuple(schemes.names()) + ("finetune",))
        be = backend.select(device, "auto", dtype or str(np.asarray(saved.params["layer1/W"]).dtype))
        layers = checkpoint.layers_from_params(be, saved.params, path)
        network = checkpoint.finetuned_from_params(be, saved.params, layers, loss, path)
        return cls(network or StackedAutoencoder.from_layers(be, layers, loss=loss), be, path=Path(path).parent)


def pretrain(x, y=None, *, test=None, test_fraction: float = 0.2, layers: str | None = None,
             scheme: str = "greedy", epochs: int = 10, finetune_epochs: int = 10, seed: int = 0,
             out=None, quiet: bool = True, **options) -> Autoencoder:
    """Pre-train a stacked autoencoder on the rows of ``x`` and fine-tune it.

    Parameters
    ----------
    x : array (n, d)
        Training rows, values in [0, 1] (the layers' visible units are Bernoulli).
    y : array (n,), optional
        Integer labels, needed for ``task="classify"``; without them the rows are one class.
    test : (x_test, y_test or None), optional
        Rows to report the test error on; default: ``test_fraction`` of ``x``, drawn by ``seed``.
    layers : str, optional
        Sizes from the input to the code, e.g. "100-50-10" (default: d-1000-500-250-30).
    scheme : str
        Any of ``aepar.schemes.names()`` or "auto" (the fastest predicted).
    epochs, finetune_epochs, seed, out, quiet :
        As ``--epochs``, ``--finetune-epochs``, ``--seed``, ``--out`` (default a new
        runs/pretrain/NNN) and ``--quiet``.
    **options :
        Any other option of ``python -m aepar.pretrain``, underscores for dashes:
        ``batch=50``, ``pretrainer="ae"``, ``task="classify"``, ``dtype="float64"``; True for a flag.

    Returns
    -------
    Autoencoder
        The trained network (fine-tuned when ``finetune_epochs`` > 0).
    """
    data = _digits(x, y, test, test_fraction, seed)
    argv = ["--scheme", scheme, "--epochs", epochs, "--finetune-epochs", finetune_epochs, "--seed", seed]
    argv += ["--layers", layers or f"{data.train_x.shape[1]}-1000-500-250-30"]
    argv += (["--out", out] if out is not None else []) + (["--quiet"] if quiet else [])
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [] if value is False else [flag, value]
    comm = world()
    summary, path = run_program([str(a) for a in argv], comm, kind="pretrain", prog=PROG, parse=parse_args,
                                data=data)
    comm.barrier()  # rank 0 has published the run directory
    model = Autoencoder.load(path / "weights.h5", loss=options.get("loss", "xent"))
    model.summary = summary if comm.is_root else None
    return model


def _matrix(x, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or not x.size:
        raise UserError(f"{what} must be a non-empty 2-D array of rows, not shape {x.shape}")
    if x.dtype.kind not in "fiu" or not np.isfinite(x).all():
        raise UserError(f"{what} must hold finite numbers ({x.dtype})")
    return x


def _digits(x, y, test, test_fraction, seed) -> Digits:
    """The arrays as the engine's data: training and test rows with their labels."""
    x = _matrix(x, "x")
    if x.min() < 0 or x.max() > 1:
        raise UserError(f"x must lie in [0, 1] (the layers' visible units are Bernoulli), not [{x.min()}, {x.max()}]")
    y = np.zeros(len(x), np.int64) if y is None else np.asarray(y)
    if y.shape != (len(x),):
        raise UserError(f"y has {y.size} labels for {len(x)} rows of x")
    if test is None:
        if not 0 < test_fraction < 1:
            raise UserError(f"test_fraction must lie strictly between 0 and 1, not {test_fraction}")
        order = np.random.default_rng(seed).permutation(len(x))
        cut = len(x) - max(1, int(round(test_fraction * len(x))))
        train, held = np.sort(order[:cut]), np.sort(order[cut:])
        x, y, test_x, test_y = x[train], y[train], x[held], y[held]
    else:
        test_x = _matrix(test[0], "the test rows")
        test_y = np.zeros(len(test_x), np.int64) if len(test) < 2 or test[1] is None else np.asarray(test[1])
        if test_x.shape[1] != x.shape[1]:
            raise UserError(f"the test rows have {test_x.shape[1]} columns, x has {x.shape[1]}")
    return Digits(x, y, test_x, test_y, f"your arrays: {len(x)} train / {len(test_x)} test rows", "arrays")
