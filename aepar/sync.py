"""Synchronized layer-wise pre-training (Santara et al. 2016, §3.1): ``mpirun -np P python -m aepar.sync``.

Stage l trains layer l of the stacked autoencoder (784-1000-500-250-30 RBMs by default)
on its own ranks. Stage l waits for stage l-1's first epoch; after every epoch l-1 hands
a new version of l's input over; l trains each next epoch on the newest input; after its
N_l epochs it sleeps and wakes for an extra epoch whenever its input changes, at most
``--extra`` times (the paper: 0, 5, 20, 40 for layers 1-4); pre-training ends when every
stage is done (or, ``--end-with-first``, no extra epoch starts after layer 1 is done, the
paper's Table 3). Then the stack is unrolled and fine-tuned data-parallel over all ranks
(:func:`aepar.finetune.finetune_and_evaluate`); ``--compare-greedy`` also runs greedy
pre-training + fine-tuning on the same data and seed in the same job, so that Tables 2/3
show both.

Ranks. P = layers: one rank per layer. P > layers: the extra ranks become data-parallel
replicas inside the stages, allotted by each stage's planned work (FLOPs x rows x epochs,
extras included), so the 784x1000 layer gets the most: one rank per layer cannot beat
greedy by more than total work / layer 1's work (layer 1 holds over half of it), replicas
can. P < layers: consecutive
layers share a rank (grouped by work), their epochs interleaved in plan order.
P = 1 runs the same schedule in one process.

Reproducibility. With real-time newest-wins the input version an epoch sees depends on
timing. The default ``--schedule plan`` first runs the schedule on a logical clock whose
epoch costs are the layers' FLOP counts (:func:`aepar.parallel.pipeline.plan_schedule`):
the plan says which input version every epoch of every stage trains on, and depends on the
configuration only. Every rank layout executes that plan (a stage that is ahead waits,
sleeping, for the planned version; versions the consumer does not use are not even sent),
so one process, P < layers, P = layers and P > layers give the same weights for the same
seed, bit for bit, replicas included (a stage's replicas add its fixed blocks in the fixed
tree, as one process does).
``--schedule newest`` is the paper's literal real-time newest-wins: not reproducible.

Hand-over (``--handover-mode``). ``data``: the producer transforms its rows,
h = transform(x_l), and sends the consumer replicas their rows of h (the paper's eq. 6).
``weights``: the producer sends the (W, b_h) of every layer below (the chain that made the
version) and the consumer recomputes its input from its own copy of the data, reusing the
activations of the unchanged bottom of the chain. The weights come out identical; the
work and the bytes do not:

- ``data`` sends the producer's outputs for every row (layer 1's 1000 per row), far more
  bytes than ``weights`` sends, and costs the producer a transform per version - on the
  pipeline's bottleneck when the producer is layer 1;
- ``weights`` keeps the transform off layer 1, but every consumer recomputes its input
  through the chain below it (all of it changes for layers 3 and 4), so the job does more
  work in total;
- where ranks share cores, total work decides, and ``data`` finishes first; with one rank
  per layer and a core each, ``weights`` does, because it keeps layer 1 free; with
  replicas ``data`` is far ahead, because single-rank small stages would recompute the big
  layers below them.

Hence the default ``auto``: data, unless every rank has a core of its own and replaying
the plan on the FLOP clock predicts weights faster (:func:`aepar.parallel.pipeline.choose_mode`;
in practice: one rank per layer). The measurements behind this are in
docs/performance-notes.md.

Time. Greedy pre-training is the sum of every layer's epochs; the pipeline cannot beat
total / heaviest stage with one rank per layer (layer 1 holds over half of the FLOPs), and
the extra epochs add work. Replicas lift that bound. On fewer cores than ranks, Table 3 of
a run measures what those cores do, not the schedule; bench/makespan.py says which figures
are simulated.

Ranks beyond one per layer make this the hybrid scheme (aepar.schemes.hybrid; the log and
the summary say so). Outputs (``--out``, default runs/sync, written only when the run succeeds): weights.h5
(pre-trained layers as layer{i}/W|bv|bh - loadable by ``python -m aepar.finetune`` -,
the fine-tuned network as finetuned/*, the greedy ones under greedy/), summary.json,
tables.md (Tables 2 and 3, greedy vs sync), trace.json (Chrome trace of every rank's
epochs, waits and hand-overs: open in https://ui.perfetto.dev), spacetime.png (Fig. 3).

Examples
--------
    mpirun -np 4 python -m aepar.sync --preset quick
    mpirun -np 8 python -m aepar.sync --dataset fashion --optimizer adam --loss xent
    python -m aepar.sync --layers 784-64-32-8 --epochs 2 --extra 0,1,2 --limit 500
"""
from __future__ import annotations

