"""Fine-tuning the unrolled autoencoder by backpropagation, data-parallel (the ``reconstruct`` task).

The pre-trained layers are unrolled into the deep autoencoder (784-1000-500-250-30-250-500-
1000-784 for the paper's stack) and trained over every rank given: the global minibatch is
drawn from fixed blocks of the rows, the blocks' gradients are added in one fixed tree, so
any number of ranks takes the same steps. The default is Adam on pixel cross-entropy, its
rate falling along half a cosine and the weight matrices decaying (AdamW), which gains far
more in the same epochs than the paper's literal recipe, plain SGD at learning rate 0.001 on
squared error (``--optimizer sgd --loss mse --finetune-lr 0.001 --finetune-lr-decay none
--finetune-weight-decay 0``; docs/architecture.md, "Training recipes").
"""
from __future__ import annotations

from aepar import metrics
from aepar.cli import (add_reduce_blocks, learning_rate, momentum, non_negative_float, non_negative_int, positive_int,
                       progress, renamed)
from aepar.models.stacked import LOSSES, StackedAutoencoder
from aepar.optim import cosine, make_optimizer
from aepar.parallel.data_parallel import reducer
from aepar.resume import BackpropRun, timed, warm_up, warm_up_rows
from aepar.rows import Shard

__all__ = ["add_finetune_args", "finetune_optimizer", "finetune_decay", "finetune_rate", "finetune_and_evaluate"]

# Adam's first rate with the cosine decay: chosen on held-out rows of the Fashion-MNIST
# training set (docs/architecture.md, "Training recipes")
LR = 0.004
WEIGHT_DECAY = 0.05  # chosen the same way, with LR and the cosine decay


def add_finetune_args(parser, *, standalone=False):
    """Fine-tuning options (every name starts with --finetune-). ``standalone`` (the finetune
    program) also takes --reduce-blocks, and for one more release its old short names."""
    g = parser.add_argument_group("fine-tuning (backprop through the unrolled autoencoder)")
    g.add_argument("--finetune-epochs", type=non_negative_int, default=10,
                   help="epochs of backprop (default 10; 0 skips fine-tuning)")
    g.add_argument("--optimizer", choices=["sgd", "adam"], default="adam",
                   help="adam: Adam (default); sgd: plain SGD. The paper's literal recipe is --optimizer sgd "
                        "--loss mse --finetune-lr 0.001 --finetune-lr-decay none --finetune-weight-decay 0, which "
                        "barely moves the weights in 10 epochs")
    g.add_argument("--loss", choices=list(LOSSES), default="xent",
                   help="xent: pixel cross-entropy from logits (default, Hinton's fine-tuning objective); "
                        "mse: squared error (the paper)")
    g.add_argument("--finetune-lr", type=learning_rate, default=LR,
                   help=f"learning rate at the first epoch (default {LR:g}, for either optimizer)")
    g.add_argument("--finetune-lr-decay", choices=["none", "cosine"], default="cosine",
                   help="cosine (default): the rate falls along half a cosine from --finetune-lr toward 0 by the "
                        "last epoch (a lower error than a constant rate in the same epochs); none: the rate stays")
    g.add_argument("--finetune-weight-decay", type=non_negative_float, default=WEIGHT_DECAY, metavar="C",
                   help=f"each step shrinks the weight matrices (not the biases) by the factor 1 - lr x C, apart "
                        f"from the gradient (Adam: AdamW's decoupled decay; SGD: C x W added to the gradient, the "
                        f"same without momentum); a lower test error than none, where the network otherwise "
                        f"overfits its training rows (default {WEIGHT_DECAY:g}; 0: none)")
    g.add_argument("--finetune-momentum", type=momentum, default=0.0,
                   help="SGD momentum in [0, 1) (default 0: plain SGD, as the paper)")
    g.add_argument("--finetune-batch", type=positive_int, default=100,
                   help="global minibatch, drawn from every block of the data (default 100)")
    if standalone:
        add_reduce_blocks(g)
        for short, kind in (("epochs", non_negative_int), ("lr", learning_rate), ("momentum", momentum),
                            ("batch", positive_int)):
            renamed(g, f"--{short}", f"--finetune-{short}", dest=f"finetune_{short}", type=kind)
    return g


