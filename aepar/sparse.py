"""Ng's sparse autoencoder on natural-image patches, serial or MPI data-parallel:
``python -m aepar.sparse`` / ``mpirun -np N python -m aepar.sparse``.

The scheme of Lewis & Canann (2015): the patches are sampled once from the seed (the same
patches whatever the number of processes), every rank keeps a share of them, even at first
and then following the ranks' measured speeds (``--balance-every``), and a copy of the
weights; the root runs L-BFGS-B, and each evaluation of the cost is the paper's two
rounds: a broadcast of θ, the sum of every rank's hidden activations on every rank (ρ̂, so
that the KL sparsity term is folded into the backward pass), and one reduction of a packed
buffer of partial sums (see aepar.kernels.ref.sparse_ae). The algorithm is
aepar.schemes.sparse; this file is the program around it.

Same answer on any number of ranks: the patches are cut into fixed blocks of 128 and the
blocks' sums are added in one fixed tree (aepar.rows), so 1, 2, 4 or 8
processes (and any number of threads) take bit-identical L-BFGS steps. A run saves a
checkpoint (θ and the whole L-BFGS memory) every ``--checkpoint-minutes``, every
``--checkpoint-every`` iterations and on SIGTERM/SIGUSR1/SIGINT (then exits 75);
``--resume DIR`` continues it, on any number of processes, to the same final θ.

Writes into the run directory (``--out``, default a new runs/sparse/NNN): ``weights.h5``
(W1, W2, b1, b2; aepar.checkpoint, scheme "sparse"), ``features.png`` (one tile per
hidden unit: the paper's Figure 1.1), ``summary.json`` and ``summary.csv`` (final cost,
iterations, evaluations, processes, times, communications per evaluation, data source),
``metrics.csv`` and ``metrics.png`` (the cost every 25 iterations), ``run.json``.

Examples
--------
    python -m aepar.sparse                                  # 10,000 patches, 400 iterations
    mpirun -np 4 python -m aepar.sparse --limit 40000
    python -m aepar.sparse --images IMAGES.mat --hidden 100 --out runs/sparse100
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from aepar import backend
from aepar.cli import (ArgumentParser, add_common, describe_dtype, non_negative_float, non_negative_int, positive_int,
                       progress, renamed, unit_interval)
from aepar.comm import run_main
from aepar.errors import UserError
from aepar.finish import finish
from aepar.parallel.root_optimizer import OPTIMIZERS
from aepar.schemes import sparse as scheme

__all__ = ["build_parser", "main", "PROG"]

PROG = "aepar.sparse"


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m aepar.sparse",
        description="Train Ng's sparse autoencoder (sigmoid v-h-v, squared error + weight decay\n"
                    "+ KL sparsity) on natural-image patches with L-BFGS(-B) on the root rank. Under\n"
                    "mpirun every rank evaluates the cost on its blocks of patches in the paper's\n"
                    "two rounds: a broadcast of the weights, the fixed-tree sum of the hidden\n"
                    "activations (so every rank knows the KL term before its backward pass), then\n"
                    "one fixed-tree reduction of packed partial sums per evaluation, bit-identical\n"
                    "on any number of processes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="outputs in the run directory: weights.h5, features.png (one tile per hidden unit),\n"
               "  summary.json, summary.csv (cost, iterations, times, communications/evaluation),\n"
               "  metrics.csv and metrics.png (the cost every 25 iterations), run.json\n"
               "images: --data PATH (your images: a folder, .npy, .npz or HDF5), --images IMAGES.mat, else\n"
               "  IMAGES.mat or the first CIFAR-10 batch in --data-dir/$AEPAR_DATA (a directory with neither\n"
               "  is refused), else whitened photographs from the scikit-image wheel\n"
               "progress: every 25 iterations on rank 0 (iteration, cost, seconds)\n"
               "exit codes: 0 done, 2 bad input, 3 diverged, 75 interrupted (checkpoint saved),\n"
               "  124 a rank stalled (--timeout), 1 internal error\n\n"
               "examples:\n"
               "  python -m aepar.sparse\n"
               "  mpirun -np 4 python -m aepar.sparse --limit 40000 --out runs/sparse40k\n"
               "  mpirun -np 2 python -m aepar.sparse --resume runs/sparse40k   # after an interruption\n"
               "  python -m aepar.sparse --images IMAGES.mat --hidden 100 --out runs/sparse100")
    g = p.add_argument_group("model and data")
    g.add_argument("--limit", dest="samples", type=positive_int, default=10000, metavar="N",
                   help="training rows: random patches sampled, in blocks of 128 shared by the processes "
                        "(default 10000)")
    renamed(g, "--samples", "--limit", dest="samples", type=positive_int)
    g.add_argument("--iterations", type=positive_int, default=400, help="optimiser iterations (default 400)")
    g.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="lbfgs-b",
                   help="the root's optimiser: lbfgs-b, scipy's L-BFGS-B (the textbook's); lbfgs, aepar's "
                        "L-BFGS without bounds (UFLDL's minFunc method: two-loop direction, strong-Wolfe line "
                        "search), whose serial step, which every other rank waits for, costs less; its iterates "
                        "are its own (default lbfgs-b)")
    g.add_argument("--patch", type=positive_int, default=8,
                   help="patch side in pixels: v = patch² inputs (default 8)")
    g.add_argument("--hidden", type=positive_int, default=25, help="hidden units h (default 25)")
    g.add_argument("--rho", type=unit_interval, default=0.01, help="sparsity target ρ, in (0, 1) (default 0.01)")
    g.add_argument("--weight-cost", dest="lam", type=non_negative_float, default=1e-4, metavar="λ",
                   help="weight decay λ >= 0 (default 1e-4)")
    renamed(g, "--lam", "--weight-cost", dest="lam", type=non_negative_float)
    g.add_argument("--beta", type=non_negative_float, default=3.0, help="sparsity weight β >= 0 (default 3)")
    g = p.add_argument_group("processes")
    g.add_argument("--balance-every", type=non_negative_int, default=50, metavar="N",
                   help="every N evaluations the processes share the blocks anew in proportion to their "
                        "measured speed, where that shortens the slowest share by 10%% or more: the same bits, "
                        "less waiting where cores run at different speeds; 0: equal shares throughout "
                        "(default 50)")
    g.add_argument("--images", metavar="PATH",
                   help="an IMAGES.mat (variable IMAGES, rows x columns x images); default: "
                        "IMAGES.mat or the first CIFAR-10 batch in --data-dir, else the scikit-image photographs")
    add_common(p, scheme="sparse")
    p.set_defaults(dtype="float32")
    describe_dtype(p, "precision of the kernels (default float32): each block of 128 patches is summed in it (on "
                      "the CPU by aepar's own SIMD kernels) and the blocks' sums are added in it in the fixed "
                      "tree; the optimiser keeps θ, the cost and the gradient in float64 either way. float32 "
                      "takes about half the time on the CPU and reaches the same cost; float64 is the textbook's "
                      "precision (docs/schemes/sparse.md)")
    return p


@dataclass
class Setup:
    be: object
    patches: np.ndarray   # this rank's blocks of patches, float64
    blocks: object        # aepar.rows.Blocks
    source: str
    fingerprint: str | None  # of all patches (root)
    all_patches: np.ndarray | None = None  # every block's, where shares may move (several ranks)


def _setup(args, rank: int, size: int, images=None) -> Setup:
    """Everything that can fail on bad input, before any file is written (no communication).
    ``images``: (the (S, S, K) stack, its source line) given instead of the options' (aepar.api)."""
    from aepar.data.files import check_source, user_images
    from aepar.data.imagesmat import read_images_mat
    from aepar.data.patches import sample_patches
    from aepar.data.sources import natural_images
    from aepar.models.sparse_ae import LEAF
    from aepar.rows import Blocks
    from aepar.rundir import fingerprint

    blocks = Blocks.fixed(args.samples, LEAF, rank, size)
    if blocks.count < size:
        raise UserError(f"--limit {args.samples} make {blocks.count} block(s) of {LEAF} patches, fewer than "
                        f"the {size} processes (every process needs a block): use at most {blocks.count} "
                        f"or at least {LEAF * size} samples")
    be = backend.select(args.device, args.kernels, args.dtype)
    check_source(args)
    if images is not None:
        images, source = images
    elif args.data is not None:  # the user's images: grey, square, whitened (aepar.data.files)
        images, source = user_images(args.data, x_name=args.data_x, image_size=args.image_size)
    elif args.images:
        images = read_images_mat(args.images)
        h, w, k = images.shape
        source = f"IMAGES.mat: {k} images {h}x{w} from {args.images}"
    else:
        images, source = natural_images(args.data_dir)
    # the same patches whatever the number of processes: all are drawn, each keeps its blocks
    try:
        patches = sample_patches(images, args.samples, args.patch, seed=args.seed)
    except UserError as e:  # the sampler cannot know which file the images came from
        raise UserError(f"{args.data or args.images or source}: {e}") from None
    digest = fingerprint(patches) if rank == 0 else None
    if size > 1 and args.balance_every:  # shares may move: every block's patches stay
        return Setup(be, patches[blocks.rows], blocks, source, digest, patches)
    return Setup(be, patches[blocks.rows].copy(), blocks, source, digest)  # .copy() frees the rest


