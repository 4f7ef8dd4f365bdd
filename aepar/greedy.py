"""Greedy layer-wise pre-training and fine-tuning of a stacked autoencoder: ``python -m aepar.greedy``.

The baseline of Santara et al. (2016), Hinton & Salakhutdinov's recipe: train the RBM of
layer 1 (784-1000) for N epochs, turn the data into its hidden probabilities, train layer 2
on them, and so on to the 30 linear code units; then unroll the stack into the deep
autoencoder and fine-tune it by backpropagation. Every stage is data-parallel over all the
ranks it is given (the global batch of 100 is split over them; one packed Allreduce of the
gradients per step), and gives the same weights on any number of ranks.

Writes into the run directory (default runs/greedy): ``weights.h5`` (pre-trained layers
and, after fine-tuning, the unrolled network), ``summary.json`` (per-layer epoch times and
errors, pre-training and fine-tuning wall times, error per digit before and after
fine-tuning, the PCA-30 baseline) and ``tables.md`` (the seed's Tables 2 and 3).

Examples
--------
    python -m aepar.greedy --dataset mnist5k
    mpirun -np 2 python -m aepar.greedy --layers 784-64-32-8 --epochs 2 --finetune-epochs 1 --limit 500
"""
from __future__ import annotations

import sys

import numpy as np

from aepar import backend
from aepar.cli import ArgumentParser, RunDir, add_common, progress
from aepar.comm import run_main
from aepar.finetune import (add_finetune_args, check_ranks, default_float32, finetune_and_evaluate, layers_to_params,
                            shard_rows, span)
from aepar.pretrain import add_pretrain_args, layers_from_args, parse_layers, warm_up

__all__ = ["pca_error", "pretrain_greedy", "build_parser", "main", "finetune_and_evaluate"]

PROG = "aepar.greedy"


def pca_error(train_x, test_x, k=30) -> dict:
    """Error per digit of reconstructing from the first ``k`` principal components.

    The components and the mean come from the training set (float64 SVD); the error is
    Σ_pixels (x − x̂)² averaged over images, as for the autoencoder.

    Returns
    -------
    dict
        {"k": k, "train": error on train_x, "test": error on test_x}
    """
    train = np.asarray(train_x, dtype=np.float64)
    mean = train.mean(axis=0)
    k = int(min(k, *train.shape))
    # right singular vectors of the centred data = principal directions
    _, _, vt = np.linalg.svd(train - mean, full_matrices=False)
    basis = vt[:k].T

    def error(x):
        c = np.asarray(x, dtype=np.float64) - mean
        r = c - (c @ basis) @ basis.T
        return float(np.einsum("ij,ij->", r, r) / max(c.shape[0], 1))

    return {"k": k, "train": error(train), "test": error(test_x)}


def pretrain_greedy(be, comm, layers, train, test, *, quiet=False, trace=None) -> dict:
    """Train ``layers`` one after another, each on the previous one's hidden probabilities.

    Parameters
    ----------
    layers : list of RBM or AELayer
        With ``layer.epochs`` set (see :func:`aepar.pretrain.make_layers`).
    train, test : backend arrays
        This rank's shard of the training and test rows (test only for reporting).

    Returns
    -------
    dict
        ``time_s``: pre-training wall time of the slowest rank (epochs and transforms,
        evaluation excluded); ``eval_s``; ``layers``: per layer the epoch times and the
        train (as seen while training) and test reconstruction errors per epoch.
    """
    stats, time_s, eval_s = [], 0.0, 0.0
    for i, layer in enumerate(layers):
        entry = {"layer": i + 1, "shape": f"{layer.n_in}-{layer.n_out}", "kind": layer.kind,
                 "hidden": layer.hidden, "lr": layer.lr, "epoch_times_s": [], "train_error": [],
                 "test_error": []}
        for epoch in range(layer.epochs):
            comm.barrier()
            t0 = comm.wtime()
            with span(trace, f"layer{i + 1}", epoch=epoch):
                err = layer.train_epoch(train, epoch, comm)
            be.synchronize()
            dt = comm.max(comm.wtime() - t0)
            t0 = comm.wtime()
            test_err = layer.recon_error(test, comm)
            eval_s += comm.wtime() - t0
            time_s += dt
            entry["epoch_times_s"].append(dt)
            entry["train_error"].append(err)
            entry["test_error"].append(test_err)
            progress(comm, quiet, f"layer {i + 1}/{len(layers)} ({entry['shape']}, {layer.kind}) "
                                  f"epoch {epoch + 1:3d}/{layer.epochs}  recon error {err:9.4f}  "
                                  f"test {test_err:9.4f}  {dt:7.2f}s")
        t0 = comm.wtime()
        if i + 1 < len(layers):  # the code layer's output feeds nothing
            train, test = layer.transform(train), layer.transform(test)
            be.synchronize()
        dt = comm.max(comm.wtime() - t0)
        entry["transform_s"] = dt
        entry["time_s"] = sum(entry["epoch_times_s"]) + dt
        time_s += dt
        stats.append(entry)
    return {"time_s": time_s, "eval_s": comm.max(eval_s), "layers": stats}


