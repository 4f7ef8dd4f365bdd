"""Simulated pre-training times: greedy (the sum) against the synchronized pipeline.

This 2-core machine cannot give each of 4+ stages its own core, so the wall time of
``mpirun -np 4 python -m aepar.sync`` here measures the scheduler as much as the
schedule. This module takes per-layer times MEASURED on one core (epoch and transform of
every layer, e.g. written by ``bench.stacked``) and SIMULATES what each rank layout would
take with one core per rank:

- greedy: sum over layers of epochs x epoch time + the transforms between layers;
- sync (``--handover plan``): the executor's own plan (FLOP clock), replayed with the
  measured costs (:func:`aepar.parallel.pipeline.replay_plan`): an epoch starts when its
  rank is free and its planned input has arrived;
- sync (``--handover newest``): the real-time schedule under the measured costs
  (:func:`aepar.parallel.pipeline.plan_schedule`), one rank per layer only;
- greedy on the same ranks (``aepar.greedy`` is data-parallel): every layer's epochs at
  t1 / n + steps x Allreduce(parameters) each, transforms split n ways. The paper (and
  ``greedy_s``) compares against greedy on one core; this column says what the same
  cores would give greedy.

Hand-over modes: ``data`` charges the producer one transform of its rows per hand-over;
``weights`` charges the consumer the recompute of the changed top of the chain below it
per new version (as aepar does: it reuses the activations of the unchanged bottom). Replicas (ranks >
layers): epoch time = t1 / n + steps x Allreduce(parameters), with the Allreduce modelled
as 2 log2(n) alpha + 2 (n-1)/n bytes / beta (defaults: alpha 5 us, beta 5 GB/s, shared
memory); this part is a model, not a measurement, and every output row says so.

    python -m bench.makespan bench/results/stage_times_quick.json [--ranks 1,2,4,8,16]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

from aepar.parallel.pipeline import make_layout, mode_costs, plan_schedule, replay_plan

__all__ = ["allreduce_s", "greedy_dp_s", "simulate", "simulate_grid", "FIELDS", "main"]

FIELDS = ("kind", "scenario", "schedule", "ranks", "layout", "mode", "handover", "end_with_first", "greedy_s",
          "sync_s", "ratio", "target_0_56", "greedy_same_ranks_s", "ratio_same_ranks", "note")


def allreduce_s(nbytes: float, n: int, alpha=5e-6, beta=5e9) -> float:
    """Modelled time of one Allreduce of ``nbytes`` over ``n`` ranks (ring/tree hybrid)."""
    if n <= 1:
        return 0.0
    return 2 * math.log2(n) * alpha + 2.0 * (n - 1) / n * nbytes / beta


def _plan(st: dict, end_with_first: bool):
    """The plan aepar.sync executes: FLOP-clock costs, the run's epochs and extras."""
    layers = st["layers"]
    ec = [l["flops_per_sample"] * st["n_train"] + 4.0 * l["n_in"] * l["n_out"] * st["n_val"] for l in layers]
    hc = [2.0 * l["n_in"] * l["n_out"] * (st["n_train"] + st["n_val"]) for l in layers]
    return plan_schedule(ec, hc, st["epochs"], st["extras"], end_with_first), ec


def greedy_s(st: dict) -> float:
    """Greedy on one core: every layer's epochs, then its transform (not the code layer's)."""
    layers = st["layers"]
    return sum(e * l["epoch_s"] for e, l in zip(st["epochs"], layers)) + \
        sum(l["transform_s"] for l in layers[:-1])


def greedy_dp_s(st: dict, ranks: int, alpha=5e-6, beta=5e9) -> float:
    """Data-parallel greedy on ``ranks`` cores: each epoch t1 / n plus an Allreduce of the
    parameters every step; the transforms between layers split n ways."""
    layers = st["layers"]
    return sum(e * (l["epoch_s"] / ranks + l["steps"] * allreduce_s(l["param_bytes"], ranks, alpha, beta))
               for e, l in zip(st["epochs"], layers)) + sum(l["transform_s"] for l in layers[:-1]) / ranks


def simulate(st: dict, ranks: int, mode: str = "data", end_with_first: bool = False,
             alpha=5e-6, beta=5e9) -> dict:
    """Sync makespan on ``ranks`` cores (one rank each) from per-layer single-core times.

    Parameters
    ----------
    st : dict
        ``layers``: per layer ``n_in, n_out, flops_per_sample, epoch_s, transform_s,
        steps, param_bytes``; ``epochs``, ``extras`` (per layer), ``n_train``, ``n_val``,
        ``batch``.
    """
    layers = st["layers"]
    n = len(layers)
    plan, ec = _plan(st, end_with_first)
    totals = [ec[l] * plan.epochs(l) for l in range(n)]
    layout = make_layout(totals, ranks, max_per_stage=st.get("batch", 100))
    reps = [layout.replicas(l) for l in range(n)]
    _, hand, recompute = mode_costs(plan, layout, [l["epoch_s"] for l in layers],
                                    [l["transform_s"] for l in layers], mode)
    # replicas: t1 / n plus a modelled Allreduce of the parameters every step
    epoch = [layers[l]["epoch_s"] / reps[l] + layers[l]["steps"] * allreduce_s(layers[l]["param_bytes"], reps[l],
                                                                                 alpha, beta)
             for l in range(n)]
    replay = replay_plan(plan, epoch, hand, layout, recompute)
    return {"sync_s": replay["makespan"], "layout": layout.describe(), "replicas": reps,
            "epochs": [plan.epochs(l) for l in range(n)], "stage_busy_s": replay["busy"]}


