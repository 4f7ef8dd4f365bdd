"""The synchronized pipeline shared by the sync and hybrid schemes (Santara et al. 2016, §3.1).

Stage l trains layer l on its own ranks. Stage l waits for stage l-1's first epoch; after
every epoch l-1 hands a new version of l's input over; l trains each next epoch on the
newest input; after its N_l epochs it sleeps and wakes for an extra epoch whenever its
input changes, at most ``--extra`` times (the paper: 0, 5, 20, 40 for layers 1-4).

Reproducibility. With real-time newest-wins the input version an epoch sees depends on
timing. ``--schedule plan`` (the default) first runs the schedule on a logical clock whose
epoch costs are the layers' FLOP counts (:func:`aepar.parallel.pipeline.plan_schedule`):
the plan says which input version every epoch of every stage trains on and depends on the
configuration only. Every rank layout executes that plan, so one process, fewer ranks than
layers, one per layer and replicas give the same weights, bit for bit.

Hand-over (``--handover-mode``): ``data`` sends the consumer its rows of the producer's
output; ``weights`` sends the parameters of the layers below and the consumer recomputes
its input. The weights come out identical; the work and the bytes do not, so ``auto``
chooses by replaying the plan (:func:`aepar.parallel.pipeline.choose_mode`).
"""
from __future__ import annotations

import argparse

import numpy as np

from aepar import metrics
from aepar.checkpoint import layers_to_params, restore_layers
from aepar.cli import fraction_to_half, positive_int, progress, renamed
from aepar.data.sources import Digits
from aepar.errors import UserError
from aepar.parallel.executor import Pipeline
from aepar.parallel.pipeline import HANDOVERS, MODES, choose_mode, make_layout, plan_schedule, replay_plan, stage_costs
from aepar.parallel.subset import data_parallel_ranks
from aepar.report.spacetime import plot_spacetime
from aepar.rows import check_blocks

__all__ = ["PAPER_EXTRAS", "FULL_SIZE_EXTRAS", "DEFAULT_HANDOVER_MODE", "default_extras", "parse_extras",
           "sync_split", "split_validation", "add_sync_args", "check", "prepare", "setup", "pretrain",
           "summarize", "tables", "handover_stats"]

# The paper's extra epochs for layers 1-4; deeper stacks repeat the last value.
PAPER_EXTRAS = (0, 5, 20, 40)
# The full presets' caps (20 epochs per layer): high enough that every layer's last epoch
# trains on its input's final version (the paper's leave layer 2 on layer 1's version 18 of
# 20). Measured on held-out and test rows: docs/schemes/sync.md, "Extras".
FULL_SIZE_EXTRAS = "0,10,40,80"

# "auto" picks data (the least work in total) unless replaying the plan predicts weights
# faster on cores of their own (docs/performance-notes.md).
DEFAULT_HANDOVER_MODE = "auto"


def check(args, n_layers: int, n_rows: int):
    """The pipeline's options against the stack and the rows: one UserError line."""
    parse_extras(args.extra, n_layers)
    check_blocks(1, args.reduce_blocks, n_rows)  # a stage's replicas share its fixed blocks


def prepare(digits, args):
    """The training digits less a stratified ``--val-fraction`` held out to watch the stages
    on (the space-time diagram's validation curves), and the held-out rows."""
    train_idx, val_idx = sync_split(digits, args)
    if train_idx.size == 0:
        raise UserError(f"--val-fraction {args.val_fraction} leaves no training digits")
    note = f", {val_idx.size} of them held out for validation" if val_idx.size else ""
    kept = Digits(digits.train_x[train_idx], None if digits.train_y is None else digits.train_y[train_idx],
                  digits.test_x, digits.test_y, digits.source + note, digits.name, classes=digits.classes)
    return kept, digits.train_x[val_idx]


