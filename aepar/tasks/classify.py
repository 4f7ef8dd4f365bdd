"""A softmax classifier on a pre-trained encoder, trained on the labels (the ``classify`` task).

CMU 15-618's last figure: the encoder of a pre-trained stack with a softmax layer of 10
classes on top, trained by backprop on the labels. Training is data-parallel exactly as
fine-tuning is (aepar.parallel.data_parallel): the rows, each carrying its label as a
trailing column (aepar.models.classifier.with_labels), are cut into fixed blocks, each
block's gradient is computed alone and the blocks are added in one fixed tree, so 1, 2,
4, ... ranks take bit-identical steps. The floors (softmax regression on raw pixels and on
PCA features) are what any network must beat.
"""
from __future__ import annotations

import numpy as np

from aepar import metrics
from aepar.cli import learning_rate, momentum, non_negative_int, positive_int, progress
from aepar.data.sources import CLASSES
from aepar.errors import UserError
from aepar.models.classifier import Classifier, with_labels
from aepar.optim import make_optimizer
from aepar.parallel.data_parallel import reducer
from aepar.report.stacked import hms
from aepar.resume import BackpropRun, timed, warm_up, warm_up_rows
from aepar.rows import Shard
from aepar.stack import parse_layers

__all__ = ["add_classify_args", "classify_optimizer", "check_labels", "classify_and_evaluate", "fit_on_features", "floors",
           "pca_features", "pca_basis", "table", "build_model", "network_sizes", "FLOOR_PCA", "CMU_15618_ACCURACY",
           "DEFAULT_LAYERS"]
# the floors' PCA features: as many as the 784-1000-500-250-30 stack's code units
FLOOR_PCA = 30
# CMU 15-618's test accuracy after fine-tuning (MNIST), for the table
CMU_15618_ACCURACY = 0.9662
DEFAULT_LAYERS = "784-1000-500-250-30"


def add_classify_args(parser):
    """Options of supervised fine-tuning (every name starts with --classify-)."""
    g = parser.add_argument_group("classification (supervised fine-tuning)")
    g.add_argument("--classify-epochs", type=non_negative_int, default=10,
                   help="epochs of backprop on the labels (default 10; 0: evaluate only)")
    g.add_argument("--classify-lr", type=learning_rate, default=1e-3, help="learning rate (default 0.001)")
    g.add_argument("--classify-batch", type=positive_int, default=100,
                   help="global minibatch, drawn from every block of the data (default 100)")
    g.add_argument("--classify-optimizer", choices=["adam", "sgd"], default="adam",
                   help="adam: Adam (default); sgd: SGD with --classify-momentum")
    g.add_argument("--classify-momentum", type=momentum, default=0.9,
                   help="SGD momentum in [0, 1) (default 0.9; Adam ignores it)")
    return g


def classify_optimizer(be, params, args):
    return make_optimizer(be, params, args.classify_optimizer, args.classify_lr,
                          getattr(args, "classify_momentum", 0.0))


def check_labels(digits, n_classes: int = CLASSES, what: str = "the data"):
    """UserError (one line) unless train and test have one integer label in
    [0, n_classes) per row."""
    for part in ("train", "test"):
        x, y = getattr(digits, f"{part}_x"), getattr(digits, f"{part}_y", None)
        if y is None:
            raise UserError(f"{what}: no {part} labels (classification needs one label per image)")
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != np.shape(x)[0]:
            raise UserError(f"{what}: {np.shape(x)[0]} {part} images but {y.shape[0] if y.ndim else 0} labels")
        if y.size and (y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= n_classes):
            raise UserError(f"{what}: {part} labels must be integers in [0, {n_classes}), got "
                            f"{y.dtype} in [{y.min()}, {y.max()}]")


def _warm_up(be, args, model, count):
    """A throw-away copy of the classifier ``model`` (its sizes, units and classes) trained
    one step on a batch of random labelled rows in the run's ``count`` blocks, with the
    run's optimiser, and its evaluation (aepar.resume.warm_up): the kernels its shapes take
    load (or compile) here, not in the first timed epoch."""
    copy = Classifier(be, model.sizes, model.n_classes, model.acts[:-1], batch=model.batch)
    rows = warm_up_rows(model.batch, model.sizes[0], count)
    x = Shard.of(be, with_labels(rows, np.arange(len(rows)) % model.n_classes, be.dtype), count)
    warm_up(be, copy, x, copy.evaluate, batch=model.batch, optimizer=classify_optimizer(be, copy.params, args))


def _shards(be, comm, train_x, train_y, test_x, test_y, count):
    """This rank's blocks of the labelled training and test rows."""
    train = Shard.of(be, with_labels(train_x, train_y, be.dtype), count, comm.rank, comm.size)
    test = Shard.of(be, with_labels(test_x, test_y, be.dtype), min(count, max(1, len(test_y))),
                    comm.rank, comm.size)
    return train, test


