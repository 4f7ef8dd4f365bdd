"""Data parallelism (CMU 15-618): greedy layer by layer, each batch split over the ranks.

Every rank holds one block of the rows; each step every rank computes the gradient of its
share of the batch and one MPI Allreduce of the packed gradient adds them up. Fast, but the
rounding of the sum depends on the ranks, so the weights are the same only on the same
rank count. For large batches ``--lr-scaling`` raises the layers' learning rate (times
batch/100, or its square root) over ``--warmup-epochs``, and the task's rate (fine-tuning's
or the classifier's) likewise from its own batch; ``--lr-decay cosine`` lowers every rate
toward 0 by the last epoch after the warm-up, and ``--lars`` gives each weight matrix a
layer-wise adaptive rate (LARS).
"""
from __future__ import annotations

from aepar.errors import UserError
from aepar.optim import cosine
from aepar.parallel.layerwise import resume_point, train_layer_by_layer
from aepar.rows import Shard
from aepar.stack import BASE_BATCH
from aepar.tasks.finetune import finetune_decay


def check(args, ranks, n_layers, n_rows):
    if ranks > args.batch:
        raise UserError(f"--scheme data splits each batch over the ranks: batch {args.batch} < {ranks} ranks")


def setup(job):
    args = job.args
    job.summary.update(blocks=job.comm.size, lr_scaling=args.lr_scaling, warmup_epochs=args.warmup_epochs,
                       lr_decay=args.lr_decay, lars=args.lars)
    for layer in job.layers:
        layer.optimizer.trust = args.lars
    if scheduled(args):  # the task's rate from its own batch, on the layers' schedule
        base_f, base_c = args.finetune_lr, args.classify_lr
        args.finetune_lr = base_f * scale(args, args.finetune_batch)
        args.classify_lr = base_c * scale(args, args.classify_batch)
        args.finetune_lr_decay = finetune_decay(args, args.lr_decay)  # as the run reports it
        args.finetune_lr_at = schedule(args, base_f, args.finetune_lr, args.finetune_epochs, args.finetune_lr_decay)
        args.classify_lr_at = schedule(args, base_c, args.classify_lr, args.classify_epochs)
        job.summary.update(classify_lr=args.classify_lr, finetune_lr=args.finetune_lr)
    job.announce(f"data-parallel over {job.comm.size} rank(s), one Allreduce per step"
                 + (f", learning rate scaled {args.lr_scaling} from batch {BASE_BATCH}"
                    if args.lr_scaling != "none" else "")
                 + (f", {args.warmup_epochs} warm-up epochs" if args.warmup_epochs else "")
                 + (f", {args.lr_decay} decay" if args.lr_decay != "none" else "")
                 + (f", LARS trust {args.lars:g}" if args.lars else ""))


def scheduled(args) -> bool:
    return args.lr_scaling != "none" or bool(args.warmup_epochs) or args.lr_decay != "none"


def scale(args, batch: int) -> float:
    """--lr-scaling's factor for ``batch``: batch/100 (linear), its square root, or 1."""
    return {"none": 1.0, "linear": batch / BASE_BATCH, "sqrt": (batch / BASE_BATCH) ** 0.5}[args.lr_scaling]


def schedule(args, base: float, scaled: float, epochs: int, decay: str | None = None):
    """The rate of (0-based) ``epoch`` of ``epochs``: from ``base`` (batch 100's, which works)
    up to ``scaled`` linearly over --warmup-epochs, then ``scaled``, or with ``decay`` cosine
    (default: --lr-decay's) half a cosine from ``scaled`` toward 0 over the epochs after the
    warm-up."""
    warmup = args.warmup_epochs
    after = cosine(scaled, epochs, warmup) if (decay or args.lr_decay) == "cosine" else (lambda epoch: scaled)

    def lr_at(epoch: int) -> float:
        if epoch < warmup:
            return base + (scaled - base) * (epoch + 1) / warmup
        return after(epoch)
    return lr_at


def lr_rule(args):
    """The learning rate of a layer's epoch, or None for the layers' own (:func:`schedule`
    from the layer's rate and its scaled value)."""
    if not scheduled(args):
        return None
    factor = scale(args, args.batch)
    return lambda layer, epoch: schedule(args, layer.lr, layer.lr * factor, layer.epochs)(epoch)


def pretrain(job) -> dict:
    be, comm = job.be, job.comm
    position = resume_point(be, job.layers, job.loaded, job.prefix)
    train = Shard.of(be, job.digits.train_x, comm.size, comm.rank, comm.size)  # one block per rank
    watch = Shard.of(be, job.watch_x, min(comm.size, job.watch_x.shape[0]), comm.rank, comm.size)
    return train_layer_by_layer(be, comm, job.layers, train, watch, quiet=job.args.quiet, trace=job.trace,
                                ckpt=job.ckpt, guard=job.guard, position=position, outer=job.outer,
                                allreduce=True, lr_at=lr_rule(job.args), what="data pre-training")
