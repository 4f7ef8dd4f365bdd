"""Eager training of parallel convolutional autoencoders: ``mpirun -np P python -m aepar.eager``.

Bhargava & Surana: K convolutional autoencoders (aepar.models.cae) from different random
seeds are trained at the same time and stopped *eagerly*, well before their validation
loss reaches its minimum; their encoders' codes, concatenated, feed one classifier
trained on the labels, and per-model classifiers vote. Against them: one monolithic CAE
with K times the filters, trained until its validation loss stops improving. The claim:
with little data the parallel CAEs are ahead at low epochs; with more data the two
converge.

The algorithm, as this file runs it:

1. split the training images into train / validation (the paper's 4.8k / 1.2k on MNIST,
   48k / 12k on the full set); the embedded 5,000 digits are pooled and split 3,600 /
   900 / 500 test by the seed;
2. the K CAEs, model m seeded ``seed * 1000 + m``, are spread over the ranks
   (aepar.parallel.ensemble: one per rank, several per rank in turn, or groups of ranks
   training one data-parallel); each epoch logs train and validation loss and wall time
   and saves a snapshot ``model{m}_epoch{E}.h5``; a model stops after ``--epochs``, at
   its ``--budget`` of seconds, or by ``--eager-rule K:DELTA`` (validation loss improved
   by less than the fraction DELTA over its last K epochs);
3. the monolithic CAE (``--mono-width`` times the filters, default K) is trained by all
   ranks together until ``--mono-patience`` epochs bring no new best validation loss;
4. the snapshots to combine are picked: the last epoch, ``--pick-epoch E``, or per model
   the newest whose training time fits ``--pick-by-budget SECONDS`` (the paper picked
   older snapshots by the time the classifier would take);
5. combination: softmax regression (or ``--combine-hidden H``: an MLP) on the
   concatenated codes (each feature standardized by its training mean and deviation),
   and a vote of per-model classifiers; the monolithic CAE's code
   gets the same classifier. Effective wall time as the paper counts it: the slowest
   rank's training + the combination's classifier.

A model's steps are the same bits on any number of ranks (fixed blocks, fixed-tree sums),
so the per-model weights do not depend on P or on the grouping. Safe points are the ends
of the rounds (every group has trained one more epoch of each of its models): a stop
signal saves ``checkpoint.h5`` there and exits 75; ``--resume DIR`` goes on, on any
number of ranks.

Writes into the run directory (default runs/eager/NNN): ``summary.json``,
``accuracy.md`` (the table), ``epochs.csv`` (every model's epochs), ``losses.png``
(validation loss against epochs and wall time, parallel vs monolithic),
``reconstructions.png`` (originals and reconstructions after epoch 1 and the last),
``curve.csv``/``curve.png`` with ``--curve`` (accuracy after every epoch), the
snapshots and ``run.json``.

Examples
--------
    mpirun -np 2 python -m aepar.eager --models 4 --preset quick
    mpirun -np 5 python -m aepar.eager --preset small --curve
    python -m aepar.eager --dataset fashion --preset large
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from aepar import backend
from aepar.cli import (ArgumentParser, add_common, add_reduce_blocks, gpu_blocks_hint, learning_rate, non_negative_int,
                       parse_with_preset, positive_float, positive_int, progress)
from aepar.comm import run_main
from aepar.errors import Diverged, UserError

__all__ = ["PRESETS", "build_parser", "parse", "load_split", "train_members", "combine", "main"]

PROG = "aepar.eager"
SCHEME = "eager"
PRESETS = {
    # a few minutes on 2 cores: the embedded digits, small filters, few epochs
    "quick": dict(dataset="mnist5k", models=4, filters=(16, 32), epochs=5, mono_epochs=5, mono_patience=2,
                  classify_epochs=5),
    # the paper's small regime (embedded 5,000 digits) and large regime (Fashion-MNIST 48k/12k)
    "small": dict(dataset="mnist5k", models=5, filters=(16, 32), epochs=10, mono_epochs=20, mono_patience=2,
                  classify_epochs=10),
    "large": dict(dataset="fashion", models=5, filters=(16, 32), epochs=10, mono_epochs=10, mono_patience=2,
                  classify_epochs=10),
}
SEED_STRIDE = 1000  # model m of seed s is seeded s * 1000 + m; the monolithic CAE s * 1000 + 999
MONO = "mono"
SHOWN = 8  # images in reconstructions.png


# ---- options ------------------------------------------------------------------------------
def _filters(text: str) -> tuple:
    try:
        parts = tuple(int(t) for t in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 2 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"--filters wants two positive counts like 16,32, got {text!r}")
    return parts


def _rule(text: str) -> tuple:
    try:
        k, delta = text.split(":")
        k, delta = int(k), float(delta)
    except ValueError:
        k, delta = 0, -1.0
    if k < 1 or not 0 <= delta < 1:
        raise argparse.ArgumentTypeError(f"--eager-rule wants K:DELTA with K >= 1 epochs and 0 <= DELTA < 1, "
                                         f"got {text!r}")
    return k, delta


def _epochs_list(text: str):
    if text == "all":
        return text
    try:
        epochs = sorted({int(t) for t in text.split(",")})
    except ValueError:
        epochs = [0]
    if epochs[0] < 1:
        raise argparse.ArgumentTypeError(f"--curve wants 'all' or epochs like 1,2,5,10, got {text!r}")
    return tuple(epochs)


def build_parser():
    from aepar.classify import add_classify_args
    from aepar.data.sources import DIGIT_SOURCES

    parser = ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0] + " " + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples: mpirun -np 2 python -m aepar.eager --models 4 --preset quick;  "
               "mpirun -np 5 python -m aepar.eager --preset small --curve")
    g = parser.add_argument_group("the parallel CAEs")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="quick: minutes on 2 cores; small: the paper's small regime (embedded digits); large: "
                        "Fashion-MNIST 48k/12k (make fashion). Options given explicitly override the preset.")
    g.add_argument("--models", type=positive_int, default=5, help="K, the parallel CAEs (default 5, the paper's)")
    g.add_argument("--groups", type=positive_int, default=None,
                   help="groups of ranks, each training its models data-parallel (default min(K, ranks))")
    g.add_argument("--filters", type=_filters, default=(16, 32), metavar="F1,F2",
                   help="feature maps of the two encoder convolutions (default 16,32)")
    g.add_argument("--epochs", type=positive_int, default=10, help="most epochs a CAE trains (default 10)")
    g.add_argument("--budget", type=positive_float, default=None, metavar="SECONDS",
                   help="stop a CAE once its training took this long (wall clock)")
    g.add_argument("--eager-rule", type=_rule, default=None, metavar="K:DELTA",
                   help="stop a CAE when its validation loss improved by less than the fraction DELTA over "
                        "its last K epochs (e.g. 2:0.05)")
    g.add_argument("--lr", type=learning_rate, default=1e-3, help="Adam's learning rate (default 0.001)")
    g.add_argument("--batch", type=positive_int, default=100, help="minibatch (default 100, the paper's)")
    g.add_argument("--val-fraction", type=float, default=0.2,
                   help="of the training images held out for validation (default 0.2: 4.8k/1.2k of 6k)")
    g.add_argument("--limit", type=positive_int, default=None, help="use only the first N training images")
    g.add_argument("--dataset", choices=DIGIT_SOURCES, default="auto",
                   help="mnist5k: the embedded digits; fashion: Debian's Fashion-MNIST; cifar10 or idx: "
                        "your files in --data-dir (default auto)")
    add_reduce_blocks(g)
    m = parser.add_argument_group("the monolithic baseline")
    m.add_argument("--mono-width", type=positive_int, default=None,
                   help="its filters are this many times --filters (default K)")
    m.add_argument("--mono-epochs", type=non_negative_int, default=20,
                   help="most epochs (default 20; 0: no monolithic CAE)")
    m.add_argument("--mono-patience", type=positive_int, default=2,
                   help="stop after this many epochs without a new best validation loss (default 2)")
    c = parser.add_argument_group("combination")
    c.add_argument("--pick-epoch", type=positive_int, default=None, metavar="E",
                   help="combine the snapshots of epoch E (a model that stopped earlier: its last)")
    c.add_argument("--pick-by-budget", type=positive_float, default=None, metavar="SECONDS",
                   help="per model, the newest snapshot whose training time fits SECONDS")
    c.add_argument("--combine-hidden", type=non_negative_int, default=0, metavar="H",
                   help="a hidden ReLU layer of H units in the combining classifier (default 0: softmax "
                        "regression)")
    c.add_argument("--curve", type=_epochs_list, nargs="?", const="all", default=None, metavar="E1,E2,...",
                   help="also classify after every epoch (or after the epochs listed): accuracy against "
                        "epochs and wall time (curve.csv, curve.png; the paper's Figures 8-9)")
    c.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="write the PNGs")
    add_classify_args(parser)
    add_common(parser, scheme=SCHEME)
    parser.set_defaults(dtype="float32")
    return parser


def parse(argv):
    """Options with the preset's values as defaults; impossible combinations are UserErrors."""
    args = parse_with_preset(build_parser(), PRESETS, argv)
    if args.pick_epoch is not None and args.pick_epoch > args.epochs:
        raise _refuse(f"--pick-epoch {args.pick_epoch} is beyond the {args.epochs} epochs the CAEs train")
    if args.pick_epoch is not None and args.pick_by_budget is not None:
        raise _refuse("--pick-epoch and --pick-by-budget are two ways to pick: give one")
    if args.groups is not None and args.groups > args.models:
        raise _refuse(f"--groups {args.groups} is more than the {args.models} models (a group would have none)")
    if not 0 < args.val_fraction < 1:
        raise _refuse(f"--val-fraction must lie strictly between 0 and 1, got {args.val_fraction}")
    return args