def build_parser():
    parser = ArgumentParser(
        prog=f"python -m {PROG}",
        description="Greedy layer-wise pre-training of a stacked autoencoder (RBMs trained by CD-1, "
                    "one layer after another, Hinton & Salakhutdinov 2006), then fine-tuning by "
                    "backprop; data-parallel over all MPI ranks. Prints one line per epoch (layer, "
                    "epoch, reconstruction error, seconds) and writes weights.h5, summary.json and "
                    "tables.md (error per digit, times, PCA-30 baseline) into --out.",
        epilog="Examples: python -m aepar.greedy --dataset mnist5k;  mpirun -np 2 python -m aepar.greedy "
               "--layers 784-64-32-8 --epochs 2 --finetune-epochs 1 --limit 500")
    add_pretrain_args(parser)
    add_finetune_args(parser)
    add_common(parser, out_default="runs/greedy")
    default_float32(parser)
    return parser


def _setup(args, comm):
    """Every rank, no communication: backend, data, layer sizes, rank checks."""
    from aepar.data.sources import load_digits

    be = backend.select(args.device, args.kernels, args.dtype)
    digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    n_train, n_in = digits.train_x.shape
    sizes = parse_layers(args.layers, n_in)
    check_ranks(comm, n_train, args.batch)
    if args.finetune_epochs:
        check_ranks(comm, n_train, args.finetune_batch)
    return be, digits, sizes


def run_greedy(be, comm, args, digits, run=None, trace=None) -> dict:
    """Pre-train, fine-tune, evaluate; returns the summary (and writes the run files on rank 0)."""
    from aepar import checkpoint
    from aepar.report.stacked import write_tables

    layers = layers_from_args(be, args, digits.train_x.shape[1])
    train = shard_rows(be, digits.train_x, comm)
    test = shard_rows(be, digits.test_x, comm)
    progress(comm, args.quiet, f"{PROG}: {'-'.join(str(l.n_in) for l in layers)}-{layers[-1].n_out}, "
                               f"{args.pretrainer}, {args.epochs} epochs/layer, batch {args.batch}, "
                               f"{comm.size} rank(s), {be.device}/{be.kernel_set}/{be.dtype}")
    warm_up(be, args.pretrainer)
    pre = pretrain_greedy(be, comm, layers, train, test, quiet=args.quiet, trace=trace)
    progress(comm, args.quiet, f"pre-training: {pre['time_s']:.1f}s")
    del train, test
    summary = {"scheme": "greedy", "source": digits.source, "n_train": int(digits.train_x.shape[0]),
               "n_test": int(digits.test_x.shape[0]), "ranks": comm.size, "device": be.device,
               "kernels": be.kernel_set, "dtype": str(be.dtype),
               "layers": [layers[0].n_in] + [l.n_out for l in layers], "pretrainer": args.pretrainer,
               "epochs_per_layer": args.epochs, "batch": args.batch, "seed": args.seed,
               "pretrain": pre, "pretrain_time_s": pre["time_s"]}
    pca = comm.bcast_obj(pca_error(digits.train_x, digits.test_x, k=layers[-1].n_out) if comm.is_root else None)
    summary["pca"] = pca
    progress(comm, args.quiet, f"PCA-{pca['k']} baseline: train error/digit {pca['train']:.3f}  "
                               f"test {pca['test']:.3f}")
    ft = finetune_and_evaluate(be, comm, layers, digits, args, trace=trace)
    model = ft.pop("model")
    summary["finetune"] = ft
    summary["finetune_time_s"] = ft["time_s"]
    summary["error"] = {"pretrained": ft["before"], "finetuned": ft["after"] if args.finetune_epochs else None}
    if run is not None and comm.is_root:
        params = layers_to_params(be, layers)
        if args.finetune_epochs:
            params.update({f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()})
        checkpoint.save(run.file("weights.h5"), scheme="greedy", params=params, epoch=args.epochs,
                        config={"sizes": summary["layers"], "pretrainer": args.pretrainer,
                                "epochs": args.epochs, "finetune_epochs": args.finetune_epochs,
                                "loss": args.loss, "optimizer": args.optimizer, "seed": args.seed})
        run.write_json("summary.json", summary)
        text = write_tables(run.path, {"greedy": summary})
        if not args.quiet:
            print(text, flush=True)
    return summary


def main(argv, comm):
    args = build_parser().parse_args(argv)
    be, digits, _ = comm.agree(_setup, args, comm)
    progress(comm, args.quiet, f"{PROG}: {digits.source}")
    with RunDir(args.out, comm) as run:
        run_greedy(be, comm, args, digits, run)
    progress(comm, args.quiet, f"{PROG}: wrote {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