import sys

from aepar.cli import ArgumentParser, add_common, default_float32, parse_with_preset
from aepar.comm import run_main
from aepar.parallel.synchronized import FULL_SIZE_EXTRAS, add_sync_args
from aepar.pretrain import offer_the_rest, run_program
from aepar.stack import FULL_SIZE_RBMS, add_pretrain_args
from aepar.tasks.finetune import add_finetune_args

__all__ = ["build_parser", "parse_args", "main", "PRESETS"]

PROG = "aepar.sync"

PRESETS = {
    # `make run`: the embedded 5,000 real MNIST digits, the real architecture, reduced
    # epochs, Adam on cross-entropy for fine-tuning (the paper's plain SGD at lr 0.001
    # barely moves the weights in 10 epochs; docs/architecture.md, "Training recipes").
    "quick": dict(dataset="mnist5k", epochs=10, finetune_epochs=10, optimizer="adam", loss="xent",
                  dtype="float32", compare_greedy=True),
    # the paper's budget (20 pre-training epochs per layer, 10 of fine-tuning) on
    # full-size data: Fashion-MNIST (apt-get install dataset-fashion-mnist), the RBMs'
    # recipe and the extra epochs' caps chosen on held-out Fashion rows
    "full": dict(dataset="fashion", epochs=20, finetune_epochs=10, optimizer="adam", loss="xent",
                 dtype="float32", compare_greedy=True, val_fraction=1 / 6, extra=FULL_SIZE_EXTRAS,
                 **FULL_SIZE_RBMS),
}


def build_parser():
    parser = ArgumentParser(
        prog=f"python -m {PROG}",
        description="Synchronized layer-wise pre-training of a stacked autoencoder (Santara et al. 2016): "
                    "every layer trains on its own MPI ranks, handing its output to the next layer after "
                    "each epoch; then fine-tuning by backprop over all ranks. Rank 0 prints one line per "
                    "epoch of every stage (layer, epoch, input version, reconstruction error). Writes "
                    "weights.h5, summary.json, tables.md, trace.json and spacetime.png into --out.",
        epilog="Examples: mpirun -np 4 python -m aepar.sync --preset quick;  "
               "mpirun -np 8 python -m aepar.sync (extra ranks become data-parallel replicas of the "
               "heavy layers);  python -m aepar.sync --layers 784-64-32-8 --epochs 2 --extra 0,1,2 --limit 500")
    g = parser.add_argument_group("synchronized schedule")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="quick: mnist5k, the real 784-1000-500-250-30, 10 epochs/layer + extras, 10 of "
                        "fine-tuning (Adam, cross-entropy), float32, greedy comparison (`make run`, a few "
                        "minutes on 2 cores); full: Fashion-MNIST, 20 + 10 epochs, the RBMs at --lr 0.05 and "
                        f"--final-momentum 0.95, --extra {FULL_SIZE_EXTRAS}. Options given explicitly override "
                        "the preset.")
    add_sync_args(parser)
    add_pretrain_args(parser)
    add_finetune_args(parser)
    add_common(parser, scheme="sync")
    default_float32(parser)
    return offer_the_rest(parser, "sync")


def parse_args(argv=None):
    """Parse with the chosen preset's values as defaults (explicit options win)."""
    return parse_with_preset(build_parser(), PRESETS, argv)


def _sync_or_hybrid(args, comm) -> str:
    """sync, or hybrid when the ranks outnumber the layers (a bad --layers is refused later)."""
    n_layers = len(str(args.layers).replace(",", "-").split("-")) - 1
    return "hybrid" if comm.size > n_layers else "sync"


def main(argv, comm):
    return run_program(argv, comm, kind="sync", prog=PROG, parse=parse_args, scheme_for=_sync_or_hybrid)


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
