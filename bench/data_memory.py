"""A rank's memory for the data: ``--data X.npy`` under the data-parallel schemes, on 1, 2, 4 ranks.

Writes a synthetic float32 ``.npy`` of ``--gb`` gigabytes (a size benchmark: the values do
not matter) into a temporary directory, then under ``mpirun -np P`` every rank does what
``python -m aepar.pretrain --scheme data --data X.npy`` does before its first step:
aepar's reader (:func:`aepar.data.files.load_user`: memory map, split by seed, rank 0
scans for NaN/Inf) and the data scheme's sharding (:class:`aepar.rows.Shard` of the
training rows, one block per rank, and of the test rows it watches). Each rank records
its peak resident memory (``VmHWM``; the mapped file pages it touched count too) before
and after. A reference row reads the whole file on every rank (``np.load``) and shards
it, which is what a reader without memory maps costs.

Rows go to ``bench/results/data_memory.csv`` (with the machine columns) and a short
``data_memory.md``; ``make bench-memory``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine_columns, mpi_env, python_command, with_machine, write_rows

RESULTS = Path(__file__).parent / "results"
WIDTH = 1000  # float32 values per row: 4 kB rows


def _status() -> dict:
    """VmHWM, VmRSS, RssAnon, RssFile of this process, in MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def worker(path: str, mode: str):
    """One rank: read and shard as the data scheme does; rank 0 prints every rank's record."""
    from aepar import backend
    from aepar.comm import world
    from aepar.data.files import load_user
    from aepar.rows import Shard

    comm = world()
    be = backend.select("cpu", "numpy", "float32")
    before = _status()
    t0 = time.perf_counter()
    if mode == "own":
        digits = load_user(path, seed=0, dtype=np.float32, check=comm.is_root)
        train_x, test_x = digits.train_x, digits.test_x
    else:  # every rank holds the whole file, then takes its rows
        whole = np.load(path)
        train_x, test_x = whole[: int(len(whole) * 0.8)], whole[int(len(whole) * 0.8):]
    train = Shard.of(be, train_x, comm.size, comm.rank, comm.size)  # aepar.schemes.data.pretrain
    watch = Shard.of(be, test_x, comm.size, comm.rank, comm.size)
    checksum = float(train.x[:, 0].sum()) + float(watch.x[:, 0].sum())  # the rows were really read
    seconds = time.perf_counter() - t0
    after = _status()
    record = {"rank": comm.rank, "shard_rows": int(train.x.shape[0] + watch.x.shape[0]),
              "shard_mib": (train.x.nbytes + watch.x.nbytes) / 2 ** 20, "start_hwm_mib": before["VmHWM"],
              "peak_hwm_mib": after["VmHWM"], "rss_anon_mib": after["RssAnon"], "rss_file_mib": after["RssFile"],
              "read_s": seconds, "checksum": checksum}
    records = comm.gather(record)
    if comm.is_root:
        print("RECORDS " + json.dumps(records), flush=True)


def make_file(directory: Path, gb: float) -> Path:
    """A float32 (N, WIDTH) .npy of ``gb`` GB, written a slab at a time."""
    n = int(gb * 1e9) // (WIDTH * 4) + 1
    path = directory / "x.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, WIDTH))
    rng = np.random.default_rng(0)
    step = 1 << 15
    for lo in range(0, n, step):
        out[lo:lo + step] = rng.random((min(step, n - lo), WIDTH), dtype=np.float32)
    out.flush()
    del out
    return path


def measure(path: Path, ranks: int, mode: str) -> list[dict]:
    cmd = python_command("bench.data_memory", ["--worker", path, "--mode", mode], ranks=ranks)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(AEPAR_THREADS=1),
                          cwd=Path(__file__).parent.parent)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RECORDS ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"bench.data_memory: {' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return [dict(r, mode=mode, ranks=ranks) for r in json.loads(line[len("RECORDS "):])]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.data_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=2.0, help="size of the generated .npy (default 2 GB)")
    p.add_argument("--ranks", default="1,2,4", help="rank counts (default 1,2,4; oversubscribed past the cores)")
    p.add_argument("--whole-ranks", default="2", help="rank counts of the whole-file reference (default 2; '' none)")
    p.add_argument("--out", default=str(RESULTS), help="where the CSV and .md go (default bench/results)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="own", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.mode)
    started = time.strftime("%Y-%m-%d %H:%M")
    rows = []
    with tempfile.TemporaryDirectory(prefix="aepar-data-memory-") as tmp:
        path = make_file(Path(tmp), args.gb)
        size = path.stat().st_size
        n = np.load(path, mmap_mode="r").shape[0]
        plan = [("own", int(r)) for r in args.ranks.split(",") if r] + \
               [("whole", int(r)) for r in args.whole_ranks.split(",") if r]
        for mode, ranks in plan:
            for r in measure(path, ranks, mode):
                rows.append({"benchmark": "data_memory", "mode": mode, "ranks": ranks, "rank": r["rank"],
                             "file_bytes": size, "rows": n, "width": WIDTH, "dtype": "float32",
                             "shard_rows": r["shard_rows"], "shard_mib": r["shard_mib"],
                             "start_hwm_mib": r["start_hwm_mib"], "peak_hwm_mib": r["peak_hwm_mib"],
                             "data_peak_mib": r["peak_hwm_mib"] - r["start_hwm_mib"],
                             "rss_anon_mib": r["rss_anon_mib"], "rss_file_mib": r["rss_file_mib"],
                             "read_s": r["read_s"]})
                print(f"{mode:5s} {ranks} rank(s), rank {r['rank']}: peak {r['peak_hwm_mib']:.0f} MiB "
                      f"(start {r['start_hwm_mib']:.0f}), shard {r['shard_mib']:.0f} MiB", flush=True)
    machine = machine_columns()
    out = Path(args.out)
    write_rows(out / "data_memory.csv", with_machine(rows, machine))
    _markdown(out / "data_memory.md", rows, machine, started, size, n, argv)
    print(f"wrote {out / 'data_memory.csv'} and {out / 'data_memory.md'}")


def _markdown(path: Path, rows, machine, started, size, n, argv):
    lines = ["# A rank's memory for the data (bench/data_memory.py)", "",
             f"Machine: {machine['cpu_model']} ({machine['isa']}), {machine['cores']} cores, {machine['blas']}; "
             f"{started}.", "",
             f"Command: `{' '.join(['python -m bench.data_memory', *(argv or sys.argv[1:])])}` (`make bench-memory`): a "
             f"float32 .npy of {size / 1e9:.2f} GB ({n} rows of {WIDTH}) read by aepar's reader (memory map, "
             "split 80/20 by seed, rank 0 scans for NaN/Inf) and sharded as `--scheme data` shards it (one block "
             "of the training rows and of the test rows per rank). Peak = VmHWM after the read, which counts "
             "the mapped file pages the rank touched as well as its copy of the rows; start = VmHWM before.", "",
             "| reader | ranks | rank | rows held | held (MiB) | peak (MiB) | peak - start (MiB) | "
             "seconds |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        reader = "aepar (--data, memory map)" if r["mode"] == "own" else "whole file on every rank (np.load)"
        lines.append(f"| {reader} | {r['ranks']} | {r['rank']} | {r['shard_rows']} | {r['shard_mib']:.0f} | "
                     f"{r['peak_hwm_mib']:.0f} | {r['data_peak_mib']:.0f} | {r['read_s']:.2f} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
