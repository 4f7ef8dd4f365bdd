"""Greedy layer-wise pre-training (Hinton & Salakhutdinov 2006; the baseline of Santara et al.).

Train layer 1 (an RBM by CD-1, 784-1000 for the paper's stack) for N epochs on the data,
turn the data into its hidden probabilities, train layer 2 on them, and so on to the code
layer. Every layer is data-parallel over all the ranks: the rows are cut into
``--reduce-blocks`` fixed blocks and each step adds the blocks' gradients in one fixed
tree, so the weights are the same bits on one process or on any number of ranks up to
that count.
"""
from __future__ import annotations

from aepar.cli import gpu_blocks_hint
from aepar.parallel.layerwise import resume_point, train_layer_by_layer
from aepar.rows import Shard, check_blocks


def check(args, ranks, n_layers, n_rows):
    check_blocks(ranks, args.reduce_blocks, n_rows)


def setup(job):
    comm, blocks = job.comm, job.args.reduce_blocks
    job.summary["blocks"] = blocks
    gpu_blocks_hint(comm, job.be, blocks, job.args.quiet)
    job.announce(f"{'one rank' if comm.size == 1 else f'data-parallel over {comm.size} ranks'}, "
                 f"{blocks} blocks summed in a fixed tree")


def pretrain(job) -> dict:
    be, comm, blocks = job.be, job.comm, job.summary["blocks"]
    position = resume_point(be, job.layers, job.loaded, job.prefix)
    train = Shard.of(be, job.digits.train_x, blocks, comm.rank, comm.size)
    watch = Shard.of(be, job.watch_x, min(blocks, job.watch_x.shape[0]), comm.rank, comm.size)
    return train_layer_by_layer(be, comm, job.layers, train, watch, quiet=job.args.quiet, trace=job.trace,
                                ckpt=job.ckpt, guard=job.guard, position=position, outer=job.outer,
                                what="greedy pre-training")
