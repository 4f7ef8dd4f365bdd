"""Synchronized layer-wise pre-training (Santara et al. 2016, §3.1): ``mpirun -np P python -m aepar.sync``.

Stage l trains layer l of the stacked autoencoder (784-1000-500-250-30 RBMs by default)
on its own ranks. Stage l waits for stage l-1's first epoch; after every epoch l-1 hands
a new version of l's input over; l trains each next epoch on the newest input; after its
N_l epochs it sleeps and wakes for an extra epoch whenever its input changes, at most
``--extra`` times (the seed: 0, 5, 20, 40 for layers 1-4); pre-training ends when every
stage is done (or, ``--end-with-first``, no extra epoch starts after layer 1 is done, the
seed's Table 3). Then the stack is unrolled and fine-tuned data-parallel over all ranks
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
timing. The default ``--handover plan`` first runs the schedule on a logical clock whose
epoch costs are the layers' FLOP counts (:func:`aepar.parallel.pipeline.plan_schedule`):
the plan says which input version every epoch of every stage trains on, and depends on the
configuration only. Every rank layout executes that plan (a stage that is ahead waits,
sleeping, for the planned version; versions the consumer does not use are not even sent),
so one process, P < layers, P = layers and P > layers give the same weights for the same
seed, bit for bit, replicas included (a stage's replicas add its fixed blocks in the fixed
tree, as one process does).
``--handover newest`` is the paper's literal real-time newest-wins: not reproducible.

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

Outputs (``--out``, default runs/sync, written only when the run succeeds): weights.h5
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

import argparse
import sys

import numpy as np

from aepar import backend
from aepar.cli import ArgumentParser, add_common, fraction_to_half, parse_with_preset, positive_int, progress
from aepar.comm import run_main
from aepar.errors import UserError
from aepar.parallel.pipeline import (HANDOVERS, MODES, choose_mode, make_layout,
                                     plan_schedule, replay_plan, stage_costs)
from aepar.parallel.subset import Subset, data_parallel_ranks

__all__ = ["build_parser", "parse_args", "parse_extras", "default_extras", "split_validation",
           "run_sync", "main", "PRESETS", "DEFAULT_HANDOVER_MODE"]

PROG = "aepar.sync"

# The seed's extra epochs for layers 1-4; deeper stacks repeat the last value.
PAPER_EXTRAS = (0, 5, 20, 40)

# Chosen from bench.stacked's measurements (docs/performance-notes.md): "auto" picks data (the least
# work in total) unless replaying the plan predicts weights faster on cores of their own.
DEFAULT_HANDOVER_MODE = "auto"

PRESETS = {
    # `make run`: the embedded 5,000 real MNIST digits, the real architecture, reduced
    # epochs, Adam on cross-entropy for fine-tuning (the seed's plain SGD at lr 0.001
    # barely moves the weights in 10 epochs; docs/architecture.md, "Training recipes").
    "quick": dict(dataset="mnist5k", epochs=10, finetune_epochs=10, optimizer="adam", loss="xent",
                  dtype="float32", compare_greedy=True),
    # the seed's budget (20 pre-training epochs per layer, 10 of fine-tuning) on
    # full-size data: Fashion-MNIST (apt-get install dataset-fashion-mnist)
    "full": dict(dataset="fashion", epochs=20, finetune_epochs=10, optimizer="adam", loss="xent",
                 dtype="float32", compare_greedy=True, val_fraction=1 / 6),
}


def default_extras(n_layers: int) -> list[int]:
    """The seed's 0, 5, 20, 40, cut or extended (repeating 40) to ``n_layers``."""
    return [PAPER_EXTRAS[min(i, len(PAPER_EXTRAS) - 1)] for i in range(n_layers)]


