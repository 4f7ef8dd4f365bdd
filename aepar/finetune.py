"""Fine-tune a pre-trained stack by backpropagation: ``python -m aepar.finetune``.

The pre-trained layers (``weights.h5`` of ``aepar.greedy`` or ``aepar.sync``) are unrolled
into the deep autoencoder 784-1000-500-250-30-250-500-1000-784 and trained data-parallel
over every rank: the global minibatch is split over the ranks, one packed Allreduce sums
the gradients each step. The seed's recipe is plain SGD, learning rate 0.001, 10 epochs,
on squared error; ``--optimizer adam --loss xent`` (Adam on pixel cross-entropy) gains far
more in the same epochs (DESIGN.md, "Reference figures").

Examples
--------
    python -m aepar.finetune --weights runs/greedy/weights.h5
    mpirun -np 4 python -m aepar.finetune --weights runs/greedy/weights.h5 --optimizer adam --loss xent
"""
from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import numpy as np

from aepar import backend
from aepar.cli import ArgumentParser, RunDir, add_common, progress
from aepar.comm import run_main
from aepar.data.sources import DIGIT_SOURCES
from aepar.errors import CheckpointError, UserError
from aepar.models.stacked import LOSSES, StackedAutoencoder
from aepar.optim import SGD, Adam
from aepar.parallel.data_parallel import shard

__all__ = ["add_finetune_args", "default_float32", "make_optimizer", "finetune_and_evaluate", "shard_rows",
           "layers_to_params", "layers_from_params", "span", "main"]

PROG = "aepar.finetune"


def _non_negative_int(text):
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


_non_negative_int.__name__ = "non-negative integer"
_positive_int.__name__ = "positive integer"


def add_finetune_args(parser, *, standalone=False):
    """Fine-tuning options. ``standalone`` (the finetune CLI) also accepts the short names
    --epochs, --lr, --batch and --momentum."""
    g = parser.add_argument_group("fine-tuning (backprop through the unrolled autoencoder)")

    def names(long, short):
        return (long, short) if standalone else (long,)

    g.add_argument(*names("--finetune-epochs", "--epochs"), dest="finetune_epochs", type=_non_negative_int,
                   default=10, help="epochs of backprop (default 10; 0 skips fine-tuning)")
    g.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                   help="sgd: the seed's plain SGD; adam: Adam (default sgd)")
    g.add_argument("--loss", choices=list(LOSSES), default="mse",
                   help="mse: squared error (the seed); xent: pixel cross-entropy from logits "
                        "(default mse)")
    g.add_argument(*names("--finetune-lr", "--lr"), dest="finetune_lr", type=float, default=0.001,
                   help="learning rate (default 0.001, for either optimizer)")
    g.add_argument(*names("--finetune-momentum", "--momentum"), dest="finetune_momentum", type=float,
                   default=0.0, help="SGD momentum (default 0: plain SGD, as the seed)")
    g.add_argument(*names("--finetune-batch", "--batch"), dest="finetune_batch", type=_positive_int,
                   default=100, help="global minibatch, split over the ranks (default 100)")
    return g


def default_float32(parser):
    """float32 unless asked otherwise: on mnist5k it trains to the same errors as float64
    (within the run-to-run spread of CD sampling) with about half the CPU time."""
    parser.set_defaults(dtype="float32")
    for action in parser._actions:
        if action.dest == "dtype":
            action.help = "precision of weights and arithmetic (default float32 for this scheme)"


def make_optimizer(be, params, args):
    if args.optimizer == "adam":
        return Adam(be, params, lr=args.finetune_lr)
    return SGD(be, params, lr=args.finetune_lr, momentum=args.finetune_momentum)


def shard_rows(be, x, comm):
    """This rank's contiguous share of the rows of host array ``x``, as a backend array."""
    return be.asarray(x[shard(x.shape[0], comm.rank, comm.size)])


def span(trace, name, **meta):
    """A trace span when tracing, else nothing (the trace object's ``span`` context manager)."""
    if trace is None or not hasattr(trace, "span"):
        return contextlib.nullcontext()
    return trace.span(name, **meta)


def _timed(comm, be, fn, *args):
    """(result, seconds of the slowest rank) of ``fn(*args)``."""
    t0 = comm.wtime()
    result = fn(*args)
    be.synchronize()
    return result, comm.max(comm.wtime() - t0)


def _warm_up(be, args):
    """One step of a tiny model with the same loss and optimiser: kernels compiled (or
    loaded from Numba's cache) before the first timed epoch."""
    tiny = StackedAutoencoder(be, [5, 3, 2], loss=args.loss)
    x = be.asarray(np.random.default_rng(0).random((4, 5)))
    tiny.train_epoch(x, 0, make_optimizer(be, tiny.params, args), batch=4)
    tiny.error_per_digit(x)
    be.synchronize()