def simulate_newest(st: dict, mode: str = "data", end_with_first: bool = False) -> float:
    """Real-time newest-wins, one rank per layer, under the measured costs."""
    layers = st["layers"]
    n = len(layers)
    epoch = [l["epoch_s"] for l in layers]
    hand = [l["transform_s"] if mode == "data" else 0.0 for l in layers]
    if mode == "weights":  # the consumer recomputes before each epoch (upper bound: every epoch)
        epoch = [epoch[l] + sum(layers[k]["transform_s"] for k in range(l)) for l in range(n)]
    return plan_schedule(epoch, hand, st["epochs"], st["extras"], end_with_first).makespan


def simulate_grid(st: dict, ranks=(1, 2, 3, 4, 5, 6, 8, 16), alpha=5e-6, beta=5e9) -> list[dict]:
    """Rows of FIELDS for every rank count, hand-over mode and ending rule."""
    g = greedy_s(st)
    n = len(st["layers"])
    sched = f"{'/'.join(map(str, sorted(set(st['epochs']))))} ep + {','.join(map(str, st['extras']))}"
    rows = []
    note_rep = f"simulated from measured single-core layer times; replicas: Allreduce model alpha {alpha:g}s beta {beta:g}B/s"
    gdp = {p: greedy_dp_s(st, p, alpha, beta) for p in (*ranks, n)}
    for ewf in (False, True):
        for mode in ("data", "weights"):
            for p in ranks:
                sim = simulate(st, p, mode, ewf, alpha, beta)
                rows.append({"kind": "simulated", "scenario": "sync", "schedule": sched, "ranks": p, "layout": sim["layout"],
                             "mode": mode, "handover": "plan", "end_with_first": ewf, "greedy_s": g,
                             "sync_s": sim["sync_s"], "ratio": sim["sync_s"] / g,
                             "target_0_56": sim["sync_s"] / g <= 0.56, "greedy_same_ranks_s": gdp[p],
                             "ratio_same_ranks": sim["sync_s"] / gdp[p],
                             "note": note_rep if p > n else "simulated from measured single-core layer times"})
            t = simulate_newest(st, mode, ewf)
            rows.append({"kind": "simulated", "scenario": "sync", "schedule": sched, "ranks": n,
                         "layout": "one rank per layer",
                         "mode": mode, "handover": "newest", "end_with_first": ewf, "greedy_s": g, "sync_s": t,
                         "ratio": t / g, "target_0_56": t / g <= 0.56, "greedy_same_ranks_s": gdp[n],
                         "ratio_same_ranks": t / gdp[n],
                         "note": "simulated real-time newest-wins from measured single-core layer times"})
    return rows


def write_csv(rows, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(FIELDS) + sorted({k for r in rows for k in r} - set(FIELDS)))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def format_rows(rows) -> str:
    lines = ["| kind | schedule | ranks | layout | mode | handover | ends with L1 | greedy s (1 core) | sync s "
             "| sync/greedy | greedy s (same ranks) | sync/that |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        layout = r["layout"].replace(" | ", "; ")  # the layout's own bars would split the cell
        same = (f"{r['greedy_same_ranks_s']:.2f} | {r['ratio_same_ranks']:.3f}" if "greedy_same_ranks_s" in r
                else "– | –")
        lines.append(f"| {r['kind']} | {r.get('schedule', '')} | {r['ranks']} | {layout} | {r['mode']} | {r['handover']} | "
                     f"{'yes' if r['end_with_first'] else 'no'} | {r['greedy_s']:.2f} | {r['sync_s']:.2f} | "
                     f"{r['ratio']:.3f} | {same} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.makespan", description=__doc__.splitlines()[0])
    p.add_argument("stage_times", help="JSON with measured per-layer times (bench.stacked writes "
                                       "bench/results/stage_times_quick.json)")
    p.add_argument("--ranks", default="1,2,3,4,5,6,8,16")
    p.add_argument("--epochs", type=int, default=None, help="simulate this many epochs per layer instead")
    p.add_argument("--alpha", type=float, default=5e-6, help="Allreduce latency model (s)")
    p.add_argument("--beta", type=float, default=5e9, help="Allreduce bandwidth model (bytes/s)")
    p.add_argument("--out", default=None, help="also write the rows as CSV here")
    args = p.parse_args(argv)
    st = json.loads(Path(args.stage_times).read_text())
    if args.epochs:
        st["epochs"] = [args.epochs] * len(st["layers"])
    rows = simulate_grid(st, [int(r) for r in args.ranks.split(",")], args.alpha, args.beta)
    print(format_rows(rows))
    if args.out:
        write_csv(rows, args.out)
        print(f"wrote {args.out}")
    print(f"(all rows SIMULATED from the measured layer times in {args.stage_times})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
