"""Simulated pre-training times of every scheme, from per-layer times measured on one core.

Greedy (the sum) against the synchronized pipeline and the 15-618 data- and
model-parallel schemes.

This 2-core machine cannot give each of 4+ stages its own core, so the wall time of
``mpirun -np 4 python -m aepar.sync`` here measures the scheduler as much as the
schedule. This module takes per-layer times MEASURED on one core (epoch and transform of
every layer, e.g. written by ``bench.stacked``) and SIMULATES what each scheme and rank
layout would take with one core per rank. Every figure comes from
:mod:`aepar.parallel.planner` (the same model ``python -m aepar.pretrain --scheme auto``
uses; its docstring lists the assumptions); this module only reads the file and writes
rows:

- greedy_s: greedy on one core, the sum of every layer's epochs and the transforms between;
- sync_s (``--schedule plan``): the executor's own plan (FLOP clock), replayed with the
  measured costs (:func:`aepar.parallel.pipeline.replay_plan`); ranks > layers: the
  ``hybrid`` layout (extra ranks as data-parallel replicas of the costly layers);
- sync_s (``--schedule newest``): the real-time schedule under the measured costs, one
  rank per layer only;
- greedy_same_ranks_s: ``aepar.greedy`` on the same ranks (data-parallel, the blocks'
  gradients summed in the fixed tree). The paper compares against greedy on one core;
  this column says what the same cores would give greedy;
- data_s: the 15-618 data-parallel scheme on the same ranks (one Allreduce per step);
- model_s: the 15-618 model-parallel scheme (a layer per rank, groups when layers > ranks;
  empty where it cannot run).

Hand-over modes: ``data`` charges the producer one transform of its rows per hand-over;
``weights`` charges the consumer the recompute of the changed top of the chain below it
per new version (as aepar does: it reuses the activations of the unchanged bottom).
Communication (every reduction, the replicas' sums and model-parallel's weight exchange)
is an alpha-beta MODEL, not a measurement (defaults: alpha 5 us, beta 5 GB/s, shared
memory), and every output row says so.

    python -m bench.makespan bench/results/stage_times_quick.json [--ranks 1,2,4,8,16] [--predict]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from aepar.parallel import planner
from aepar.parallel.planner import LayerCosts, allreduce_s
from bench.common import machine_columns, with_machine

__all__ = ["allreduce_s", "greedy_s", "greedy_dp_s", "simulate", "simulate_newest", "simulate_grid",
           "FIELDS", "main"]

FIELDS = ("kind", "scenario", "schedule", "ranks", "layout", "mode", "handover", "end_with_first", "greedy_s",
          "sync_s", "ratio", "target_0_56", "greedy_same_ranks_s", "ratio_same_ranks", "note", "data_s", "model_s")


def _costs(st) -> LayerCosts:
    return st if isinstance(st, LayerCosts) else LayerCosts.from_stage_times(st)


def greedy_s(st) -> float:
    """Greedy on one core (:func:`aepar.parallel.planner.greedy_s`)."""
    return planner.greedy_s(_costs(st))


def greedy_dp_s(st, ranks: int, alpha=5e-6, beta=5e9) -> float:
    """The layer-wise data-parallel figure with one Allreduce per step: what this module
    called greedy on the same ranks before aepar.greedy's fixed-tree sum was modelled on
    its own; the 15-618 ``data`` scheme (:func:`aepar.parallel.planner.data_parallel_s`)."""
    return planner.data_parallel_s(_costs(st), ranks, alpha, beta)


def simulate(st, ranks: int, mode: str = "data", end_with_first: bool = False, alpha=5e-6, beta=5e9) -> dict:
    """Sync (ranks <= layers) or hybrid (ranks > layers) makespan on ``ranks`` cores from
    per-layer single-core times (:func:`aepar.parallel.planner.pipeline_s`)."""
    r = planner.pipeline_s(_costs(st), ranks, replicas=True, mode=mode, end_with_first=end_with_first,
                           alpha=alpha, beta=beta)
    return {"sync_s": r["seconds"], "layout": r["layout"], "replicas": r["replicas"], "epochs": r["epochs"],
            "stage_busy_s": r["busy"]}


def simulate_newest(st, mode: str = "data", end_with_first: bool = False) -> float:
    """Real-time newest-wins, one rank per layer (:func:`aepar.parallel.planner.newest_s`)."""
    return planner.newest_s(_costs(st), mode, end_with_first)


def simulate_grid(st, ranks=(1, 2, 3, 4, 5, 6, 8, 16), alpha=5e-6, beta=5e9) -> list[dict]:
    """Rows of FIELDS for every rank count, hand-over mode and ending rule."""
    costs = _costs(st)
    g = planner.greedy_s(costs)
    n = costs.n_layers
    sched = f"{'/'.join(map(str, sorted(set(costs.epochs))))} ep + {','.join(map(str, costs.extras))}"
    note = ("simulated from measured single-core layer times; communication modelled "
            f"(alpha {alpha:g}s beta {beta:g}B/s)")
    same = {}
    for p in (*ranks, n):
        pred = planner.predict(costs, p, alpha=alpha, beta=beta)
        same[p] = {k: pred[k]["seconds"] for k in ("greedy", "data", "model")}

    def row(p, layout, mode, handover, ewf, t, scenario, why):
        gp = same[p]["greedy"]
        return {"kind": "simulated", "scenario": scenario, "schedule": sched, "ranks": p, "layout": layout,
                "mode": mode, "handover": handover, "end_with_first": ewf, "greedy_s": g, "sync_s": t,
                "ratio": t / g, "target_0_56": t / g <= 0.56, "greedy_same_ranks_s": gp if gp is not None else "",
                "ratio_same_ranks": t / gp if gp else "", "note": why,
                "data_s": same[p]["data"] if same[p]["data"] is not None else "",
                "model_s": same[p]["model"] if same[p]["model"] is not None else ""}

    rows = []
    for ewf in (False, True):
        for mode in ("data", "weights"):
            for p in ranks:
                sim = simulate(costs, p, mode, ewf, alpha, beta)
                rows.append(row(p, sim["layout"], mode, "plan", ewf, sim["sync_s"], "hybrid" if p > n else "sync",
                                note + ("; replicas sum in the fixed tree" if p > n else "")))
            rows.append(row(n, "one rank per layer", mode, "newest", ewf, simulate_newest(costs, mode, ewf), "sync",
                            "simulated real-time newest-wins from measured single-core layer times"))
    return rows


def write_csv(rows, path, machine=None):
    """Rows to ``path``, each with the machine columns (a row's own values win): ``machine``,
    the one the layer times were measured on, else this one."""
    rows = with_machine(rows, machine or machine_columns())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(FIELDS) + sorted({k for r in rows for k in r} - set(FIELDS)))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def _num(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def format_rows(rows) -> str:
    lines = ["| kind | schedule | ranks | layout | mode | handover | ends with L1 | greedy s (1 core) | sync s "
             "| sync/greedy | greedy s (same ranks) | sync/that | data s (same ranks) | model s (same ranks) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        layout = r["layout"].replace(" | ", "; ")  # the layout's own bars would split the cell
        lines.append(f"| {r['kind']} | {r.get('schedule', '')} | {r['ranks']} | {layout} | {r['mode']} | {r['handover']} | "
                     f"{'yes' if r['end_with_first'] else 'no'} | {r['greedy_s']:.2f} | {r['sync_s']:.2f} | "
                     f"{r['ratio']:.3f} | {_num(r.get('greedy_same_ranks_s'), '.2f')} | "
                     f"{_num(r.get('ratio_same_ranks'), '.3f')} | {_num(r.get('data_s'), '.2f')} | "
                     f"{_num(r.get('model_s'), '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.makespan", description=__doc__.splitlines()[0])
    p.add_argument("stage_times", help="JSON with measured per-layer times (bench.stacked writes "
                                       "bench/results/stage_times_quick.json)")
    p.add_argument("--ranks", default="1,2,3,4,5,6,8,16",
                   help="rank counts to simulate, comma-separated (default 1,2,3,4,5,6,8,16)")
    p.add_argument("--epochs", type=int, default=None, help="simulate this many epochs per layer instead")
    p.add_argument("--alpha", type=float, default=5e-6, help="communication model: latency (s)")
    p.add_argument("--beta", type=float, default=5e9, help="communication model: bandwidth (bytes/s)")
    p.add_argument("--out", default=None, help="also write the rows as CSV here")
    p.add_argument("--predict", action="store_true",
                   help="also print the planner's table (every scheme, the one auto picks) per rank count")
    p.add_argument("--cores", type=int, default=None,
                   help="with --predict: cores the ranks share (fewer than ranks: oversubscribed)")
    p.add_argument("--tables", default=None, metavar="MD",
                   help="write the planner's tables (implies --predict) to this markdown file")
    args = p.parse_args(argv)
    costs = LayerCosts.from_stage_times(args.stage_times)
    if args.epochs:
        costs = costs.with_epochs(args.epochs)
    ranks = [int(r) for r in args.ranks.split(",")]
    rows = simulate_grid(costs, ranks, args.alpha, args.beta)
    print(format_rows(rows))
    machine = json.loads(Path(args.stage_times).read_text()).get("machine")  # where the layer times ran, if said
    if args.out:
        write_csv(rows, args.out, machine)
        print(f"wrote {args.out}")
    if args.predict or args.tables:
        tables = [planner.format_table(planner.predict(costs, r, cores=args.cores, alpha=args.alpha, beta=args.beta))
                  for r in ranks]
        print("\n\n" + "\n\n".join(tables))
        if args.tables:
            path = Path(args.tables)
            path.parent.mkdir(parents=True, exist_ok=True)
            head = (f"# Predicted pre-training time per scheme (aepar.parallel.planner)\n\n"
                    f"SIMULATED from the one-core layer times in {args.stage_times}"
                    + (f" (measured on {machine.get('cpu_model')}, {machine.get('cores')} cores)" if machine else "") +
                    f"{f' with {args.epochs} epochs per layer' if args.epochs else ''}; communication "
                    f"modelled (alpha {args.alpha:g} s, beta {args.beta:g} B/s). Written {time.strftime('%Y-%m-%d')} by "
                    f"`python -m bench.makespan {' '.join(argv if argv is not None else sys.argv[1:])}`.\n\n")
            path.write_text(head + "\n\n".join(tables) + "\n")
            print(f"wrote {path}")
    print(f"(all rows SIMULATED from the measured layer times in {args.stage_times})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