def _refuse(message: str) -> UserError:
    """Options are parsed alike on every rank: one line from rank 0, exit 2 everywhere."""
    error = UserError(message)
    error.collective = True
    return error


# ---- data -----------------------------------------------------------------------------------
@dataclass
class Split:
    """Images as rows, with their (C, H, W), split train / validation / test."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    shape: tuple
    source: str


def load_split(args) -> Split:
    """The images the run trains on (every rank reads the same; UserError on bad data)."""
    from aepar.data.sources import load_images
    from aepar.data.splits import split_indices
    from aepar.models.cae import check_image_shape

    im = load_images(args.dataset, args.data_dir, seed=args.seed, limit=args.limit, dtype=np.dtype(args.dtype))
    try:
        shape = check_image_shape(im.train_x.shape[1:])
    except ValueError as e:
        raise UserError(f"{im.source}: {e}") from None
    rows = lambda a: a.reshape(len(a), -1)  # noqa: E731
    if im.name == "mnist5k":  # pooled: closer to the paper's 4.8k/1.2k than 4,000 train alone
        x, y = np.concatenate([rows(im.train_x), rows(im.test_x)]), np.concatenate([im.train_y, im.test_y])
        n_test = len(y) // 10
        n_val = int(round((len(y) - n_test) * args.val_fraction))
        tr, va, te = split_indices(len(y), (len(y) - n_test - n_val, n_val, n_test), args.seed)
        parts = (x[tr], y[tr], x[va], y[va], x[te], y[te])
    else:
        tr, va = split_indices(len(im.train_y), (1 - args.val_fraction, args.val_fraction), args.seed)
        x = rows(im.train_x)
        parts = (x[tr], im.train_y[tr], x[va], im.train_y[va], rows(im.test_x), im.test_y)
    split = Split(*(np.ascontiguousarray(p) for p in parts), shape=shape, source=im.source)
    return split


# ---- training -------------------------------------------------------------------------------
@dataclass
class Member:
    """One CAE being trained: the model, its optimiser, its record and its stopping rules."""

    name: str
    model: object
    optimizer: object
    record: dict

    @property
    def done(self) -> bool:
        return self.record["stopped"] is not None


def new_record() -> dict:
    return {"epochs": [], "stopped": None}


def stop_reason(record: dict, *, epochs: int, budget=None, rule=None, patience=None) -> str | None:
    """Why a CAE stops after its last epoch, or None: ``epochs`` run, ``budget`` seconds
    spent, the eager ``rule`` (K, DELTA) met, or ``patience`` epochs without a new best."""
    ep = record["epochs"]
    val = [e["val_loss"] for e in ep]
    if rule is not None and len(val) > rule[0]:
        before = val[-1 - rule[0]]
        gain = (before - val[-1]) / before if before > 0 else 0.0
        if gain < rule[1]:
            return f"eager rule: validation loss improved {100 * gain:.1f}% over {rule[0]} epochs"
    if patience is not None and len(val) > patience and min(val[-patience:]) >= min(val[:-patience]):
        return f"no new best validation loss in {patience} epochs"
    if budget is not None and ep and ep[-1]["cum_seconds"] >= budget:
        return f"budget of {budget:g} s spent"
    if len(ep) >= epochs:
        return f"{epochs} epochs"
    return None


def _host_state(member) -> dict:
    """What rank 0 keeps of a member: its model's state (``params/...``, ``opt/...``) and record."""
    return {"state": member.model.state(), "record": member.record}