def finetune_and_evaluate(be, comm, layers, digits, args, trace=None) -> dict:
    """Unroll ``layers``, report its error, fine-tune it data-parallel, report again.

    Parameters
    ----------
    be : aepar.backend.Backend
    comm : aepar.comm.Comm
        All ranks that fine-tune together (data parallel).
    layers : list
        Pre-trained layers: objects with ``params`` {"W", "bv", "bh"}, the same on every rank.
    digits : aepar.data.sources.Digits
        The whole data set, on every rank (each takes its shard of the rows).
    args : namespace
        ``finetune_epochs, optimizer, loss, finetune_lr, finetune_momentum,
        finetune_batch, seed, quiet`` (see :func:`add_finetune_args`).
    trace : optional
        An aepar trace; each epoch is recorded as a span "finetune".

    Returns
    -------
    dict
        JSON-ready summary: ``before`` and ``after`` {"train", "test"} error per digit,
        ``epochs`` (per epoch: loss, train error seen while training, test error,
        seconds), ``time_s`` (training wall time, slowest rank, evaluation excluded),
        ``eval_s``, the settings; plus ``"model"``, the fine-tuned
        :class:`StackedAutoencoder` (pop it before writing the dict as JSON).
    """
    quiet = getattr(args, "quiet", False)
    _warm_up(be, args)
    train = shard_rows(be, digits.train_x, comm)
    test = shard_rows(be, digits.test_x, comm)
    model = StackedAutoencoder.from_layers(be, layers, loss=args.loss)
    optimizer = make_optimizer(be, model.params, args)
    eval_s = 0.0
    (before_train, before_test), dt = _timed(comm, be, lambda: (model.error_per_digit(train, comm),
                                                               model.error_per_digit(test, comm)))
    eval_s += dt
    progress(comm, quiet, f"fine-tuning {model!r}: {args.optimizer} lr {args.finetune_lr:g}, "
                          f"{args.finetune_epochs} epochs, {comm.size} rank(s)")
    progress(comm, quiet, f"  before: train error/digit {before_train:.3f}  test {before_test:.3f}")
    epochs, time_s = [], 0.0
    for epoch in range(args.finetune_epochs):
        with span(trace, "finetune", epoch=epoch):
            (loss, seen), dt = _timed(comm, be, model.train_epoch, train, epoch, optimizer, comm,
                                      args.finetune_batch, args.seed)
        time_s += dt
        test_err, et = _timed(comm, be, model.error_per_digit, test, comm)
        eval_s += et
        epochs.append({"epoch": epoch + 1, "loss": loss, "train_error_seen": seen,
                       "test_error": test_err, "seconds": dt})
        progress(comm, quiet, f"  finetune epoch {epoch + 1:3d}/{args.finetune_epochs}  loss {loss:9.4f}  "
                              f"train error {seen:8.3f}  test {test_err:8.3f}  {dt:7.2f}s")
    if args.finetune_epochs:
        (after_train, after_test), dt = _timed(comm, be, lambda: (model.error_per_digit(train, comm),
                                                                 model.error_per_digit(test, comm)))
        eval_s += dt
    else:
        after_train, after_test = before_train, before_test
    progress(comm, quiet, f"  after:  train error/digit {after_train:.3f}  test {after_test:.3f}  "
                          f"({time_s:.1f}s fine-tuning)")
    return {"optimizer": args.optimizer, "loss": args.loss, "lr": args.finetune_lr,
            "momentum": args.finetune_momentum if args.optimizer == "sgd" else None,
            "batch": args.finetune_batch, "n_epochs": args.finetune_epochs, "ranks": comm.size,
            "before": {"train": before_train, "test": before_test},
            "after": {"train": after_train, "test": after_test},
            "epochs": epochs, "time_s": time_s, "eval_s": eval_s, "model": model}


# ---- checkpoints of pre-trained stacks -----------------------------------------------------
def layers_to_params(be, layers) -> dict:
    """{"layer1/W": ..., "layer1/bv": ..., ...} as host arrays, for aepar.checkpoint."""
    out = {}
    for i, layer in enumerate(layers):
        for k, v in layer.params.items():
            out[f"layer{i + 1}/{k}"] = be.to_host(v)
    return out


