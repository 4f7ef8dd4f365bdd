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

The other two studies, alike: :func:`sparse_autoencoder` (``python -m aepar.sparse``) learns
features from patches of your images and returns a :class:`SparseAutoencoder`;
:func:`eager` (``python -m aepar.eager``) trains the convolutional autoencoders on your
labelled images, combines their codes into one classifier and returns its run
(:class:`EagerRun`: accuracies, files).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepar import backend, checkpoint, schemes
from aepar.comm import world
from aepar.data.sources import Digits, Images
from aepar.errors import UserError
from aepar.models.stacked import StackedAutoencoder
from aepar.pretrain import PROG, parse_args, run_program
from aepar.rows import Shard

__all__ = ["pretrain", "Autoencoder", "sparse_autoencoder", "SparseAutoencoder", "eager", "EagerRun"]


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


def pretrain(x, y=None, *, test=None, test_fraction: float = 0.2, layers=None,
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
    layers : str or sequence of int, optional
        Sizes from the input to the code, "100-50-10" or [100, 50, 10] (default:
        d-1000-500-250-30).
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
    argv = _argv(dict(scheme=scheme, epochs=epochs, finetune_epochs=finetune_epochs, seed=seed,
                      layers=_layers_text(layers) or f"{data.train_x.shape[1]}-1000-500-250-30", out=out,
                      quiet=quiet, **options))
    comm = world()
    summary, path = run_program(argv, comm, kind="pretrain", prog=PROG, parse=parse_args, data=data)
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
        train, held = _held_out(len(x), test_fraction, seed)
        x, y, test_x, test_y = x[train], y[train], x[held], y[held]
    else:
        test_x = _matrix(test[0], "the test rows")
        test_y = np.zeros(len(test_x), np.int64) if len(test) < 2 or test[1] is None else np.asarray(test[1])
        if test_x.shape[1] != x.shape[1]:
            raise UserError(f"the test rows have {test_x.shape[1]} columns, x has {x.shape[1]}")
    return Digits(x, y, test_x, test_y, f"your arrays: {len(x)} train / {len(test_x)} test rows", "arrays")


def _held_out(n: int, test_fraction: float, seed: int) -> tuple:
    """Sorted indices of the training rows and of the ``test_fraction`` held out by ``seed``."""
    if not 0 < test_fraction < 1:
        raise UserError(f"test_fraction must lie strictly between 0 and 1, not {test_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    cut = n - max(1, int(round(test_fraction * n)))
    return np.sort(order[:cut]), np.sort(order[cut:])


def _layers_text(layers):
    """``layers`` as ``--layers`` takes it: a string as it is, a sequence of sizes joined by '-'."""
    if layers is None or isinstance(layers, str):
        return layers
    try:
        text = "-".join(str(operator.index(size)) for size in layers)
    except TypeError:
        text = ""
    if not text:
        raise UserError(f"layers={layers!r}: give the sizes as integers, e.g. [100, 50, 10] or "
                        "\"100-50-10\"")
    return text


def _argv(options: dict) -> list:
    """Keyword arguments as the command's options: underscores for dashes, True for a flag,
    False or None left out."""
    argv = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [] if value is False or value is None else [flag, value]
    return [str(a) for a in argv]


def _images(x, what: str) -> np.ndarray:
    """Images (N, H, W), (N, C, H, W) or (N, H, W, C) as float64 (N, C, H, W), uint8 scaled
    to [0, 1]."""
    from aepar.data.files import image_layout

    x = np.asarray(x)
    if x.ndim not in (3, 4) or not x.size:
        raise UserError(f"{what} must be images (N, H, W), (N, C, H, W) or (N, H, W, C), not shape {x.shape}")
    if x.dtype.kind not in "fiu" or not np.isfinite(x).all():
        raise UserError(f"{what} must hold finite numbers ({x.dtype})")
    chw, last = image_layout(x.shape[1:], what)
    x = np.moveaxis(x, 3, 1) if last else x
    return np.ascontiguousarray(x.reshape((len(x),) + chw), dtype=np.float64) / (255.0 if x.dtype == np.uint8 else 1.0)


class SparseAutoencoder:
    """Ng's sparse autoencoder as trained: ``W1`` (v, h), ``b1`` (h), ``W2`` (h, v), ``b2`` (v)
    for patches of ``patch`` x ``patch`` pixels as rows of v = patch² values; ``summary`` and
    ``path`` as for :class:`Autoencoder`."""

    def __init__(self, params: dict, summary=None, path=None):
        self.W1, self.b1, self.W2, self.b2 = (np.asarray(params[k]) for k in ("W1", "b1", "W2", "b2"))
        self.patch = int(round(np.sqrt(self.W1.shape[0])))
        self.summary, self.path = summary, Path(path) if path is not None else None

    def encode(self, patches) -> np.ndarray:
        """The hidden units' activations (the learned features) of the rows of ``patches``."""
        patches = _matrix(patches, "patches")
        if patches.shape[1] != self.W1.shape[0]:
            raise UserError(f"patches have {patches.shape[1]} values but the network takes {self.W1.shape[0]}")
        return 1.0 / (1.0 + np.exp(-(patches @ self.W1 + self.b1)))

    def reconstruct(self, patches) -> np.ndarray:
        """The network's outputs for the rows of ``patches``."""
        return 1.0 / (1.0 + np.exp(-(self.encode(patches) @ self.W2 + self.b2)))

    def save(self, path):
        """The parameters as a weights.h5 of aepar.sparse's format."""
        checkpoint.save(path, scheme="sparse", params={k: getattr(self, k) for k in ("W1", "W2", "b1", "b2")})
        return Path(path)

    @classmethod
    def load(cls, path):
        """The network in a weights.h5 of ``python -m aepar.sparse`` or of :meth:`save`."""
        return cls(checkpoint.load(path, scheme="sparse").params, path=Path(path).parent)


def sparse_autoencoder(images=None, *, hidden: int = 25, patch: int = 8, samples: int = 10000,
                       iterations: int = 400, seed: int = 0, out=None, quiet: bool = True,
                       **options) -> SparseAutoencoder:
    """Train Ng's sparse autoencoder on patches of ``images`` with L-BFGS, as
    ``python -m aepar.sparse`` does (the same patches, bits and run directory).

    Parameters
    ----------
    images : array (N, H, W), (N, C, H, W) or (N, H, W, C), optional
        Natural images (uint8 or numbers); made grey, cropped square and whitened like the
        paper's IMAGES.mat. Default: the program's own (``--images``, ``data_dir``, else the
        scikit-image photographs).
    hidden, patch, samples, iterations, seed, out, quiet :
        As ``--hidden``, ``--patch``, ``--limit`` (patches sampled), ``--iterations``,
        ``--seed``, ``--out`` and ``--quiet``.
    **options :
        Any other option of ``python -m aepar.sparse``, underscores for dashes:
        ``rho=0.05``, ``weight_cost=3e-3``, ``dtype="float64"``, ``optimizer="lbfgs"``.

    Returns
    -------
    SparseAutoencoder
    """
    from aepar.data.files import natural_from
    from aepar.sparse import run_program as run_sparse

    given = None
    if images is not None:
        stack, how = natural_from(_images(images, "images"), "images")
        given = stack, f"your array: {how}"
    argv = _argv(dict(hidden=hidden, patch=patch, limit=samples, iterations=iterations, seed=seed, out=out,
                      quiet=quiet, **options))
    comm = world()
    summary, path = run_sparse(argv, comm, images=given)
    comm.barrier()  # rank 0 has published the run directory
    model = SparseAutoencoder.load(path / "weights.h5")
    model.summary = summary if comm.is_root else None
    return model


@dataclass
class EagerRun:
    """What :func:`eager` trained: ``summary`` (summary.json: every CAE's record and the
    accuracies; rank 0, None elsewhere) and ``path``, its run directory (accuracy.md,
    metrics.csv, the CAEs' snapshots)."""

    summary: dict | None
    path: Path

    @property
    def accuracy(self) -> dict | None:
        """Test accuracy (a fraction) of the combined classifier, of the vote and of the
        monolithic CAE where there was one (rank 0; None elsewhere)."""
        if self.summary is None:
            return None
        final = self.summary["final"]
        return {k: final[k]["test"] for k in ("combined", "vote", "mono") if k in final}


def eager(x, y, *, test=None, test_fraction: float = 0.2, models: int = 4, epochs: int = 10, seed: int = 0,
          out=None, quiet: bool = True, **options) -> EagerRun:
    """Train ``models`` convolutional autoencoders eagerly on labelled images and combine
    their codes into one classifier, as ``python -m aepar.eager`` does.

    Parameters
    ----------
    x : array (N, H, W), (N, C, H, W) or (N, H, W, C)
        Images, uint8 or values in [0, 1].
    y : array (N,)
        Their labels (any values; mapped to 0..K-1 in sorted order).
    test : (x_test, y_test), optional
        Test images; default: ``test_fraction`` of ``x``, drawn by ``seed``.
    models, epochs, seed, out, quiet :
        As ``--models``, ``--epochs``, ``--seed``, ``--out`` and ``--quiet``.
    **options :
        Any other option of ``python -m aepar.eager``, underscores for dashes:
        ``filters="8,16"``, ``mono_epochs=0``, ``classify_epochs=5``.

    Returns
    -------
    EagerRun
    """
    from aepar.data.files import labels_to_classes
    from aepar.eager import run_program as run_eager

    x = _images(x, "x")
    if x.min() < 0 or x.max() > 1:
        raise UserError(f"x must lie in [0, 1] (or be uint8), not [{x.min()}, {x.max()}]")
    if np.shape(y) != (len(x),):
        raise UserError(f"y has {np.size(y)} labels for {len(x)} images")
    if test is None:
        train, held = _held_out(len(x), test_fraction, seed)
        x, y, test_x, test_y = x[train], np.asarray(y)[train], x[held], np.asarray(y)[held]
    else:
        test_x, test_y = _images(test[0], "the test images"), test[1]
        if test_x.shape[1:] != x.shape[1:]:
            raise UserError(f"the test images are {test_x.shape[1:]}, x's {x.shape[1:]}")
    y, test_y, classes = labels_to_classes("y", y, test_y)
    data = Images(x, y, test_x, test_y, f"your arrays: {len(x)} train / {len(test_x)} test images "
                  f"{'x'.join(map(str, x.shape[1:]))}, {len(classes)} classes", "arrays", classes=classes)
    comm = world()
    summary, path = run_eager(_argv(dict(models=models, epochs=epochs, seed=seed, out=out, quiet=quiet,
                                         **options)), comm, images=data)
    comm.barrier()
    return EagerRun(summary if comm.is_root else None, Path(path))
