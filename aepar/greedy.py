"""Greedy layer-wise pre-training and fine-tuning of a stacked autoencoder: ``python -m aepar.greedy``.

The baseline of Santara et al. (2016), Hinton & Salakhutdinov's recipe: train the RBM of
layer 1 (784-1000) for N epochs, turn the data into its hidden probabilities, train layer 2
on them, and so on to the 30 linear code units; then unroll the stack into the deep
autoencoder and fine-tune it by backpropagation. Every stage is data-parallel over all the
ranks it is given: the rows are cut into ``--reduce-blocks`` fixed blocks, each step adds
the blocks' gradients in one fixed tree (aepar.parallel.data_parallel), so the weights are
bit-identical on one process or any number of ranks up to that count. Checkpoints (every
layer, the epoch and batch reached, the random streams) are saved at safe points;
``--resume DIR`` continues an interrupted run to the same weights, on any number of ranks.

Writes into the run directory (default a new runs/greedy/NNN): ``weights.h5`` (pre-trained
layers and, after fine-tuning, the unrolled network), ``summary.json`` (per-layer epoch
times and errors, pre-training and fine-tuning wall times, error per digit before and
after fine-tuning, the PCA-30 baseline), ``tables.md`` (the seed's Tables 2 and 3) and
``run.json``.

Examples
--------
    python -m aepar.greedy --dataset mnist5k
    mpirun -np 2 python -m aepar.greedy --layers 784-64-32-8 --epochs 2 --finetune-epochs 1 --limit 500
"""
from __future__ import annotations

import contextlib
import sys

from aepar import backend
from aepar.checkpoint import layer_state, layers_to_params, restore_layers
from aepar.cli import ArgumentParser, add_common, gpu_blocks_hint, progress
from aepar.comm import run_main
from aepar.finetune import add_finetune_args, default_float32, finetune_and_evaluate
from aepar.parallel.data_parallel import EpochState, reducer, train_epoch
from aepar.stack import add_pretrain_args, check_blocks, layers_from_args, parse_layers, warm_up
from aepar.rows import Shard
from aepar.trace import span

__all__ = ["pretrain_greedy", "run_layerwise", "lr_rule", "build_parser", "main", "LAYERWISE"]

PROG = "aepar.greedy"