def parse_extras(text, n_layers: int) -> list[int]:
    """'0,5,20,40' -> [0, 5, 20, 40]; None -> :func:`default_extras`.

    Raises
    ------
    UserError
        Not one non-negative integer per layer, or a non-zero count for layer 1 (its
        input, the data, never changes).
    """
    if text is None:
        return default_extras(n_layers)
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"--extra {text!r}: give non-negative integers separated by commas") from None
    if len(values) != n_layers:
        raise UserError(f"--extra {text!r} has {len(values)} count(s) but there are {n_layers} layers")
    if any(v < 0 for v in values):
        raise UserError(f"--extra {text!r}: counts cannot be negative")
    if values[0] != 0:
        raise UserError(f"--extra {text!r}: layer 1's input never changes, its count must be 0")
    return values


def split_validation(labels, fraction: float, seed: int):
    """Stratified hold-out: (train indices, validation indices), each sorted.

    ``fraction`` of every class (rounded) goes to validation, like the seed's 1,000
    digits per class; the same seed gives the same split.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng((int(seed), 7919))
    val = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = int(round(fraction * idx.size))
        val.append(rng.permutation(idx)[:k])
    val = np.sort(np.concatenate(val)) if val else np.empty(0, dtype=np.int64)
    train = np.setdiff1d(np.arange(labels.size), val)
    return train, val


def add_sync_args(parser):
    """Options of the synchronized pipeline (the sync and hybrid schemes)."""
    g = parser.add_argument_group("synchronized schedule (sync, hybrid)")
    g.add_argument("--extra", default=None,
                   help="extra epochs per layer when its input changes after its --epochs, comma-separated, "
                        "one per layer, the first 0 (default: the seed's 0,5,20,40)")
    g.add_argument("--handover", choices=HANDOVERS, default="plan",
                   help="plan (default): execute a schedule planned on a logical clock, so the same seed "
                        "gives the same weights on any number of ranks; newest: the paper's real-time "
                        "newest-wins, NOT reproducible (which version an epoch sees depends on timing)")
    g.add_argument("--handover-mode", choices=("auto",) + MODES, default=DEFAULT_HANDOVER_MODE,
                   help="what moves between ranks: data (the transformed rows), weights (the parameters "
                        "of the layers below; the consumer recomputes its input), auto (default: data, "
                        "unless each rank has a core of its own and replaying the plan predicts weights "
                        "faster - one rank per layer). The weights are the same in every mode")
    g.add_argument("--end-with-first", action="store_true",
                   help="no extra epoch starts once layer 1 has finished (the seed's Table 3 run)")
    g.add_argument("--val-fraction", type=fraction_to_half, default=0.1,
                   help="share of the training digits held out (stratified) for the validation "
                        "curves of the space-time diagram (default 0.1; 0: none)")
    g.add_argument("--compare-greedy", action=argparse.BooleanOptionalAction, default=False,
                   help="also run greedy pre-training + fine-tuning on the same data and seed "
                        "(default: on with --preset, off otherwise)")
    g.add_argument("--dp-ranks", type=positive_int, default=None,
                   help="ranks for fine-tuning and the greedy comparison (default: all, or one per "
                        "core when ranks outnumber cores - waiting collectives spin in MPI)")
    g.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True,
                   help="write spacetime.png (needs matplotlib; default on)")
    return g


def build_parser():
    from aepar.finetune import add_finetune_args, default_float32
    from aepar.stack import add_pretrain_args

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
                        "minutes on 2 cores); full: Fashion-MNIST, 20 + 10 epochs. Options given "
                        "explicitly override the preset.")
    add_sync_args(parser)
    add_pretrain_args(parser)
    add_finetune_args(parser)
    add_common(parser, scheme="sync")
    default_float32(parser)
    return parser


def parse_args(argv=None):
    """Parse with the chosen preset's values as defaults (explicit options win)."""
    return parse_with_preset(build_parser(), PRESETS, argv)


