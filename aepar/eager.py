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

Steps 2-4 are aepar.schemes.eager (the training, the stop rules, the snapshots, the
pick), step 5 is aepar.tasks.combine; this file is the program around them.

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

from aepar import backend, metrics
from aepar.cli import (ArgumentParser, add_common, add_reduce_blocks, default_float32, learning_rate,
                       non_negative_int, parse_with_preset, positive_float, positive_int, progress, renamed)
from aepar.comm import run_main
from aepar.errors import UserError
from aepar.finish import finish
from aepar.schemes.eager import flat_states, load_snapshot, pick_epoch, saved_states, train_members
from aepar.tasks.combine import combine

__all__ = ["PRESETS", "build_parser", "parse", "load_split", "main"]

PROG = "aepar.eager"
SCHEME = "eager"
PRESETS = {
    # a few minutes on 2 cores: the embedded digits, small filters, few epochs
    "quick": dict(dataset="mnist5k", models=4, filters=(16, 32), epochs=5, mono_epochs=5, mono_patience=2,
                  classify_epochs=5),
    # the paper's small regime (embedded 5,000 digits) and large regime (Fashion-MNIST 48k/12k)
    "small": dict(dataset="mnist5k", models=5, filters=(16, 32), epochs=10, mono_epochs=20, mono_patience=2,
                  classify_epochs=10),
    "full": dict(dataset="fashion", models=5, filters=(16, 32), epochs=10, mono_epochs=10, mono_patience=2,
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
    from aepar.cli import DatasetOption
    from aepar.data.sources import DIGIT_SOURCES

    parser = ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0] + " " + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples: mpirun -np 2 python -m aepar.eager --models 4 --preset quick;  "
               "mpirun -np 5 python -m aepar.eager --preset small --curve")
    g = parser.add_argument_group("the parallel CAEs")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="quick: minutes on 2 cores; small: the paper's small regime (embedded digits); full: its "
                        "large regime, Fashion-MNIST 48k/12k (make fashion). Options given explicitly override "
                        "the preset (default: none)")
    g.add_argument("--models", type=positive_int, default=5, help="K, the parallel CAEs (default 5, the paper's)")
    g.add_argument("--rank-groups", type=positive_int, default=None,
                   help="groups of ranks, each training its models data-parallel (default min(K, ranks))")
    renamed(g, "--groups", "--rank-groups", dest="rank_groups", type=positive_int)
    g.add_argument("--filters", type=_filters, default=(16, 32), metavar="F1,F2",
                   help="feature maps of the two encoder convolutions (default 16,32)")
    g.add_argument("--epochs", type=positive_int, default=10, help="most epochs a CAE trains (default 10)")
    g.add_argument("--budget", type=positive_float, default=None, metavar="SECONDS",
                   help="stop a CAE once its training took this long (wall clock)")
    g.add_argument("--eager-rule", type=_rule, default=None, metavar="K:DELTA",
                   help="stop a CAE when its validation loss improved by less than the fraction DELTA over "
                        "its last K epochs (e.g. 2:0.05)")
    g.add_argument("--cae-lr", type=learning_rate, default=1e-3,
                   help="the CAEs' Adam learning rate (default 0.001)")
    renamed(g, "--lr", "--cae-lr", dest="cae_lr", type=learning_rate)
    g.add_argument("--batch", type=positive_int, default=100, help="minibatch (default 100, the paper's)")
    g.add_argument("--val-fraction", type=float, default=0.2,
                   help="of the training images held out for validation (default 0.2: 4.8k/1.2k of 6k)")
    g.add_argument("--limit", type=positive_int, default=None, help="use only the first N training images")
    g.add_argument("--dataset", choices=DIGIT_SOURCES, default="auto", action=DatasetOption,
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
    add_classify_args(parser)
    add_common(parser, scheme=SCHEME)
    default_float32(parser)
    return parser


def parse(argv):
    """Options with the preset's values as defaults; impossible combinations are UserErrors."""
    args = parse_with_preset(build_parser(), PRESETS, argv, old_names={"large": "full"})
    if args.pick_epoch is not None and args.pick_epoch > args.epochs:
        raise _refuse(f"--pick-epoch {args.pick_epoch} is beyond the {args.epochs} epochs the CAEs train")
    if args.pick_epoch is not None and args.pick_by_budget is not None:
        raise _refuse("--pick-epoch and --pick-by-budget are two ways to pick: give one")
    if args.rank_groups is not None and args.rank_groups > args.models:
        raise _refuse(f"--rank-groups {args.rank_groups} is more than the {args.models} models "
                      "(a group would have none)")
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
    n_classes: int


def load_split(args, images=None) -> Split:
    """The images the run trains on (every rank reads the same; UserError on bad data);
    ``images``: labelled Images given instead of the options' data (aepar.api.eager)."""
    from aepar.data.sources import load_images
    from aepar.data.splits import split_indices
    from aepar.models.cae import check_image_shape

    from aepar.data.files import check_source, images_from_args

    check_source(args)
    if images is not None:
        im = images
    elif args.data is not None:  # the user's images, labelled (the classifiers need labels)
        im = images_from_args(args, np.dtype(args.dtype), why="aepar.eager (its classifiers)")
    else:
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
    split = Split(*(np.ascontiguousarray(p) for p in parts), shape=shape, source=im.source, n_classes=im.n_classes)
    return split


# ---- the run -------------------------------------------------------------------------------------
def _setup(args, comm, images=None):
    be = backend.select(args.device, args.kernels, args.dtype)
    split = load_split(args, images)
    from aepar.rows import check_blocks

    groups = args.rank_groups or min(args.models, comm.size)
    if groups > comm.size:
        raise UserError(f"--rank-groups {groups} is more than the {comm.size} ranks")
    # the monolithic CAE and the classifiers train on every rank: each needs a whole block
    check_blocks(comm.size, args.reduce_blocks, len(split.train_y))
    # no gpu_blocks_hint: the CAEs, most of this command's time, train as fast in 8 blocks on
    # a GPU as in one (H200, aepar 0.8.28: 0.82 s an epoch against 0.93 s, gpu_epoch.csv)
    if len(split.val_y) < 1 or len(split.test_y) < 1:
        raise UserError(f"{split.source}: too few images for a validation and a test set")
    return be, split, groups


def main(argv, comm):
    run_program(sys.argv[1:] if argv is None else [str(a) for a in argv], comm)


def run_program(argv: list, comm, images=None) -> tuple:
    """The program on ``argv``; ``images``: labelled Images to train on instead of the
    options' data (aepar.api.eager). Returns (the summary, the run directory)."""
    from aepar.guard import Guard
    from aepar.machine import describe
    from aepar.models.cae import ConvAutoencoder
    from aepar.parallel.ensemble import Ensemble
    from aepar.resume import Checkpointer
    from aepar.rundir import fingerprint, parse_and_open

    args, run = parse_and_open(comm, SCHEME, PROG, parse, argv)
    say = lambda m, **kw: progress(comm, args.quiet, m, **kw)  # noqa: E731
    metrics.of(run)  # metrics.csv's clock starts with the run
    with run, Guard.from_args(comm, PROG, args) as guard:
        be, split, groups = comm.agree(_setup, args, comm, images)
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
        # this process's part (a resumed run: since the resume)
        parallel_wall = comm.allreduce(comm.wtime() - t0, op="max")
        if args.mono_epochs:
            whole = Ensemble.split(comm, 1, 1)
            say(f"{PROG}: the monolithic CAE {mono(0)[1]!r} on all {comm.size} rank(s), at most "
                f"{args.mono_epochs} epochs, patience {args.mono_patience}")
            mono_saved = {n: s for n, s in saved.items() if n == MONO}
            done = states  # the parallel CAEs' states ride along in every checkpoint (rank 0's)
            mono_state = train_members(
                be, whole, split, mono, dict(epochs=args.mono_epochs, patience=args.mono_patience), args=args,
                guard=guard, ckpt=ckpt, run=run, saved=mono_saved, say=say,
                outer=lambda: flat_states(done))
            if comm.is_root:
                states.update(mono_state)
        states = comm.bcast({n: {"record": s["record"]} for n, s in states.items()} if comm.is_root else None)
        summary = _evaluate(be, comm, run, split, args, states, groups, cae, mono, say, guard, ckpt)
        summary.update({"scheme": SCHEME, "source": split.source, "shape": list(split.shape),
                        "n_train": len(split.train_y), "n_validation": len(split.val_y), "n_test": len(split.test_y),
                        "models": K, "groups": groups, "ranks": comm.size, "ranks_per_group": ens.ranks_per_group,
                        "filters": list(args.filters), "mono_filters": [width * f for f in args.filters],
                        "device": be.device, "kernels": be.kernel_set, "dtype": str(be.dtype), "seed": args.seed,
                        "parallel_wall_s": parallel_wall, "resumed": run.resumed, "machine": describe(threads=None)})
        finish(run, comm, summary, **(_results(run, summary, args, split, be, cae, mono) if comm.is_root else {}),
               prog=PROG, quiet=args.quiet, plot=args.plot)
        run.complete()
    say(f"{PROG}: wrote {run.path}")
    return summary, run.path


def _stop_if_asked(guard, comm, ckpt):
    """A safe point between two evaluations (minutes each on a large data set): a stop signal
    on any rank ends the run here, and --resume evaluates again from the checkpoint taken when
    training ended."""
    if guard.decide(comm.allreduce(guard.flags()))[1]:
        raise ckpt.interrupted()


def _picked_models(comm, run, names, make, picks) -> dict:
    """name -> its CAE with the weights of snapshot ``picks[name]``, on every rank."""
    return {name: load_snapshot(make(name)[1], run, name, picks[name], comm) for name in names}


def _evaluate(be, comm, run, split, args, states, groups, cae, mono, say, guard, ckpt) -> dict:
    """Step 4 and 5: pick, combine, time; with --curve, after every epoch too."""
    from aepar.parallel.ensemble import models_of

    safe_point = lambda: _stop_if_asked(guard, comm, ckpt)  # noqa: E731

    names = [f"model{m}" for m in range(args.models)]
    make = lambda n: mono(0) if n == MONO else cae(int(n[5:]))  # noqa: E731
    records = {n: s["record"] for n, s in states.items()}

    def effective(picks: dict) -> float:
        """The slowest group: its models one after another, up to the picked epochs."""
        per_group = [sum(records[f"model{m}"]["epochs"][picks[f"model{m}"] - 1]["cum_s"]
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
            mono_s = records[MONO]["epochs"][e - 1]["cum_s"]
            row[MONO] = {"epoch": e, **alone[e], "train_s": mono_s, "effective_s": mono_s + alone[e]["time_s"]}
        return row

    say(f"{PROG}: combining")
    safe_point()
    final = at(lambda r: pick_epoch(r, args))
    out = {"records": records, "final": final}
    if args.curve:
        longest = max(len(r["epochs"]) for r in records.values())
        wanted = range(1, longest + 1) if args.curve == "all" else [e for e in args.curve if e <= longest]
        out["curve"] = []
        for e in wanted:
            safe_point()
            say(f"{PROG}: accuracy after epoch {e}")
            row = at(lambda r, e=e: min(e, len(r["epochs"])))
            out["curve"].append({"epoch": e, **row})
    return out


def _results(run, summary, args, split, be, cae, mono) -> dict:
    """finish()'s accuracy table, CSVs and figures (losses, curve, reconstructions)."""
    from aepar.report import eager as report

    texts = {"epochs.csv": report.epochs_csv(summary["records"])}
    if summary.get("curve"):
        texts["curve.csv"] = report.curve_csv(summary["curve"])
    figures = {}
    if args.plot:
        figures["losses.png"] = lambda path: report.losses_png(summary["records"], path,
                                                               title=f"({split.source.split(':')[0]})")
        if summary.get("curve"):
            figures["curve.png"] = lambda path: report.curve_png(summary["curve"], path)
        figures["reconstructions.png"] = lambda path: _reconstructions(run, summary, split, be, cae, mono, path)
    return {"tables": report.accuracy_table(summary), "tables_file": "accuracy.md", "texts": texts,
            "figures": figures}


def _reconstructions(run, summary, split, be, cae, mono, path):
    """Originals and model0's (and the monolithic CAE's) reconstructions after epoch 1,
    10 and the last."""
    from aepar.report import eager as report

    shown = split.val_x[:SHOWN]
    rows = []
    for name in ["model0"] + ([MONO] if MONO in summary["records"] else []):
        last = len(summary["records"][name]["epochs"])
        for epoch in sorted({1, min(10, last), last}):
            model = load_snapshot((mono(0) if name == MONO else cae(0))[1], run, name, epoch)
            rows.append((f"{name} epoch {epoch}", be.to_host(model.reconstruct(be.asarray(shown)))))
    report.reconstructions_png(shown, rows, split.shape, path)


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