def _pct(a) -> str:
    return f"{100.0 * a:.2f}%"


def _fit(be, comm, model, train, test, args, *, what, trace=None, ckpt=None, resume=None, outer=None,
         guard=None, prefix="") -> dict:
    """Evaluate ``model``, train it for ``args.classify_epochs`` through the safe points,
    evaluate again (what :func:`classify_and_evaluate` and :func:`floors` share)."""
    quiet = getattr(args, "quiet", False)
    epochs = args.classify_epochs
    reduce = reducer(comm)
    run = ckpt.run if ckpt is not None else None
    fit = BackpropRun(be, comm, model, classify_optimizer(be, model.params, args), train, batch=args.classify_batch,
                      what=what, params_tag=f"{prefix}classifier/", opt_tag=f"{prefix}classify/",
                      record_key="classify", fields={"phase": "classify", "part": prefix}, ckpt=ckpt, guard=guard,
                      outer=outer, trace=trace, span="classify",
                      lr_at=getattr(args, "classify_lr_at", None))
    record = fit.record

    def evaluate():
        (tr, tr_loss), (te, te_loss) = model.evaluate(train, reduce), model.evaluate(test, reduce)
        return {"train": tr, "test": te, "train_loss": tr_loss, "test_loss": te_loss}

    if fit.restore(resume):
        record = fit.record
        progress(comm, quiet, f"{what}: resuming at {fit.resuming_at}")
    else:
        record["before"], dt = timed(comm, be, evaluate)
        record["eval_s"] += dt
        if guard is not None:
            guard.check(record["before"]["train_loss"] + record["before"]["test_loss"],
                        "the loss before training", what, run, comm)
    progress(comm, quiet, f"{what}: {model!r}, {args.classify_optimizer} lr {args.classify_lr:g}, batch "
                          f"{args.classify_batch}, {epochs} epochs, {comm.size} rank(s), {train.blocks.count} blocks")
    progress(comm, quiet, f"  before: train accuracy {_pct(record['before']['train'])}  "
                          f"test {_pct(record['before']['test'])}")

    rows, eta = metrics.of(run), metrics.Eta(epochs, fit.done_before)

    def after_epoch(epoch, result):
        loss, seen = result.means
        fit.check_epoch(loss, f"{what} epoch {epoch + 1}")
        (test_acc, test_loss), et = timed(comm, be, model.evaluate, test, reduce)
        record["eval_s"] += et
        seconds = fit.epoch_seconds()
        record["epochs"].append({"epoch": epoch + 1, "loss": loss, "train_accuracy_seen": seen,
                                 "test_accuracy": test_acc, "test_loss": test_loss, "epoch_s": seconds})
        rows.add("classify", epoch + 1, stage=prefix.rstrip("/") or ("" if what == "classification" else what), train_loss=loss, val_loss=test_loss,
                 train_error=1.0 - seen, val_error=1.0 - test_acc, lr=fit.optimizer.lr)
        progress(comm, quiet, f"  classify epoch {epoch + 1:3d}/{epochs}  loss {loss:8.4f}  train accuracy seen "
                              f"{_pct(seen):>7}  test {_pct(test_acc):>7}  {seconds:7.2f}s", left=eta.left(epoch + 1))

    fit.run(epochs, after_epoch)
    if epochs:
        after, dt = timed(comm, be, evaluate)
        record["eval_s"] += dt
    else:
        after = record["before"]
    progress(comm, quiet, f"  after:  train accuracy {_pct(after['train'])}  test {_pct(after['test'])}  "
                          f"({record['time_s']:.1f}s training)")
    return {"sizes": model.dims, "acts": model.acts, "optimizer": args.classify_optimizer, "lr": args.classify_lr,
            "momentum": getattr(args, "classify_momentum", 0.0) if args.classify_optimizer == "sgd" else None,
            "batch": args.classify_batch, "n_epochs": epochs, "ranks": comm.size, "blocks": train.blocks.count,
            "before": record["before"], "after": after, "epochs": record["epochs"], "time_s": record["time_s"],
            "eval_s": record["eval_s"], "flops_per_sample": model.flops_per_sample(), "model": model}


def network_sizes(args, n_in: int) -> list:
    """Layer sizes of a randomly initialised network from ``args.layers`` ("784-...")."""
    layers = getattr(args, "layers", None) or DEFAULT_LAYERS
    return list(layers) if not isinstance(layers, str) else parse_layers(layers, n_in)


def build_model(be, layers, n_in: int, args, n_classes: int = CLASSES) -> Classifier:
    """The network :func:`classify_and_evaluate` trains: ``layers`` as its encoder, or (None)
    random weights of ``args.layers`` sizes, with ``args.acts`` (default sigmoid) hidden units."""
    if layers is not None:
        return Classifier.from_layers(be, layers, n_classes, seed=args.seed, batch=args.classify_batch)
    return Classifier(be, network_sizes(args, n_in), n_classes, getattr(args, "acts", None), seed=args.seed,
                      batch=args.classify_batch)


