"""bench/results/peers.csv: the side-by-side rows of every peer benchmark in one file.

Each benchmark names itself in the ``benchmark`` column; writing its rows replaces only
its own earlier rows from the same host, CPU and code path (ISA Numba compiled for, OpenBLAS
core type), and the columns of all benchmarks are
kept (a row lacking one leaves it empty).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

__all__ = ["merge_rows", "write_rows", "KEY"]

KEY = ("hostname", "cpu_model", "isa", "blas_coretype")


def merge_rows(rows: list[dict], path, benchmark: str, *, legacy: bool = False, key=KEY) -> None:
    """Write ``rows`` (each gets ``benchmark``) into the CSV at ``path``, replacing that
    benchmark's earlier rows from the same machine and code path (:data:`KEY`, or the columns
    ``key`` names: a benchmark of several shapes adds them). ``legacy``: rows with
    no benchmark name (written before the column existed) count as this benchmark's."""
    path = Path(path)
    rows = [{"benchmark": benchmark, **r} for r in rows]
    old, fields = [], ["benchmark"]
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields += [k for k in (reader.fieldnames or []) if k not in fields]
            old = list(reader)
    mine = {tuple(str(r.get(k) or "") for k in key) for r in rows}
    ours = {benchmark, ""} if legacy else {benchmark}
    old = [r for r in old if not ((r.get("benchmark") or "") in ours and tuple(r.get(k) or "" for k in key) in mine)]
    for r in rows:
        fields += [k for k in r if k not in fields]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        w.writeheader()
        for r in old + rows:
            w.writerow(r)
    os.replace(tmp, path)


def write_rows(path, rows: list[dict], *, digits: int = 6) -> Path:
    """``rows`` to the CSV at ``path``, replacing it: every key as a column, in the order
    they first appear; floats to ``digits`` significant digits."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.{digits}g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path
