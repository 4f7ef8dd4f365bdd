"""Greedy layer-wise pre-training and fine-tuning of a stacked autoencoder: ``python -m aepar.greedy``.

The baseline of Santara et al. (2016), Hinton & Salakhutdinov's recipe (aepar.schemes.greedy):
train the RBM of layer 1 (784-1000) for N epochs, turn the data into its hidden
probabilities, train layer 2 on them, and so on to the 30 linear code units; then unroll
the stack into the deep autoencoder and fine-tune it by backpropagation. Every stage is
data-parallel over all the ranks with fixed blocks summed in a fixed tree, so the weights
are bit-identical on one process or any number of ranks up to ``--reduce-blocks``.
``--resume DIR`` continues an interrupted run to the same weights, on any number of ranks.

The same as ``python -m aepar.pretrain --scheme greedy`` with this program's options and
run directory (default a new runs/greedy/NNN): ``weights.h5``, ``summary.json``,
``tables.md`` (the paper's Tables 2 and 3), ``trace.json`` and ``run.json``.

Examples
--------
    python -m aepar.greedy --dataset mnist5k
    mpirun -np 2 python -m aepar.greedy --layers 784-64-32-8 --epochs 2 --finetune-epochs 1 --limit 500
"""
from __future__ import annotations

import sys

from aepar.cli import ArgumentParser, add_common, default_float32
from aepar.comm import run_main
from aepar.pretrain import offer_the_rest, run_program
from aepar.stack import add_pretrain_args
from aepar.tasks.finetune import add_finetune_args

__all__ = ["build_parser", "main"]

PROG = "aepar.greedy"


def build_parser():
    parser = ArgumentParser(
        prog=f"python -m {PROG}",
        description="Greedy layer-wise pre-training of a stacked autoencoder (RBMs trained by CD-1, "
                    "one layer after another, Hinton & Salakhutdinov 2006), then fine-tuning by "
                    "backprop; data-parallel over all MPI ranks, with bit-identical results on any "
                    "number of ranks up to --reduce-blocks. Prints one line per epoch (layer, epoch, "
                    "reconstruction error, seconds) and writes weights.h5, summary.json and tables.md "
                    "(error per digit, times, PCA-30 baseline) into the run directory.",
        epilog="Exit codes: 0 done, 2 bad input, 3 diverged, 75 interrupted (checkpoint saved: "
               "--resume DIR), 124 a rank stalled, 1 internal error. Examples: python -m aepar.greedy "
               "--dataset mnist5k;  mpirun -np 2 python -m aepar.greedy --layers 784-64-32-8 --epochs 2 "
               "--finetune-epochs 1 --limit 500")
    add_pretrain_args(parser)
    add_finetune_args(parser)
    add_common(parser, scheme="greedy")
    default_float32(parser)
    return offer_the_rest(parser, "greedy")


def main(argv, comm):
    return run_program(argv, comm, kind="greedy", prog=PROG, parse=build_parser().parse_args)


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