def layers_from_params(be, params) -> list:
    """Inverse of :func:`layers_to_params`: objects with ``params`` (backend arrays)."""
    layers, i = [], 1
    while f"layer{i}/W" in params:
        try:
            p = {k: be.asarray(np.asarray(params[f"layer{i}/{k}"])) for k in ("W", "bv", "bh")}
        except KeyError as e:
            raise CheckpointError(f"layer {i} lacks {e.args[0]}") from None
        if p["bv"].shape != (p["W"].shape[0],) or p["bh"].shape != (p["W"].shape[1],):
            raise CheckpointError(f"layer {i}: biases {p['bv'].shape}, {p['bh'].shape} do not fit W {p['W'].shape}")
        if layers and layers[-1].params["W"].shape[1] != p["W"].shape[0]:
            raise CheckpointError(f"layer {i} takes {p['W'].shape[0]} inputs but layer {i - 1} "
                                  f"gives {layers[-1].params['W'].shape[1]}")
        layers.append(SimpleNamespace(params=p))
        i += 1
    if not layers:
        raise CheckpointError("no pre-trained layers (layer1/W, ...) in the checkpoint")
    return layers


# ---- the CLI -----------------------------------------------------------------------------
def build_parser():
    parser = ArgumentParser(prog=f"python -m {PROG}",
                            description="Fine-tune a pre-trained stacked autoencoder by backpropagation, "
                                        "data-parallel over every MPI rank; prints the average squared "
                                        "reconstruction error per digit on the training and test sets.",
                            epilog="Example: mpirun -np 2 python -m aepar.finetune --weights "
                                   "runs/greedy/weights.h5 --optimizer adam --loss xent")
    parser.add_argument("--weights", required=True,
                        help="checkpoint of a pre-trained stack (weights.h5 of aepar.greedy / aepar.sync)")
    parser.add_argument("--dataset", choices=list(DIGIT_SOURCES), default="auto",
                        help="digits to fine-tune on, as for aepar.greedy (default: auto)")
    parser.add_argument("--limit", type=_positive_int, default=None, help="use at most this many training digits")
    add_finetune_args(parser, standalone=True)
    add_common(parser, out_default="runs/finetune")
    default_float32(parser)
    return parser


def _setup(args, comm):
    """Every rank, no communication: backend, checkpoint, data, checks."""
    from aepar import checkpoint
    from aepar.data.sources import load_digits

    be = backend.select(args.device, args.kernels, args.dtype)
    ckpt = checkpoint.load(args.weights)
    layers = layers_from_params(be, ckpt.params)
    digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    n_in = layers[0].params["W"].shape[0]
    if digits.train_x.shape[1] != n_in:
        raise UserError(f"{args.weights} takes {n_in} inputs but the digits have {digits.train_x.shape[1]} pixels")
    check_ranks(comm, digits.train_x.shape[0], args.finetune_batch)
    return be, layers, digits, ckpt


def check_ranks(comm, n_train: int, batch: int):
    """UserError if the ranks cannot each get rows of every batch."""
    n_batches = -(-n_train // batch)
    if comm.size > n_batches:
        raise UserError(f"{comm.size} ranks but {n_train} training digits make only {n_batches} "
                        f"batch(es) of {batch}: use at most {n_batches} ranks")
    if comm.size > batch:
        raise UserError(f"{comm.size} ranks cannot split a batch of {batch}: use at most {batch} ranks")


def main(argv, comm):
    from aepar import checkpoint
    from aepar.greedy import pca_error
    from aepar.report.stacked import write_tables

    args = build_parser().parse_args(argv)
    be, layers, digits, ckpt = comm.agree(_setup, args, comm)
    progress(comm, args.quiet, f"{PROG}: {digits.source}")
    with RunDir(args.out, comm) as run:
        result = finetune_and_evaluate(be, comm, layers, digits, args)
        model = result.pop("model")
        summary = {"scheme": "finetune", "weights": str(args.weights), "source": digits.source,
                   "n_train": int(digits.train_x.shape[0]), "n_test": int(digits.test_x.shape[0]),
                   "ranks": comm.size, "device": be.device, "kernels": be.kernel_set,
                   "dtype": str(be.dtype), "layers": model.sizes, "finetune": result,
                   "error": {"pretrained": result["before"], "finetuned": result["after"]},
                   "finetune_time_s": result["time_s"], "pretrain_time_s": None}
        k = model.sizes[-1]
        summary["pca"] = comm.bcast_obj(pca_error(digits.train_x, digits.test_x, k) if comm.is_root else None)
        if comm.is_root:
            params = layers_to_params(be, layers)
            params.update({f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()})
            checkpoint.save(run.file("weights.h5"), scheme="finetune", params=params,
                            epoch=args.finetune_epochs,
                            config={"sizes": model.sizes, "loss": args.loss, "optimizer": args.optimizer})
        run.write_json("summary.json", summary)
        if comm.is_root:
            text = write_tables(run.path, {f"{args.optimizer}/{args.loss}": summary})
            progress(comm, args.quiet, text)
    progress(comm, args.quiet, f"{PROG}: wrote {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
