"""Ranks or threads on one machine: the same greedy job (pre-training, then fine-tuning) as
one process with every core as a thread, as one rank per core, and as one process with one
thread, taken in turns.

    python -m bench.layouts [--rounds 2] [--limit 20000] [--epochs 2] [--out DIR]

aepar's 8 fixed blocks give the same weights in every layout, so only the seconds differ.
A rank sums its blocks' gradients in memory; ranks exchange theirs (the fixed tree's
messages, the whole gradient every step), which is what fine-tuning's eight weight matrices
make expensive. Rows (one per layout and round, with the machine) go to
OUT/layouts.csv (default bench/results), replacing this machine's earlier rows; the
tables, a section per machine with the fastest round per layout, to OUT/layouts.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aepar._threads import usable_cores
from bench.common import fastest, machine_columns, merge_rows, mpi_env, python_command, read_rows, with_machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
COMMAND = "python -m bench.layouts"


def layouts(cores: int) -> list[tuple[int, int]]:
    """(ranks, threads per rank): every core as a thread of one process, one rank per core,
    from 8 cores also ranks of 4 threads, and one process with one thread (the baseline)."""
    middle = [(cores // 4, 4)] if cores >= 8 else []
    return list(dict.fromkeys([(1, cores), (cores, 1), *middle, (1, 1)]))


def run_once(ranks: int, threads: int, args, work: Path) -> dict:
    out = work / f"np{ranks}x{threads}-{time.monotonic_ns()}"
    job = ["--scheme", "greedy", "--dataset", args.dataset, "--limit", args.limit, "--epochs", args.epochs,
           "--finetune-epochs", args.epochs, "--no-plot", "--quiet", "--out", out]
    cmd = python_command("aepar.pretrain", job, ranks, threads)
    done = subprocess.run(cmd, env=mpi_env(AEPAR_THREADS=threads), capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"bench.layouts: {' '.join(map(str, cmd))} failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"pretrain_s": s["pretrain_time_s"], "finetune_s": s["finetune_time_s"], "source": s["source"]}


def table(rows: list[dict]) -> str:
    """layouts.md: a section per machine of the CSV's rows, the fastest round per layout."""
    lines = ["# Ranks or threads on one machine (the greedy job; seconds, lower is better)", "",
             "`aepar.pretrain --scheme greedy` (784-1000-500-250-30 RBMs, 8 blocks, batch 100): epochs per layer, "
             "then as many of fine-tuning, as one process with every core as a thread, one rank per core, and one "
             "process with one thread; the layouts in turns, the fastest round counts (every round is in "
             "layouts.csv). The weights are the same in every layout. Ranks of one thread run under mpirun with "
             "its default binding, ranks of several unbound (--bind-to none); threads are aepar's own "
             "(AEPAR_THREADS), each taking whole blocks. A rank adds its blocks' gradients in memory; ranks send "
             "theirs whole each step, which fine-tuning's eight weight matrices make dear.", ""]
    machines = {}
    for r in rows:
        machines.setdefault((r["cpu_model"], r["isa"], r["blas"], r["cores"], r["mpi"]), []).append(r)
    for (cpu, isa, blas, cores, mpi), group in machines.items():
        best = {}
        for r in group:
            best.setdefault((int(r["ranks"]), int(r["threads"])), []).append(r)
        base = best.get((1, 1))
        bp = fastest(float(r["pretrain_s"]) for r in base) if base else None
        bf = fastest(float(r["finetune_s"]) for r in base) if base else None
        ratio = lambda b, x: f"{b / x:.2f}x" if b else "-"  # noqa: E731
        dates = ", ".join(sorted({r["date"] for r in group}))
        lines += [f"## {cpu} ({isa}), {cores} cores, {blas}, {mpi}", "",
                  f"Measured {dates} with `{group[-1]['command']}` on {group[-1]['source']}.", "",
                  "| layout | pre-training s | fine-tuning s | pre-training vs 1 x 1 | fine-tuning vs 1 x 1 |",
                  "| --- | --- | --- | --- | --- |"]
        for (ranks, threads), rs in best.items():
            pre, fine = fastest(float(r["pretrain_s"]) for r in rs), fastest(float(r["finetune_s"]) for r in rs)
            lines.append(f"| {ranks} rank{'s' if ranks > 1 else ''} x {threads} thread{'s' if threads > 1 else ''} "
                         f"| {pre:.2f} | {fine:.2f} | {ratio(bp, pre)} | {ratio(bf, fine)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds over the layouts (default 2)")
    p.add_argument("--limit", type=int, default=20_000, help="training rows (default 20000)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per layer and of fine-tuning (default 2)")
    p.add_argument("--dataset", default="fashion", help="aepar's --dataset (default fashion)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where layouts.csv and .md go (default bench/results)")
    args = p.parse_args(argv)
    cores = usable_cores()
    machine = machine_columns()
    rows = []
    with tempfile.TemporaryDirectory(prefix="aepar-layouts-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for ranks, threads in layouts(cores):
                r = run_once(ranks, threads, args, Path(tmp))
                rows.append({"ranks": ranks, "threads": threads, "round": round_, **r})
                print(f"bench.layouts: round {round_}: {ranks} x {threads}: pre-training {r['pretrain_s']:.2f} s, "
                      f"fine-tuning {r['finetune_s']:.2f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = f"{COMMAND} --limit {args.limit} --epochs {args.epochs} --rounds {args.rounds}"
    stamp = {"date": time.strftime("%Y-%m-%d"), "command": command}
    merge_rows(with_machine([dict(r, **stamp) for r in rows], machine), args.out / "layouts.csv", "layouts")
    (args.out / "layouts.md").write_text(table(read_rows(args.out / "layouts.csv")))
    print(f"bench.layouts: wrote {args.out / 'layouts.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