def classify_and_evaluate(be, comm, layers, digits, args, *, trace=None, ckpt=None, resume=None, outer=None,
                          guard=None, prefix="", reduce_blocks=None) -> dict:
    """Put a softmax layer on ``layers`` (or random weights), report its accuracy, train it on
    the labels data-parallel, report again.

    Parameters
    ----------
    be : aepar.backend.Backend
    comm : aepar.comm.Comm
        All ranks that train together (data parallel).
    layers : list or None
        Pre-trained layers: objects with ``params`` {"W", "bv", "bh"} and ``hidden``
        (aepar.models.classifier.Classifier.from_layers), the same on every rank. None: a
        randomly initialised network of ``args.layers`` sizes (default 784-1000-500-250-30,
        sigmoid units, or ``args.acts``).
    digits : aepar.data.sources.Digits
        The whole labelled data set, on every rank (each takes its blocks of the rows).
    args : namespace
        ``classify_epochs, classify_lr, classify_batch, classify_optimizer,
        classify_momentum, reduce_blocks, seed, quiet`` (see :func:`add_classify_args`).
    trace : optional
        An aepar trace; each epoch is recorded as a span "classify".
    ckpt : aepar.resume.Checkpointer, optional
        Safe points: checkpoints and stops inside training.
    resume : (params, opt_state, progress), optional
        A checkpoint saved during this training: go on from it.
    outer : callable() -> (params, opt_state, progress), optional
        What the calling scheme adds to every checkpoint.
    guard : aepar.guard.Guard, optional
    prefix : str
        Before this network's checkpoint names ("classifier/...", "classify/...").
    reduce_blocks : int, optional
        Fixed blocks of the rows (default ``args.reduce_blocks``).

    Returns
    -------
    dict
        JSON-ready: ``before`` and ``after`` {"train", "test"} accuracy (and mean losses),
        ``epochs`` (per epoch: loss, training accuracy seen while training, test accuracy,
        seconds), ``time_s`` (training wall time, slowest rank, evaluation excluded),
        ``eval_s``, ``init`` ("pretrained" or "random"), the settings; plus ``"model"``,
        the trained :class:`Classifier` (pop it before writing the dict as JSON).

    Raises
    ------
    UserError
        Labels missing, not one per row or outside [0, classes); layers that do not take the
        data's inputs.
    """
    check_labels(digits, digits.n_classes)
    n_in = int(digits.train_x.shape[1])
    if layers is not None and int(layers[0].params["W"].shape[0]) != n_in:
        raise UserError(f"the first layer takes {layers[0].params['W'].shape[0]} inputs but the data have {n_in}")
    count = int(reduce_blocks or args.reduce_blocks)
    model = build_model(be, layers, n_in, args, digits.n_classes)
    _warm_up(be, args, model, count)
    train, test = _shards(be, comm, digits.train_x, digits.train_y, digits.test_x, digits.test_y, count)
    result = _fit(be, comm, model, train, test, args, what="classification", trace=trace, ckpt=ckpt,
                  resume=resume, outer=outer, guard=guard, prefix=prefix)
    result["init"] = "random" if layers is None else "pretrained"
    return result


def fit_on_features(be, comm, train, test, args, *, what, hidden=(), count=None, trace=None, ckpt=None, resume=None,
                    outer=None, guard=None, prefix="", n_classes: int = CLASSES) -> dict:
    """Train a classifier on feature rows: softmax regression, or with ``hidden`` sizes a
    small MLP (ReLU) below the softmax layer; data-parallel over ``comm`` as
    :func:`classify_and_evaluate`, with the same options (``args.classify_*``, ``seed``).

    Parameters
    ----------
    train, test : (features (n, d), labels (n,))
        The whole labelled sets, on every rank (each takes its blocks).
    hidden : sequence of int
        Hidden layer sizes (none: softmax regression).
    count : int, optional
        Fixed blocks of the rows (default ``args.reduce_blocks``).

    Returns
    -------
    dict
        As :func:`classify_and_evaluate` (``before``, ``after``, ``epochs``, ``time_s``, ...,
        ``"model"``); "test" there is ``test``'s accuracy.
    """
    sizes = [int(np.shape(train[0])[1])] + [int(h) for h in hidden]
    model = Classifier(be, sizes, n_classes, ["relu"] * len(hidden), seed=args.seed, batch=args.classify_batch)
    count = int(count or args.reduce_blocks)
    _warm_up(be, args, model, count)
    train_shard, test_shard = _shards(be, comm, train[0], train[1], test[0], test[1], count)
    return _fit(be, comm, model, train_shard, test_shard, args, what=what, trace=trace, ckpt=ckpt, resume=resume,
                outer=outer, guard=guard, prefix=prefix)


