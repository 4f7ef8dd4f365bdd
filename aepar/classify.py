"""Supervised fine-tuning to a classifier: ``python -m aepar.classify``.

CMU 15-618's last figure: the encoder of a pre-trained stack (``weights.h5`` of
``aepar.greedy``, ``aepar.sync`` or ``aepar.finetune``; 784-1000-500-250-30) with a
softmax layer of one output per class (10 for the digits) on top, trained by backprop on the labels; the project
reported 96.62% test accuracy after fine-tuning. ``--random-init`` trains the same
network from random weights (what pre-training is worth), ``--floors`` also trains
softmax regression on the raw pixels and on PCA-30 features (what any network must beat).

Training is data-parallel over every rank exactly as fine-tuning is
(aepar.parallel.data_parallel): the rows, each carrying its label as a trailing column
(aepar.models.classifier.with_labels), are cut into ``--reduce-blocks`` fixed blocks,
each block's gradient is computed alone and the blocks are added in one fixed tree, so
1, 2, 4, ... ranks take bit-identical steps. Checkpoints at safe points; ``--resume DIR``
continues an interrupted run bit for bit, on any number of ranks.

Examples
--------
    python -m aepar.classify --weights runs/greedy/001/weights.h5 --floors
    mpirun -np 2 python -m aepar.classify --weights runs/greedy/001/weights.h5 --random-init
    python -m aepar.classify --dataset mnist5k --layers 784-2000-2000-2000-2000 --classify-epochs 30
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from aepar import backend, checkpoint, schemes
from aepar.checkpoint import layers_from_params
from aepar.cli import (ArgumentParser, DatasetOption, add_common, add_reduce_blocks, default_float32, gpu_blocks_hint, positive_int,
                       progress, renamed)
from aepar.comm import run_main
from aepar.data.files import check_source, from_args, require_labels
from aepar.data.sources import DIGIT_SOURCES, load_digits
from aepar.errors import CheckpointError, UserError
from aepar.finish import Weights, finish
from aepar.guard import Guard
from aepar.models.classifier import UNIT_ACTS
from aepar.resume import Checkpointer
from aepar.rows import check_blocks
from aepar.rundir import fingerprint, parse_and_open
from aepar.tasks.classify import (DEFAULT_LAYERS, FLOOR_PCA, add_classify_args, build_model, check_labels,
                                  classify_and_evaluate, floors, network_sizes, table)

__all__ = ["build_parser", "main"]

PROG = "aepar.classify"


def build_parser():
    parser = ArgumentParser(
        prog=f"python -m {PROG}",
        description="Supervised fine-tuning: the encoder of a pre-trained stacked autoencoder (--weights, the "
                    "weights.h5 of aepar.greedy / aepar.sync / aepar.finetune) with a softmax layer of 10 "
                    "classes on top, trained by backprop on the labels (softmax cross-entropy), data-parallel "
                    "over every MPI rank with bit-identical results on any number of ranks up to "
                    "--reduce-blocks. Prints one line per epoch (loss, training accuracy seen while training, "
                    "test accuracy, seconds) and the train/test accuracy before and after; writes weights.h5, "
                    "summary.json and tables.md (accuracy: higher is better) into the run directory. "
                    "--random-init trains the same network from random weights; without --weights, --layers "
                    "gives a randomly initialised sigmoid network; --floors adds softmax regression on raw "
                    "pixels and on PCA-30 features.",
        epilog="Exit codes: 0 done, 2 bad input (missing or mismatched labels, a weights file whose first "
               "layer does not take the data), 3 diverged, 75 interrupted (checkpoint saved: --resume DIR), "
               "124 a rank stalled, 1 internal error. Examples: python -m aepar.classify --weights "
               "runs/greedy/001/weights.h5 --floors;  mpirun -np 2 python -m aepar.classify --dataset mnist5k "
               "--layers 784-2000-2000-2000-2000 --classify-epochs 30")
    parser.add_argument("--weights", default=None,
                        help="weights.h5 of aepar.greedy / aepar.sync / aepar.finetune: its pre-trained layers are "
                             "the encoder (Bernoulli layers -> sigmoid units, the last, linear code layer -> "
                             "identity)")
    parser.add_argument("--start-from", choices=["pretrained", "finetuned"], default="pretrained",
                        help="pretrained: the pre-trained layers of --weights are the encoder (default); finetuned: "
                             "the encoder half of the fine-tuned autoencoder in --weights")
    renamed(parser, "--from-finetuned", "--start-from finetuned", dest="start_from", value="finetuned")
    parser.add_argument("--random-init", action="store_true",
                        help="train the same network from random weights (0.1·N(0,1), softmax layer 0.01·N(0,1)) instead")
    parser.add_argument("--layers", default=None,
                        help=f"sizes of a randomly initialised network without --weights, e.g. "
                             f"784-2000-2000-2000-2000 (default {DEFAULT_LAYERS}); sigmoid units")
    parser.add_argument("--floors", action="store_true",
                        help=f"also train softmax regression on raw pixels and on PCA-{FLOOR_PCA} features "
                             f"(same optimizer and epochs) and report their accuracy")
    parser.add_argument("--dataset", choices=list(DIGIT_SOURCES), default="auto", action=DatasetOption,
                        help="labelled data, as for aepar.greedy (default: auto)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use at most this many training images")
    g = add_classify_args(parser)
    add_reduce_blocks(g)
    add_common(parser, scheme="classify")
    default_float32(parser)
    return parser


def _load_layers(be, args):
    """The encoder layers of ``args.weights`` (with their hidden-unit kinds), or None."""
    if args.weights is None:
        if args.start_from == "finetuned" or args.random_init:
            raise UserError("--start-from finetuned and --random-init need --weights (or give --layers alone)")
        return None
    if args.layers is not None:
        raise UserError("--layers is for a network without --weights (the weights file sets the sizes)")
    ckpt = checkpoint.load(args.weights, scheme=tuple(schemes.names()) + ("finetune",))
    layers = layers_from_params(be, ckpt.params, args.weights)
    for i, layer in enumerate(layers):  # the stack's convention (aepar.stack.make_layers)
        layer.hidden = "gaussian" if i == len(layers) - 1 else "bernoulli"
    if args.start_from == "finetuned":
        if "finetuned/W1" not in ckpt.params:
            raise CheckpointError(f"{args.weights}: holds no fine-tuned network (finetuned/W1, ...) for "
                                  f"--start-from finetuned")
        for i, layer in enumerate(layers):
            for mine, theirs in (("W", f"finetuned/W{i + 1}"), ("bh", f"finetuned/b{i + 1}")):
                if theirs not in ckpt.params:
                    raise CheckpointError(f"{args.weights}: {theirs} missing (the fine-tuned network is incomplete)")
                value = np.asarray(ckpt.params[theirs])
                if value.shape != tuple(layer.params[mine].shape):
                    raise CheckpointError(f"{args.weights}: {theirs} has shape {value.shape}, layer {i + 1} "
                                          f"{tuple(layer.params[mine].shape)}")
                layer.params[mine] = be.asarray(value)
    return layers


def _setup(args, comm):
    """Every rank, no communication: backend, weights, data, checks."""
    be = backend.select(args.device, args.kernels, args.dtype)
    layers = _load_layers(be, args)
    check_source(args)
    if args.data is not None:
        digits = from_args(args, be.dtype, check=comm.is_root)
        require_labels(digits, args.data, PROG)
    else:
        digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    check_labels(digits, digits.n_classes, digits.source.split(":")[0])
    n_in = int(digits.train_x.shape[1])
    if layers is not None and int(layers[0].params["W"].shape[0]) != n_in:
        raise UserError(f"{args.weights}: the first layer takes {layers[0].params['W'].shape[0]} inputs but the "
                        f"data have {n_in}")
    if layers is None:
        network_sizes(args, n_in)  # a bad --layers is one line here, on every rank
    check_blocks(comm.size, args.reduce_blocks, digits.train_x.shape[0])
    gpu_blocks_hint(comm, be, args.reduce_blocks, args.quiet)
    return be, layers, digits


def main(argv, comm):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, "classify", PROG, build_parser().parse_args, argv)
    with run, Guard.from_args(comm, PROG, args) as guard:
        be, layers, digits = comm.agree(_setup, args, comm)
        progress(comm, args.quiet, f"{PROG}: {digits.source}")
        encoder = None if args.random_init else layers
        if args.random_init:  # the same network, random weights
            args = argparse.Namespace(**dict(vars(args), layers=[int(layers[0].params["W"].shape[0])] +
                                             [int(l.params["W"].shape[1]) for l in layers],
                                             acts=[UNIT_ACTS[l.hidden] for l in layers]))
        ckpt = Checkpointer(run, comm, guard, "classify",
                            fingerprint(digits.train_x, digits.train_y, digits.test_x, digits.test_y)
                            if comm.is_root else None, progress=lambda m: progress(comm, args.quiet, m))
        loaded = ckpt.load()
        part = loaded[2].get("part") if loaded is not None else None
        if loaded is None or part == "":
            result = classify_and_evaluate(be, comm, encoder, digits, args, ckpt=ckpt, resume=loaded,
                                           outer=lambda: ({}, {}, {}), guard=guard)
            model = result.pop("model")
        else:  # interrupted in the floors: the network is finished and in the checkpoint
            result = loaded[2]["classify_result"]
            model = build_model(be, encoder, int(digits.train_x.shape[1]), args, digits.n_classes)
            for k, v in model.params.items():
                v[...] = be.asarray(loaded[0][f"classifier/{k}"])
        params = {f"classifier/{k}": be.to_host(v) for k, v in model.params.items()}
        summary = {"scheme": "classify", "weights": None if args.weights is None else str(args.weights),
                   "encoder": None if encoder is None else args.start_from,
                   "source": digits.source, "n_train": int(digits.train_x.shape[0]),
                   "n_test": int(digits.test_x.shape[0]), "ranks": comm.size, "device": be.device,
                   "kernels": be.kernel_set, "dtype": str(be.dtype), "seed": args.seed, "classify": result,
                   "accuracy": {"before": {"train": result["before"]["train"], "test": result["before"]["test"]},
                                "after": {"train": result["after"]["train"], "test": result["after"]["test"]}},
                   "time_s": result["time_s"], "floors": None}
        if args.floors:
            summary["floors"] = floors(be, comm, digits, args, ckpt=ckpt, guard=guard,
                                       resume=loaded if part not in (None, "") else None,
                                       outer=lambda: (params, {}, {"classify_result": result}))
        finish(run, comm, summary, weights=Weights("classify", params, args.classify_epochs,
                                                   {"sizes": model.dims, "acts": model.acts, "init": result["init"],
                                                    "weights": summary["weights"],
                                                    "optimizer": args.classify_optimizer}),
               tables=table(summary), prog=PROG, quiet=args.quiet, plot=args.plot)
        run.complete()
    progress(comm, args.quiet, f"{PROG}: wrote {run.path}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
