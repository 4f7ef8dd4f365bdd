"""Fine-tune a pre-trained stack by backpropagation: ``python -m aepar.finetune``.

The pre-trained layers of a ``weights.h5`` (any stacked scheme's) are unrolled into the
deep autoencoder and fine-tuned data-parallel over every rank: the ``reconstruct`` task
(aepar.tasks.finetune) as a program of its own.

Given a checkpoint that was fine-tuned already (``finetuned/*`` in a weights.h5 of any
of these schemes), fine-tuning continues from the fine-tuned network (``--start-from pretrained``
starts again from its pre-trained layers). Like every scheme it saves checkpoints at safe
points and ``--resume DIR`` continues an interrupted run bit for bit.

Examples
--------
    python -m aepar.finetune --weights runs/greedy/001/weights.h5
    mpirun -np 4 python -m aepar.finetune --weights runs/greedy/001/weights.h5 --optimizer adam --loss xent
"""
from __future__ import annotations

import sys

from aepar import backend, checkpoint, schemes
from aepar.checkpoint import finetuned_from_params, layers_from_params, layers_to_params
from aepar.cli import ArgumentParser, DatasetOption, add_common, default_float32, gpu_blocks_hint, positive_int, progress, renamed
from aepar.comm import run_main
from aepar.data.files import check_source, fingerprinted, from_args
from aepar.data.sources import DIGIT_SOURCES, load_digits
from aepar.errors import UserError
from aepar.finish import Weights, finish
from aepar.guard import Guard
from aepar.report.stacked import TABLES_FILE, pca_error, reconstructions_figure, tables
from aepar.resume import Checkpointer
from aepar.rows import check_blocks
from aepar.rundir import fingerprint, parse_and_open
from aepar.tasks.finetune import add_finetune_args, finetune_and_evaluate

__all__ = ["build_parser", "main"]

PROG = "aepar.finetune"
# the weights it takes: any stacked scheme's, or its own
STACKED_WEIGHTS = tuple(schemes.names()) + ("finetune",)


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
    parser.add_argument("--start-from", choices=["finetuned", "pretrained"], default="finetuned",
                        help="finetuned: go on fine-tuning the fine-tuned network in --weights, where it holds "
                             "one (default); pretrained: start again from its pre-trained layers")
    renamed(parser, "--from-pretrained", "--start-from pretrained", dest="start_from", value="pretrained")
    parser.add_argument("--dataset", choices=list(DIGIT_SOURCES), default="auto", action=DatasetOption,
                        help="data to fine-tune on, as for aepar.greedy (default: auto)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use at most this many training digits")
    add_finetune_args(parser, standalone=True)
    add_common(parser, scheme="finetune")
    default_float32(parser)
    return parser


def _setup(args, comm):
    """Every rank, no communication: backend, checkpoint, data, checks."""
    be = backend.select(args.device, args.kernels, args.dtype)
    ckpt = checkpoint.load(args.weights, scheme=STACKED_WEIGHTS)
    layers = layers_from_params(be, ckpt.params, args.weights)
    model = None if args.start_from == "pretrained" else finetuned_from_params(be, ckpt.params, layers, args.loss, args.weights)
    check_source(args)
    if args.data is not None:  # rows read when a rank takes them; no labels needed
        digits = from_args(args, be.dtype, check=comm.is_root)
    else:
        digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    n_in = layers[0].params["W"].shape[0]
    if digits.train_x.shape[1] != n_in:
        raise UserError(f"{args.weights} takes {n_in} inputs but the data have {digits.train_x.shape[1]}")
    check_blocks(comm.size, args.reduce_blocks, digits.train_x.shape[0])
    gpu_blocks_hint(comm, be, args.reduce_blocks, args.quiet)
    return be, layers, model, digits


def main(argv, comm):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, "finetune", PROG, build_parser().parse_args, argv)
    with run, Guard.from_args(comm, PROG, args) as guard:
        be, layers, model, digits = comm.agree(_setup, args, comm)
        continued = model is not None
        progress(comm, args.quiet, f"{PROG}: {digits.source}")
        if continued:
            progress(comm, args.quiet, f"{PROG}: {args.weights} holds a fine-tuned network: fine-tuning it further "
                                       "(--start-from pretrained starts from its pre-trained layers)")
        ckpt = Checkpointer(run, comm, guard, "finetune",
                            fingerprint(fingerprinted(digits.train_x), fingerprinted(digits.test_x))
                            if comm.is_root else None,
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
        params = dict(layer_params, **{f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()})
        draw = (reconstructions_figure(be, layers, params, digits.test_x, loss=args.loss)
                if comm.is_root and args.plot else None)
        finish(run, comm, summary, weights=Weights("finetune", params, args.finetune_epochs,
                                                   {"sizes": model.sizes, "loss": args.loss,
                                                    "optimizer": args.optimizer}),
               tables=tables({f"{args.optimizer}/{args.loss}": summary}), tables_file=TABLES_FILE, prog=PROG,
               figures={"reconstructions.png": draw} if draw else None, quiet=args.quiet, plot=args.plot)
        run.complete()
    progress(comm, args.quiet, f"{PROG}: wrote {run.path}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