def train_members(be, ens, split, make, rules: dict, *, args, guard, ckpt, run, saved=None, outer=None,
                  say=print) -> dict:
    """Train the members of ensemble ``ens`` round by round (module docstring, step 2).

    Parameters
    ----------
    ens : aepar.parallel.ensemble.Ensemble
    make : callable(index) -> (name, model)
        The CAE of model ``index`` (the same on every rank).
    rules : dict
        ``stop_reason``'s keyword arguments.
    saved : dict, optional
        name -> host state (params, opt, record) of a checkpoint: go on from there.
    outer : callable() -> (params, opt_state, progress)
        What the rest of the run adds to every checkpoint.

    Returns
    -------
    dict
        name -> host state of every member (rank 0; None elsewhere).
    """
    from aepar.guard import StepsOnly
    from aepar.optim import Adam
    from aepar.parallel.data_parallel import reducer, train_epoch
    from aepar.rows import Shard

    sub, count = ens.sub, args.reduce_blocks
    members = {}
    for m in ens.mine:
        name, model = make(m)
        member = Member(name, model, Adam(be, model.params, lr=args.lr), new_record())
        model.optimizer = member.optimizer
        if saved and name in saved:
            model.load_state(saved[name]["state"])
            member.record = saved[name]["record"]
        members[m] = member
    train = Shard.of(be, split.train_x, count, sub.rank, sub.size)
    val = Shard.of(be, split.val_x, min(count, len(split.val_y)), sub.rank, sub.size)
    reduce, steps = reducer(sub), StepsOnly(guard)
    latest = dict(saved or {}) if ens.comm.is_root else None
    # the next round: the fewest epochs among the models still going
    epoch = min((len(s["record"]["epochs"]) for s in (saved or {}).values() if not s["record"]["stopped"]),
                default=0)
    with guard.training(SCHEME):
        while not ens.comm.bcast(all(s["record"]["stopped"] for s in latest.values())
                                     and len(latest) == ens.n_models if ens.comm.is_root else None):
            out, failed = {}, None
            for m, mb in members.items():
                if failed or mb.done or len(mb.record["epochs"]) > epoch:
                    continue
                t0 = sub.wtime()
                result = train_epoch(mb.model, train, epoch, sub, optimizer=mb.optimizer, guard=steps)
                be.synchronize()
                seconds = sub.allreduce(sub.wtime() - t0, op="max")
                val_loss = mb.model.recon_error(val, reduce)
                where = f"{mb.name} epoch {epoch + 1}"
                try:
                    guard.check(val_loss, "the validation loss", where, run, sub)
                    guard.check_params(mb.model.params, where, run, sub)
                except Diverged as e:  # every rank ends with it at the round's end
                    failed = str(e)
                    continue
                cum = (mb.record["epochs"][-1]["cum_seconds"] if mb.record["epochs"] else 0.0) + seconds
                mb.record["epochs"].append({"epoch": epoch + 1, "train_loss": result.means[0], "val_loss": val_loss,
                                            "seconds": seconds, "cum_seconds": cum})
                mb.record["stopped"] = stop_reason(mb.record, **rules)
                out[mb.name] = _host_state(mb)
            merged, summed, failed = ens.collect(out, guard.flags(), failed)
            if failed:
                err = Diverged(failed)
                err.collective = True
                raise err
            epoch += 1
            if ens.comm.is_root and merged:
                latest.update(merged)
                for name, state in sorted(merged.items()):
                    _snapshot(run, name, state, args)
                say(f"epoch {epoch:3d}  " + "  ".join(
                    f"{n} val {s['record']['epochs'][-1]['val_loss']:7.3f}" + (" (stopped)" if s["record"]["stopped"]
                                                                                  else "")
                    for n, s in sorted(merged.items())))
            checkpoint, stop = guard.decide(summed)
            if stop or checkpoint or guard.epoch_due(epoch):
                _save(ckpt, latest, outer, f"{epoch} epochs", "signal" if stop else "periodic")
                if stop:
                    raise ckpt.interrupted()
    return latest


