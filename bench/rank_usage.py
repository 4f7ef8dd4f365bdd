"""What one process of a run spent, from the kernel's own accounting: run a module as
``python -m`` would, and when it ends write its rusage to a JSON file.

    python -m bench.rank_usage --out DIR [--tag NAME] -m MODULE [ARGS...]

Each process writes ``DIR/<tag>-rank<R>.json`` (R from the launcher's environment, 0 when
it was not launched as a rank). The fields say where a rank's time went when it
runs slower under MPI than alone: user and system CPU seconds against the wall (a rank that
polls for messages spends CPU while it waits; one that sleeps in the kernel does not),
voluntary and involuntary context switches (waiting on a message, or losing its core to
another process), page faults, peak memory, and the cores it was allowed to run on.
``bench.gpu_node``'s sixteen step runs the sparse autoencoder this way under 16 ranks,
alone with one rank's share, and as 16 independent processes, and merges the files
(:func:`usage_rows`).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import runpy
import sys
import time
from pathlib import Path

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def rank_of(env=os.environ) -> int | None:
    """This process's rank as its launcher set it, None when it was not launched as a rank."""
    for var in RANK_VARS:
        if env.get(var, "").isdigit():
            return int(env[var])
    return None


def usage(wall_s: float) -> dict:
    """This process's rusage and placement now, with the wall seconds since it started."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {"wall_s": round(wall_s, 4), "user_s": round(ru.ru_utime, 4), "system_s": round(ru.ru_stime, 4),
            "voluntary_switches": ru.ru_nvcsw, "involuntary_switches": ru.ru_nivcsw,
            "minor_faults": ru.ru_minflt, "major_faults": ru.ru_majflt, "max_rss_mb": round(ru.ru_maxrss / 1024, 1),
            "allowed_cpus": len(cpus), "first_allowed_cpu": cpus[0] if cpus else None}


def usage_rows(folder: Path) -> list[dict]:
    """Every JSON file of ``folder`` as one row (its file name's stem as ``process``), with
    the counters of ``perf stat -x,`` where its file is beside it (``<tag>-perf-rank<R>.csv``
    for ``<tag>-rank<R>.json``; a count perf could not take left empty)."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        row = {"process": path.stem, **json.loads(path.read_text())}
        perf = path.with_name(path.stem.replace("-rank", "-perf-rank") + ".csv")
        row.update(perf_counts(perf.read_text()) if perf.exists() else {})
        rows.append(row)
    return rows


def perf_counts(text: str) -> dict:
    """``perf stat -x,``'s lines (value, unit, event, ...) as {event: value}; None for a count
    it could not take (``<not supported>``, ``<not counted>``)."""
    out = {}
    for line in text.splitlines():
        fields = line.split(",")
        if line.startswith("#") or len(fields) < 3 or not fields[2]:
            continue
        try:
            out[fields[2]] = float(fields[0])
        except ValueError:
            out[fields[2]] = None
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-m" not in argv:
        raise SystemExit("bench.rank_usage: usage: --out DIR [--tag NAME] -m MODULE [ARGS...]")
    split = argv.index("-m")
    p = argparse.ArgumentParser(prog="python -m bench.rank_usage", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder the JSON file goes to (made if missing)")
    p.add_argument("--tag", default="usage", help="the file's name before -rank<R> (default usage)")
    opts = p.parse_args(argv[:split])
    if split + 1 >= len(argv):
        raise SystemExit("bench.rank_usage: -m needs a module")
    module, args = argv[split + 1], argv[split + 2:]
    rank = rank_of()
    out = Path(opts.out) / f"{opts.tag}-rank{rank or 0}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def record():  # at exit, whatever way the module ended
        row = {"module": module, "rank": rank, **usage(time.perf_counter() - t0)}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(row) + "\n")
        tmp.replace(out)
    atexit.register(record)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