def pretrain_greedy(be, comm, layers, train: Shard, test: Shard, *, quiet=False, trace=None, ckpt=None,
                    guard=None, position=None, outer=None, allreduce=False, lr_at=None) -> dict:
    """Train ``layers`` one after another, each on the previous one's hidden probabilities.

    Parameters
    ----------
    layers : list of RBM or AELayer
        With ``layer.epochs`` set (see :func:`aepar.stack.make_layers`).
    train, test : Shard
        This rank's blocks of the training and test rows (test only for reporting).
    ckpt : aepar.resume.Checkpointer, optional
        Safe points: checkpoints, stops.
    position : dict, optional
        The progress record of a checkpoint taken during pre-training: go on from it.
    outer : callable() -> (params, opt_state, progress), optional
        What a calling scheme adds to every checkpoint.
    allreduce : bool
        Sum each step's gradients with one MPI Allreduce of the packed buffer (15-618's
        ``data`` scheme: fast, but the rounding depends on the ranks) instead of the fixed
        tree (the same weights on any number of ranks).
    lr_at : callable(layer, epoch) -> float, optional
        The learning rate of an epoch (large-batch scaling and warm-up); default the layer's own.

    Returns
    -------
    dict
        ``time_s``: pre-training wall time of the slowest rank (epochs and transforms,
        evaluation excluded); ``eval_s``; ``layers``: per layer the epoch times and the
        train (as seen while training) and test reconstruction errors per epoch.
    """
    position = position or {}
    record = position.get("pretrain") or {"time_s": 0.0, "eval_s": 0.0, "layers": []}
    start_layer = int(position.get("layer", 0))
    for i, layer in enumerate(layers):
        if i < start_layer:  # trained before the checkpoint: only its output is needed
            train, test = layer.transform(train), layer.transform(test)
            continue
        if i == len(record["layers"]):
            record["layers"].append({"layer": i + 1, "shape": f"{layer.n_in}-{layer.n_out}", "kind": layer.kind,
                                     "hidden": layer.hidden, "lr": layer.lr, "epoch_times_s": [],
                                     "train_error": [], "test_error": []})
        entry = record["layers"][i]
        first = len(entry["epoch_times_s"])
        state = EpochState.from_dict(position["state"]) if i == start_layer and position.get("state") else None
        if state is not None or first:
            progress(comm, quiet, f"layer {i + 1}: resuming at epoch {first + 1}"
                                  + (f", batch {state.batch + 1}" if state else ""))
        clock = {"t": 0.0}

        def train_one(epoch, resume, layer=layer, i=i, clock=clock):
            comm.barrier()
            t0 = comm.wtime()
            with span(trace, f"layer{i + 1}", epoch=epoch):
                if lr_at is not None:
                    layer.optimizer.lr = lr_at(layer, epoch)
                result = train_epoch(layer, train, epoch, comm, guard=guard, resume=resume, allreduce=allreduce)
            be.synchronize()
            clock["t"] += comm.allreduce(comm.wtime() - t0, op="max")
            return result

        def after_epoch(epoch, result, layer=layer, i=i, entry=entry, clock=clock):
            err = result.means[0]
            if guard is not None:
                where = f"greedy pre-training, layer {i + 1} ({entry['shape']}), epoch {epoch + 1}"
                guard.check(err, "the reconstruction error", where, ckpt.run if ckpt else None, comm)
                guard.check_params(layer.params, where, ckpt.run if ckpt else None, comm)
            t0 = comm.wtime()
            test_err = layer.recon_error(test, reducer(comm))
            record["eval_s"] += comm.wtime() - t0
            if guard is not None:
                guard.check(test_err, "the test reconstruction error", where, ckpt.run if ckpt else None, comm)
            dt, clock["t"] = clock["t"], 0.0
            record["time_s"] += dt
            entry["epoch_times_s"].append(dt)
            entry["train_error"].append(err)
            entry["test_error"].append(test_err)
            progress(comm, quiet, f"layer {i + 1}/{len(layers)} ({entry['shape']}, {layer.kind}) "
                                  f"epoch {epoch + 1:3d}/{layer.epochs}  recon error {err:9.4f}  "
                                  f"test {test_err:9.4f}  {dt:7.2f}s")

        def save(epochs_done, epoch_state, why, i=i):
            params, opt, prog = outer() if outer is not None else ({}, {}, {})
            if comm.is_root:
                lp, lo = layer_state(be, layers, current=i, prefix=prog.get("prefix", ""))
                params, opt = dict(params, **lp), dict(opt, **lo)
            label = (f"layer {i + 1} epoch {epochs_done + 1} batch {epoch_state.batch}" if epoch_state
                     else f"layer {i + 1}, {epochs_done} epochs done")
            ckpt.save(params, opt, dict(prog, phase="pretrain", layer=i, pretrain=record,
                                        state=epoch_state.to_dict() if epoch_state else None), label, why, comm=comm)

        if ckpt is not None:
            armed = guard.training(f"pre-training layer {i + 1}") if guard is not None else contextlib.nullcontext()
            with armed:
                ckpt.epochs(train_one, first, layer.epochs, save=save, after_epoch=after_epoch, resume=state,
                            comm=comm)
        else:
            for epoch in range(first, layer.epochs):
                after_epoch(epoch, train_one(epoch, None))
        t0 = comm.wtime()
        if i + 1 < len(layers):  # the code layer's output feeds nothing
            train, test = layer.transform(train), layer.transform(test)
            be.synchronize()
        dt = comm.allreduce(comm.wtime() - t0, op="max")
        entry["transform_s"] = dt
        entry["time_s"] = sum(entry["epoch_times_s"]) + dt
        record["time_s"] += dt
    record["eval_s"] = comm.allreduce(record["eval_s"], op="max")
    return record



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
    return parser


def _setup(args, comm):
    """Every rank, no communication: backend, data, layer sizes, rank checks."""
    from aepar.data.sources import load_digits

    be = backend.select(args.device, args.kernels, args.dtype)
    digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    n_train, n_in = digits.train_x.shape
    sizes = parse_layers(args.layers, n_in)
    check_blocks(comm.size, args.reduce_blocks, n_train)
    gpu_blocks_hint(comm, be, args.reduce_blocks, args.quiet)
    return be, digits, sizes


def lr_rule(args):
    """The learning rate of a layer's epoch, or None for the layers' own: the ``data`` scheme's
    large-batch rule (``--lr-scaling``: the rate times batch/100 (linear) or its square root,
    reached by a linear warm-up over ``--warmup-epochs``)."""
    rule = getattr(args, "lr_scaling", "none")
    warmup = int(getattr(args, "warmup_epochs", 0) or 0)
    if rule == "none" and not warmup:
        return None
    ratio = args.batch / BASE_BATCH
    factor = {"none": 1.0, "linear": ratio, "sqrt": ratio ** 0.5}[rule]

    def lr_at(layer, epoch):
        ramp = min(1.0, (epoch + 1) / warmup) if warmup else 1.0
        return layer.lr * (1.0 + (factor - 1.0) * ramp)  # from the base rate, which works, to the scaled one
    return lr_at