def _setup(args, comm):
    """Every rank, no communication: backend, data, layer sizes, every check on the input."""
    from aepar.data.sources import Digits, load_digits
    from aepar.stack import check_blocks, parse_layers

    be = backend.select(args.device, args.kernels, args.dtype)
    digits = load_digits(args.dataset, args.data_dir, args.seed, args.limit, dtype=be.dtype)
    n_in = digits.train_x.shape[1]
    sizes = parse_layers(args.layers, n_in)
    extras = parse_extras(args.extra, len(sizes) - 1)
    train_idx, val_idx = split_validation(digits.train_y, args.val_fraction, args.seed)
    if train_idx.size == 0:
        raise UserError(f"--val-fraction {args.val_fraction} leaves no training digits")
    check_blocks(1, args.reduce_blocks, int(train_idx.size))
    note = f", {val_idx.size} of them held out for validation" if val_idx.size else ""
    ft = Digits(digits.train_x[train_idx], digits.train_y[train_idx], digits.test_x, digits.test_y,
                digits.source + note, digits.name)
    return be, ft, digits.train_x[val_idx], sizes, extras


def warm_up(be, args):
    """Every kernel of either scheme once, on a tiny stack (aepar.resume.warm_up): compiled
    (or loaded from Numba's cache) before the timed pre-training and fine-tuning."""
    from aepar.finetune import finetune_optimizer
    from aepar.models.stacked import StackedAutoencoder
    from aepar.resume import warm_up as warm_up_model
    from aepar.stack import make_layers
    from aepar.rows import Shard

    x = Shard.of(be, np.random.default_rng(0).random((4, 6)), 1)
    tiny = make_layers(be, [6, 4, 3], args.pretrainer, seed=0, batch=2)
    h = x
    for layer in tiny:
        warm_up_model(be, layer, h, layer.recon_error)
        h = layer.transform(h)
    model = StackedAutoencoder.from_layers(be, tiny, loss=args.loss)
    warm_up_model(be, model, x, model.error_per_digit, batch=2, optimizer=finetune_optimizer(be, model.params, args))




def _stage_line(layers):
    def fmt(rec):
        l = rec["stage"]
        val = "" if rec.get("val_error") is None else f"  val {rec['val_error']:9.4f}"
        tag = "extra" if rec["extra"] else "     "
        return (f"sync  L{l + 1} ({layers[l].n_in}-{layers[l].n_out}) epoch {rec['epoch'] + 1:3d} {tag} "
                f"input v{rec['version']:<3d} recon {rec['train_error']:9.4f}{val}  "
                f"[{rec['start']:7.2f}-{rec['end']:7.2f}s]")
    return fmt


def handover_stats(records: dict, n_stages: int) -> list[dict]:
    """Per stage boundary: hand-overs, bytes and seconds per hand-over (producer side,
    receiver's recompute included) against the producer's mean epoch time. ``records``:
    the pipeline's "handovers", "receives" and "epochs"."""
    out = []
    for l in range(n_stages - 1):
        hs = [h for h in records["handovers"] if h["stage"] == l]
        rs = [r for r in records["receives"] if r["stage"] == l + 1]
        es = [e["end"] - e["start"] for e in records["epochs"] if e["stage"] == l]
        if not hs:
            continue
        send_s = float(np.mean([h["seconds"] for h in hs]))
        recompute_s = float(np.mean([r["recompute_s"] for r in rs])) if rs else 0.0
        epoch_s = float(np.mean(es)) if es else float("nan")
        out.append({"from_layer": l + 1, "to_layer": l + 2, "handovers": len(hs), "remote": bool(hs[0]["remote"]),
                    "bytes_per_handover": float(np.mean([h["bytes"] for h in hs])),
                    "producer_s_per_handover": send_s, "consumer_recompute_s_per_handover": recompute_s,
                    "producer_epoch_s": epoch_s,
                    "handover_vs_epoch": (send_s + recompute_s) / epoch_s if es else None})
    return out


