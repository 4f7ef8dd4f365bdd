"""What a round of work handed to a process's threads costs beyond the work.

``python -m bench.handoff`` (``make bench-handoff``) splits one job into equal shares, one
per thread, and times many rounds of it, a short serial step between rounds (as the
sparse autoencoder's L-BFGS step sits between its evaluations), through:

- ``parallel_map``: :func:`aepar.rows.parallel_map`, Python threads handed their share
  through locks (each share's Python runs under the interpreter lock);
- ``team``: :class:`aepar.kernels.nb.team.Team`, helpers that wait in compiled code (the
  sparse autoencoder's evaluation);
- ``numba-workqueue`` and ``numba-omp``: one Numba ``prange`` over the shares, with
  Numba's own thread pool or GNU OpenMP's (not aepar's way: aepar keeps Numba to one
  thread per aepar thread; the OpenMP layer needs libgomp on the machine).

Each way runs in a process of its own (Numba's threading layer is fixed per process).
A row per way: the share's time alone, the round's median and 90th percentile, and the
overhead, median minus the share alone. Rows, with the machine, are merged into
``bench/results/handoff.csv``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ONE_PROCESS, machine_columns, merge_rows, with_machine

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "handoff.csv"
WAYS = ("parallel_map", "team", "numba-workqueue", "numba-omp")


def _child(way: str, threads: int, rounds: int, share_us: float) -> dict:
    """Times ``rounds`` rounds one way in this process (its environment set by the parent)."""
    import numpy as np
    from numba import njit, prange

    @njit(nogil=True)
    def share(a, lo, hi, reps, out, i):
        s = 0.0
        for _ in range(reps):
            for j in range(lo, hi):
                s += a[j] * 1.0000001
        out[i] = s

    n = 4096
    a = np.random.default_rng(0).random(n * threads)
    out = np.zeros(threads)
    share(a, 0, n, 1, out, 0)
    t0 = time.perf_counter()
    share(a, 0, n, 100, out, 0)
    reps = max(1, round(share_us * 1e-6 / ((time.perf_counter() - t0) / 100)))
    alone = min(_timed(lambda: share(a, 0, n, reps, out, 0)) for _ in range(200))
    args = [(a, i * n, (i + 1) * n, reps, out, i) for i in range(threads)]
    if way == "parallel_map":
        from aepar.rows import parallel_map
        run = lambda: parallel_map(lambda i: share(*args[i]), range(threads))  # noqa: E731
    elif way == "team":
        from aepar.kernels.nb import team

        @njit(nogil=True)
        def serve(ctrl, k, budget, a, lo, hi, reps, out, i):
            while True:
                op = team.wait_for_work(ctrl, k, budget)
                if op <= 0:
                    return op
                share(a, lo, hi, reps, out, i)
                team.finish(ctrl, k)

        helpers = team.Team(threads - 1, serve, lambda op, *own: share(*own))
        helpers.bind(args[1:])
        run = lambda: helpers.run(1, args[0])  # noqa: E731
    else:
        @njit(nogil=True, parallel=True)
        def shares(a, n, reps, out):
            for i in prange(out.size):
                share(a, i * n, (i + 1) * n, reps, out, i)
        run = lambda: shares(a, n, reps, out)  # noqa: E731
    run()
    times = []
    for _ in range(rounds):
        times.append(_timed(run))
        share(a, 0, 256, 1, out, 0)  # the serial step between rounds
    if way.startswith("numba-"):
        import numba
        if numba.threading_layer() != way.split("-")[1]:
            raise RuntimeError(f"Numba ran the {numba.threading_layer()} layer")
    times.sort()
    return {"share_us": alone * 1e6, "round_median_us": times[len(times) // 2] * 1e6,
            "round_p90_us": times[int(len(times) * 0.9)] * 1e6}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _environment(way: str, threads: int) -> dict:
    env = {**os.environ, "AEPAR_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    env["NUMBA_NUM_THREADS"] = str(threads if way.startswith("numba-") else 1)
    if way.startswith("numba-"):
        env["NUMBA_THREADING_LAYER"] = way.split("-")[1]
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.handoff", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="shares per round, one per thread (default 2)")
    p.add_argument("--rounds", type=int, default=2000, help="rounds timed per way (default 2000)")
    p.add_argument("--share-us", type=float, default=150.0,
                   help="microseconds of work in one share (default 150: the sparse command's first round)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)} (default: all)")
    p.add_argument("--out", type=Path, default=OUT, help=f"CSV the rows are merged into (default {OUT})")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.threads, args.rounds, args.share_us)))
        return 0
    ways = [w for w in args.ways.split(",") if w]
    if args.threads < 2 or args.rounds < 1 or args.share_us <= 0 or not set(ways) <= set(WAYS):
        p.error(f"need --threads >= 2, --rounds >= 1, --share-us > 0 and --ways of {', '.join(WAYS)}")
    rows = []
    for way in ways:
        cmd = [sys.executable, "-m", "bench.handoff", "--child", way, "--threads", str(args.threads),
               "--rounds", str(args.rounds), "--share-us", str(args.share_us)]
        done = subprocess.run(cmd, env=_environment(way, args.threads), cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"bench.handoff: {way}: not measured ({last})", file=sys.stderr)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r = {k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()}
        # from the columns as written, so that it is their difference
        r = {"way": way, "threads": args.threads, **r, "overhead_us": round(r["round_median_us"] - r["share_us"], 1)}
        rows.append(r)
        print(f"{way:16s} share {r['share_us']:7.1f} us   round median {r['round_median_us']:7.1f} us "
              f"(p90 {r['round_p90_us']:7.1f})   overhead {r['overhead_us']:6.1f} us")
    if not rows:
        return 1
    machine = machine_columns(mpi=ONE_PROCESS, threads=args.threads)
    merge_rows(with_machine(rows, machine), args.out, "handoff",
               key=("hostname", "cpu_model", "isa", "way", "threads"))
    print(f"bench.handoff: rows in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
