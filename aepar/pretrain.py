"""One pre-training engine, six schemes: ``python -m aepar.pretrain --scheme S``.

Every scheme pre-trains the same layers (RBMs or autoencoder layers, aepar.stack) with the
same kernels and collectives, then hands them to the same task: fine-tuning the unrolled
autoencoder (``--task reconstruct``, error per digit: lower is better) or a softmax
classifier on the encoder (``--task classify``, test accuracy: higher is better).

    greedy  one layer after another (Hinton & Salakhutdinov); on several ranks each layer is
            data-parallel with a fixed-tree sum: the same weights on any number of ranks
    data    15-618's data parallelism: greedy layer by layer, each batch split over the ranks,
            one MPI Allreduce of the packed gradient per step (--lr-scaling for large batches)
    model   15-618's model parallelism: a layer per rank, layer n one epoch behind n-1 on
            frozen copies of the layers below refreshed every epoch; groups of --layer-group layers
    sync    Santara et al.: a pipeline stage per layer trained on the newest input of the
            stage below, extra epochs while it changes (ranks beyond the layers wait)
    hybrid  sync whose ranks beyond one per layer become data-parallel replicas of the
            stages, allotted by cost
    auto    measure every layer's epoch on a few batches, predict each scheme's makespan on
            these ranks (aepar.parallel.planner; the table is printed), run the fastest;
            never one predicted slower than data

``python -m aepar.greedy`` is ``--scheme greedy``; ``mpirun -np N python -m aepar.sync`` is
``--scheme sync``, or ``hybrid`` when N exceeds the layers (the log says which).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from aepar import _threads, backend, checkpoint, engine, schemes
from aepar.cli import (ArgumentParser, add_common, default_float32, non_negative_float, non_negative_int,
                       parse_with_preset, positive_int, progress, renamed)
from aepar.comm import run_main
from aepar.data.files import check_source, from_args, require_labels
from aepar.data.sources import Digits, load_digits
from aepar.errors import UserError
from aepar.guard import Guard
from aepar.parallel.data_parallel import train_epoch
from aepar.parallel.planner import LayerCosts, choose, format_table, predict
from aepar.parallel.synchronized import FULL_SIZE_EXTRAS, add_sync_args, parse_extras, sync_split
from aepar.rows import Blocks, Shard
from aepar.rundir import parse_and_open
from aepar.stack import BASE_BATCH, FULL_SIZE_RBMS, add_pretrain_args, layers_from_args, parse_layers, warm_up
from aepar.tasks.classify import add_classify_args, check_labels
from aepar.tasks.finetune import add_finetune_args

__all__ = ["PRESETS", "choices", "build_parser", "parse_args", "measure_costs", "main"]

PROG = "aepar.pretrain"

# --help prints a line per scheme; "auto" chooses one of the registered
AUTO = ("time every layer on a few batches, predict each scheme on these ranks (table printed), "
        "run the fastest; never one predicted slower than data")


def choices() -> dict:
    """What --scheme takes: the engine's schemes (aepar.schemes) and auto, with their lines."""
    return {**{s: schemes.get(s).about for s in schemes.names()}, "auto": AUTO}


_CMU = dict(pretrainer="ae", task="classify", dataset="auto")
PRESETS = {
    # `make run`-sized: the embedded digits, the real architecture, Adam on cross-entropy
    "quick": dict(dataset="mnist5k", epochs=10, finetune_epochs=10, classify_epochs=10),
    # the paper's budget on full-size data (apt-get install dataset-fashion-mnist), the
    # RBMs' recipe and sync's extra epochs chosen on held-out Fashion rows
    "full": dict(dataset="fashion", epochs=20, finetune_epochs=10, classify_epochs=10, extra=FULL_SIZE_EXTRAS,
                 **FULL_SIZE_RBMS),
    # CMU 15-618's two networks at its two settings (autoencoder layers, then a classifier)
    "15618": dict(_CMU, layers="784-2000-2000-2000-2000", epochs=30, batch=100, classify_epochs=30,
                  classify_batch=100),
    "15618-large": dict(_CMU, layers="784-2000-2000-2000-2000", epochs=60, batch=5000, classify_epochs=60,
                        classify_batch=5000),
    "15618-skewed": dict(_CMU, layers="784-2000-1000-500-100", epochs=30, batch=100, classify_epochs=30,
                         classify_batch=100),
    "15618-skewed-large": dict(_CMU, layers="784-2000-1000-500-100", epochs=60, batch=5000,
                               classify_epochs=60, classify_batch=5000),
}