def task_lr_scaled(args):
    """``args`` with the fine-tuning and classification learning rates scaled by the same
    rule as the layers' (``--lr-scaling``, each from its own batch), for large batches."""
    import argparse

    power = {"linear": 1.0, "sqrt": 0.5}[args.lr_scaling]
    out = argparse.Namespace(**vars(args))
    out.finetune_lr = args.finetune_lr * (args.finetune_batch / BASE_BATCH) ** power
    out.classify_lr = args.classify_lr * (args.classify_batch / BASE_BATCH) ** power
    return out


# The batch the layers' learning rates were chosen for (Hinton & Salakhutdinov's recipe).
BASE_BATCH = 100
# What each layer-wise scheme saves its checkpoints as (a resumed run insists on it).
LAYERWISE = ("greedy", "data", "model")


def run_layerwise(be, comm, args, digits, run, guard, *, scheme="greedy", prog=PROG, ckpt_name="greedy",
                  extra=None) -> dict:
    """Pre-train with a layer-wise scheme (greedy, data or model), then fine-tune the unrolled
    autoencoder (``args.task`` "reconstruct") or a classifier on the encoder ("classify");
    returns the summary and writes the run files on rank 0. ``extra``: summary entries of
    the caller (e.g. the planner's predictions)."""
    from aepar import checkpoint
    from aepar.parallel.model_parallel import pretrain_model_parallel, restore_velocities
    from aepar.report.stacked import TABLES_FILE, pca_error, tables
    from aepar.resume import Checkpointer
    from aepar.rundir import fingerprint

    task = getattr(args, "task", "reconstruct")
    say = lambda m: progress(comm, args.quiet, m)  # noqa: E731
    ckpt = Checkpointer(run, comm, guard, ckpt_name,
                        fingerprint(digits.train_x, digits.test_x) if comm.is_root else None, progress=say)
    loaded = ckpt.load()
    layers = layers_from_args(be, args, digits.train_x.shape[1])
    # data: one block per rank, the batch split over them; model: a layer's epochs run on one
    # rank with nothing to add up, so its rows are one block (the fused one-process step)
    count = {"data": comm.size, "model": 1}.get(scheme, args.reduce_blocks)
    position = {}
    if loaded is not None:
        params, opt_state, position = loaded
        pretraining = position["phase"] == "pretrain"
        if scheme == "model":
            restore_layers(be, layers, params, {})
            if pretraining:
                restore_velocities(be, layers, opt_state)
        else:
            restore_layers(be, layers, params, opt_state, int(position["layer"]) if pretraining else None)
        say(f"{prog}: resuming from {run.checkpoint_path} ({run.checkpoint_progress})")
    group = min(getattr(args, "group", None) or comm.size, len(layers))
    how = {"greedy": f"{'one rank' if comm.size == 1 else f'data-parallel over {comm.size} ranks'}, "
                     f"{count} blocks summed in a fixed tree",
           "data": f"data-parallel over {comm.size} rank(s), one Allreduce per step"
                   + (f", learning rate scaled {args.lr_scaling} from batch {BASE_BATCH}"
                      if getattr(args, "lr_scaling", "none") != "none" else "")
                   + (f", {args.warmup_epochs} warm-up epochs" if getattr(args, "warmup_epochs", 0) else ""),
           "model": f"model-parallel, groups of {group} layer(s) on {comm.size} rank(s)"}[scheme]
    say(f"{prog}: {scheme}: {'-'.join(str(l.n_in) for l in layers)}-{layers[-1].n_out}, {args.pretrainer}, "
        f"{args.epochs} epochs/layer, batch {args.batch}, {how}; {be.device}/{be.kernel_set}/{be.dtype}")
    warm_up(be, args.pretrainer)
    if position.get("phase", "pretrain") == "pretrain":
        if scheme == "model":
            train = Shard.of(be, digits.train_x, count)
            test = Shard.of(be, digits.test_x, min(count, digits.test_x.shape[0]))
            pre = pretrain_model_parallel(be, comm, layers, train, test, group=group, ckpt=ckpt, guard=guard,
                                          position=position, say=None if args.quiet else say)
        else:
            train = Shard.of(be, digits.train_x, count, comm.rank, comm.size)
            test = Shard.of(be, digits.test_x, min(count, digits.test_x.shape[0]), comm.rank, comm.size)
            pre = pretrain_greedy(be, comm, layers, train, test, quiet=args.quiet, ckpt=ckpt, guard=guard,
                                  position=position, allreduce=scheme == "data",
                                  lr_at=lr_rule(args) if scheme == "data" else None)
        del train, test
    else:
        pre = position["pretrain"]
    say(f"pre-training ({scheme}): {pre['time_s']:.1f}s")
    summary = {"scheme": scheme, "task": task, "source": digits.source, "n_train": int(digits.train_x.shape[0]),
               "n_test": int(digits.test_x.shape[0]), "ranks": comm.size, "device": be.device,
               "kernels": be.kernel_set, "dtype": str(be.dtype), "blocks": count,
               "layers": [layers[0].n_in] + [l.n_out for l in layers], "pretrainer": args.pretrainer,
               "epochs_per_layer": args.epochs, "batch": args.batch, "seed": args.seed,
               "pretrain": pre, "pretrain_time_s": pre["time_s"], **(extra or {})}
    if scheme == "model":
        summary["group"] = group
    if scheme == "data":
        summary.update(lr_scaling=getattr(args, "lr_scaling", "none"), warmup_epochs=getattr(args, "warmup_epochs", 0))
    if scheme == "data" and getattr(args, "lr_scaling", "none") != "none":
        args = task_lr_scaled(args)
        summary.update(classify_lr=args.classify_lr, finetune_lr=args.finetune_lr)
    layer_params = layers_to_params(be, layers)
    resume = loaded if position.get("phase") in ("finetune", "classify") else None
    outer = lambda: (layer_params, {}, {"pretrain": pre})  # noqa: E731
    ft_params = {}
    if task == "classify":
        from aepar.classify import classify_and_evaluate

        cl = classify_and_evaluate(be, comm, layers, digits, args, ckpt=ckpt, guard=guard, resume=resume,
                                   outer=outer, reduce_blocks=args.reduce_blocks)
        model = cl.pop("model")
        summary.update(classify=cl, finetune_time_s=cl["time_s"],
                       accuracy={"pretrained": cl["before"], "finetuned": cl["after"]})
        ft_params = {f"classifier/{k}": be.to_host(v) for k, v in model.params.items()}
    else:
        pca = comm.bcast(pca_error(digits.train_x, digits.test_x, k=layers[-1].n_out) if comm.is_root else None)
        summary["pca"] = pca
        say(f"PCA-{pca['k']} baseline: train error/digit {pca['train']:.3f}  test {pca['test']:.3f}")
        ft = finetune_and_evaluate(be, comm, layers, digits, args, ckpt=ckpt, guard=guard, resume=resume, outer=outer)
        model = ft.pop("model")
        summary.update(finetune=ft, finetune_time_s=ft["time_s"],
                       error={"pretrained": ft["before"], "finetuned": ft["after"] if args.finetune_epochs else None})
        if args.finetune_epochs:
            ft_params = {f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()}
    if comm.is_root:
        from aepar.machine import describe

        summary["machine"] = describe()
        with run.output("weights.h5") as path:
            checkpoint.save(path, scheme=ckpt_name, params=dict(layer_params, **ft_params), epoch=args.epochs,
                            config={"sizes": summary["layers"], "pretrainer": args.pretrainer, "scheme": scheme,
                                    "epochs": args.epochs, "task": task, "finetune_epochs": args.finetune_epochs,
                                    "loss": args.loss, "optimizer": args.optimizer, "seed": args.seed})
        run.write_json("summary.json", summary)
        if task == "classify":
            from aepar.classify import table

            text = table(dict(summary, classify=dict(summary["classify"], init="pretrained")))
        else:
            text = tables({scheme: summary})
        run.write_text(TABLES_FILE, text)
        if not args.quiet:
            print(text, flush=True)
    return summary


def main(argv, comm):
    from aepar.guard import Guard
    from aepar.rundir import parse_and_open

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, "greedy", PROG, build_parser().parse_args, argv)
    with run, Guard.from_args(comm, PROG, args) as guard:
        be, digits, _ = comm.agree(_setup, args, comm)
        progress(comm, args.quiet, f"{PROG}: {digits.source}")
        run_layerwise(be, comm, args, digits, run, guard)
        run.complete()
    progress(comm, args.quiet, f"{PROG}: wrote {run.path}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
