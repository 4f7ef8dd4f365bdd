"""Ng's sparse autoencoder on natural-image patches, serial or MPI data-parallel:
``python -m aepar.sparse`` / ``mpirun -np N python -m aepar.sparse``.

The scheme of Lewis & Canann (2015): the patches are sampled once from the seed (the same
patches whatever the number of processes), every rank keeps an even shard of them and a
copy of the weights; the root runs L-BFGS-B, and each evaluation of the cost is one
broadcast of θ and one reduction of a packed buffer of partial sums (the KL sparsity
term is folded in so that one reduction is enough; see aepar.kernels.ref.sparse_ae).

Writes into the run directory (default runs/sparse), which appears only when the run
succeeds: ``weights.h5`` (W1, W2, b1, b2; aepar.checkpoint, scheme "sparse"),
``features.png`` (one tile per hidden unit: the paper's Figure 1.1), ``summary.json``
and ``summary.csv`` (final cost, iterations, evaluations, processes, times, collectives
per evaluation, data source).

Examples
--------
    python -m aepar.sparse                                  # 10,000 patches, 400 iterations
    mpirun -np 4 python -m aepar.sparse --samples 40000
    python -m aepar.sparse --images IMAGES.mat --hidden 100 --out runs/sparse100
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from aepar import backend
from aepar.cli import ArgumentParser, RunDir, add_common, progress
from aepar.comm import run_main
from aepar.errors import UserError

__all__ = ["build_parser", "main", "train", "PROG"]

PROG = "aepar.sparse"
PROGRESS_EVERY = 25


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m aepar.sparse",
        description="Train Ng's sparse autoencoder (sigmoid v-h-v, squared error + weight decay\n"
                    "+ KL sparsity) on natural-image patches with L-BFGS-B on the root rank. Under\n"
                    "mpirun every rank evaluates the cost on its share of the patches: one broadcast\n"
                    "of the weights and one reduction of packed partial sums per evaluation.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="outputs in --out: weights.h5, features.png (one tile per hidden unit),\n"
               "  summary.json, summary.csv (cost, iterations, times, collectives/evaluation)\n"
               "images: --images FILE, else IMAGES.mat in --data-dir/$AEPAR_DATA, else whitened\n"
               "  photographs from the scikit-image wheel\n"
               "progress: every 25 iterations on rank 0 (iteration, cost, seconds)\n\n"
               "examples:\n"
               "  python -m aepar.sparse\n"
               "  mpirun -np 4 python -m aepar.sparse --samples 40000\n"
               "  python -m aepar.sparse --images IMAGES.mat --hidden 100 --out runs/sparse100")
    g = p.add_argument_group("model and data")
    g.add_argument("--samples", type=int, default=10000,
                   help="number of random patches, split evenly over the processes (default 10000)")
    g.add_argument("--iterations", type=int, default=400, help="L-BFGS-B iterations (default 400)")
    g.add_argument("--patch", type=int, default=8, help="patch side in pixels: v = patch² inputs (default 8)")
    g.add_argument("--hidden", type=int, default=25, help="hidden units h (default 25)")
    g.add_argument("--rho", type=float, default=0.01, help="sparsity target ρ, in (0, 1) (default 0.01)")
    g.add_argument("--lam", type=float, default=1e-4, help="weight decay λ (default 1e-4)")
    g.add_argument("--beta", type=float, default=3.0, help="sparsity weight β (default 3)")
    g.add_argument("--images", metavar="PATH",
                   help="an IMAGES.mat (variable IMAGES, rows x columns x images); default: "
                        "IMAGES.mat in --data-dir, else the scikit-image photographs")
    add_common(p, out_default="runs/sparse")
    return p


@dataclass
class Setup:
    be: object
    patches: np.ndarray   # this rank's shard, float64 (m_local, patch²)
    samples: int
    source: str


def _validate(args, size: int):
    positive = {"--samples": args.samples, "--iterations": args.iterations, "--patch": args.patch,
                "--hidden": args.hidden}
    for name, value in positive.items():
        if value < 1:
            raise UserError(f"{name} must be a positive integer, got {value}")
    if args.samples < size:
        raise UserError(f"--samples {args.samples} is fewer than the {size} processes "
                        "(every process needs at least one patch)")
    if not 0.0 < args.rho < 1.0:
        raise UserError(f"--rho must lie strictly between 0 and 1, got {args.rho}")
    if not args.lam >= 0.0:
        raise UserError(f"--lam must be non-negative, got {args.lam}")
    if not args.beta >= 0.0:
        raise UserError(f"--beta must be non-negative, got {args.beta}")


def _setup(args, rank: int, size: int) -> Setup:
    """Everything that can fail on bad input, before any file is written (no communication)."""
    from aepar.data.patches import sample_patches
    from aepar.data.sources import natural_images
    from aepar.data.imagesmat import read_images_mat
    from aepar.parallel.data_parallel import shard

    _validate(args, size)
    be = backend.select(args.device, args.kernels, args.dtype)
    if args.images:
        images = read_images_mat(args.images)
        h, w, k = images.shape
        source = f"IMAGES.mat: {k} images {h}x{w} from {args.images}"
    else:
        images, source = natural_images(args.data_dir)
    # the same patches whatever the number of processes: all are drawn, each keeps a shard
    patches = sample_patches(images, args.samples, args.patch, seed=args.seed)
    return Setup(be, patches[shard(args.samples, rank, size)].copy(), args.samples, source)  # frees the rest


def train(args, comm, setup: Setup):
    """Train on every rank. Returns (summary, model, θ) on rank 0 and ({}, model, None)
    elsewhere; nothing is written."""
    from aepar.models.sparse_ae import SparseAutoencoder
    from aepar.parallel.root_optimizer import RootOptimizer

    be = setup.be
    v, h = args.patch * args.patch, args.hidden
    model = SparseAutoencoder(be, v, h, rho=args.rho, beta=args.beta, lam=args.lam)
    model.attach(setup.patches, setup.samples)
    opt = RootOptimizer(comm, model.partials, model.assemble, model.n_theta, model.new_partials(),
                        xp=be.xp, dtype=be.dtype, synchronize=be.synchronize)
    progress(comm, args.quiet,
             f"{PROG}: {setup.samples} patches {args.patch}x{args.patch} ({setup.source}); "
             f"{v}-{h}-{v}, rho {args.rho:g} lambda {args.lam:g} beta {args.beta:g}; "
             f"{comm.size} process{'es' if comm.size > 1 else ''} "
             f"({setup.patches.shape[0]} patches on rank 0); {be.kernel_set} kernels, {be.dtype.name}")
    theta0 = model.init_theta(args.seed) if comm.is_root else None
    # warm-up (not timed, not counted): loads the compiled kernels and touches every buffer
    model.partials(opt.buffer[1:], opt.partials)
    if comm.is_root:
        import scipy.optimize  # noqa: F401  (its import is not training time either)
    comm.barrier()
    start = comm.wtime()

    def report(iteration, cost, theta):
        if iteration % PROGRESS_EVERY == 0 or iteration == args.iterations:
            progress(comm, args.quiet, f"iteration {iteration:4d}  cost {cost:.6f}  "
                                       f"{comm.wtime() - start:7.2f} s")

    result = opt.run(theta0, args.iterations, callback=report)
    seconds_total = comm.max(comm.wtime() - start)
    seconds_compute = comm.max(result.seconds_compute)
    seconds_comm = comm.max(result.seconds_comm)
    if not comm.is_root:
        return {}, model, None
    summary = {
        "scheme": "sparse",
        "final_cost": result.cost, "iterations": result.iterations, "evaluations": result.evaluations,
        "processes": comm.size, "samples": setup.samples, "hidden": h, "patch": args.patch,
        "dtype": be.dtype.name, "kernels": be.kernel_set, "device": be.device,
        "seconds_total": seconds_total, "seconds_compute": seconds_compute, "seconds_comm": seconds_comm,
        "collectives_per_evaluation": result.collectives_per_evaluation,
        "collectives_total": result.collectives_total,
        "seed": args.seed, "source": setup.source,
        "rho": args.rho, "lam": args.lam, "beta": args.beta,
        "samples_on_root": int(setup.patches.shape[0]),
        "optimizer_message": result.message,
    }
    return summary, model, result.theta


def _write_outputs(run: RunDir, model, theta, args, summary):
    from aepar import checkpoint
    from aepar.data.patches import ORDER
    from aepar.report.sparse import features_png, write_summary

    params = model.params(theta)
    checkpoint.save(run.file("weights.h5"), scheme="sparse", params=params,
                    epoch=int(summary["iterations"]),
                    config={k: summary[k] for k in ("samples", "patch", "hidden", "rho", "lam", "beta",
                                                    "seed", "dtype", "kernels", "processes", "source")})
    features_png(params["W1"], args.patch, run.file("features.png"), order=ORDER,
                 title=f"{model.hidden} features, {summary['samples']} patches, "
                       f"{summary['processes']} process{'es' if summary['processes'] > 1 else ''}")
    write_summary(run.path, summary)


def main(argv=None, comm=None):
    if comm is None:
        from aepar.comm import world
        comm = world()
    args = build_parser().parse_args(argv)
    setup = comm.agree(_setup, args, comm.rank, comm.size)
    summary, model, theta = train(args, comm, setup)
    # the run directory is made only now: a run that fails leaves nothing behind
    with RunDir(args.out, comm) as run:
        if comm.is_root:
            _write_outputs(run, model, theta, args, summary)
    if comm.is_root:
        print(f"{PROG}: {summary['iterations']} iterations, {summary['evaluations']} evaluations, "
              f"final cost {summary['final_cost']:.6f}; "
              f"{summary['collectives_per_evaluation']:.2f} collectives/evaluation "
              f"(1 bcast + 1 reduce); {summary['seconds_total']:.2f} s total, "
              f"compute {summary['seconds_compute']:.2f} s, comm {summary['seconds_comm']:.2f} s "
              f"(max over {comm.size} rank{'s' if comm.size > 1 else ''}); wrote {args.out}",
              flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