def build_parser(scheme=None):
    parser = ArgumentParser(
        prog=f"python -m {PROG}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"Pre-train a stacked autoencoder with one of {len(schemes.names())} parallel schemes over the same layers, "
                    "kernels and collectives, then fine-tune it (--task reconstruct: error per digit, "
                    "lower is better) or train a softmax classifier on its encoder (--task classify: test "
                    "accuracy, higher is better). Rank 0 prints a line per epoch; summary.json, tables.md "
                    "and weights.h5 go into the run directory.\n\nschemes:\n"
                    + "\n".join(f"  {k:7s} {v}" for k, v in choices().items()),
        epilog="Exit codes: 0 done, 2 bad input, 3 diverged, 75 interrupted (checkpoint saved: --resume DIR), "
               "124 a rank stalled, 1 internal error. Examples: mpirun -np 4 python -m aepar.pretrain --scheme "
               "model --preset quick;  mpirun -np 2 python -m aepar.pretrain --scheme data --task classify "
               "--batch 1000 --lr-scaling sqrt --warmup-epochs 2;  python -m aepar.pretrain --scheme auto")
    g = parser.add_argument_group("scheme and task")
    g.add_argument("--scheme", choices=list(choices()), default=scheme or "auto",
                   help=f"how the layers are pre-trained (see above; default {scheme or 'auto'})")
    g.add_argument("--task", choices=["reconstruct", "classify"], default="reconstruct",
                   help="reconstruct: fine-tune the unrolled autoencoder (default); classify: a softmax layer "
                        "on the encoder trained end to end on the labels")
    g.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="quick: mnist5k, 10 epochs per layer + 10; full: Fashion-MNIST, 20 + 10, the RBMs "
                        f"at --lr 0.05 and --final-momentum 0.95, --extra {FULL_SIZE_EXTRAS} (sync, hybrid); "
                        "15618 / 15618-large: CMU 15-618's "
                        "784-2000-2000-2000-2000 autoencoder layers at 30 + 30 epochs, batch 100 / 60 + 60, batch "
                        "5000, --task classify; 15618-skewed(-large): its "
                        "784-2000-1000-500-100. Options given explicitly override the preset")
    g.add_argument("--layer-group", dest="group", type=positive_int, default=None,
                   help="model: layers trained at once (default: the ranks; fewer ranks than the group "
                        "train the slot's layers in turn, so one process reproduces a P-rank run with --layer-group P)")
    renamed(g, "--group", "--layer-group", dest="group", type=positive_int)
    g.add_argument("--lr-scaling", choices=["none", "linear", "sqrt"], default="none",
                   help=f"data: the layers' learning rate times batch/{BASE_BATCH} (linear) or its square root, "
                        "for large batches, and the fine-tuning / classifier rate likewise from its own batch "
                        "(default none: 15-618's plain average)")
    g.add_argument("--warmup-epochs", type=non_negative_int, default=0,
                   help="data: epochs over which the learning rates (the layers', fine-tuning's, the "
                        "classifier's) rise linearly from the base rate to the scaled one (default 0)")
    g.add_argument("--lr-decay", choices=["none", "cosine"], default="none",
                   help="data: after the warm-up, the layers', fine-tuning's and classifier's rates stay "
                        "(none, the default) or fall along half a cosine toward 0 by each one's last epoch")
    g.add_argument("--lars", type=non_negative_float, default=0.0, metavar="TRUST",
                   help="data: layer-wise adaptive rates (LARS) for the layers' weight matrices, each step "
                        "moving W by about TRUST x the rate of its norm, whatever the batch; e.g. 0.005, as "
                        "bench/results/pretrain_largebatch.md (default 0: off, the layers' plain SGD)")
    add_pretrain_args(parser)
    add_finetune_args(parser)
    add_classify_args(parser)
    add_sync_args(parser)
    add_common(parser, scheme="pretrain")
    default_float32(parser)
    return parser