def pca_features(train_x, test_x, k: int = FLOOR_PCA):
    """Projections (float64) of train and test rows on the first ``k`` principal directions
    of the training rows (centred by the training mean; float64 SVD, as the PCA baseline
    of the reconstruction tables, pca_error), without whitening."""
    mean, basis = pca_basis(train_x, k)
    return _project(train_x, mean, basis), _project(test_x, mean, basis)


def pca_basis(train_x, k: int = FLOOR_PCA):
    """(mean (d,), basis (d, k)): the training rows' mean and first ``k`` principal directions."""
    train = np.asarray(train_x, dtype=np.float64)
    mean = train.mean(axis=0)
    k = int(min(k, *train.shape))
    # right singular vectors of the centred data = principal directions
    _, _, vt = np.linalg.svd(train - mean, full_matrices=False)
    return mean, np.ascontiguousarray(vt[:k].T)


def _project(x, mean, basis):
    return (np.asarray(x, dtype=np.float64) - mean) @ basis


def floors(be, comm, digits, args, *, trace=None, ckpt=None, resume=None, outer=None, guard=None,
           prefix="floors/", reduce_blocks=None, k: int = FLOOR_PCA) -> dict:
    """Softmax regression on the raw pixels and on PCA-``k`` features, with the same
    optimiser, batch and epochs as the network: the accuracy any network must beat.

    The principal directions come from the training rows (float64 SVD on rank 0, sent
    to every rank). Checkpoints and ``resume`` as for :func:`classify_and_evaluate`
    (names under ``prefix``; the progress record's ``floors_done`` holds the finished
    floors).

    Returns
    -------
    dict
        {"raw": result, "pca": result with "k"}, each result as :func:`classify_and_evaluate`'s
        (without the model).
    """
    check_labels(digits, digits.n_classes)
    count = int(reduce_blocks or args.reduce_blocks)
    done = dict(resume[2].get("floors_done", {})) if resume is not None else {}
    part = resume[2].get("part") if resume is not None else None
    basis = None
    out = {}
    for name in ("raw", "pca"):
        if name in done:
            out[name] = done[name]
            continue
        if name == "raw":
            train_x, test_x = digits.train_x, digits.test_x
        else:
            if basis is None:  # computed once, on rank 0: every rank projects with the same bits
                basis = comm.bcast(pca_basis(digits.train_x, k) if comm.is_root else None)
            mean, vecs = basis
            train_x, test_x = _project(digits.train_x, mean, vecs), _project(digits.test_x, mean, vecs)
        here = f"{prefix}{name}/"

        def part_outer():
            params, opt_state, prog = outer() if outer is not None else ({}, {}, {})
            return params, opt_state, dict(prog, floors_done=dict(done))
        what = "floor: softmax regression on " + ("raw pixels" if name == "raw" else f"PCA-{vecs.shape[1]}")
        result = fit_on_features(be, comm, (train_x, digits.train_y), (test_x, digits.test_y), args, what=what,
                                 count=count, trace=trace, ckpt=ckpt, resume=resume if part == here else None,
                                 outer=part_outer, guard=guard, prefix=here, n_classes=digits.n_classes)
        result.pop("model")
        result["features"] = "raw pixels" if name == "raw" else f"PCA-{vecs.shape[1]}"
        if name == "pca":
            result["k"] = int(vecs.shape[1])
        done[name] = out[name] = result
    return out


# ---- the report --------------------------------------------------------------------------------
def table(summary: dict) -> str:
    """Markdown accuracy table of a classify summary (higher is better)."""
    rows = []
    c = summary["classify"]
    name = "-".join(map(str, c["sizes"]))
    init = "pre-trained layers" if c["init"] == "pretrained" else "random init"
    rows.append((f"{name} ({init})", c))
    for key in ("raw", "pca"):
        f = (summary.get("floors") or {}).get(key)
        if f:
            rows.append((f"softmax regression on {f['features']} (floor)", f))
    lines = [f"Classification accuracy (higher is better): {summary['source']}", "",
             "| model | optimizer | epochs | train before | test before | train after | test after | time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in rows:
        lines.append(f"| {label} | {r['optimizer']} lr {r['lr']:g} | {r['n_epochs']} | {_pct(r['before']['train'])} "
                     f"| {_pct(r['before']['test'])} | {_pct(r['after']['train'])} | {_pct(r['after']['test'])} "
                     f"| {hms(r['time_s'])} |")
    lines += ["", f"CMU 15-618 reported {_pct(CMU_15618_ACCURACY)} test accuracy on MNIST after fine-tuning "
                  f"(a different split and size; for orientation only).", ""]
    return "\n".join(lines)