def _spread(summary) -> str:
    """", each rank's compute a-b s (slowest: rank r)" on more than one rank."""
    per_rank = summary["compute_per_rank_s"]
    if len(per_rank) < 2:
        return ""
    slowest = max(range(len(per_rank)), key=per_rank.__getitem__)
    moved = summary.get("rebalances") or 0
    return (f"; each rank's compute {min(per_rank):.2f}-{max(per_rank):.2f} s, slowest rank {slowest}"
            + (f"; blocks shared by speed {moved} time{'s' if moved > 1 else ''}, now "
               f"{'/'.join(map(str, summary['blocks_per_rank']))}" if moved else ""))


def _results(args, model, theta, summary) -> dict:
    """finish()'s weights, summary.csv and features.png (the paper's Figure 1.1)."""
    from aepar.data.patches import ORDER
    from aepar.finish import Weights
    from aepar.report.sparse import features_png, summary_csv

    params = model.params(theta)
    processes = summary["processes"]
    title = (f"{model.hidden} features, {summary['samples']} patches, "
             f"{processes} process{'es' if processes > 1 else ''}")
    config = {k: summary[k] for k in ("samples", "patch", "hidden", "rho", "lam", "beta", "seed", "dtype",
                                      "kernels", "processes", "source")}
    return {"weights": Weights("sparse", params, int(summary["iterations"]), config),
            "texts": {"summary.csv": summary_csv(summary)},
            "figures": {"features.png": lambda path: features_png(params["W1"], args.patch, path, order=ORDER,
                                                                   title=title)}}


