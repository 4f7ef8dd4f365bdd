"""Data parallelism (CMU 15-618): greedy layer by layer, each batch split over the ranks.

Every rank holds one block of the rows; each step every rank computes the gradient of its
share of the batch and one MPI Allreduce of the packed gradient adds them up. Fast, but the
rounding of the sum depends on the ranks, so the weights are the same only on the same
rank count. For large batches ``--lr-scaling`` raises the layers' learning rate (times
batch/100, or its square root) over ``--warmup-epochs``, and the task's rate likewise from
its own batch.
"""
from __future__ import annotations

from aepar.errors import UserError
from aepar.parallel.layerwise import resume_point, train_layer_by_layer
from aepar.rows import Shard
from aepar.stack import BASE_BATCH


def check(args, ranks, n_layers, n_rows):
    if ranks > args.batch:
        raise UserError(f"--scheme data splits each batch over the ranks: batch {args.batch} < {ranks} ranks")


def setup(job):
    args = job.args
    job.summary.update(blocks=job.comm.size, lr_scaling=args.lr_scaling, warmup_epochs=args.warmup_epochs)
    if args.lr_scaling != "none":
        power = {"linear": 1.0, "sqrt": 0.5}[args.lr_scaling]
        args.finetune_lr *= (args.finetune_batch / BASE_BATCH) ** power
        args.classify_lr *= (args.classify_batch / BASE_BATCH) ** power
        job.summary.update(classify_lr=args.classify_lr, finetune_lr=args.finetune_lr)
    job.announce(f"data-parallel over {job.comm.size} rank(s), one Allreduce per step"
                 + (f", learning rate scaled {args.lr_scaling} from batch {BASE_BATCH}"
                    if args.lr_scaling != "none" else "")
                 + (f", {args.warmup_epochs} warm-up epochs" if args.warmup_epochs else ""))


def lr_rule(args):
    """The learning rate of a layer's epoch, or None for the layers' own: the rate times
    batch/100 (linear) or its square root, reached by a linear warm-up over --warmup-epochs."""
    if args.lr_scaling == "none" and not args.warmup_epochs:
        return None
    ratio = args.batch / BASE_BATCH
    factor = {"none": 1.0, "linear": ratio, "sqrt": ratio ** 0.5}[args.lr_scaling]

    def lr_at(layer, epoch):
        ramp = min(1.0, (epoch + 1) / args.warmup_epochs) if args.warmup_epochs else 1.0
        return layer.lr * (1.0 + (factor - 1.0) * ramp)  # from the base rate, which works, to the scaled one
    return lr_at


def pretrain(job) -> dict:
    be, comm = job.be, job.comm
    position = resume_point(be, job.layers, job.loaded, job.prefix)
    train = Shard.of(be, job.digits.train_x, comm.size, comm.rank, comm.size)  # one block per rank
    watch = Shard.of(be, job.watch_x, min(comm.size, job.watch_x.shape[0]), comm.rank, comm.size)
    return train_layer_by_layer(be, comm, job.layers, train, watch, quiet=job.args.quiet, trace=job.trace,
                                ckpt=job.ckpt, guard=job.guard, position=position, outer=job.outer,
                                allreduce=True, lr_at=lr_rule(job.args), what="data pre-training")