def _snapshot(run, name, state, args):
    from aepar import checkpoint

    epoch = len(state["record"]["epochs"])
    with run.output(snapshot_name(name, epoch)) as path:
        checkpoint.save(path, scheme=SCHEME, params=_part(state["state"], "params/"), epoch=epoch,
                        config={"model": name, "record": state["record"]["epochs"][-1], "lr": args.lr})


def snapshot_name(name: str, epoch: int) -> str:
    return f"{name}_epoch{epoch:03d}.h5"


def _part(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _flat_states(states) -> tuple:
    """(params, opt_state, progress) of a checkpoint holding ``states`` (name -> host state)."""
    params, opt, records = {}, {}, {}
    for name, s in (states or {}).items():
        params.update({f"{name}/{k}": v for k, v in s["state"].items() if k.startswith("params/")})
        opt.update({f"{name}/{k}": v for k, v in s["state"].items() if k.startswith("opt/")})
        records[name] = s["record"]
    return params, opt, {"records": records}


def _save(ckpt, latest, outer, label, why):
    """The run's checkpoint: every member's latest state (rank 0's), plus ``outer()``."""
    params, opt, prog = outer() if outer is not None else ({}, {}, {})
    mine = _flat_states(latest)
    ckpt.save({**params, **mine[0]}, {**opt, **mine[1]},
              dict(prog, records={**prog.get("records", {}), **mine[2]["records"]}), label, why)


def saved_states(resume) -> dict:
    """name -> host state from a checkpoint's (params, opt_state, progress)."""
    if resume is None:
        return {}
    params, opt, prog = resume
    both = {**params, **opt}
    return {name: {"state": _part(both, f"{name}/"), "record": record}
            for name, record in prog.get("records", {}).items()}


# ---- combination ------------------------------------------------------------------------------
def pick_epoch(record: dict, args) -> int:
    """The snapshot (1-based epoch) of a model to combine (module docstring, step 4)."""
    ep = record["epochs"]
    if args.pick_epoch is not None:
        return min(args.pick_epoch, len(ep))
    if args.pick_by_budget is not None:
        fits = [e["epoch"] for e in ep if e["cum_seconds"] <= args.pick_by_budget]
        return fits[-1] if fits else 1
    return len(ep)


def load_snapshot(model, run, name, epoch, comm=None):
    """Give ``model`` the weights of its snapshot after ``epoch`` (read on rank 0, sent to
    every rank of ``comm``; None: rank 0 alone). Returns the model."""
    from aepar import checkpoint

    params = None
    if comm is None or comm.is_root:
        params = checkpoint.load(run.written(snapshot_name(name, epoch)), scheme=SCHEME).params
    if comm is not None:
        params = comm.bcast(params)
    model.load_state({f"params/{k}": v for k, v in params.items()})
    return model


def _codes(be, model, x):
    """The encoder's codes of rows ``x`` (host, the run's dtype), in chunks."""
    from aepar.rows import CHUNK

    out = np.empty((len(x), model.code_size), dtype=be.dtype)
    for lo in range(0, len(x), CHUNK):
        out[lo:lo + CHUNK] = be.to_host(model.encode(be.asarray(x[lo:lo + CHUNK])))
    return out


def standardized_codes(be, model, split) -> list:
    """The codes of the train, validation and test images, each feature shifted and scaled
    by its training mean and standard deviation (constant features left at 0). Raw ReLU
    codes run to tens with very different scales per feature; on them the softmax's Adam
    steps oscillate (the test accuracy swings from one epoch to the next, below the steady
    accuracy of standardized codes; docs/performance-notes.md)."""
    parts = [_codes(be, model, x) for x in (split.train_x, split.val_x, split.test_x)]
    mean = parts[0].mean(axis=0, dtype=np.float64)
    std = np.sqrt(np.mean(np.square(parts[0] - mean.astype(parts[0].dtype), dtype=np.float64), axis=0))
    scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
    for p in parts:  # in place, in the run's dtype: the codes of 60k images are gigabytes
        p -= mean.astype(p.dtype)
        p *= scale.astype(p.dtype)
    return parts


def combine(be, comm, split, models: dict, args, *, quiet=False) -> dict:
    """Classifiers on the codes of ``models`` (name -> CAE with the picked weights): the
    concatenated codes' classifier and, with several models, each model's own classifier and
    their vote. Accuracies on the validation set (the paper's) and the test set."""
    from aepar.classify import fit_on_features
    from aepar.models.classifier import with_labels
    from aepar.parallel.data_parallel import reducer
    from aepar.rows import Shard

    hidden = (args.combine_hidden,) if args.combine_hidden else ()
    codes = {n: standardized_codes(be, m, split) for n, m in models.items()}
    names = sorted(models)

    def fit(parts, what):
        args_q = argparse.Namespace(**{**vars(args), "quiet": True})
        result = fit_on_features(be, comm, (parts[0], split.train_y), (parts[1], split.val_y), args_q, what=what,
                                 hidden=hidden)
        model = result.pop("model")
        test = Shard.of(be, with_labels(parts[2], split.test_y, be.dtype), min(args.reduce_blocks, len(split.test_y)),
                        comm.rank, comm.size)
        return model, {"validation": result["after"]["test"], "test": model.accuracy(test, reducer(comm)),
                       "time_s": result["time_s"]}

    joined = [np.concatenate([codes[n][i] for n in names], axis=1) for i in range(3)]
    _, out = fit(joined, "combined classifier")
    out = {"combined": out}
    if len(names) > 1:
        votes = {"validation": [], "test": []}
        each = {}
        for n in names:
            clf, each[n] = fit(codes[n], f"classifier of {n}")
            for part, x in (("validation", codes[n][1]), ("test", codes[n][2])):
                votes[part].append(be.to_host(clf.forward(be.asarray(x))[-1]))
        out["each"] = each
        out["vote"] = {part: _vote(v, split.val_y if part == "validation" else split.test_y)
                       for part, v in votes.items()}
        out["vote"]["time_s"] = max(e["time_s"] for e in each.values())
    progress(comm, quiet, f"  combined: validation {100 * out['combined']['validation']:.2f}%  test "
                          f"{100 * out['combined']['test']:.2f}%" + (
                              f"   vote: validation {100 * out['vote']['validation']:.2f}%  test "
                              f"{100 * out['vote']['test']:.2f}%" if "vote" in out else ""))
    return out


def _vote(logits: list, labels) -> float:
    """Accuracy of the majority vote of the classifiers' predictions; a tie goes to the
    class with the largest summed probability."""
    probs = [np.exp(z - z.max(axis=1, keepdims=True)) for z in logits]
    probs = [p / p.sum(axis=1, keepdims=True) for p in probs]
    n_classes = probs[0].shape[1]
    counts = sum(np.eye(n_classes)[p.argmax(axis=1)] for p in probs)
    score = counts + 1e-3 * sum(probs) / len(probs)  # probabilities < 1 vote only between tied classes
    return float(np.mean(score.argmax(axis=1) == np.asarray(labels)))


# ---- the run -------------------------------------------------------------------------------------
def _setup(args, comm):
    be = backend.select(args.device, args.kernels, args.dtype)
    split = load_split(args)
    from aepar.stack import check_blocks

    groups = args.groups or min(args.models, comm.size)
    if groups > comm.size:
        raise UserError(f"--groups {groups} is more than the {comm.size} ranks")
    # the monolithic CAE and the classifiers train on every rank: each needs a whole block
    check_blocks(comm.size, args.reduce_blocks, len(split.train_y))
    gpu_blocks_hint(comm, be, args.reduce_blocks, args.quiet)
    if len(split.val_y) < 1 or len(split.test_y) < 1:
        raise UserError(f"{split.source}: too few images for a validation and a test set")
    return be, split, groups


def main(argv, comm):
    from aepar.guard import Guard
    from aepar.machine import describe
    from aepar.models.cae import ConvAutoencoder
    from aepar.parallel.ensemble import Ensemble
    from aepar.resume import Checkpointer
    from aepar.rundir import fingerprint, parse_and_open

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, SCHEME, PROG, parse, argv)
    say = lambda m: progress(comm, args.quiet, m)  # noqa: E731
    with run, Guard.from_args(comm, PROG, args) as guard:
        be, split, groups = comm.agree(_setup, args, comm)
        say(f"{PROG}: {split.source}; {len(split.train_y)} train / {len(split.val_y)} validation / "
            f"{len(split.test_y)} test images of {'x'.join(map(str, split.shape))}")
        ckpt = Checkpointer(run, comm, guard, SCHEME,
                            fingerprint(split.train_x, split.val_x) if comm.is_root else None, progress=say)
        saved = saved_states(ckpt.load())
        K, width = args.models, args.mono_width or args.models

        def cae(m):
            return f"model{m}", ConvAutoencoder(be, split.shape, args.filters, seed=args.seed * SEED_STRIDE + m,
                                                batch=args.batch)

        def mono(_):
            filters = tuple(width * f for f in args.filters)
            return MONO, ConvAutoencoder(be, split.shape, filters, seed=args.seed * SEED_STRIDE + SEED_STRIDE - 1,
                                         batch=args.batch)

        ens = Ensemble.split(comm, K, groups)
        say(f"{PROG}: {K} CAEs {cae(0)[1]!r} on {comm.size} rank(s) in {groups} group(s) of "
            f"{ens.ranks_per_group} rank(s); {args.epochs} epochs at most"
            + (f", budget {args.budget:g} s" if args.budget else "")
            + (f", eager rule {args.eager_rule[0]}:{args.eager_rule[1]:g}" if args.eager_rule else ""))
        t0 = comm.wtime()
        parallel_saved = {n: s for n, s in saved.items() if n != MONO}
        rules = dict(epochs=args.epochs, budget=args.budget, rule=args.eager_rule)
        states = train_members(be, ens, split, cae, rules, args=args, guard=guard, ckpt=ckpt, run=run,
                               saved=parallel_saved, outer=lambda: ({}, {}, {}), say=say)
        parallel_wall = comm.allreduce(comm.wtime() - t0, op="max")  # this process's part (a resumed run: since the resume)
        if args.mono_epochs:
            whole = Ensemble.split(comm, 1, 1)
            say(f"{PROG}: the monolithic CAE {mono(0)[1]!r} on all {comm.size} rank(s), at most "
                f"{args.mono_epochs} epochs, patience {args.mono_patience}")
            mono_saved = {n: s for n, s in saved.items() if n == MONO}
            done = states  # the parallel CAEs' states ride along in every checkpoint (rank 0's)
            mono_state = train_members(
                be, whole, split, mono, dict(epochs=args.mono_epochs, patience=args.mono_patience), args=args,
                guard=guard, ckpt=ckpt, run=run, saved=mono_saved, say=say,
                outer=lambda: _flat_states(done))
            if comm.is_root:
                states.update(mono_state)
        states = comm.bcast({n: {"record": s["record"]} for n, s in states.items()} if comm.is_root else None)
        summary = _evaluate(be, comm, run, split, args, states, groups, cae, mono, say)
        summary.update({"scheme": SCHEME, "source": split.source, "shape": list(split.shape),
                        "n_train": len(split.train_y), "n_validation": len(split.val_y), "n_test": len(split.test_y),
                        "models": K, "groups": groups, "ranks": comm.size, "ranks_per_group": ens.ranks_per_group,
                        "filters": list(args.filters), "mono_filters": [width * f for f in args.filters],
                        "device": be.device, "kernels": be.kernel_set, "dtype": str(be.dtype), "seed": args.seed,
                        "parallel_wall_s": parallel_wall, "resumed": run.resumed, "machine": describe(threads=None)})
        if comm.is_root:
            _write(run, summary, args, split, be, cae, mono, say)
        run.complete()
    say(f"{PROG}: wrote {run.path}")