def main(argv=None, comm=None):
    if comm is None:
        from aepar.comm import world
        comm = world()
    return run_program(sys.argv[1:] if argv is None else [str(a) for a in argv], comm)[0]


def run_program(argv: list, comm, images=None) -> tuple:
    """The program on ``argv``; ``images``: (stack, source) to sample the patches from
    instead of the options' data (aepar.api.sparse_autoencoder). Returns (the summary,
    the run directory)."""
    from aepar.guard import Guard
    from aepar.rundir import parse_and_open

    args, run = parse_and_open(comm, "sparse", PROG, build_parser().parse_args, argv)
    with run, Guard.from_args(comm, PROG, args) as guard:
        setup = comm.agree(_setup, args, comm.rank, comm.size, images)
        resume = comm.agree(lambda: scheme.load_resume(args, run, setup) if run.resumed and comm.is_root else None)
        progress(comm, args.quiet, f"{PROG}: {scheme.describe(args, comm, setup, resume, run)}")
        summary, model, theta = scheme.train(args, comm, setup, resume=resume, run=run, guard=guard)
        finish(run, comm, summary, **(_results(args, model, theta, summary) if comm.is_root else {}),
               prog=PROG, quiet=args.quiet, plot=args.plot)
        run.complete()
    if comm.is_root:  # (the summary holds the figures on rank 0 only)
        progress(comm, args.quiet,
                 f"{PROG}: {summary['iterations']} iterations, {summary['evaluations']} evaluations, "
                 f"final cost {summary['final_cost']:.6f}; "
                 f"{summary['collectives_per_evaluation']:.2f} communications/evaluation "
                 f"(bcast of θ, fixed-tree sum of Σ a2 and its bcast, fixed-tree reduction); "
                 f"{summary['total_s']:.2f} s total, "
                 f"compute {summary['compute_s']:.2f} s, comm {summary['comm_s']:.2f} s "
                 f"(max over {comm.size} rank{'s' if comm.size > 1 else ''}{_spread(summary)}); "
                 f"the root's own step {summary['root_step_s']:.2f} s "
                 f"({1e6 * summary['root_step_s'] / max(summary['evaluations'], 1):.0f} µs an evaluation); "
                 f"wrote {run.path}")
    return summary, run.path


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
