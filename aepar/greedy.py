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
from aepar.cli import ArgumentParser, add_common, progress
from aepar.comm import run_main
from aepar.finetune import add_finetune_args, default_float32, finetune_and_evaluate
from aepar.parallel.data_parallel import EpochState, reducer, train_epoch
from aepar.pretrain import add_pretrain_args, check_blocks, layers_from_args, parse_layers, warm_up
from aepar.rows import Shard
from aepar.trace import span

__all__ = ["pretrain_greedy", "run_greedy", "build_parser", "main"]

PROG = "aepar.greedy"


def pretrain_greedy(be, comm, layers, train: Shard, test: Shard, *, quiet=False, trace=None, ckpt=None,
                    guard=None, position=None, outer=None) -> dict:
    """Train ``layers`` one after another, each on the previous one's hidden probabilities.

    Parameters
    ----------
    layers : list of RBM or AELayer
        With ``layer.epochs`` set (see :func:`aepar.pretrain.make_layers`).
    train, test : Shard
        This rank's blocks of the training and test rows (test only for reporting).
    ckpt : aepar.resume.Checkpointer, optional
        Safe points: checkpoints, stops.
    position : dict, optional
        The progress record of a checkpoint taken during pre-training: go on from it.
    outer : callable() -> (params, opt_state, progress), optional
        What a calling scheme adds to every checkpoint.

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
                result = train_epoch(layer, train, epoch, comm, guard=guard, resume=resume)
            be.synchronize()
            clock["t"] += comm.max(comm.wtime() - t0)
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
        dt = comm.max(comm.wtime() - t0)
        entry["transform_s"] = dt
        entry["time_s"] = sum(entry["epoch_times_s"]) + dt
        record["time_s"] += dt
    record["eval_s"] = comm.max(record["eval_s"])
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
    return be, digits, sizes


def run_greedy(be, comm, args, digits, run, guard) -> dict:
    """Pre-train, fine-tune, evaluate; returns the summary and writes the run files on rank 0."""
    from aepar import checkpoint
    from aepar.report.stacked import TABLES_FILE, pca_error, tables
    from aepar.resume import Checkpointer
    from aepar.rundir import fingerprint

    ckpt = Checkpointer(run, comm, guard, "greedy",
                        fingerprint(digits.train_x, digits.test_x) if comm.is_root else None,
                        progress=lambda m: progress(comm, args.quiet, m))
    loaded = ckpt.load()
    layers = layers_from_args(be, args, digits.train_x.shape[1])
    count = args.reduce_blocks
    train = Shard.of(be, digits.train_x, count, comm.rank, comm.size)
    test = Shard.of(be, digits.test_x, min(count, digits.test_x.shape[0]), comm.rank, comm.size)
    position = {}
    if loaded is not None:
        params, opt_state, position = loaded
        current = int(position["layer"]) if position["phase"] == "pretrain" else None
        restore_layers(be, layers, params, opt_state, current)
        progress(comm, args.quiet, f"{PROG}: resuming from {run.checkpoint_path} ({run.checkpoint_progress})")
    progress(comm, args.quiet, f"{PROG}: {'-'.join(str(l.n_in) for l in layers)}-{layers[-1].n_out}, "
                               f"{args.pretrainer}, {args.epochs} epochs/layer, batch {args.batch}, "
                               f"{comm.size} rank(s), {count} blocks, {be.device}/{be.kernel_set}/{be.dtype}")
    warm_up(be, args.pretrainer)
    if position.get("phase", "pretrain") == "pretrain":
        pre = pretrain_greedy(be, comm, layers, train, test, quiet=args.quiet, ckpt=ckpt, guard=guard,
                              position=position)
    else:
        pre = position["pretrain"]
    progress(comm, args.quiet, f"pre-training: {pre['time_s']:.1f}s")
    del train, test
    summary = {"scheme": "greedy", "source": digits.source, "n_train": int(digits.train_x.shape[0]),
               "n_test": int(digits.test_x.shape[0]), "ranks": comm.size, "device": be.device,
               "kernels": be.kernel_set, "dtype": str(be.dtype), "blocks": count,
               "layers": [layers[0].n_in] + [l.n_out for l in layers], "pretrainer": args.pretrainer,
               "epochs_per_layer": args.epochs, "batch": args.batch, "seed": args.seed,
               "pretrain": pre, "pretrain_time_s": pre["time_s"]}
    pca = comm.bcast_obj(pca_error(digits.train_x, digits.test_x, k=layers[-1].n_out) if comm.is_root else None)
    summary["pca"] = pca
    progress(comm, args.quiet, f"PCA-{pca['k']} baseline: train error/digit {pca['train']:.3f}  "
                               f"test {pca['test']:.3f}")
    layer_params = layers_to_params(be, layers)
    ft = finetune_and_evaluate(be, comm, layers, digits, args, ckpt=ckpt, guard=guard,
                               resume=loaded if position.get("phase") == "finetune" else None,
                               outer=lambda: (layer_params, {}, {"pretrain": pre}))
    model = ft.pop("model")
    summary["finetune"] = ft
    summary["finetune_time_s"] = ft["time_s"]
    summary["error"] = {"pretrained": ft["before"], "finetuned": ft["after"] if args.finetune_epochs else None}
    if comm.is_root:
        params = dict(layer_params)
        if args.finetune_epochs:
            params.update({f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()})
        with run.output("weights.h5") as path:
            checkpoint.save(path, scheme="greedy", params=params, epoch=args.epochs,
                            config={"sizes": summary["layers"], "pretrainer": args.pretrainer,
                                    "epochs": args.epochs, "finetune_epochs": args.finetune_epochs,
                                    "loss": args.loss, "optimizer": args.optimizer, "seed": args.seed})
        run.write_json("summary.json", summary)
        text = tables({"greedy": summary})
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
        run_greedy(be, comm, args, digits, run, guard)
        run.complete()
    progress(comm, args.quiet, f"{PROG}: wrote {run.path}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
