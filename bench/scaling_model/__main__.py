"""``python -m bench.scaling_model``: measure, fit, validate, predict, write (see the package)."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.common import mpi_env, python_command
from bench.scaling_model import __doc__ as OVERVIEW
from bench.scaling_model.measure import (COMPUTE_CSV, CONTENTION_CSV, MPI_CSV, REPO, SPARSE_CSV, STACKED_CSV,
                                         measure_compute, measure_contention, measure_mpi, measure_sparse,
                                         measure_stacked)
from bench.scaling_model.report import report

PROG = "python -m bench.scaling_model"
STEPS = {"measure-mpi": MPI_CSV, "measure-compute": COMPUTE_CSV, "measure-contention": CONTENTION_CSV,
         "measure-sparse": SPARSE_CSV, "measure-stacked": STACKED_CSV}  # each step and where it writes
ABOUT = {  # what each step measures, for its --help and the overview's
    "measure-mpi": "the collectives through aepar.comm, 8 B to 64 MB, each way a sum can take, and at 2 ranks a "
                   "training step's sums (run it under mpirun, one thread per rank)",
    "measure-compute": "one process on one thread: every scheme's compute terms (layer steps, optimiser, "
                       "sparse evaluations)",
    "measure-contention": "one process per core started together against one alone: how ranks sharing a "
                          "machine slow each other",
    "measure-sparse": "python -m aepar.sparse at 1 and 2 processes for each number of patches",
    "measure-stacked": "python -m aepar.pretrain at the engine's points of bench/results, measured again here",
}


def _measure(argv) -> int:
    """One measurement step (``measure-mpi``, ``measure-compute``, ...) with its own options."""
    step = argv[0]
    p = argparse.ArgumentParser(prog=f"{PROG} {step}", description=f"Measures {ABOUT[step]}.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=str(STEPS[step]), help="the CSV to write (replaced)")
    if step in ("measure-mpi", "measure-compute"):
        p.add_argument("--quick", action="store_true", help="fewer sizes and shorter timings")
    if step == "measure-sparse":
        p.add_argument("--samples", default="10000,40000,160000", help="numbers of patches, comma-separated")
    if step in ("measure-sparse", "measure-stacked"):
        p.add_argument("--repeats", type=int, default=3, help="rounds; each point's fastest counts")
    a = p.parse_args(argv[1:])
    if step == "measure-mpi":
        return measure_mpi(Path(a.out), a.quick, 0.03 if a.quick else 0.15)
    if step == "measure-compute":
        return measure_compute(Path(a.out), a.quick)
    if step == "measure-contention":
        return measure_contention(Path(a.out))
    if step == "measure-sparse":
        return measure_sparse(Path(a.out), tuple(int(x) for x in a.samples.split(",")), repeats=a.repeats)
    return measure_stacked(Path(a.out), a.repeats)


def _measure_all(quick: bool):
    """Every measurement step, each in a fresh process (the collectives on 2 ranks), one
    thread per rank."""
    q = ["--quick"] if quick else []
    for cmd in (python_command("bench.scaling_model", ["measure-mpi", *q], 2),
                python_command("bench.scaling_model", ["measure-compute", *q]),
                python_command("bench.scaling_model", ["measure-contention"]),
                python_command("bench.scaling_model", ["measure-sparse"]
                               + (["--samples", "10000,40000", "--repeats", "1"] if quick else [])),
                python_command("bench.scaling_model", ["measure-stacked"] + (["--repeats", "1"] if quick else []))):
        print("bench.scaling_model: " + " ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=REPO, env=mpi_env(AEPAR_THREADS=1)).returncode != 0:
            raise SystemExit(f"bench.scaling_model: {' '.join(cmd)} failed")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in STEPS:
        return _measure(argv)
    steps = "\n".join(f"  {step:<20}{ABOUT[step]} -> {STEPS[step].name}" for step in STEPS)
    p = argparse.ArgumentParser(prog=PROG, description=OVERVIEW.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"one measurement step alone: {PROG} STEP [--help]\n{steps}")
    p.add_argument("--reuse", action="store_true", help="fit, validate and predict from the measurement CSVs "
                                                        "already in bench/results (no measuring)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (a few minutes less)")
    p.add_argument("--ranks-per-node", type=int, default=2,
                   help="ranks per node in the predictions (default 2: nodes like this 2-core machine)")
    p.add_argument("--contended", default="", help="a note for the report when the timings shared the cores")
    a = p.parse_args(argv)
    if not a.reuse:
        _measure_all(a.quick)
    how = " ".join([PROG] + argv)
    if a.reuse:
        how += " (from scaling_model_{mpi,compute,contention,sparse,stacked}.csv, each row with its time's load_1min)"
    return report(ranks_per_node=a.ranks_per_node, contended=a.contended, how=how)


if __name__ == "__main__":
    sys.exit(main())