def finetune_optimizer(be, params, args):
    return make_optimizer(be, params, args.optimizer, args.finetune_lr, args.finetune_momentum,
                          args.finetune_weight_decay)


def finetune_decay(args, scheme_decay: str = "none") -> str:
    """Fine-tuning's rate decay, decided here only: cosine when --finetune-lr-decay says so
    or when a scheme's rule for every rate does (``scheme_decay``: the data scheme's
    --lr-decay), else none."""
    return "cosine" if "cosine" in (args.finetune_lr_decay, scheme_decay) else "none"


def finetune_rate(args):
    """The rate of each (0-based) fine-tuning epoch, or None for --finetune-lr throughout: a
    scheme's own schedule (``args.finetune_lr_at``, set by the data scheme's large-batch
    rules, with :func:`finetune_decay`), else :func:`finetune_decay`'s."""
    scheduled = getattr(args, "finetune_lr_at", None)
    if scheduled is not None or finetune_decay(args) == "none":
        return scheduled
    return cosine(args.finetune_lr, args.finetune_epochs)



def _warm_up(be, args, model, count):
    """A throw-away copy of the network ``model`` (its sizes and loss) trained one step on a
    batch of random rows in the run's ``count`` blocks, with the run's optimiser, and its
    error (aepar.resume.warm_up): the kernels its shapes take load (or compile) here, not in
    the first timed epoch. A tiny network loaded the element-wise kernels only, not the
    wide layers' row kernels nor the optimiser's for their arrays."""
    copy = StackedAutoencoder(be, model.sizes, loss=model.loss, batch=args.finetune_batch)
    x = Shard.of(be, warm_up_rows(args.finetune_batch, model.sizes[0], count), count)
    warm_up(be, copy, x, copy.error_per_digit, batch=args.finetune_batch,
            optimizer=finetune_optimizer(be, copy.params, args))