def _pipeline_checkpoint(layers, state, be) -> tuple[dict, dict, dict]:
    """(params, opt_state, skeleton) of a paused pipeline's :meth:`Pipeline.state` (root)."""
    from aepar.checkpoint import layers_to_params

    params, opt, stages = layers_to_params(be, layers), {}, []
    for s, st in enumerate(state["stages"]):
        opt.update({f"layer{s + 1}/{k}": v for k, v in st["velocity"].items()})
        inputs = {}
        for v, inp in st["inputs"].items():
            for k, p in enumerate(inp["params"]):
                params.update({f"input/{s}/{v}/{k}/{name}": a for name, a in p.items()})
            inputs[str(v)] = {"chain": inp["chain"], "n": len(inp["params"])}
        stages.append({"done": st["done"], "paused": st["paused"], "counters": st["counters"], "inputs": inputs})
    return params, opt, {"stages": stages}


def _pipeline_state(params, opt, skeleton) -> dict:
    """Inverse of :func:`_pipeline_checkpoint`."""
    stages = []
    for s, st in enumerate(skeleton["stages"]):
        tag = f"layer{s + 1}/"
        inputs = {}
        for v, inp in st["inputs"].items():
            inputs[int(v)] = {"chain": inp["chain"],
                              "params": [{name: params[f"input/{s}/{v}/{k}/{name}"] for name in ("W", "bh")}
                                         for k in range(int(inp["n"]))]}
        stages.append({"done": st["done"], "paused": st["paused"], "counters": st.get("counters") or {},
                       "inputs": inputs,
                       "velocity": {k[len(tag):]: a for k, a in opt.items() if k.startswith(tag)}})
    return {"stages": stages}


def _merge_segments(done: dict | None, result) -> dict:
    """The records of the pipeline's runs so far (a resumed run's are shifted to follow)."""
    out = dict(done or {"time_s": 0.0, "epochs": [], "handovers": [], "receives": [], "waits": []})
    shift = out["time_s"]

    def moved(records, keys):
        return [dict(r, **{k: r[k] + shift for k in keys if k in r}) for r in records]
    out["epochs"] = out["epochs"] + moved(result.epochs, ("start", "end"))
    out["handovers"] = out["handovers"] + moved(result.handovers, ("t",))
    out["receives"] = out["receives"] + moved(result.receives, ("t",))
    out["waits"] = out["waits"] + list(result.waits)
    out["time_s"] = shift + result.time_s
    out["layout"], out["mode"], out["handover"] = result.layout, result.mode, result.handover
    return out


def _run_pipeline(be, comm, args, layers, layout, x_train, x_val, plan, mode, epochs, extras, trace, guard, ckpt,
                  state=None, done=None) -> dict:
    """The pipeline until it is done, through its checkpoints (a periodic one rebuilds it from
    its state and goes on). Returns the merged records (complete on rank 0)."""
    from aepar.parallel.executor import Pipeline

    on_epoch = None if args.quiet else (lambda r, f=_stage_line(layers): print(f(r), flush=True))
    while True:
        pipe = Pipeline(be, comm, layers, layout, x_train, x_val, epochs=epochs, extras=extras,
                        blocks=args.reduce_blocks, mode=mode, handover=args.handover,
                        plan=plan if args.handover == "plan" else None, end_with_first=args.end_with_first,
                        trace=trace, on_epoch=on_epoch, guard=guard, resume=state)
        with guard.training("synchronized pre-training"):
            result = pipe.run()
        done = _merge_segments(done, result) if comm.is_root else None
        if not result.paused:
            return done
        state = pipe.state()
        params = opt = skeleton = None
        if comm.is_root:
            params, opt, skeleton = _pipeline_checkpoint(layers, state, be)
            where = ", ".join(f"L{s + 1} {st['done']}" + ("+" if st["paused"] else "")
                              for s, st in enumerate(skeleton["stages"]))
            label = f"sync pre-training, epochs done per layer: {where}"
        else:
            label = None
        ckpt.save(params or {}, opt or {}, {"part": "sync", "pipeline": skeleton, "segments": done},
                  comm.bcast(label), "signal" if result.stop else "periodic")
        if result.stop:
            raise ckpt.interrupted()
        state = comm.bcast(state)