def setup(job):
    """Plan the schedule on the FLOP clock, place the stages on the ranks, choose what the
    hand-over sends; the run's first lines, and the summary's and weights' entries."""
    args, comm, layers = job.args, job.comm, job.layers
    n = len(layers)
    epochs = [layer.epochs for layer in layers]
    extras = parse_extras(args.extra, n)
    ec, hc = stage_costs(layers, job.digits.train_x.shape[0], job.x_val.shape[0])
    plan = plan_schedule(ec, hc, epochs, extras, args.end_with_first)
    layout = make_layout([ec[l] * plan.epochs(l) for l in range(n)], comm.size,
                         max_per_stage=min(args.batch, args.reduce_blocks))
    greedy_cost = sum(c * e for c, e in zip(ec, epochs)) + sum(hc[:-1])
    oversubscribed = len(data_parallel_ranks(comm)) < comm.size
    mode, predicted = choose_mode(plan, layout, ec, hc, oversubscribed)
    if args.handover_mode != "auto":
        mode = args.handover_mode
    job.state.update(plan=plan, layout=layout, mode=mode, epochs=epochs, extras=extras)
    job.summary.update(
        epochs_per_layer=epochs, extra=extras, handover=args.handover, handover_mode=mode,
        handover_mode_choice={"asked": args.handover_mode, "oversubscribed": oversubscribed,
                              "predicted_flop_makespan": predicted},
        end_with_first=args.end_with_first, layout=layout.to_dict(), plan=plan.to_dict(),
        planned_vs_greedy=plan.makespan / greedy_cost)
    job.config.update(epochs=epochs, extra=extras, handover=args.handover, handover_mode=mode,
                      layout=layout.describe())
    why = f" (auto{': ranks outnumber cores' if oversubscribed else ''})" if args.handover_mode == "auto" else ""
    job.say(f"{job.prog}: {job.name}: {job.shape}, {args.pretrainer}, {comm.size} rank(s): {layout.describe()}; "
            f"{args.reduce_blocks} blocks; {job.be.device}/{job.be.kernel_set}/{job.be.dtype}")
    job.say(f"{job.prog}: epochs per layer {epochs} + extra up to {extras} -> "
            + ("planned " if args.handover == "plan" else "(FLOP-clock estimate) ")
            + f"{[plan.epochs(l) for l in range(n)]}; hand-over {args.handover}/{mode}{why}; "
            f"planned makespan {plan.makespan / greedy_cost:.2f}x greedy's work (FLOP clock, one core per stage)")


def pretrain(job) -> dict:
    """Run the pipeline to its end through its checkpoints; the merged records (complete
    on rank 0, None elsewhere)."""
    state = None
    if job.loaded is not None:
        params, opt, position = job.loaded
        restore_layers(job.be, job.layers, params, {})
        state = _pipeline_state(params, opt, position["pipeline"])
        for s, st in enumerate(state["stages"]):
            job.layers[s].optimizer.load_state(st["velocity"])
    done = job.position.get("pretrain") if job.loaded is not None else None
    return _run_pipeline(job, state, done)


def summarize(job, record) -> dict:
    """The pipeline's records in the summary: time, epochs, hand-overs, and what the
    measured epoch times would give with one core per stage."""
    comm, n = job.comm, len(job.layers)
    time_s = comm.bcast(record["time_s"] if comm.is_root else None)
    job.say(f"{job.name} pre-training: {time_s:.1f}s")
    out = {"pretrain_time_s": time_s}
    if comm.is_root:
        out["pretrain"] = {"time_s": time_s, "epochs": record["epochs"], "handovers": record["handovers"],
                           "receives": record["receives"], "waits": record["waits"],
                           "handover_stats": handover_stats(record, n)}
        measured = [float(np.mean([e["end"] - e["start"] for e in record["epochs"] if e["stage"] == l]))
                    for l in range(n)]
        out["measured_epoch_s"] = measured
        if job.args.handover == "plan":
            out["replay_one_core_per_stage_s"] = replay_plan(job.state["plan"], measured, [0.0] * n)["makespan"]
        if job.args.plot:
            job.figures["spacetime.png"] = lambda path: _plot(job, record, path)
    return out


def _plot(job, record, path):
    plot_spacetime(record["epochs"], record["handovers"], path, n_stages=len(job.layers),
                   title=f"Synchronized pre-training, {job.shape}, {job.comm.size} rank(s): "
                         f"{job.state['layout'].describe()}")


def tables(summary) -> str:
    """The schedule's table (epochs, hand-overs per stage) after the scheme's Tables 2/3."""
    return _extra_tables(summary)


def default_extras(n_layers: int) -> list[int]:
    """The paper's 0, 5, 20, 40, cut or extended (repeating 40) to ``n_layers``."""
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


def sync_split(digits, args):
    """(train indices, validation indices) of ``digits``' training rows as sync and hybrid
    split them (:func:`split_validation` with ``--val-fraction`` and ``--seed``); the
    user's unlabelled rows (--data) are one class, a plain random hold-out."""
    labels = digits.train_y
    if labels is None:
        labels = np.zeros(digits.train_x.shape[0], np.int64)
    return split_validation(labels, args.val_fraction, args.seed)


