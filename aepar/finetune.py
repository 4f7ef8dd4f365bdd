"""Fine-tune a pre-trained stack by backpropagation: ``python -m aepar.finetune``.

The pre-trained layers (``weights.h5`` of ``aepar.greedy`` or ``aepar.sync``) are unrolled
into the deep autoencoder 784-1000-500-250-30-250-500-1000-784 and trained data-parallel
over every rank: the global minibatch is split over the ranks, one packed Allreduce sums
the gradients each step. The default is Adam on pixel cross-entropy, which gains far more
in the same epochs than the seed's literal recipe, plain SGD at learning rate 0.001 on
squared error (``--optimizer sgd --loss mse``; docs/architecture.md, "Training recipes").

Given a checkpoint that was fine-tuned already (``finetuned/*`` in a weights.h5 of any
of these schemes), fine-tuning continues from the fine-tuned network (``--from-pretrained``
starts again from its pre-trained layers). Like every scheme it saves checkpoints at safe
points and ``--resume DIR`` continues an interrupted run bit for bit.

Examples
--------
    python -m aepar.finetune --weights runs/greedy/001/weights.h5
    mpirun -np 4 python -m aepar.finetune --weights runs/greedy/001/weights.h5 --optimizer adam --loss xent
"""
from __future__ import annotations

import sys

import numpy as np

from aepar import backend
from aepar.checkpoint import finetuned_from_params, layers_from_params, layers_to_params
from aepar.cli import (ArgumentParser, add_common, add_reduce_blocks, gpu_blocks_hint, learning_rate, momentum,
                       non_negative_int, positive_int, progress)
from aepar.comm import run_main
from aepar.data.sources import DIGIT_SOURCES
from aepar.errors import UserError
from aepar.models.stacked import LOSSES, StackedAutoencoder
from aepar.optim import make_optimizer
from aepar.parallel.data_parallel import reducer
from aepar.resume import BackpropRun, timed, warm_up
from aepar.rows import Shard

__all__ = ["add_finetune_args", "default_float32", "finetune_optimizer", "finetune_and_evaluate", "build_parser",
           "main"]

PROG = "aepar.finetune"


def add_finetune_args(parser, *, standalone=False):
    """Fine-tuning options. ``standalone`` (the finetune CLI) also accepts the short names
    --epochs, --lr, --batch and --momentum, and --reduce-blocks."""
    g = parser.add_argument_group("fine-tuning (backprop through the unrolled autoencoder)")

    def names(long, short):
        return (long, short) if standalone else (long,)

    g.add_argument(*names("--finetune-epochs", "--epochs"), dest="finetune_epochs", type=non_negative_int,
                   default=10, help="epochs of backprop (default 10; 0 skips fine-tuning)")
    g.add_argument("--optimizer", choices=["sgd", "adam"], default="adam",
                   help="adam: Adam (default); sgd: plain SGD. The seed's literal recipe is --optimizer sgd "
                        "--loss mse, which barely moves the weights in 10 epochs")
    g.add_argument("--loss", choices=list(LOSSES), default="xent",
                   help="xent: pixel cross-entropy from logits (default, Hinton's fine-tuning objective); "
                        "mse: squared error (the seed)")
    g.add_argument(*names("--finetune-lr", "--lr"), dest="finetune_lr", type=learning_rate, default=0.001,
                   help="learning rate (default 0.001, for either optimizer)")
    g.add_argument(*names("--finetune-momentum", "--momentum"), dest="finetune_momentum", type=momentum,
                   default=0.0, help="SGD momentum in [0, 1) (default 0: plain SGD, as the seed)")
    g.add_argument(*names("--finetune-batch", "--batch"), dest="finetune_batch", type=positive_int,
                   default=100, help="global minibatch, drawn from every block of the data (default 100)")
    if standalone:
        add_reduce_blocks(g)
    return g


def default_float32(parser):
    """float32 unless asked otherwise: on mnist5k it trains to the same errors as float64
    (within the run-to-run spread of CD sampling) with about half the CPU time."""
    parser.set_defaults(dtype="float32")
    for action in parser._actions:
        if action.dest == "dtype":
            action.help = "precision of weights and arithmetic (default float32 for this scheme)"


def finetune_optimizer(be, params, args):
    return make_optimizer(be, params, args.optimizer, args.finetune_lr, args.finetune_momentum)


def _warm_up(be, args):
    """A tiny model with the same loss and optimiser, once (aepar.resume.warm_up)."""
    tiny = StackedAutoencoder(be, [5, 3, 2], loss=args.loss)
    x = Shard.of(be, np.random.default_rng(0).random((4, 5)), 1)
    warm_up(be, tiny, x, tiny.error_per_digit, batch=4, optimizer=finetune_optimizer(be, tiny.params, args))