def parse_args(argv=None, scheme=None):
    """Parse with the chosen preset's values as defaults (explicit options win)."""
    return parse_with_preset(build_parser(scheme), PRESETS, argv)


def offer_the_rest(parser, scheme):
    """A program that offers some of this engine's options (aepar.greedy, aepar.sync) runs
    the rest at their defaults, with ``scheme``."""
    own = {a.dest for a in parser._actions}
    rest = {k: v for k, v in vars(build_parser().parse_args([])).items() if k not in own}
    parser.set_defaults(**dict(rest, scheme=scheme))
    return parser


def _check(args, comm, n_layers, n_rows, scheme):
    """One line per impossible combination (every rank, no communication)."""
    engine.check(args, comm.size, n_layers, n_rows, scheme)
    if args.scheme != "model" and args.group is not None:
        raise UserError("--layer-group applies to --scheme model only")


def _setup(args, comm, data=None):
    """Every rank, no communication: backend, data (``data``: given rows, e.g. from
    :mod:`aepar.api`, else ``--dataset``), every check on the input."""
    be = backend.select(args.device, args.kernels, args.dtype)
    check_source(args)
    if data is None and args.data is not None:  # rows read when a rank takes them (aepar.data.files)
        digits = from_args(args, be.dtype, check=comm.is_root)
        if args.task == "classify":
            require_labels(digits, args.data, "--task classify")
    elif data is None:
        digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    else:
        digits = Digits(data.train_x.astype(be.dtype, copy=False), data.train_y,
                        data.test_x.astype(be.dtype, copy=False), data.test_y, data.source, data.name)
    if args.task == "classify":
        check_labels(digits, digits.n_classes)
    n_layers = len(parse_layers(args.layers, digits.train_x.shape[1])) - 1
    if args.scheme != "auto":
        _check(args, comm, n_layers, engine.prepare(args.scheme, digits, args)[0].train_x.shape[0], args.scheme)
    return be, digits


def measure_costs(be, args, x, ranks, held_out=0):
    """Planner input from this process: every layer's epoch and transform timed on a few
    batches of throw-away copies of the layers (the run's own are untouched), scaled to all
    the rows; an epoch the faster of two (a process's first epoch of a layer's shape also
    loads its compiled tiles, which the warm-up's tiny layer does not take), as one block
    (model, data on one rank) and in the ``--reduce-blocks`` fixed blocks (greedy on one
    rank, sync's and hybrid's stages: a narrow layer's blocks cost more than their rows).
    With ``held_out`` rows (those sync and hybrid keep for validation), also the
    reconstruction of that many rows, which their stages add to every epoch. Timed on one
    process while the others wait."""
    warm_up(be, args.pretrainer)
    probes = layers_from_args(be, args, x.shape[1])
    n = x.shape[0]
    rows = probe_rows(n, args.batch)
    h = Shard.of(be, x[:rows], 1)
    in_blocks = Blocks.of(rows, min(args.reduce_blocks, rows))
    epoch_s, blocked_s, transform_s, validation_s = [], [], [], []

    def epoch_of(layer, shard):
        seconds = []
        for epoch in range(2):
            t0 = be_time(be)
            train_epoch(layer, shard, epoch, batch=args.batch)
            seconds.append(be_time(be) - t0)
        return min(seconds) * n / rows

    for layer in probes:
        epoch_s.append(epoch_of(layer, h))
        if in_blocks.count > 1:  # with --reduce-blocks 1 the blocked epoch is this one
            blocked_s.append(epoch_of(layer, Shard(h.x, in_blocks)))
        t0 = be_time(be)
        h_next = layer.transform(h)
        transform_s.append((be_time(be) - t0) * n / rows)
        if held_out:  # after the transform, which the other schemes' prices have always taken first
            t0 = be_time(be)
            layer.recon_error(h)
            validation_s.append((be_time(be) - t0) * held_out / rows)
        h = h_next
    return LayerCosts.measured(probes, epoch_s, transform_s, n, args.batch,
                               parse_extras(args.extra, len(probes)), dtype=be.dtype,
                               n_val=held_out, blocks=args.reduce_blocks, held_out=held_out,
                               validation_s=validation_s if held_out else None,
                               blocked_epoch_s=blocked_s or None)