def run_sync(be, comm, args, digits, x_val, run, guard, *, scheme="sync", extra=None) -> dict:
    """Synchronized pre-training, fine-tuning (or, ``args.task`` "classify", a classifier on
    the encoder), optionally greedy for comparison, each part resumable; writes the run files
    on rank 0. Returns the summary (rank 0's is complete). ``scheme``: its name in the
    summary (sync, or hybrid with replicas); ``extra``: summary entries of the caller."""
    from aepar import checkpoint
    from aepar.checkpoint import layers_to_params, restore_layers
    from aepar.finetune import finetune_and_evaluate
    from aepar.greedy import pretrain_greedy
    from aepar.stack import layers_from_args
    from aepar.report.stacked import TABLES_FILE, pca_error, tables
    from aepar.resume import Checkpointer
    from aepar.rows import Shard
    from aepar.rundir import fingerprint
    from aepar.trace import Trace

    quiet = args.quiet
    x_train = digits.train_x
    n_in = x_train.shape[1]
    ckpt = Checkpointer(run, comm, guard, "sync",
                        fingerprint(x_train, x_val, digits.test_x) if comm.is_root else None,
                        progress=lambda m: progress(comm, quiet, m))
    loaded = ckpt.load()
    position = loaded[2] if loaded is not None else {"part": "sync"}
    part = position.get("part", "sync")
    warm_up(be, args)
    trace = Trace(comm)
    layers = layers_from_args(be, args, n_in)
    n = len(layers)
    epochs = [layer.epochs for layer in layers]
    extras = parse_extras(args.extra, n)
    ec, hc = stage_costs(layers, x_train.shape[0], x_val.shape[0])
    plan = plan_schedule(ec, hc, epochs, extras, args.end_with_first)
    totals = [ec[l] * plan.epochs(l) for l in range(n)]
    layout = make_layout(totals, comm.size, max_per_stage=min(args.batch, args.reduce_blocks))
    greedy_cost = sum(c * e for c, e in zip(ec, epochs)) + sum(hc[:-1])
    dp = Subset(comm, data_parallel_ranks(comm, args.dp_ranks)[:args.reduce_blocks])
    oversubscribed = len(data_parallel_ranks(comm)) < comm.size
    mode, predicted = choose_mode(plan, layout, ec, hc, oversubscribed)
    if args.handover_mode != "auto":
        mode = args.handover_mode
    sizes = [layers[0].n_in] + [l.n_out for l in layers]
    progress(comm, quiet, f"{PROG}: {'-'.join(map(str, sizes))}, {args.pretrainer}, {comm.size} rank(s): "
                          f"{layout.describe()}; {args.reduce_blocks} blocks; {be.device}/{be.kernel_set}/{be.dtype}")
    why = f" (auto{': ranks outnumber cores' if oversubscribed else ''})" if args.handover_mode == "auto" else ""
    progress(comm, quiet, f"{PROG}: epochs per layer {epochs} + extra up to {extras} -> "
                          + ("planned " if args.handover == "plan" else "(FLOP-clock estimate) ")
                          + f"{[plan.epochs(l) for l in range(n)]}; hand-over {args.handover}/{mode}{why}; "
                          f"planned makespan {plan.makespan / greedy_cost:.2f}x greedy's work (FLOP clock, "
                          "one core per stage)")

    # ---- 1. synchronized pre-training on the pipeline ----------------------------------------
    if loaded is not None:
        params, opt_state, _ = loaded
        restore_layers(be, layers, params, {})
        progress(comm, quiet, f"{PROG}: resuming from {run.checkpoint_path} ({run.checkpoint_progress})")
    if part == "sync":
        state = _pipeline_state(*loaded[:2], position["pipeline"]) if loaded is not None else None
        if state is not None:
            for s, st in enumerate(state["stages"]):
                layers[s].optimizer.load_state(st["velocity"])
        segments = _run_pipeline(be, comm, args, layers, layout, x_train, x_val, plan, mode, epochs, extras,
                                 trace, guard, ckpt, state, position.get("segments"))
    else:
        segments = position["segments"]
    time_s = comm.bcast(segments["time_s"] if comm.is_root else None)
    progress(comm, quiet, f"sync pre-training: {time_s:.1f}s")
    summary = {"scheme": scheme, "task": getattr(args, "task", "reconstruct"), "source": digits.source, "n_train": int(x_train.shape[0]),
               "n_val": int(x_val.shape[0]), "n_test": int(digits.test_x.shape[0]), "ranks": comm.size,
               "device": be.device, "kernels": be.kernel_set, "dtype": str(be.dtype), "layers": sizes,
               "pretrainer": args.pretrainer, "epochs_per_layer": epochs, "extra": extras, "batch": args.batch,
               "blocks": args.reduce_blocks, "seed": args.seed, "handover": args.handover, "handover_mode": mode,
               "handover_mode_choice": {"asked": args.handover_mode, "oversubscribed": oversubscribed,
                                        "predicted_flop_makespan": predicted},
               "end_with_first": args.end_with_first, "layout": layout.to_dict(),
               "plan": plan.to_dict(), "planned_vs_greedy": plan.makespan / greedy_cost,
               "pretrain_time_s": time_s, **(extra or {})}
    if comm.is_root:
        from aepar.machine import describe

        summary["machine"] = describe()
        summary["pretrain"] = {"time_s": time_s, "epochs": segments["epochs"], "handovers": segments["handovers"],
                               "receives": segments["receives"], "waits": segments["waits"],
                               "handover_stats": handover_stats(segments, n)}
        # what this run's measured epoch times would give with one core per stage
        measured = [float(np.mean([e["end"] - e["start"] for e in segments["epochs"] if e["stage"] == l]))
                    for l in range(n)]
        summary["measured_epoch_s"] = measured
        if args.handover == "plan":
            summary["replay_one_core_per_stage_s"] = replay_plan(plan, measured, [0.0] * n)["makespan"]
    pca = comm.bcast(pca_error(x_train, digits.test_x, k=sizes[-1]) if comm.is_root else None)
    summary["pca"] = pca
    progress(comm, quiet, f"PCA-{pca['k']} baseline: train error/digit {pca['train']:.3f}  test {pca['test']:.3f}")
    summary["dp_ranks"] = dp.size
    sync_params = layers_to_params(be, layers)

    # ---- 2. fine-tuning, data-parallel --------------------------------------------------------
    def outer_sync():
        return sync_params, {}, {"part": "finetune", "segments": segments}

    if getattr(args, "task", "reconstruct") == "classify":
        from aepar.classify import classify_and_evaluate

        cl = dp.run(lambda sub: classify_and_evaluate(
            be, sub, layers, digits, args, trace=trace, ckpt=ckpt, guard=guard, outer=outer_sync,
            prefix="classify/", resume=loaded if position.get("phase") == "classify" else None))
        model = cl.pop("model") if cl is not None else None
        cl = comm.bcast(cl)
        ft_params = {f"classifier/{k}": be.to_host(v) for k, v in model.params.items()} if model is not None else {}
        summary.update(classify=cl, finetune_time_s=cl["time_s"],
                       accuracy={"pretrained": cl["before"], "finetuned": cl["after"]})
    elif part in ("sync", "finetune"):
        ft = dp.run(lambda sub: finetune_and_evaluate(
            be, sub, layers, digits, args, trace=trace, ckpt=ckpt, guard=guard, outer=outer_sync,
            resume=loaded if part == "finetune" else None))
        model = ft.pop("model") if ft is not None else None
        ft = comm.bcast(ft)
        ft_params = {f"finetuned/{k}": be.to_host(v) for k, v in model.params.items()} if model is not None else {}
    else:
        ft = position["sync_finetune"]
        ft_params = {k: v for k, v in loaded[0].items() if k.startswith("finetuned/")}
    if "classify" not in summary:
        summary.update(finetune=ft, finetune_time_s=ft["time_s"],
                       error={"pretrained": ft["before"], "finetuned": ft["after"] if args.finetune_epochs else None})

    # ---- 3. greedy pre-training and fine-tuning on the same data, for comparison ------------------
    greedy = glayers = None
    greedy_params = {}
    if args.compare_greedy and "classify" not in summary:
        progress(comm, quiet, f"{PROG}: greedy pre-training on the same data and seed, data-parallel over "
                              f"{dp.size} rank(s)")
        glayers = layers_from_args(be, args, n_in)
        base = {"segments": segments, "sync_finetune": ft}
        gposition = position if part in ("greedy", "greedy-finetune") else {}
        if gposition:
            restore_layers(be, glayers, loaded[0], loaded[1],
                           int(gposition["layer"]) if part == "greedy" else None, prefix="greedy/")

        def greedy_run(sub):
            if part != "greedy-finetune":
                train_sh = Shard.of(be, x_train, args.reduce_blocks, sub.rank, sub.size)
                val_sh = Shard.of(be, x_val, args.reduce_blocks, sub.rank, sub.size)
                pre = pretrain_greedy(be, sub, glayers, train_sh, val_sh, quiet=quiet, trace=trace, ckpt=ckpt,
                                      guard=guard, position=gposition if part == "greedy" else None,
                                      outer=lambda: (dict(sync_params, **ft_params), {},
                                                     dict(base, part="greedy", prefix="greedy/")))
                del train_sh, val_sh
            else:
                pre = gposition["pretrain"]
            gparams = {f"greedy/{k}": v for k, v in layers_to_params(be, glayers).items()}
            gft = finetune_and_evaluate(
                be, sub, glayers, digits, args, trace=trace, ckpt=ckpt, guard=guard, prefix="greedy/",
                resume=loaded if part == "greedy-finetune" else None,
                outer=lambda: (dict(sync_params, **ft_params, **gparams), {},
                               dict(base, part="greedy-finetune", pretrain=pre)))
            return pre, gft

        result_g = dp.run(greedy_run)
        gmodel = result_g[1].pop("model") if result_g is not None else None
        pre, gft = comm.bcast(result_g)
        if comm.is_root:
            greedy_params = {f"greedy/{k}": v for k, v in layers_to_params(be, glayers).items()}
            if args.finetune_epochs:
                greedy_params.update({f"greedy/finetuned/{k}": be.to_host(v) for k, v in gmodel.params.items()})
        greedy = {"scheme": "greedy", "source": digits.source, "n_train": summary["n_train"],
                  "n_test": summary["n_test"], "ranks": dp.size, "device": be.device,
                  "kernels": be.kernel_set, "dtype": str(be.dtype), "layers": sizes, "pretrainer": args.pretrainer,
                  "epochs_per_layer": epochs[0], "batch": args.batch, "seed": args.seed, "pretrain": pre,
                  "pretrain_time_s": pre["time_s"], "pca": pca, "finetune": gft, "finetune_time_s": gft["time_s"],
                  "error": {"pretrained": gft["before"],
                            "finetuned": gft["after"] if args.finetune_epochs else None}}
        summary["greedy"] = greedy
        summary["speedup_vs_greedy"] = pre["time_s"] / time_s if time_s > 0 else None
        ge, se = greedy["error"], summary["error"]
        key = "finetuned" if args.finetune_epochs else "pretrained"
        summary["test_error_vs_greedy"] = se[key]["test"] / ge[key]["test"]
        progress(comm, quiet, f"{PROG}: pre-training greedy {pre['time_s']:.1f}s vs sync {time_s:.1f}s "
                              f"({summary['speedup_vs_greedy']:.2f}x); test error/digit greedy "
                              f"{ge[key]['test']:.3f} vs sync {se[key]['test']:.3f}")

    # ---- outputs ------------------------------------------------------------------------------
    with run.output("trace.json") as path:
        trace.to_chrome_json(path, extra={"scheme": "sync", "layout": layout.describe()})
    if comm.is_root:
        params = dict(sync_params, **(ft_params if args.finetune_epochs else {}), **greedy_params)
        with run.output("weights.h5") as path:
            checkpoint.save(path, scheme="sync", params=params, epoch=max(epochs),
                            config={"sizes": sizes, "pretrainer": args.pretrainer, "epochs": epochs, "extra": extras,
                                    "handover": args.handover, "handover_mode": mode,
                                    "finetune_epochs": args.finetune_epochs, "loss": args.loss,
                                    "optimizer": args.optimizer, "seed": args.seed, "layout": layout.describe()})
        run.write_json("summary.json", summary)
        schemes = {"greedy": greedy, scheme: summary} if greedy else {scheme: summary}
        if "classify" in summary:
            from aepar.classify import table

            text = table(dict(summary, classify=dict(summary["classify"], init="pretrained")))
        else:
            text = tables(schemes)
        text += "\n" + _extra_tables(summary)
        run.write_text(TABLES_FILE, text)
        if args.plot:
            try:
                from aepar.report.spacetime import plot_spacetime

                with run.output("spacetime.png") as path:
                    plot_spacetime(segments["epochs"], segments["handovers"], path, n_stages=n,
                                   title=f"Synchronized pre-training, {'-'.join(map(str, sizes))}, "
                                         f"{comm.size} rank(s): {layout.describe()}")
            except ImportError as e:
                print(f"{PROG}: no spacetime.png ({e})", file=sys.stderr, flush=True)
        if not quiet:
            print(text, flush=True)
    return summary


