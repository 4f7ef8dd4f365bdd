"""Strong and weak scaling of the data-parallel sparse autoencoder (seed 001, Fig. 2.1-3.1).

The grid is data (bench/grid.json); the sweep that runs it is jobs/lib.sh, shared by
``sbatch jobs/sparse_scaling.sh``, the Grid Engine script and ``make bench``. This module
is the sweep's Python side::

    python -m bench.scaling points  --grid quick [--procs "1 2"] [--samples "..."] [--write RUN/grid.json --run ID]
    python -m bench.scaling eta     RUN --done K   # time left for RUN/plan.tsv after its first K points
    python -m bench.scaling collect RUN      # RUN/sweep.csv + point summaries -> RUN/strong.csv, RUN/weak.csv
    python -m bench.scaling report  RUN [--out DIR] [--md FILE]   # speedup/efficiency PNGs + scaling.md

Definitions (the paper's):

- strong: samples fixed, processes vary; speedup = t(1, S) / t(P, S), efficiency = speedup / P.
- weak: samples per process fixed at W (samples = W * P); efficiency = t(1, W) / t(P, W * P),
  speedup (scaled) = P * efficiency.

``seconds`` is the scheme's own ``total_s`` from summary.json: timed after a warm-up
and a Barrier, the slowest rank's time, written by rank 0. With several repeats of a point
the fastest is kept. Machine columns come from :func:`aepar.machine.describe`.

A sweep directory holds one run at a time: ``grid.json`` names it (``run``) and only the
rows of ``sweep.csv`` from that run are collected, each from the point directory its row
names (``dir``), so results from other runs or other parameters never mix into the tables.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRID_PATH = HERE / "grid.json"

#: The paper's Fig. 3.1, raw runtimes in seconds: {processes: {samples: seconds}} measured
#: on 1-16 Amazon EC2 t2.micro instances (one process each), 400 L-BFGS iterations.
PAPER_SECONDS = {
    1: {10000: 46.44, 20000: 103.81, 40000: 205.89, 80000: 468.89, 160000: 965.79},
    2: {10000: 25.03, 20000: 49.28, 40000: 102.85, 80000: 208.40, 160000: 475.97},
    4: {10000: 13.64, 20000: 26.32, 40000: 50.72, 80000: 103.60, 160000: 219.94},
    8: {10000: 8.67, 20000: 14.82, 40000: 27.87, 80000: 51.86, 160000: 104.26},
    16: {10000: 7.53, 20000: 10.18, 40000: 15.84, 80000: 27.80, 160000: 53.09},
}
PAPER_WEAK_PER_PROCESS = 10000

#: Per-point columns, then the machine's (aepar.machine.FIELDS) in every CSV row.
COLUMNS = ("scheme", "processes", "samples", "iterations", "evaluations", "seconds", "speedup",
           "efficiency", "seconds_per_evaluation", "seconds_compute", "seconds_compute_fastest", "seconds_comm",
           "final_cost", "dtype", "kernels", "launcher", "nodes", "oversubscribed", "repeats",
           "wall_seconds")
SUMMARY_FIELDS = ("final_cost", "iterations", "evaluations", "processes", "samples",
                  "total_s", "compute_s", "comm_s")
# Fallback: summary.json's names for its times before they took the ``_s`` suffix; a
# resumed sweep keeps the points an older aepar wrote.
OLD_SUMMARY_NAMES = {"seconds_total": "total_s", "seconds_compute": "compute_s", "seconds_comm": "comm_s",
                     "seconds_compute_per_rank": "compute_per_rank_s"}


def read_summary(path: str | os.PathLike) -> dict:
    """A point's summary.json, the older names of its times read as today's."""
    with open(path) as f:
        summary = json.load(f)
    for old, new in OLD_SUMMARY_NAMES.items():
        if old in summary and new not in summary:
            summary[new] = summary.pop(old)
    return summary


class GridError(ValueError):
    """A grid that cannot be run (unknown name, bad numbers)."""


# ---------------------------------------------------------------------------- the grid
def load_grid(name: str, path: str | os.PathLike = GRID_PATH) -> dict:
    """The grid ``name`` from grid.json (keys processes, samples, weak_samples_per_process,
    iterations)."""
    with open(path) as f:
        grids = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    if name not in grids:
        raise GridError(f"unknown grid {name!r} in {path}; choose from {', '.join(grids)}")
    return grids[name]


def _ints(text, what: str) -> list[int]:
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = str(text).replace(",", " ").split()
    try:
        values = [int(v) for v in items]
    except ValueError:
        raise GridError(f"{what} must be whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise GridError(f"{what} must be one or more positive numbers, got {text!r}")
    return sorted(set(values))


def resolve(grid: dict, procs=None, samples=None, iterations=None, weak=None) -> dict:
    """The grid with overrides applied, and its points.

    ``weak`` (samples per process) defaults to the grid's, or to the smallest of
    ``samples`` when the sample sizes were overridden (10k at 1 process in the paper).

    Returns a dict with processes, samples, weak_samples_per_process, iterations,
    strong [(P, S)], weak [(P, W*P)] and points (their union, small sample sizes first,
    then fewer processes: a sweep cut short by its time limit still has whole rows of the
    strong-scaling table, each with its one-process baseline).
    """
    processes = _ints(procs if procs else grid["processes"], "processes")
    sizes = _ints(samples if samples else grid["samples"], "samples")
    if weak:
        per = _ints(weak, "weak samples per process")[0]
    elif samples:
        per = sizes[0]
    else:
        per = int(grid["weak_samples_per_process"])
    iters = _ints(iterations if iterations else grid["iterations"], "iterations")[0]
    strong = [(p, s) for p in processes for s in sizes]
    weak_points = [(p, per * p) for p in processes]
    bad = [(p, s) for p, s in strong + weak_points if s < p]
    if bad:
        raise GridError(f"fewer samples than processes at {bad[0][1]} samples on {bad[0][0]}")
    points = sorted(set(strong) | set(weak_points), key=lambda ps: (ps[1], ps[0]))
    return {"processes": processes, "samples": sizes, "weak_samples_per_process": per,
            "iterations": iters, "strong": strong, "weak": weak_points, "points": points}


# ---------------------------------------------------------------------------- collect
def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(value, kind=float):
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def _run_id(run: Path):
    """The run RUN/grid.json names, or None (a grid written without one: every row counts)."""
    try:
        with open(run / "grid.json") as f:
            return json.load(f).get("run")
    except (OSError, ValueError):
        return None


def _this_run(run: Path) -> list[dict]:
    """RUN/sweep.csv rows of the run that RUN/grid.json names."""
    rid = _run_id(run)
    return [r for r in _read_csv(run / "sweep.csv") if rid is None or r.get("run") == rid]


def measured_points(run: str | os.PathLike) -> dict:
    """{(processes, samples): best measurement} from RUN/sweep.csv and the point dirs.

    Each measurement merges the point's summary.json with the sweep's record of how it
    was launched (threads, launcher, nodes, wall time). A point that failed or was skipped
    has no summary and is left out (collect says which); so is every row of another run.
    """
    run = Path(run)
    best: dict = {}
    for rec in _this_run(run):
        summary_path = run / (rec.get("dir") or f"points/{rec['name']}") / "summary.json"
        if rec.get("status") != "ok" or not summary_path.exists():
            continue
        summary = read_summary(summary_path)
        missing = [k for k in SUMMARY_FIELDS if k not in summary]
        if missing:
            print(f"bench.scaling: {summary_path} lacks {', '.join(missing)}; point left out",
                  file=sys.stderr)
            continue
        m = dict(summary)
        m.update(scheme=rec.get("scheme", ""), launcher=rec.get("launcher", ""),
                 nodes=_num(rec.get("nodes"), int), threads=_num(rec.get("threads"), int),
                 oversubscribed=rec.get("oversubscribed", ""),
                 wall_seconds=_num(rec.get("wall_seconds")))
        key = (int(summary["processes"]), int(summary["samples"]))
        if int(rec["processes"]) != key[0] or int(rec["samples"]) != key[1]:
            print(f"bench.scaling: {summary_path} is for {key[0]} processes x {key[1]} samples, "
                  f"the sweep asked for {rec['processes']} x {rec['samples']}; point left out",
                  file=sys.stderr)
            continue
        seconds = float(summary["total_s"])
        if not seconds > 0:
            print(f"bench.scaling: {summary_path}: total_s {seconds} is not positive; "
                  "point left out", file=sys.stderr)
            continue
        repeats = best.get(key, {}).get("repeats", 0) + 1
        if key not in best or seconds < float(best[key]["total_s"]):
            best[key] = m
        best[key]["repeats"] = repeats
    return best


def _row(m: dict, speedup, efficiency, machine: dict) -> dict:
    seconds = float(m["total_s"])
    evaluations = int(m["evaluations"])
    row = {
        "scheme": m.get("scheme", ""), "processes": int(m["processes"]),
        "samples": int(m["samples"]), "iterations": int(m["iterations"]),
        "evaluations": evaluations, "seconds": f"{seconds:.4f}",
        "speedup": "" if speedup is None else f"{speedup:.3f}",
        "efficiency": "" if efficiency is None else f"{efficiency:.3f}",
        "seconds_per_evaluation": f"{seconds / max(evaluations, 1):.6f}",
        "seconds_compute": f"{float(m['compute_s']):.4f}",
        # the fastest rank's own compute: its gap to the slowest is what each evaluation waits for
        "seconds_compute_fastest": f"{min(m['compute_per_rank_s']):.4f}" if m.get("compute_per_rank_s")
        else "",
        "seconds_comm": f"{float(m['comm_s']):.4f}",
        "final_cost": f"{float(m['final_cost']):.8g}", "dtype": m.get("dtype", ""),
        "kernels": m.get("kernels", ""), "launcher": m.get("launcher", ""),
        "nodes": m.get("nodes") or "", "oversubscribed": m.get("oversubscribed", ""),
        "repeats": m.get("repeats", 1),
        "wall_seconds": "" if m.get("wall_seconds") is None else f"{m['wall_seconds']:.2f}",
    }
    row.update(machine)
    if m.get("threads") is not None:
        row["threads"] = m["threads"]
    return row


def tables(run: str | os.PathLike, machine: dict | None = None) -> tuple[list, list]:
    """(strong rows, weak rows) for RUN, from its grid.json and measured points."""
    run = Path(run)
    with open(run / "grid.json") as f:
        grid = json.load(f)
    best = measured_points(run)
    if machine is None:
        from bench.common import machine_columns
        machine = machine_columns()
    strong = []
    for p, s in sorted(map(tuple, grid["strong"]), key=lambda ps: (ps[1], ps[0])):
        if (p, s) not in best:
            continue
        t1 = best.get((1, s))
        speedup = float(t1["total_s"]) / float(best[(p, s)]["total_s"]) if t1 else None
        strong.append(_row(best[(p, s)], speedup, None if speedup is None else speedup / p, machine))
    weak = []
    base = best.get((1, int(grid["weak_samples_per_process"])))
    for p, s in sorted(map(tuple, grid["weak"])):
        if (p, s) not in best:
            continue
        eff = float(base["total_s"]) / float(best[(p, s)]["total_s"]) if base else None
        weak.append(_row(best[(p, s)], None if eff is None else p * eff, eff, machine))
    return strong, weak


def write_csv(path: str | os.PathLike, rows: list[dict]):
    """Rows to CSV (header = COLUMNS + machine fields), written whole or not at all."""
    from aepar.machine import FIELDS

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS) + list(FIELDS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def collect(run: str | os.PathLike, machine: dict | None = None) -> tuple[list, list]:
    """Write RUN/strong.csv and RUN/weak.csv; returns (strong rows, weak rows).

    Points the sweep planned but that have no result are reported on stderr.
    """
    run = Path(run)
    strong, weak = tables(run, machine)
    write_csv(run / "strong.csv", strong)
    write_csv(run / "weak.csv", weak)
    got = {(r["processes"], r["samples"]) for r in strong + weak}
    for rec in _this_run(run):
        key = (int(rec["processes"]), int(rec["samples"]))
        if key not in got and rec.get("status") != "ok":
            print(f"bench.scaling: no result for {key[0]} processes x {key[1]} samples "
                  f"({rec.get('status')})", file=sys.stderr)
    return strong, weak


# ---------------------------------------------------------------------------- time left
def _work(p: int, s: int, iterations: int, ranks_node: int, threads: int, cores: int):
    """What a point's compute time grows with: one rank's share of the work (samples /
    processes x iterations, stretched when the node's ranks x threads exceed its cores) and
    the whole work (samples x iterations: what does not divide over the ranks)."""
    stretch = max(1.0, ranks_node * threads / max(cores, 1))
    return (s / p * iterations * stretch, float(s * iterations))


def _fit(rows: list[tuple[tuple, float]], models: tuple) -> tuple:
    """Non-negative coefficients of y = sum c_j x_j, least squares over (x, y) rows, with
    the terms of one of ``models`` (tuples of term indices, simplest first). A model with
    more terms than the rows can tell apart is not tried; the first of the best wins."""
    import numpy as np

    x = np.array([r for r, _ in rows], dtype=float)
    y = np.array([t for _, t in rows], dtype=float)
    scale = np.where(x.max(axis=0) > 0, x.max(axis=0), 1.0)
    xs = x / scale
    best = None
    for terms in models:
        if len(terms) > len(rows) or np.linalg.matrix_rank(xs[:, terms]) < len(terms):
            continue
        coef, *_ = np.linalg.lstsq(xs[:, terms], y, rcond=None)
        if (coef < 0).any():
            continue
        residual = float(((xs[:, terms] @ coef - y) ** 2).sum())
        if best is None or residual < best[0] * (1 - 1e-9) - 1e-12:
            full = np.zeros(x.shape[1])
            full[list(terms)] = coef
            best = (residual, full / scale)
    return tuple(best[1]) if best else (0.0,) * x.shape[1]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def time_left(run: str | os.PathLike, done: int) -> tuple[float, int] | None:
    """(seconds, points) still to run after the first ``done`` points of RUN/plan.tsv.

    The plan (written by the sweep: name, processes, samples, iterations, ranks on the
    busiest node, threads, cores) is this invocation's points in order. Each finished one
    (an ok row of this run in sweep.csv) splits its wall time into the scheme's own
    ``total_s`` (compute, fitted to :func:`_work`, non-negative least squares) and the
    rest (start-up: launcher, imports, data; fitted to a constant plus a term in samples),
    which price the points left. None before any point has finished.
    """
    run = Path(run)
    plan = []
    with open(run / "plan.tsv") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 7:
                plan.append((parts[0], *(int(v) for v in parts[1:])))
    measured = {}
    for r in _this_run(run):
        wall = _num(r.get("wall_seconds"))
        if r.get("status") != "ok" or wall is None:
            continue
        compute = None
        try:
            compute = _num(read_summary(run / (r.get("dir") or f"points/{r['name']}") / "summary.json").get("total_s"))
        except (OSError, ValueError):
            pass
        measured[r["name"]] = (wall, compute if compute is not None and 0 <= compute <= wall else None)
    finished = [(pt, *measured[pt[0]]) for pt in plan[:done] if pt[0] in measured]
    if not finished:
        return None
    if all(c is not None for _, _, c in finished):
        compute = _fit([(_work(*pt[1:]), c) for pt, _, c in finished], ((0,), (0, 1), (1,)))
        startup = _fit([((1.0, float(pt[2])), w - c) for pt, w, c in finished], ((0,), (0, 1)))
    else:  # no compute time from the scheme: the whole wall time as work
        compute = _fit([(_work(*pt[1:]), w) for pt, w, _ in finished], ((0,), (0, 1), (1,)))
        startup = (0.0, 0.0)
    rest = plan[done:]
    seconds = sum(startup[0] + startup[1] * pt[2] + sum(c * x for c, x in zip(compute, _work(*pt[1:])))
                  for pt in rest)
    return seconds, len(rest)


# ---------------------------------------------------------------------------- report
def _by(rows, key="samples"):
    out: dict = {}
    for r in rows:
        out.setdefault(int(r[key]), []).append(r)
    return out


def paper_speedup(p: int, s: int):
    t = PAPER_SECONDS
    return t[1][s] / t[p][s] if p in t and s in t[p] and s in t[1] else None


def plot(strong: list[dict], weak: list[dict], out_dir: str | os.PathLike) -> list[Path]:
    """speedup.png and efficiency.png (Fig. 2.1 / 2.2): measured lines per sample size,
    the paper's as dashed lines of the same colour, ideal as a grey line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    groups = _by([r for r in strong if r["speedup"] != ""])
    procs_all = sorted({int(r["processes"]) for r in strong} | set(PAPER_SECONDS))
    for metric, fname, ylabel in (("speedup", "speedup.png", "speedup t(1)/t(P)"),
                                  ("efficiency", "efficiency.png", "efficiency speedup/P")):
        fig, ax = plt.subplots(figsize=(6.4, 4.6))
        cmap = plt.get_cmap("viridis")
        sizes = sorted(set(groups) | set(PAPER_SECONDS[1]))
        for i, s in enumerate(sizes):
            color = cmap(i / max(len(sizes) - 1, 1))
            pp = [p for p in sorted(PAPER_SECONDS) if s in PAPER_SECONDS[p]]
            if s in PAPER_SECONDS[1]:
                vals = [paper_speedup(p, s) / (p if metric == "efficiency" else 1) for p in pp]
                ax.plot(pp, vals, "--", color=color, alpha=0.45, lw=1)
            if s in groups:
                rows = sorted(groups[s], key=lambda r: int(r["processes"]))
                ax.plot([int(r["processes"]) for r in rows], [float(r[metric]) for r in rows],
                        "o-", color=color, label=f"{s // 1000}k samples")
        if metric == "efficiency" and any(r["efficiency"] != "" for r in weak):
            rows = sorted((r for r in weak if r["efficiency"] != ""), key=lambda r: int(r["processes"]))
            ax.plot([int(r["processes"]) for r in rows], [float(r["efficiency"]) for r in rows],
                    "s-", color="black", label=f"weak ({int(rows[0]['samples']) // 1000}k/process)")
        ax.plot([], [], "--", color="grey", alpha=0.6, lw=1, label="paper (Fig. 2.1/2.2)")
        ideal = procs_all if metric == "speedup" else [1] * len(procs_all)
        ax.plot(procs_all, ideal, color="grey", lw=0.8, label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_xticks(procs_all)
        ax.set_xticklabels([str(p) for p in procs_all])
        ax.set_xlabel("processes")
        ax.set_ylabel(ylabel)
        ax.set_title(f"Sparse autoencoder, {metric} (solid: measured, dashed: paper)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def markdown(strong: list[dict], weak: list[dict], notes: list[str] = ()) -> str:
    """scaling.md: measured seconds beside the paper's Fig. 3.1, ratios, speedups."""
    measured = {(int(r["processes"]), int(r["samples"])): r for r in strong + weak}
    procs = sorted({p for p, _ in measured} | set(PAPER_SECONDS))
    sizes = sorted({s for _, s in measured} | set(PAPER_SECONDS[1]))
    lines = ["# Sparse autoencoder scaling: measured vs Lewis & Canann (2015) Fig. 3.1", ""]
    if strong + weak:
        r0 = (strong + weak)[0]
        lines += [f"Measured on `{r0['hostname']}`: {r0['cores']} usable cores, {r0['cpu_model']}; "
                  f"BLAS {r0['blas']} (core type {r0['blas_coretype'] or 'not reported'}); "
                  f"{r0['mpi']}; Python {r0['python']}, NumPy {r0['numpy']}, Numba {r0['numba']}; "
                  f"scheme `{r0['scheme']}`, kernels {r0['kernels']}, {r0['dtype']}, "
                  f"{r0['iterations']} L-BFGS iterations (requested from the grid).", ""]
    lines += ["The paper: 1-16 Amazon EC2 t2.micro instances (Xeon 2.5 GHz, one process each), "
              "NumPy + mpi4py, 8x8 patches, 25 hidden units, 400 iterations.", ""]
    lines += ["## Seconds (measured / paper, ratio = paper / measured)", "",
              "| processes | " + " | ".join(f"{s // 1000}k" for s in sizes) + " |",
              "| --- |" + " --- |" * len(sizes)]
    for p in procs:
        cells = []
        for s in sizes:
            paper = PAPER_SECONDS.get(p, {}).get(s)
            m = measured.get((p, s))
            if m is None:
                cells.append(f"— / {paper:.2f}" if paper else "—")
            else:
                t = float(m["seconds"])
                cells.append(f"**{t:.2f}** / {paper:.2f} ({paper / t:.1f}x)" if paper else f"**{t:.2f}**")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += ["", "## Strong scaling speedup t(1,S)/t(P,S) (measured / paper)", "",
              "| processes | " + " | ".join(f"{s // 1000}k" for s in sizes) + " |",
              "| --- |" + " --- |" * len(sizes)]
    for p in procs:
        cells = []
        for s in sizes:
            m = measured.get((p, s))
            mine = next((r["speedup"] for r in strong
                         if int(r["processes"]) == p and int(r["samples"]) == s), "")
            ps = paper_speedup(p, s)
            cells.append(f"{mine or '—'} / {ps:.2f}" if ps else (mine or "—"))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    if weak:
        per = int(weak[0]["samples"]) // int(weak[0]["processes"])
        lines += ["", f"## Weak scaling, {per} samples per process: efficiency t(1)/t(P) "
                  "(measured / paper at 10k per process)", "",
                  "| processes | samples | seconds | efficiency | paper seconds | paper efficiency |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in weak:
            p, s = int(r["processes"]), int(r["samples"])
            ps_ = PAPER_WEAK_PER_PROCESS * p
            paper = PAPER_SECONDS.get(p, {}).get(ps_)
            peff = PAPER_SECONDS[1][PAPER_WEAK_PER_PROCESS] / paper if paper else None
            lines.append(f"| {p} | {s} | {float(r['seconds']):.2f} | {r['efficiency'] or '—'} | "
                         f"{paper if paper else '—'} | {f'{peff:.3f}' if peff else '—'} |")
    over = [r for r in strong + weak if str(r.get("oversubscribed")) in ("1", "True", "true")]
    if over:
        lines += ["", "Oversubscribed points (ranks x threads > cores): "
                  + ", ".join(f"{r['processes']}x{r['samples']}" for r in over)
                  + ". Their times measure the OS scheduler as much as the scheme."]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    missing = [f"{p}x{s // 1000}k" for p in sorted(PAPER_SECONDS) for s in PAPER_SECONDS[p]
               if (p, s) not in measured]
    if missing:
        lines += ["", f"Not measured here ({len(missing)} of the paper's 25 points): "
                  + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def report(run: str | os.PathLike, out: str | os.PathLike | None = None,
           md: str | os.PathLike | None = None, notes: list[str] = (), with_plots=True) -> dict:
    """PNG plots and scaling.md for RUN's strong.csv/weak.csv. Returns the paths written."""
    run = Path(run)
    out = Path(out) if out else run
    strong, weak = _read_csv(run / "strong.csv"), _read_csv(run / "weak.csv")
    written = {}
    md_path = Path(md) if md else out / "scaling.md"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    notes = [*notes, f"Written {time.strftime('%Y-%m-%d')} from the rows of strong.csv and weak.csv."]
    md_path.write_text(markdown(strong, weak, notes))
    written["md"] = md_path
    if with_plots:
        written["plots"] = plot(strong, weak, out)
    return written


# ---------------------------------------------------------------------------- CLI
def _print_table(rows: list[dict], title: str):
    print(title)
    print(f"  {'P':>3} {'samples':>8} {'iters':>5} {'evals':>5} {'seconds':>9} {'speedup':>7} "
          f"{'eff':>6} {'thr':>3}")
    for r in rows:
        print(f"  {r['processes']:>3} {r['samples']:>8} {r['iterations']:>5} {r['evaluations']:>5} "
              f"{r['seconds']:>9} {r['speedup'] or '-':>7} {r['efficiency'] or '-':>6} {r['threads']:>3}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    pts = sub.add_parser("points", help="print the grid's points as 'processes samples iterations'")
    pts.add_argument("--grid", default="full", help="grid name in bench/grid.json (default full)")
    pts.add_argument("--grid-file", default=str(GRID_PATH))
    pts.add_argument("--procs", default="", help='override processes, e.g. "1 2 4"')
    pts.add_argument("--samples", default="", help='override sample sizes, e.g. "2000 4000"')
    pts.add_argument("--iterations", default="", help="override iterations")
    pts.add_argument("--weak", default="", help="override weak-scaling samples per process")
    pts.add_argument("--write", default="", help="also write the resolved grid (JSON) here")
    pts.add_argument("--run", default="", help="the run id recorded in the written grid")
    eta = sub.add_parser("eta", help="time left for RUN/plan.tsv after its first K points")
    eta.add_argument("run")
    eta.add_argument("--done", type=int, required=True)
    col = sub.add_parser("collect", help="RUN/points -> RUN/strong.csv, RUN/weak.csv")
    col.add_argument("run")
    col.add_argument("--quiet", action="store_true")
    rep = sub.add_parser("report", help="plots + scaling.md from RUN/strong.csv, RUN/weak.csv")
    rep.add_argument("run")
    rep.add_argument("--out", default="", help="directory for the PNGs (default RUN)")
    rep.add_argument("--md", default="", help="markdown file (default OUT/scaling.md)")
    rep.add_argument("--note", action="append", default=[], help="a line for the notes")
    rep.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)

    if args.cmd == "points":
        try:
            g = resolve(load_grid(args.grid, args.grid_file), args.procs, args.samples,
                        args.iterations, args.weak)
        except (GridError, OSError) as exc:
            print(f"bench.scaling: error: {exc}", file=sys.stderr)
            return 2
        if args.write:
            Path(args.write).parent.mkdir(parents=True, exist_ok=True)
            head = {"grid": args.grid, **({"run": args.run} if args.run else {})}
            Path(args.write).write_text(json.dumps({**head, **g}, indent=1) + "\n")
        for p, s in g["points"]:
            print(p, s, g["iterations"])
        return 0
    if args.cmd == "eta":
        try:
            left = time_left(args.run, args.done)
        except (OSError, ValueError) as exc:
            print(f"bench.scaling: error: {exc}", file=sys.stderr)
            return 2
        if left is None:
            pass  # no point has finished: nothing to go by
        elif left[1] == 0:
            print("no points left")
        else:
            print(f"about {_duration(left[0])} left ({left[1]} point{'s' if left[1] > 1 else ''})")
        return 0
    if args.cmd == "collect":
        if not (Path(args.run) / "grid.json").exists():
            print(f"bench.scaling: error: {args.run}/grid.json not found (not a sweep directory)",
                  file=sys.stderr)
            return 2
        strong, weak = collect(args.run)
        if not args.quiet:
            _print_table(strong, f"strong scaling -> {Path(args.run) / 'strong.csv'}")
            _print_table(weak, f"weak scaling -> {Path(args.run) / 'weak.csv'}")
        return 0 if strong or weak else 1
    written = report(args.run, args.out or None, args.md or None, args.note, not args.no_plots)
    for path in [written["md"], *written.get("plots", [])]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
