"""Model parallelism (CMU 15-618): a layer per rank, each one epoch behind the layer below.

Rank n trains layer n. In round r, layer n trains its epoch r - n on the outputs of frozen
copies of the layers below, copies that are refreshed from their owners after every round;
so layer n sees layer n-1 one epoch old, and all ranks train at once after the pipeline
has filled. With more layers than ranks, ``--layer-group`` layers train at once and a rank
trains its slots' layers in turn, so one process reproduces a P-rank run with
``--layer-group P``. A layer's epochs run on one rank with nothing to add up: its rows are one
block.
"""
from __future__ import annotations

from aepar.checkpoint import restore_layers
from aepar.errors import UserError
from aepar.parallel.model_parallel import pretrain_model_parallel, restore_velocities
from aepar.rows import Shard


def check(args, ranks, n_layers, n_rows):
    if ranks > n_layers:
        raise UserError(f"--scheme model trains one layer per rank: {ranks} ranks for {n_layers} layers; "
                        f"use at most {n_layers} ranks (or --scheme hybrid)")
    if args.group is not None and args.group < ranks:
        raise UserError(f"--layer-group {args.group} leaves ranks idle on {ranks} ranks: use --layer-group {ranks} "
                        "or more")


def setup(job):
    group = min(job.args.group or job.comm.size, len(job.layers))
    job.summary.update(blocks=1, group=group)
    job.announce(f"model-parallel, groups of {group} layer(s) on {job.comm.size} rank(s)")


def pretrain(job) -> dict:
    be = job.be
    if job.loaded is not None:
        params, opt_state, _ = job.loaded
        restore_layers(be, job.layers, params, {})
        restore_velocities(be, job.layers, opt_state)
    train = Shard.of(be, job.digits.train_x, 1)
    watch = Shard.of(be, job.watch_x, 1)
    return pretrain_model_parallel(be, job.comm, job.layers, train, watch, group=job.summary["group"],
                                   ckpt=job.ckpt, guard=job.guard, position=job.position if job.loaded else None,
                                   trace=job.trace, say=None if job.args.quiet else job.say)
