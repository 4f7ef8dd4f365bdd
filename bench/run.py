"""`make bench`: the sparse autoencoder's strong/weak scaling, peers side by side, stacked.

    python -m bench.run --quick     # processes 1, 2 x 10k-160k patches (minutes on 2 cores)
    python -m bench.run --full      # the paper's grid: 1-16 processes x 10k-160k (hours)

Stages, each reported with its exit status:

1. scaling: ``bash jobs/sparse_scaling.sh`` with GRID=quick|full (the same sweep as the
   SLURM and Grid Engine jobs, over bench/grid.json), work in runs/bench-<grid>/;
   then bench/results/strong.csv, weak.csv, speedup.png, efficiency.png, scaling.md
   (measured seconds beside the paper's Fig. 3.1).
2. peers: ``python -m bench.textbook_sparse`` -> bench/results/peers.csv (aepar vs the
   textbook NumPy implementation at 10k patches, 400 iterations, 1 process), then
   ``python -m bench.sparse_command`` (the two whole commands, start-up included).
3. stacked: ``python -m bench.stacked --quick|--full`` when bench/stacked.py exists.

Results go to a new directory runs/bench/<date-time>/ (the committed bench/results stay as
they are); ``--publish`` writes them into bench/results instead, ``--results DIR`` anywhere.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def _load() -> str:
    try:
        return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def _stage(name: str, cmd: list[str], env: dict | None = None) -> int:
    print(f"== bench: {name}: {' '.join(cmd)}  ({_load()})", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=REPO, env=env)
    print(f"== bench: {name} exit {rc} after {time.perf_counter() - t0:.0f}s", flush=True)
    return rc


def scaling(grid: str, python: str, results: Path) -> int:
    """Run the sweep as plain bash on this host and publish its CSVs, plots and table."""
    from bench import scaling as sc

    # a benchmark is measured afresh, never resumed, into a directory of its own
    work = REPO / "runs" / f"bench-{grid}-{time.strftime('%Y%m%d-%H%M%S')}"
    env = dict(os.environ, GRID=grid, OUT=str(work), PYTHON=python, REPORT="0", RESUME="0")
    # Waiting ranks yield the CPU instead of spinning: on a shared machine a spinning rank
    # steals the core its partner (or someone else's job) computes on.
    env.setdefault("MPI_ARGS", "--mca mpi_yield_when_idle 1")
    # the paper's precision, that of the committed tables and of the scaling model's compute
    env.setdefault("ARGS", "--dtype float64")
    for var in ("PROCS", "SAMPLES", "WEAK", "ITERS"):
        env.pop(var, None)  # the grid file decides; the job scripts take overrides
    load_before = _load()
    rc = _stage(f"scaling ({grid} grid)", ["bash", str(REPO / "jobs" / "sparse_scaling.sh")], env)
    if not (work / "strong.csv").exists():
        print("== bench: scaling produced no CSVs", file=sys.stderr)
        return rc or 1
    results.mkdir(parents=True, exist_ok=True)
    for name in ("strong.csv", "weak.csv"):
        shutil.copyfile(work / name, results / name)
    cores = os.cpu_count() or 1
    g = sc.load_grid(grid)
    notes = [f"Measured {time.strftime('%Y-%m-%d')} by `python -m bench.run` on grid `{grid}` (`make bench`: quick, "
             f"`make bench-full`: full), whose scaling stage runs `GRID={grid} bash jobs/sparse_scaling.sh`.",
             f"Grid `{grid}` of bench/grid.json: processes {g['processes']}, samples {g['samples']}, "
             f"{g['iterations']} iterations; weak scaling at {g['weak_samples_per_process']} "
             f"samples per process. One BLAS thread per rank; mpirun {env['MPI_ARGS']}.",
             f"Machine load while measuring: before the sweep {load_before}, after it {_load()} "
             "(other work on a shared machine slows every point; the 2-process points most).",
             ]
    if max(g["processes"]) <= cores < 16:
        notes.append(f"This machine has {cores} cores: points with more than {cores} processes were "
                     "not run, because oversubscribed ranks time the OS scheduler, not the scheme. "
                     "Run `make bench-full` or `sbatch jobs/sparse_scaling.sh` on 16 cores for the rest.")
    elif max(g["processes"]) > cores:
        notes.append(f"This machine has {cores} cores: points with more processes than that are "
                     "oversubscribed (marked in the CSVs) and measure the scheduler as much as the scheme.")
    sc.report(results, results, results / "scaling.md", notes)
    print(f"== bench: wrote {results}/strong.csv, weak.csv, speedup.png, efficiency.png, scaling.md")
    return rc


def peers(python: str, results: Path) -> int:
    """The sparse autoencoder side by side with the textbook version: in one process, then
    as whole commands (start-up included); each table appended to scaling.md."""
    md = results / "peers.md.tmp"
    rc = 0
    for name, module in (("peers (textbook vs aepar, 10k patches)", "bench.textbook_sparse"),
                         ("peers (whole commands: python -m aepar.sparse vs the textbook program)",
                          "bench.sparse_command")):
        md.unlink(missing_ok=True)
        status = _stage(name, [python, "-m", module, "--out", str(results / "peers.csv"), "--md", str(md)])
        if status == 0 and md.exists() and (results / "scaling.md").exists():
            with open(results / "scaling.md", "a") as f:
                f.write("\n" + md.read_text())
        rc = rc or status
    md.unlink(missing_ok=True)
    return rc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="grid", action="store_const", const="quick",
                      help="processes 1-2, 10k-160k patches (default)")
    size.add_argument("--full", dest="grid", action="store_const", const="full",
                      help="the paper's grid, 1-16 processes x 10k-160k patches")
    size.add_argument("--grid", dest="grid", help="any grid name in bench/grid.json")
    p.add_argument("--skip", action="append", default=[], choices=["scaling", "peers", "stacked", "determinism"],
                   help="leave a stage out (repeatable)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--results", default=None,
                       help="where the results go (default: a new runs/bench/<date-time>/)")
    where.add_argument("--publish", action="store_true",
                       help="write into bench/results, replacing the committed figures")
    args = p.parse_args(argv)
    grid = args.grid or "quick"
    python = sys.executable
    results = Path(RESULTS if args.publish else args.results or
                   REPO / "runs" / "bench" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    print(f"== bench: results go to {results}", flush=True)
    results.mkdir(parents=True, exist_ok=True)

    status = {}
    if "scaling" not in args.skip:
        status["scaling"] = scaling(grid, python, results)
    if "peers" not in args.skip:
        status["peers"] = peers(python, results)
    if "stacked" not in args.skip:
        if not (REPO / "bench" / "stacked.py").exists():
            print("== bench: stacked: bench/stacked.py not present, stage skipped")
        elif grid not in ("quick", "full"):
            print(f"== bench: stacked: has only --quick and --full, stage skipped for grid {grid!r}")
        else:
            status["stacked"] = _stage("stacked", [python, "-m", "bench.stacked", f"--{grid}", "--out", str(results)])
    if "determinism" not in args.skip:
        status["determinism"] = _stage("determinism (what rank-independent sums cost)",
                                       [python, "-m", "bench.determinism", "--out", str(results)])
    print("== bench: " + ", ".join(f"{k} exit {v}" for k, v in status.items()))
    return 0 if all(v == 0 for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