def _extra_tables(s: dict) -> str:
    lines = ["Synchronized schedule", "",
             f"Layout: {s['layout']['text']}; hand-over {s['handover']}/{s['handover_mode']}"
             + ("; ended with layer 1" if s["end_with_first"] else ""), "",
             "| Layer | Epochs (base + extra) | Mean epoch (s) | Hand-overs out | Bytes / hand-over | "
             "Hand-over s (producer + consumer) | Hand-over / epoch |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    pre = s.get("pretrain", {})
    stats = {h["from_layer"]: h for h in pre.get("handover_stats", [])}
    for l, m in enumerate(s.get("measured_epoch_s", [])):
        eps = [e for e in pre.get("epochs", []) if e["stage"] == l]
        base = sum(not e["extra"] for e in eps)
        h = stats.get(l + 1)
        cells = [f"L{l + 1}", f"{base} + {len(eps) - base}", f"{m:.3f}"]
        if h:
            cells += [str(h["handovers"]), f"{h['bytes_per_handover'] / 1e6:.2f} MB",
                      f"{h['producer_s_per_handover']:.4f} + {h['consumer_recompute_s_per_handover']:.4f}",
                      f"{h['handover_vs_epoch']:.3f}"]
        else:
            cells += ["–"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    if s.get("speedup_vs_greedy"):
        g = s.get("greedy") or {}
        lines += ["", f"Pre-training speed-up over greedy (measured: sync on {s['ranks']} rank(s), greedy "
                      f"data-parallel on {g.get('ranks', '?')}): {s['speedup_vs_greedy']:.2f}x; "
                      f"test error sync/greedy {s['test_error_vs_greedy']:.3f}"]
    if s.get("replay_one_core_per_stage_s") is not None:
        lines += [f"Simulated with one core per stage from these measured epoch times: "
                  f"{s['replay_one_core_per_stage_s']:.1f}s (see bench/makespan.py)"]
    return "\n".join(lines) + "\n"


def main(argv, comm):
    from aepar.guard import Guard
    from aepar.rundir import parse_and_open

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args, run = parse_and_open(comm, "sync", PROG, parse_args, argv)
    with run, Guard.from_args(comm, PROG, args, run) as guard:
        be, digits, x_val, _, _ = comm.agree(_setup, args, comm)
        progress(comm, args.quiet, f"{PROG}: {digits.source}")
        run_sync(be, comm, args, digits, x_val, run, guard)
        run.complete()
    progress(comm, args.quiet, f"{PROG}: wrote {run.path}")


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