def finetune_and_evaluate(be, comm, layers, digits, args, trace=None, *, ckpt=None, resume=None,
                          outer=None, model=None, guard=None, prefix="") -> dict:
    """Unroll ``layers`` (or go on with ``model``), report its error, fine-tune it
    data-parallel, report again.

    Parameters
    ----------
    comm : aepar.comm.Comm
        All ranks that fine-tune together (data parallel).
    layers : list
        Pre-trained layers: objects with ``params`` {"W", "bv", "bh"}, the same on every rank.
    digits : aepar.data.sources.Digits
        The whole data set, on every rank (each takes its blocks of the rows).
    args : namespace
        The options of :func:`add_finetune_args`, ``reduce_blocks``, ``seed``, ``quiet``.
    trace, guard : optional
        An aepar trace (a span "finetune" per epoch); the run's guard.
    ckpt, resume, outer : optional
        The checkpointer; a checkpoint taken during this fine-tuning to go on from; what
        the caller adds to every checkpoint (``() -> (params, opt_state, progress)``).
    model : StackedAutoencoder, optional
        Continue fine-tuning this network instead of unrolling ``layers``.
    prefix : str
        Before the checkpoint names of this network when a run fine-tunes two ("greedy/").

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
    count = args.reduce_blocks
    train = Shard.of(be, digits.train_x, count, comm.rank, comm.size)
    test = Shard.of(be, digits.test_x, min(count, max(1, digits.test_x.shape[0])), comm.rank, comm.size)
    if model is None:
        model = StackedAutoencoder.from_layers(be, layers, loss=args.loss)
    _warm_up(be, args, model, count)
    model.seed = int(args.seed)
    reduce = reducer(comm)
    fit = BackpropRun(be, comm, model, finetune_optimizer(be, model.params, args), train, batch=args.finetune_batch,
                      what="fine-tuning", params_tag=f"{prefix}finetuned/", opt_tag=f"{prefix}finetune/",
                      record_key="finetune", fields={"phase": "finetune"}, ckpt=ckpt, guard=guard, outer=outer,
                      trace=trace, span="finetune",
                      lr_at=finetune_rate(args))
    record = fit.record
    both = lambda: (model.error_per_digit(train, reduce), model.error_per_digit(test, reduce))  # noqa: E731
    if fit.restore(resume):
        record = fit.record
        progress(comm, quiet, f"fine-tuning: resuming at {fit.resuming_at}")
    else:
        (before_train, before_test), dt = timed(comm, be, both)
        record["before"] = {"train": before_train, "test": before_test}
        record["eval_s"] += dt
        if guard is not None:
            guard.check(before_train + before_test, "the error of the network before fine-tuning",
                        "fine-tuning", ckpt.run if ckpt else None, comm)
    decay = ", cosine decay" if args.finetune_lr_decay == "cosine" else ""
    decay += f", weight decay {args.finetune_weight_decay:g}" if args.finetune_weight_decay else ""
    progress(comm, quiet, f"fine-tuning {model!r}: {args.optimizer} lr {args.finetune_lr:g}{decay}, "
                          f"{args.finetune_epochs} epochs, {comm.size} rank(s), {count} blocks")
    progress(comm, quiet, f"  before: train error/digit {record['before']['train']:.3f}  "
                          f"test {record['before']['test']:.3f}")
    fit.run(args.finetune_epochs, _after_epoch(be, comm, model, test, fit, args, ckpt, guard, quiet, prefix))
    if args.finetune_epochs:
        (after_train, after_test), dt = timed(comm, be, both)
        record["eval_s"] += dt
    else:
        after_train, after_test = record["before"]["train"], record["before"]["test"]
    progress(comm, quiet, f"  after:  train error/digit {after_train:.3f}  test {after_test:.3f}  "
                          f"({record['time_s']:.1f}s fine-tuning)")
    return {"optimizer": args.optimizer, "loss": args.loss, "lr": args.finetune_lr, "lr_decay": args.finetune_lr_decay,
            "momentum": args.finetune_momentum if args.optimizer == "sgd" else None,
            "weight_decay": args.finetune_weight_decay,
            "batch": args.finetune_batch, "n_epochs": args.finetune_epochs, "ranks": comm.size,
            "blocks": count, "before": record["before"], "after": {"train": after_train, "test": after_test},
            "epochs": record["epochs"], "time_s": record["time_s"], "eval_s": record["eval_s"], "model": model}


def _after_epoch(be, comm, model, test, fit, args, ckpt, guard, quiet, prefix=""):
    """What follows every epoch: checks, the test error, the record, metrics.csv and the progress line."""
    run = ckpt.run if ckpt else None
    reduce = reducer(comm)
    rows, eta = metrics.of(run), metrics.Eta(args.finetune_epochs, fit.done_before)

    def after_epoch(epoch, result):
        loss, seen = result.means
        where = f"fine-tuning epoch {epoch + 1}"
        fit.check_epoch(loss, where)
        test_err, et = timed(comm, be, model.error_per_digit, test, reduce)
        fit.record["eval_s"] += et
        if guard is not None:
            guard.check(test_err, "the test error", where, run, comm)
        seconds = fit.epoch_seconds()
        fit.record["epochs"].append({"epoch": epoch + 1, "loss": loss, "train_error_seen": seen,
                                     "test_error": test_err, "epoch_s": seconds})
        rows.add("finetune", epoch + 1, stage=prefix.rstrip("/"), train_loss=loss, train_error=seen,
                 val_error=test_err, lr=fit.optimizer.lr)
        progress(comm, quiet, f"  finetune epoch {epoch + 1:3d}/{args.finetune_epochs}  loss {loss:9.4f}  "
                              f"train error {seen:8.3f}  test {test_err:8.3f}  {seconds:7.2f}s",
                 left=eta.left(epoch + 1))
    return after_epoch