def split_validation(labels, fraction: float, seed: int):
    """Stratified hold-out: (train indices, validation indices), each sorted.

    ``fraction`` of every class (rounded) goes to validation, like the paper's 1,000
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
                        "one per layer, the first 0 (default: the paper's 0,5,20,40)")
    g.add_argument("--schedule", dest="handover", choices=HANDOVERS, default="plan",
                   help="plan (default): execute a schedule planned on a logical clock, so the same seed "
                        "gives the same weights on any number of ranks; newest: the paper's real-time "
                        "newest-wins, NOT reproducible (which version an epoch sees depends on timing)")
    renamed(g, "--handover", "--schedule", dest="handover", choices=HANDOVERS)
    g.add_argument("--handover-mode", choices=("auto",) + MODES, default=DEFAULT_HANDOVER_MODE,
                   help="what moves between ranks: data (the transformed rows), weights (the parameters "
                        "of the layers below; the consumer recomputes its input), auto (default: data, "
                        "unless each rank has a core of its own and replaying the plan predicts weights "
                        "faster - one rank per layer). The weights are the same in every mode")
    g.add_argument("--end-with-first", action="store_true",
                   help="no extra epoch starts once layer 1 has finished (the paper's Table 3 run)")
    g.add_argument("--val-fraction", type=fraction_to_half, default=0.1,
                   help="share of the training digits held out (stratified) for the validation "
                        "curves of the space-time diagram (default 0.1; 0: none)")
    g.add_argument("--compare-greedy", action=argparse.BooleanOptionalAction, default=False,
                   help="also run greedy pre-training + fine-tuning on the same data and seed "
                        "(default: on with --preset, off otherwise)")
    g.add_argument("--dp-ranks", type=positive_int, default=None,
                   help="ranks for fine-tuning and the greedy comparison (default: all, or one per "
                        "core when ranks outnumber cores - waiting collectives spin in MPI)")
    return g


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
        send_s = float(np.mean([h["send_s"] for h in hs]))
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
    # fallback: a checkpoint of an older aepar names a hand-over's seconds "seconds"
    before = [{("send_s" if k == "seconds" else k): v for k, v in h.items()} for h in out["handovers"]]
    out["handovers"] = before + moved(result.handovers, ("t",))
    out["receives"] = out["receives"] + moved(result.receives, ("t",))
    out["waits"] = out["waits"] + list(result.waits)
    out["time_s"] = shift + result.time_s
    out["layout"], out["mode"], out["handover"] = result.layout, result.mode, result.handover
    return out


def _on_epoch(job, done):
    """Rank 0's call for every stage's finished epoch, as its record arrives: a metrics.csv
    row and a progress line. The time left is the plan's: how far along its clock the
    finished epochs reach (the latest planned end), at the pace this process has gone.
    Counting epochs instead would run ahead: the small layers' stages finish theirs many
    times faster than the first layer's, which the run waits for."""
    args, layers, plan = job.args, job.layers, job.state["plan"]
    rows, line = metrics.of(job.ckpt.run), _stage_line(layers)

    def planned_end(r) -> float:
        stage = plan.stages[r["stage"]]
        return stage[min(r["epoch"], len(stage) - 1)].end  # newest-wins may add extras past the plan

    reached = [max((planned_end(r) for r in done["epochs"]), default=0.0) if done else 0.0]
    eta = metrics.Eta(plan.makespan, reached[0])

    def on_epoch(r):
        rows.add("pretrain", r["epoch"] + 1, stage=r["stage"] + 1, train_error=r["train_error"],
                 val_error=r["val_error"], lr=layers[r["stage"]].lr)
        reached[0] = max(reached[0], planned_end(r))
        progress(job.comm, args.quiet, line(r), left=eta.left(reached[0]))
    return on_epoch


def _run_pipeline(job, state=None, done=None) -> dict:
    """The pipeline until it is done, through its checkpoints (a periodic one rebuilds it from
    its state and goes on). Returns the merged records (complete on rank 0)."""
    args, comm, layers, plan = job.args, job.comm, job.layers, job.state["plan"]
    on_epoch = _on_epoch(job, done)
    while True:
        pipe = Pipeline(job.be, comm, layers, job.state["layout"], job.digits.train_x, job.x_val,
                        epochs=job.state["epochs"], extras=job.state["extras"], blocks=args.reduce_blocks,
                        mode=job.state["mode"], handover=args.handover,
                        plan=plan if args.handover == "plan" else None, end_with_first=args.end_with_first,
                        trace=job.trace, on_epoch=on_epoch, guard=job.guard, resume=state)
        with job.guard.training("synchronized pre-training"):
            result = pipe.run()
        done = _merge_segments(done, result) if comm.is_root else None
        if not result.paused:
            return done
        state = pipe.state()
        params = opt = skeleton = label = None
        if comm.is_root:
            params, opt, skeleton = _pipeline_checkpoint(layers, state, job.be)
            where = ", ".join(f"L{s + 1} {st['done']}" + ("+" if st["paused"] else "")
                              for s, st in enumerate(skeleton["stages"]))
            label = f"sync pre-training, epochs done per layer: {where}"
        job.ckpt.save(params or {}, opt or {}, {"phase": "pretrain", "pipeline": skeleton, "pretrain": done},
                      comm.bcast(label), "signal" if result.stop else "periodic")
        if result.stop:
            raise job.ckpt.interrupted()
        state = comm.bcast(state)


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