def _picked_models(comm, run, names, make, picks) -> dict:
    """name -> its CAE with the weights of snapshot ``picks[name]``, on every rank."""
    return {name: load_snapshot(make(name)[1], run, name, picks[name], comm) for name in names}


def _evaluate(be, comm, run, split, args, states, groups, cae, mono, say) -> dict:
    """Step 4 and 5: pick, combine, time; with --curve, after every epoch too."""
    from aepar.parallel.ensemble import models_of

    names = [f"model{m}" for m in range(args.models)]
    make = lambda n: mono(0) if n == MONO else cae(int(n[5:]))  # noqa: E731
    records = {n: s["record"] for n, s in states.items()}

    def effective(picks: dict) -> float:
        """The slowest group: its models one after another, up to the picked epochs."""
        per_group = [sum(records[f"model{m}"]["epochs"][picks[f"model{m}"] - 1]["cum_seconds"]
                         for m in models_of(g, args.models, groups)) for g in range(groups)]
        return max(per_group)

    combined, alone = {}, {}  # classifiers already trained, by the snapshots they used

    def at(pick) -> dict:
        picks = {n: pick(records[n]) for n in names}
        key = tuple(picks[n] for n in names)
        if key not in combined:  # past the parallel CAEs' last epoch the curve repeats them
            chosen = _picked_models(comm, run, names, make, picks)
            combined[key] = combine(be, comm, split, chosen, args, quiet=args.quiet)
        acc = combined[key]
        train_s = effective(picks)
        row = {"picked_epochs": picks, "train_s": train_s, **acc,
               "effective_s": train_s + acc["combined"]["time_s"]}
        if MONO in records:
            e = min(pick(records[MONO]), len(records[MONO]["epochs"]))
            if e not in alone:
                alone[e] = combine(be, comm, split, _picked_models(comm, run, [MONO], make, {MONO: e}), args,
                                   quiet=True)["combined"]
            mono_s = records[MONO]["epochs"][e - 1]["cum_seconds"]
            row[MONO] = {"epoch": e, **alone[e], "train_s": mono_s, "effective_s": mono_s + alone[e]["time_s"]}
        return row

    say(f"{PROG}: combining")
    final = at(lambda r: pick_epoch(r, args))
    out = {"records": records, "final": final}
    if args.curve:
        longest = max(len(r["epochs"]) for r in records.values())
        wanted = range(1, longest + 1) if args.curve == "all" else [e for e in args.curve if e <= longest]
        out["curve"] = []
        for e in wanted:
            say(f"{PROG}: accuracy after epoch {e}")
            row = at(lambda r, e=e: min(e, len(r["epochs"])))
            out["curve"].append({"epoch": e, **row})
    return out


def _write(run, summary, args, split, be, cae, mono, say):
    from aepar.report import eager as report

    run.write_json("summary.json", summary)
    run.write_text("epochs.csv", report.epochs_csv(summary["records"]))
    table = report.accuracy_table(summary)
    run.write_text("accuracy.md", table)
    say(table)
    if summary.get("curve"):
        run.write_text("curve.csv", report.curve_csv(summary["curve"]))
    if not args.plot:
        return
    with run.output("losses.png") as path:
        report.losses_png(summary["records"], path, title=f"({split.source.split(':')[0]})")
    if summary.get("curve"):
        with run.output("curve.png") as path:
            report.curve_png(summary["curve"], path)
    shown = split.val_x[:SHOWN]
    rows = []
    for name in ["model0"] + ([MONO] if MONO in summary["records"] else []):
        last = len(summary["records"][name]["epochs"])
        for epoch in sorted({1, min(10, last), last}):
            model = load_snapshot((mono(0) if name == MONO else cae(0))[1], run, name, epoch)
            rows.append((f"{name} epoch {epoch}", be.to_host(model.reconstruct(be.asarray(shown)))))
    with run.output("reconstructions.png") as path:
        report.reconstructions_png(shown, rows, split.shape, path)


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
