"""Equal shares of the blocks against shares by speed: ``aepar.sparse`` on several ranks with
``--balance-every 0`` and with ``--balance-every N``, taken in turns, optionally with a busy
process on one core (a core another job shares, or a slower CPU).

    python -m bench.balance [--ranks N] [--limit 40000] [--every 50] [--rounds 2]
                            [--busy-core C] [--out DIR]

Each rank runs one thread; ``--ranks`` defaults to the usable cores. The launcher is
bench's (``MPIRUN``, else ``mpirun --oversubscribe``, which binds no rank to a core; plain
``mpirun`` binds each of 2 ranks to one): its options are a column, since whether a rank
stays on its core decides whether its speed lasts. Every pair of runs
must end with the same weights.h5, bit for bit (a block's sums do not depend on the rank
that computes them): a difference fails the benchmark. Rows (one per run, with the
machine, the date and the command) go to OUT/balance.csv (default bench/results),
replacing this machine's earlier rows of the same ranks, patches and busy core; the table,
the fastest round of each, to OUT/balance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aepar._threads import usable_cores
from bench.chaos import differences
from bench.common import (KEY, fastest, machine_columns, merge_rows, mpi_env, mpirun, python_command, read_rows,
                          with_machine)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
COMMAND = "python -m bench.balance"
SETTING = ("ranks", "limit", "busy_core", "mpirun_options")


def run_once(args, every: int, out: Path) -> dict:
    cmd = python_command("aepar.sparse", ["--limit", args.limit, "--balance-every", every, "--quiet",
                                          "--out", out], args.ranks)
    done = subprocess.run(cmd, env=mpi_env(AEPAR_THREADS=1), capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"bench.balance: {' '.join(map(str, cmd))} failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"total_s": s["total_s"], "compute_s": s["compute_s"], "comm_s": s["comm_s"],
            "compute_per_rank_s": " ".join(f"{t:.3f}" for t in s["compute_per_rank_s"]),
            "blocks_per_rank": " ".join(map(str, s["blocks_per_rank"])), "rebalances": s["rebalances"]}


def busy(core: int | None):
    """A process spinning on ``core`` (None: none), for the runs to share it with."""
    if core is None:
        return None
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def table(rows: list[dict]) -> str:
    """balance.md: per machine and setting, the fastest round of each, and their ratio."""
    lines = ["# Equal shares of the blocks against shares by speed (aepar.sparse; seconds, lower is better)", "",
             "`aepar.sparse` on several ranks of one thread, 400 L-BFGS iterations, with `--balance-every 0` "
             "(equal shares throughout) and with shares re-made by the ranks' measured speeds, in turns; the "
             "fastest round counts (every round is in balance.csv). Each pair ended with the same weights.h5, "
             "bit for bit. A busy core: a process spinning on it while the runs take place.", ""]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["cpu_model"], r["isa"], r["cores"], r["mpi"]), []).append(r)
    for (cpu, isa, cores, mpi), group in groups.items():
        dates = ", ".join(sorted({r["date"] for r in group}))
        commands = "; ".join(f"`{c}`" for c in dict.fromkeys(r["command"] for r in group))
        lines += [f"## {cpu} ({isa}), {cores} cores, {mpi}", "", f"Measured {dates} with {commands}.", "",
                  "| ranks | patches | busy core | mpirun options | equal shares s | by speed s | speed-up | "
                  "rebalances | blocks per rank at the end |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        settings: dict = {}
        for r in group:
            settings.setdefault(tuple(r[k] for k in SETTING), []).append(r)
        for (ranks, limit, core, options), rs in settings.items():
            equal = [r for r in rs if int(r["every"]) == 0]
            shared = [r for r in rs if int(r["every"]) > 0]
            if not equal or not shared:
                continue
            e = fastest(float(r["total_s"]) for r in equal)
            best = min(shared, key=lambda r: float(r["total_s"]))
            b = float(best["total_s"])
            lines.append(f"| {ranks} | {limit} | {core or 'none'} | {options or '(none)'} | {e:.2f} | {b:.2f} | "
                         f"{e / b:.2f}x | "
                         f"{best['rebalances']} | {best['blocks_per_rank']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=None, help="ranks (default: the usable cores)")
    p.add_argument("--limit", type=int, default=40_000, help="patches (default 40000)")
    p.add_argument("--every", type=int, default=50, help="--balance-every of the shared runs (default 50)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the two runs (default 2)")
    p.add_argument("--busy-core", type=int, default=None, help="a core to keep busy during the runs (default none)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where balance.csv and .md go (default bench/results)")
    args = p.parse_args(argv)
    args.ranks = args.ranks or usable_cores()
    if args.ranks < 2 or args.every < 1:
        p.error("--ranks must be at least 2 and --every at least 1")
    machine = machine_columns()
    options = " ".join(mpirun()[1:])
    rows = []
    spinner = busy(args.busy_core)
    try:
        with tempfile.TemporaryDirectory(prefix="aepar-balance-") as tmp:
            for round_ in range(1, args.rounds + 1):
                outs = {}
                for every in (0, args.every):
                    outs[every] = Path(tmp) / f"r{round_}-every{every}"
                    r = run_once(args, every, outs[every])
                    rows.append({"ranks": args.ranks, "limit": args.limit, "busy_core": args.busy_core,
                                 "mpirun_options": options, "every": every, "round": round_, **r})
                    print(f"bench.balance: round {round_}: --balance-every {every}: {r['total_s']:.2f} s, "
                          f"blocks {r['blocks_per_rank']}, {r['rebalances']} rebalance(s)", flush=True)
                found = differences(outs[0], outs[args.every])
                if found:
                    raise SystemExit("bench.balance: the weights differ between equal and balanced shares: "
                                     + "; ".join(found[:4]))
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    launcher = f"MPIRUN='{os.environ['MPIRUN']}' " if os.environ.get("MPIRUN") else ""
    command = (f"{launcher}{COMMAND} --ranks {args.ranks} --limit {args.limit} --every {args.every} "
               f"--rounds {args.rounds}" + (f" --busy-core {args.busy_core}" if args.busy_core is not None else ""))
    stamp = {"date": time.strftime("%Y-%m-%d"), "command": command}
    merge_rows(with_machine([dict(r, **stamp) for r in rows], machine), args.out / "balance.csv", "balance",
               key=KEY + SETTING)
    (args.out / "balance.md").write_text(table(read_rows(args.out / "balance.csv")))
    print(f"bench.balance: wrote {args.out / 'balance.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