def finetune_and_evaluate(be, comm, layers, digits, args, trace=None, *, ckpt=None, resume=None,
                          outer=None, model=None, guard=None, prefix="") -> dict:
    """Unroll ``layers`` (or go on with ``model``), report its error, fine-tune it
    data-parallel, report again.

    Parameters
    ----------
    be : aepar.backend.Backend
    comm : aepar.comm.Comm
        All ranks that fine-tune together (data parallel).
    layers : list
        Pre-trained layers: objects with ``params`` {"W", "bv", "bh"}, the same on every rank.
    digits : aepar.data.sources.Digits
        The whole data set, on every rank (each takes its blocks of the rows).
    args : namespace
        ``finetune_epochs, optimizer, loss, finetune_lr, finetune_momentum,
        finetune_batch, reduce_blocks, seed, quiet`` (see :func:`add_finetune_args`).
    trace : optional
        An aepar trace; each epoch is recorded as a span "finetune".
    ckpt : aepar.resume.Checkpointer, optional
        Safe points: checkpoints and stops inside fine-tuning.
    resume : (params, opt_state, progress), optional
        A checkpoint saved during this fine-tuning: go on from it.
    outer : callable() -> (params, opt_state, progress), optional
        What the calling scheme adds to every checkpoint (its pre-trained layers, ...).
    model : StackedAutoencoder, optional
        Continue fine-tuning this network instead of unrolling ``layers``.
    guard : aepar.guard.Guard, optional
    prefix : str
        Before the checkpoint names of this network ("finetuned/...", "finetune/..."), when
        a run fine-tunes two (aepar.sync's greedy comparison: "greedy/").

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
    count = args.reduce_blocks
    train = Shard.of(be, digits.train_x, count, comm.rank, comm.size)
    test = Shard.of(be, digits.test_x, min(count, max(1, digits.test_x.shape[0])), comm.rank, comm.size)
    if model is None:
        model = StackedAutoencoder.from_layers(be, layers, loss=args.loss)
    model.seed = int(args.seed)
    reduce = reducer(comm)
    fit = BackpropRun(be, comm, model, finetune_optimizer(be, model.params, args), train, batch=args.finetune_batch,
                      what="fine-tuning", params_tag=f"{prefix}finetuned/", opt_tag=f"{prefix}finetune/",
                      record_key="finetune", fields={"phase": "finetune"}, ckpt=ckpt, guard=guard, outer=outer,
                      trace=trace, span="finetune")
    record = fit.record
    if fit.restore(resume):
        record = fit.record
        progress(comm, quiet, f"fine-tuning: resuming at {fit.resuming_at}")
    else:
        (before_train, before_test), dt = timed(comm, be, lambda: (model.error_per_digit(train, reduce),
                                                                   model.error_per_digit(test, reduce)))
        record["before"] = {"train": before_train, "test": before_test}
        record["eval_s"] += dt
        if guard is not None:
            guard.check(before_train + before_test, "the error of the network before fine-tuning",
                        "fine-tuning", ckpt.run if ckpt else None, comm)
    progress(comm, quiet, f"fine-tuning {model!r}: {args.optimizer} lr {args.finetune_lr:g}, "
                          f"{args.finetune_epochs} epochs, {comm.size} rank(s), {count} blocks")
    progress(comm, quiet, f"  before: train error/digit {record['before']['train']:.3f}  "
                          f"test {record['before']['test']:.3f}")

    def after_epoch(epoch, result):
        loss, seen = result.means
        if guard is not None:
            where = f"fine-tuning epoch {epoch + 1}"
            guard.check(loss, "the loss", where, ckpt.run if ckpt else None, comm)
            guard.check_params(model.params, where, ckpt.run if ckpt else None, comm)
        test_err, et = timed(comm, be, model.error_per_digit, test, reduce)
        record["eval_s"] += et
        if guard is not None:
            guard.check(test_err, "the test error", f"fine-tuning epoch {epoch + 1}", ckpt.run if ckpt else None, comm)
        seconds = fit.epoch_seconds()
        record["epochs"].append({"epoch": epoch + 1, "loss": loss, "train_error_seen": seen,
                                 "test_error": test_err, "seconds": seconds})
        progress(comm, quiet, f"  finetune epoch {epoch + 1:3d}/{args.finetune_epochs}  loss {loss:9.4f}  "
                              f"train error {seen:8.3f}  test {test_err:8.3f}  {seconds:7.2f}s")

    fit.run(args.finetune_epochs, after_epoch)
    if args.finetune_epochs:
        (after_train, after_test), dt = timed(comm, be, lambda: (model.error_per_digit(train, reduce),
                                                                 model.error_per_digit(test, reduce)))
        record["eval_s"] += dt
    else:
        after_train, after_test = record["before"]["train"], record["before"]["test"]
    progress(comm, quiet, f"  after:  train error/digit {after_train:.3f}  test {after_test:.3f}  "
                          f"({record['time_s']:.1f}s fine-tuning)")
    return {"optimizer": args.optimizer, "loss": args.loss, "lr": args.finetune_lr,
            "momentum": args.finetune_momentum if args.optimizer == "sgd" else None,
            "batch": args.finetune_batch, "n_epochs": args.finetune_epochs, "ranks": comm.size,
            "blocks": count, "before": record["before"], "after": {"train": after_train, "test": after_test},
            "epochs": record["epochs"], "time_s": record["time_s"], "eval_s": record["eval_s"], "model": model}


# ---- the CLI -----------------------------------------------------------------------------
def build_parser():
    parser = ArgumentParser(prog=f"python -m {PROG}",
                            description="Fine-tune a pre-trained stacked autoencoder by backpropagation, "
                                        "data-parallel over every MPI rank; prints the average squared "
                                        "reconstruction error per digit on the training and test sets. "
                                        "Weights that were fine-tuned already are fine-tuned further.",
                            epilog="Exit codes: 0 done, 2 bad input, 3 diverged, 75 interrupted (checkpoint "
                                   "saved: --resume DIR), 124 a rank stalled, 1 internal error. Example: "
                                   "mpirun -np 2 python -m aepar.finetune --weights "
                                   "runs/greedy/001/weights.h5 --optimizer adam --loss xent")
    parser.add_argument("--weights", required=True,
                        help="weights.h5 of aepar.greedy / aepar.sync / aepar.finetune")
    parser.add_argument("--from-pretrained", action="store_true",
                        help="start from the pre-trained layers even if the file holds a fine-tuned network")
    parser.add_argument("--dataset", choices=list(DIGIT_SOURCES), default="auto",
                        help="data to fine-tune on, as for aepar.greedy (default: auto)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use at most this many training digits")
    add_finetune_args(parser, standalone=True)
    add_common(parser, scheme="finetune")
    default_float32(parser)
    return parser


def _setup(args, comm):
    """Every rank, no communication: backend, checkpoint, data, checks."""
    from aepar import checkpoint
    from aepar.data.sources import load_digits
    from aepar.stack import check_blocks

    be = backend.select(args.device, args.kernels, args.dtype)
    ckpt = checkpoint.load(args.weights, scheme=("greedy", "sync", "finetune"))
    layers = layers_from_params(be, ckpt.params, args.weights)
    model = None if args.from_pretrained else finetuned_from_params(be, ckpt.params, layers, args.loss, args.weights)
    digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    n_in = layers[0].params["W"].shape[0]
    if digits.train_x.shape[1] != n_in:
        raise UserError(f"{args.weights} takes {n_in} inputs but the data have {digits.train_x.shape[1]}")
    check_blocks(comm.size, args.reduce_blocks, digits.train_x.shape[0])
    gpu_blocks_hint(comm, be, args.reduce_blocks, args.quiet)
    return be, layers, model, digits


def main(argv, comm):
    from aepar import checkpoint
    from aepar.guard import Guard
    from aepar.report.stacked import TABLES_FILE, pca_error, tables
    from aepar.resume import Checkpointer
    from aepar.rundir import fingerprint, parse_and_open

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, "finetune", PROG, build_parser().parse_args, argv)
    with run, Guard.from_args(comm, PROG, args) as guard:
        be, layers, model, digits = comm.agree(_setup, args, comm)
        continued = model is not None
        progress(comm, args.quiet, f"{PROG}: {digits.source}")
        if continued:
            progress(comm, args.quiet, f"{PROG}: {args.weights} holds a fine-tuned network: fine-tuning it further "
                                       "(--from-pretrained starts from its pre-trained layers)")
        ckpt = Checkpointer(run, comm, guard, "finetune",
                            fingerprint(digits.train_x, digits.test_x) if comm.is_root else None,
                            progress=lambda m: progress(comm, args.quiet, m))
        resume = ckpt.load()
        layer_params = layers_to_params(be, layers)
        result = finetune_and_evaluate(be, comm, layers, digits, args, ckpt=ckpt, resume=resume,
                                       outer=lambda: (layer_params, {}, {}), model=model, guard=guard)
        model = result.pop("model")
        summary = {"scheme": "finetune", "weights": str(args.weights), "source": digits.source,
                   "n_train": int(digits.train_x.shape[0]), "n_test": int(digits.test_x.shape[0]),
                   "ranks": comm.size, "device": be.device, "kernels": be.kernel_set,
                   "dtype": str(be.dtype), "layers": model.sizes, "finetune": result,
                   "continued_finetuned": continued,
                   "error": {"pretrained": result["before"], "finetuned": result["after"]},
                   "finetune_time_s": result["time_s"], "pretrain_time_s": None}
        k = model.sizes[-1]
        summary["pca"] = comm.bcast(pca_error(digits.train_x, digits.test_x, k) if comm.is_root else None)
        if comm.is_root:
            params = dict(layer_params, **{f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()})
            with run.output("weights.h5") as path:
                checkpoint.save(path, scheme="finetune", params=params, epoch=args.finetune_epochs,
                                config={"sizes": model.sizes, "loss": args.loss, "optimizer": args.optimizer})
            run.write_json("summary.json", summary)
            text = tables({f"{args.optimizer}/{args.loss}": summary})
            run.write_text(TABLES_FILE, text)
            progress(comm, args.quiet, text)
        run.complete()
    progress(comm, args.quiet, f"{PROG}: wrote {run.path}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