def probe_rows(n: int, batch: int) -> int:
    """The rows the planner's probes train on: a few batches, at least 512 rows."""
    return min(n, batch * max(3, -(-512 // batch)))


def measure_on_ranks(be, args, x, comm, schemes_here) -> tuple[dict, dict]:
    """Planner input from every rank (collective): each layer's data-parallel epoch on
    these ranks, timed on throw-away probes of the layers as :func:`measure_costs` times
    one rank's, the sums over the ranks included, for ``schemes_here`` of greedy (the
    ``--reduce-blocks`` fixed blocks, their tree) and data (a block per rank, one Allreduce
    a step). A rank's step on its share of a batch takes more than that share of one
    process's step (its weights' sums written out, summed over the ranks, then the
    update), so these are measured, not divided. Each epoch is the faster of two, its
    slowest rank's seconds, scaled to all the rows. Returns ({scheme: seconds per layer},
    {scheme: of those, the sums over the ranks, the mean over the ranks})."""
    n = x.shape[0]
    rows = probe_rows(n, args.batch)
    epoch_s, reduction_s = {}, {}
    for scheme, blocks, allreduce in (("greedy", args.reduce_blocks, False), ("data", comm.size, True)):
        if scheme not in schemes_here:
            continue
        h = Shard.of(be, x[:rows], blocks, comm.rank, comm.size)
        epoch_s[scheme], reduction_s[scheme] = [], []
        for layer in layers_from_args(be, args, x.shape[1]):
            best = None
            for epoch in range(2):
                comm.barrier()
                t0 = be_time(be)
                phases = train_epoch(layer, h, epoch, comm, batch=args.batch, allreduce=allreduce).phases
                seconds = comm.allreduce(be_time(be) - t0, op="max")
                summing = comm.allreduce(phases.get("reduction", 0.0)) / comm.size
                best = min(best or (seconds, summing), (seconds, summing))
            epoch_s[scheme].append(best[0] * n / rows)
            reduction_s[scheme].append(min(best[1], best[0]) * n / rows)
            h = layer.transform(h)
    return epoch_s, reduction_s


def be_time(be) -> float:
    be.synchronize()
    return time.perf_counter()


def choose_scheme(be, comm, args, digits) -> tuple[str, dict]:
    """``auto``: rank 0 times the layers, on several ranks all of them time greedy's and
    data's layer epochs together (:func:`measure_on_ranks`), and the planner predicts every
    scheme on these ranks; the fastest that can run here (never one predicted slower than
    data) and the table."""
    n_layers = len(parse_layers(args.layers, digits.train_x.shape[1])) - 1
    cores = _threads.node_cores(_threads.node_layout(comm))  # however the launcher bound the ranks
    predictions = costs = None
    if comm.is_root:
        costs = measure_costs(be, args, digits.train_x, comm.size, sync_split(digits, args)[1].size)
    if comm.size > 1:  # every rank: greedy's and data's epochs on these ranks, where they can run
        here = [s for s in ("greedy", "data") if _runs_here(args, comm, n_layers, digits.train_x.shape[0], s)]
        if here:
            epochs, sums = measure_on_ranks(be, args, digits.train_x, comm, here)
            if comm.is_root:
                costs = dataclasses.replace(costs, dp_ranks=comm.size, dp_epoch_s=epochs, dp_reduction_s=sums)
    if comm.is_root:
        predictions = predict(costs, comm.size, cores=cores)
        for scheme, entry in predictions.items():  # what this run could not do with these options
            try:
                _check(args, comm, n_layers, digits.train_x.shape[0], scheme)
            except UserError as exc:
                if entry["seconds"] is not None:
                    entry.update(seconds=None, ratio=None, note=f"not here: {exc}")
    predictions = comm.bcast(predictions)
    chosen = choose(predictions)
    # summary.json names seconds with the _s suffix, as every run file does (the planner: "seconds")
    written = {k: {("time_s" if f == "seconds" else f): v for f, v in e.items()} for k, e in predictions.items()}
    return chosen, {"auto": {"chosen": chosen, "predicted": written, "table": format_table(predictions)}}


def _runs_here(args, comm, n_layers, n_rows, scheme) -> bool:
    """Whether ``scheme`` can run with these options on these ranks (:func:`_check`)."""
    try:
        _check(args, comm, n_layers, n_rows, scheme)
    except UserError:
        return False
    return True


def _resumed_scheme(comm, run, n_layers) -> str:
    """The scheme an interrupted ``auto`` run chose: its checkpoint says."""
    name = comm.bcast(checkpoint.load(run.checkpoint_path).scheme if comm.is_root else None)
    if name == "sync":  # sync and hybrid share their checkpoints: the ranks say which this is
        return "hybrid" if comm.size > n_layers else "sync"
    return name


def _as_started(args, run, comm, scheme):
    """What a resumed run's bits depend on besides its options: model's group (by default
    the ranks it started on) is kept; data, whose ranks are the blocks of its Allreduce,
    resumes only on the rank count it started on."""
    started = ((run.previous or {}).get("checkpoint") or {}).get("ranks") if run.resumed else None
    if started is None:
        return
    if scheme == "model" and args.scheme == "model" and args.group is None:
        args.group = int(started)
    if scheme == "data" and int(started) != comm.size:
        raise UserError(f"--resume {run.path}: --scheme data gives the same result only on the rank count it "
                        f"started on ({started} ranks, not {comm.size}): resume with mpirun -np {started}")


def main(argv, comm, scheme=None):
    return run_program(argv, comm, kind="pretrain", prog=PROG, parse=lambda a: parse_args(a, scheme))


def run_program(argv, comm, *, kind: str, prog: str, parse, scheme_for=None, data=None):
    """The program: parse ``argv`` (``parse``), open the run directory (runs/``kind``), run
    the scheme (``scheme_for(args, comm)``, default ``args.scheme``; auto chooses), complete.
    ``data``: the rows to train on instead of ``--dataset`` (Digits). Returns (the summary,
    complete on rank 0; the run directory)."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, kind, prog, parse, argv)
    if scheme_for is not None:
        args.scheme = scheme_for(args, comm)
    with run, Guard.from_args(comm, prog, args, run) as guard:
        comm.agree(_as_started, args, run, comm, args.scheme)
        be, digits = comm.agree(_setup, args, comm, data)
        progress(comm, args.quiet, f"{prog}: {digits.source}")
        chosen, extra = args.scheme, {}
        if chosen == "auto":
            n_layers = len(parse_layers(args.layers, digits.train_x.shape[1])) - 1
            if run.resumed and run.checkpoint_path.exists():
                chosen = _resumed_scheme(comm, run, n_layers)
                comm.agree(_as_started, args, run, comm, chosen)
                progress(comm, args.quiet, f"{prog}: auto chose {chosen} when the run started")
            else:
                chosen, extra = choose_scheme(be, comm, args, digits)
                progress(comm, args.quiet, extra["auto"]["table"])
                progress(comm, args.quiet, f"{prog}: auto runs {chosen}")
            comm.agree(_check, args, comm, n_layers, digits.train_x.shape[0], chosen)
        summary = engine.run_scheme(be, comm, args, digits, run, guard, chosen, prog=prog, extra=extra)
        run.complete()
    progress(comm, args.quiet, f"{prog}: wrote {run.path}")
    return summary, run.path


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
