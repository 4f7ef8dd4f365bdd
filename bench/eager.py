"""Bhargava & Surana's study of eagerly trained parallel CAEs, in one command: the real
``python -m aepar.eager`` runs, aggregated over seeds, with every row's machine.

Stages (each runs the real command line under mpirun; figures are read back from the runs'
summary.json, never typed in):

- ``small``: ``--preset small --curve`` (the embedded 5,000 MNIST digits pooled and split
  3,600 / 900 / 500 by the seed; 5 CAEs of 16-32 filters for 10 epochs against one of
  80-160 filters, up to 20 epochs, patience 2), classified after every epoch, for each of
  ``--seeds`` (the paper averaged three runs);
- ``large``: ``--preset full`` (Fashion-MNIST 48k / 12k, 10k test; ``make fashion``)
  for each of ``--large-seeds``; on a small machine cut it with ``--large-epochs``,
  ``--large-mono-epochs`` and ``--large-curve 1,2,5`` (the monolithic CAE on 48k images
  costs minutes per epoch on 2 cores);
- ``cifar``: the large regime's options on CIFAR-10 when its python batches are in
  ``--data-dir`` (else skipped, with a note in the study).

    python -m bench.eager [--stages small,large,cifar] [--seeds 0,1,2] [--large-seeds 0]
                          [--large-epochs 5] [--large-mono-epochs 5] [--large-curve 1,2,3,5]
                          [--work DIR]

Writes bench/results/eager_{small,large,cifar}.csv (one row per seed x epoch x method:
parallel combined, parallel vote, monolithic; accuracies where the run classified that
epoch; the run's machine and date: a run reused from --work keeps its own),
eager_study.md (mean ± spread over seeds per epoch, and a verdict per regime computed from
those numbers), eager_{regime}_accuracy.png (the paper's Figures 8b/9b),
eager_{regime}_loss.png (Figure 9a / 8a) and eager_{regime}_reconstructions.png (one run's,
Figures 6-7).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
from pathlib import Path

from bench import common

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FASHION = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist (`make fashion`)
METHODS = (("parallel", "parallel, codes combined"), ("vote", "parallel, vote"), ("mono", "monolithic"))
LOW_EPOCHS = (1, 2, 3)  # "low epochs" for the verdicts
CONVERGED_POINTS = 1.0  # |parallel - monolithic| at the last epoch within this many points: "converged"


def machine_columns(summary: dict) -> dict:
    """The machine the run itself recorded (aepar.machine.describe in the run), or this one."""
    from aepar.machine import FIELDS

    m = summary.get("machine") or common.machine_columns()
    return {k: m.get(k) for k in FIELDS}


# ---- running -------------------------------------------------------------------------------------
def launch(args_list, np_, work: Path, name: str, threads: int, records: common.Records = common.Records("bench.eager")
           ) -> tuple[dict, dict]:
    """Run ``python -m aepar.eager args --out work/name`` on ``np_`` ranks (or read back an
    earlier run of the same name: from ``work``, else from ``records``); its summary.json and
    how it was launched. A finished run is recorded in ``records``."""
    out = work / name
    meta_path = work / f"{name}.launch.json"
    if (out / "summary.json").exists():
        print(f"bench.eager: {name}: reusing {out}", flush=True)
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"command": "(unknown)", "wall_s": None}
        if not meta.get("date"):
            meta["date"] = run_date(out)
        summary = json.loads((out / "summary.json").read_text())
        records.keep_if_new(name, args_list, np_, summary, meta)
        return summary, meta
    record = records.read(name, args_list, np_)
    if record is not None:
        return record["summary"], record["launch"]
    continued = out.exists()  # an earlier call's run, stopped: it goes on from its checkpoint
    work.mkdir(parents=True, exist_ok=True)
    env = common.mpi_env(AEPAR_THREADS=threads)
    cmd = common.python_command("aepar.eager", [*args_list, "--out", out, "--resume-or-start"], np_)
    shown = f"AEPAR_THREADS={threads} " + " ".join(cmd)
    print(f"bench.eager: {name}: {'continuing: ' if continued else ''}{shown}", flush=True)
    t0 = time.time()
    common.run_to_end("bench.eager", name, cmd, out, env, REPO)
    wall = None if continued else time.time() - t0  # a continued run's stretches are not all timed here
    meta = {"command": shown, "wall_s": wall, "date": time.strftime("%Y-%m-%d %H:%M")}
    meta_path.write_text(json.dumps(meta, indent=1))
    print(f"bench.eager: {name}: done" + (f" in {wall:.0f}s" if wall is not None else ""), flush=True)
    summary = json.loads((out / "summary.json").read_text())
    records.keep(name, args_list, np_, summary, meta)
    return summary, meta


def run_date(out: Path) -> str:
    """When the run in ``out`` finished, as launch() records it ("%Y-%m-%d %H:%M", local
    time): its own run.json's last update, else its summary.json's modification time."""
    import datetime

    try:
        marker = json.loads((out / "run.json").read_text())
        when = datetime.datetime.fromisoformat(marker.get("updated") or marker["started"]).astimezone()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        when = datetime.datetime.fromtimestamp((out / "summary.json").stat().st_mtime)
    return when.strftime("%Y-%m-%d %H:%M")


# ---- one run -> rows -----------------------------------------------------------------------------
def run_rows(regime: str, s: dict) -> list[dict]:
    """One row per epoch trained and method; accuracies where the run classified that epoch
    (its --curve epochs and its final pick)."""
    from aepar.parallel.ensemble import models_of
    from aepar.schemes.eager import current_record

    rec = {n: current_record(r) for n, r in s["records"].items()}  # a reused older run: its older names too
    names = sorted(n for n in rec if n != "mono")
    K, groups = s["models"], s["groups"]
    curve = {c["epoch"]: c for c in s.get("curve", [])}
    final = s["final"]
    machine = machine_columns(s)
    base = dict(regime=regime, dataset=s["source"].split(":")[0].split(",")[0], seed=s["seed"],
                n_train=s["n_train"], n_validation=s["n_validation"], n_test=s["n_test"], ranks=s["ranks"],
                models=K, filters="-".join(map(str, s["filters"])), mono_filters="-".join(map(str, s["mono_filters"])))
    rows = []
    longest = max(len(rec[n]["epochs"]) for n in names)
    for e in range(1, longest + 1):
        picks = {n: min(e, len(rec[n]["epochs"])) for n in names}
        losses = [rec[n]["epochs"][picks[n] - 1]["val_loss"] for n in names]
        train_s = max(sum(rec[f"model{m}"]["epochs"][picks[f"model{m}"] - 1]["cum_s"]
                          for m in models_of(g, K, groups)) for g in range(groups))
        c = curve.get(e)
        if c is None and final["picked_epochs"] == picks:
            c = final
        for method in ("parallel", "vote"):
            row = dict(base, epoch=e, method=method, validation_loss=sum(losses) / len(losses),
                       validation_loss_min=min(losses), validation_loss_max=max(losses), train_s=train_s,
                       validation_accuracy=None, test_accuracy=None, effective_s=None)
            key = "combined" if method == "parallel" else "vote"
            if c is not None and key in c:
                row.update(validation_accuracy=c[key]["validation"], test_accuracy=c[key]["test"],
                           effective_s=train_s + c[key]["time_s"])
            rows.append(dict(row, **machine))
    if "mono" in rec:
        for e, ep in enumerate(rec["mono"]["epochs"], start=1):
            row = dict(base, epoch=e, method="mono", validation_loss=ep["val_loss"], validation_loss_min=ep["val_loss"],
                       validation_loss_max=ep["val_loss"], train_s=ep["cum_s"], validation_accuracy=None,
                       test_accuracy=None, effective_s=None)
            c = curve.get(e)
            m = c["mono"] if c is not None and "mono" in c and c["mono"]["epoch"] == e else None
            if m is None and final.get("mono", {}).get("epoch") == e:
                m = final["mono"]
            if m is not None:
                row.update(validation_accuracy=m["validation"], test_accuracy=m["test"], effective_s=m["effective_s"])
            rows.append(dict(row, **machine))
    return rows


def write_csv(rows, path: Path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


# ---- aggregation -----------------------------------------------------------------------------------
def stats(values):
    """(mean, low, high, n) of the values that are not None; None when there are none."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return sum(v) / len(v), min(v), max(v), len(v)


def by_epoch(rows, method, key):
    """epoch -> stats over seeds of ``key`` for ``method``."""
    out = {}
    for e in sorted({r["epoch"] for r in rows if r["method"] == method}):
        st = stats([r[key] for r in rows if r["method"] == method and r["epoch"] == e])
        if st is not None:
            out[e] = st
    return out


def ms(st, scale=1.0, digits=2) -> str:
    """mean ± half the range over seeds (the band in the figures)."""
    if st is None:
        return "–"
    mean, lo, hi, n = st
    if n == 1:
        return f"{scale * mean:.{digits}f}"
    return f"{scale * mean:.{digits}f} ± {scale * (hi - lo) / 2:.{digits}f}"


def final_rows(rows, method):
    """Per seed, the method's last classified epoch (parallel: its last epoch; monolithic:
    the epoch its patience stopped it at, or its cap)."""
    out = {}
    for r in rows:
        if r["method"] == method and r["validation_accuracy"] is not None:
            if r["seed"] not in out or r["epoch"] > out[r["seed"]]["epoch"]:
                out[r["seed"]] = r
    return out


def gaps(rows, epoch, method="parallel"):
    """Per seed: ``method`` (parallel combined or vote) minus monolithic validation accuracy at
    ``epoch`` (points)."""
    acc = {(r["seed"], r["method"]): r["validation_accuracy"] for r in rows
           if r["epoch"] == epoch and r["validation_accuracy"] is not None}
    seeds = sorted({s for s, _ in acc})
    return [100 * (acc[(s, method)] - acc[(s, "mono")]) for s in seeds if (s, method) in acc and (s, "mono") in acc]


def timed_gaps(rows) -> dict:
    """Per monolithic epoch 1-3: parallel combined minus monolithic validation accuracy at the
    same effective wall time (the parallel curve interpolated linearly in time between its
    classified epochs; a seed whose parallel curve does not reach that time is left out)."""
    out = {}
    for e in LOW_EPOCHS:
        g = []
        for seed in sorted({r["seed"] for r in rows}):
            m = [r for r in rows if r["seed"] == seed and r["method"] == "mono" and r["epoch"] == e
                 and r["validation_accuracy"] is not None]
            par = sorted((r["effective_s"], r["validation_accuracy"]) for r in rows if r["seed"] == seed
                         and r["method"] == "parallel" and r["validation_accuracy"] is not None)
            if not m or not par:
                continue
            t = m[0]["effective_s"]
            for (t0, a0), (t1, a1) in zip(par, par[1:]):
                if t0 <= t <= t1:
                    a = a0 + (a1 - a0) * (t - t0) / (t1 - t0) if t1 > t0 else a1
                    g.append(100 * (a - m[0]["validation_accuracy"]))
                    break
        if g:
            out[e] = g
    return out


def verdict(rows) -> dict:
    """The numbers behind the verdicts: gaps (points, parallel combined − monolithic,
    validation accuracy) at the low epochs and at each method's last epoch."""
    low = {e: gaps(rows, e) for e in LOW_EPOCHS}
    low = {e: g for e, g in low.items() if g}
    fp, fm = final_rows(rows, "parallel"), final_rows(rows, "mono")
    last = [100 * (fp[s]["validation_accuracy"] - fm[s]["validation_accuracy"]) for s in sorted(fp) if s in fm]
    common = sorted({r["epoch"] for r in rows if r["method"] == "parallel" and r["validation_accuracy"] is not None}
                    & {r["epoch"] for r in rows if r["method"] == "mono" and r["validation_accuracy"] is not None})
    last_common = common[-1] if common else None
    out = {"low": low, "last": last, "last_common": last_common,
           "last_common_gaps": gaps(rows, last_common) if last_common else [],
           "final_epochs": ({s: fp[s]["epoch"] for s in fp}, {s: fm[s]["epoch"] for s in fm})}
    out["timed"] = timed_gaps(rows)
    out["vote_low"] = {e: g for e in LOW_EPOCHS if (g := gaps(rows, e, "vote"))}
    means = [sum(g) / len(g) for g in low.values()]
    out["ahead_low"] = bool(means) and all(m > 0 for m in means)
    out["low_mean"] = sum(means) / len(means) if means else None
    out["last_mean"] = sum(last) / len(last) if last else None
    out["converged"] = out["last_mean"] is not None and abs(out["last_mean"]) <= CONVERGED_POINTS
    out["narrowed"] = (out["low_mean"] is not None and out["last_mean"] is not None
                       and abs(out["last_mean"]) < abs(out["low_mean"]))
    return out


def _g(g):
    if not g:
        return "–"
    mean = sum(g) / len(g)
    return f"{mean:+.2f}" + (f" (seeds {min(g):+.2f} to {max(g):+.2f})" if len(g) > 1 else "")


# ---- figures ------------------------------------------------------------------------------------------
def _band(ax, rows, method, xkey, ykey, scale, **style):
    """Mean line and min-max band over seeds at each epoch; x is the seeds' mean ``xkey``."""
    pts = []
    for e in sorted({r["epoch"] for r in rows if r["method"] == method}):
        sel = [r for r in rows if r["method"] == method and r["epoch"] == e and r[ykey] is not None
               and (xkey == "epoch" or r[xkey] is not None)]
        if not sel:
            continue
        ys = [scale * r[ykey] for r in sel]
        x = e if xkey == "epoch" else sum(r[xkey] for r in sel) / len(sel)
        pts.append((x, sum(ys) / len(ys), min(ys), max(ys)))
    if not pts:
        return
    x, m, lo, hi = zip(*pts)
    line, = ax.plot(x, m, marker="o", ms=3, **style)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)


STYLE = {"parallel": dict(color="tab:blue", label="5 parallel CAEs, codes combined"),
         "vote": dict(color="tab:orange", ls="--", label="5 parallel CAEs, vote"),
         "mono": dict(color="black", label="monolithic CAE")}


def stamp(rows) -> str:
    """Where, when and how the runs behind ``rows`` were measured, for a figure's title."""
    cpus = sorted({r["cpu_model"] for r in rows if r.get("cpu_model")}) or ["an unrecorded machine"]
    command = " ".join(["python -m bench.eager", *sys.argv[1:]])
    return f"{' / '.join(cpus)}, {common.dates_text([r.get('date') for r in rows])}\n`{command}`"


def figures(rows, regime, title, n_seeds):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("bench.eager: no matplotlib: figures skipped", flush=True)
        return []
    band = f"mean over {n_seeds} seeds, band min-max" if n_seeds > 1 else "1 seed"
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for method, _ in METHODS:
        for ax, xkey in zip(axes, ("epoch", "effective_s")):
            _band(ax, rows, method, xkey, "validation_accuracy", 100, **STYLE[method])
    axes[0].set_xlabel("epoch")
    axes[1].set_xlabel("effective wall time (s): slowest rank's training + classifier")
    for ax in axes:
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}: classification accuracy on the CAEs' codes ({band})\n{stamp(rows)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / f"eager_{regime}_accuracy.png", dpi=110)
    plt.close(fig)
    written.append(f"eager_{regime}_accuracy.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in ("parallel", "mono"):
        style = dict(STYLE[method])
        if method == "parallel":
            style["label"] = "5 parallel CAEs (mean of the models)"
        for ax, xkey in zip(axes, ("epoch", "train_s")):
            _band(ax, rows, method, xkey, "validation_loss", 1.0, **style)
    axes[0].set_xlabel("epoch")
    axes[1].set_xlabel("training wall time (s): slowest rank")
    for ax in axes:
        ax.set_ylabel("validation loss (squared error per image, log)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}: reconstruction loss ({band})\n{stamp(rows)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / f"eager_{regime}_loss.png", dpi=110)
    plt.close(fig)
    written.append(f"eager_{regime}_loss.png")
    return written


# ---- the study -----------------------------------------------------------------------------------------
def regime_section(regime, title, rows, runs, options) -> tuple[list[str], dict]:
    seeds = sorted({r["seed"] for r in rows})
    v = verdict(rows)
    r0 = rows[0]
    lines = [f"## {title}", "",
             f"{r0['dataset']}: {r0['n_train']} train / {r0['n_validation']} validation / {r0['n_test']} test images; "
             f"{r0['models']} parallel CAEs of {r0['filters']} filters against one of {r0['mono_filters']}; "
             f"{r0['ranks']} ranks; seeds {', '.join(map(str, seeds))}; options `{options}`.", "",
             "Validation accuracy (%) of a softmax regression on the codes after each epoch "
             + ("(mean ± half the min-max range over the seeds; " if len(seeds) > 1 else "(one seed; ")
             + "gap = parallel combined − monolithic, points); validation loss = squared error per image "
               "(parallel: mean of the 5 models); times in seconds (effective: slowest rank's training + "
               "the classifier; the paper's count).", "",
             "| epoch | parallel, combined | parallel, vote | monolithic | gap | test: parallel | test: monolithic "
             "| val. loss parallel | val. loss monolithic | effective s parallel | effective s monolithic |",
             "| ---: | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    acc = {m: by_epoch(rows, m, "validation_accuracy") for m, _ in METHODS}
    test = {m: by_epoch(rows, m, "test_accuracy") for m in ("parallel", "mono")}
    loss = {m: by_epoch(rows, m, "validation_loss") for m in ("parallel", "mono")}
    eff = {m: by_epoch(rows, m, "effective_s") for m in ("parallel", "mono")}
    epochs = sorted(set(acc["parallel"]) | set(acc["mono"]))
    for e in epochs:
        g = gaps(rows, e)
        gap = ("+" if stats(g)[0] >= 0 else "") + ms(stats(g)) if g else "–"
        lines.append(f"| {e} | {ms(acc['parallel'].get(e), 100)} | {ms(acc['vote'].get(e), 100)} | "
                     f"{ms(acc['mono'].get(e), 100)} | {gap} | "
                     f"{ms(test['parallel'].get(e), 100)} | {ms(test['mono'].get(e), 100)} | "
                     f"{ms(loss['parallel'].get(e))} | {ms(loss['mono'].get(e))} | "
                     f"{ms(eff['parallel'].get(e), digits=1)} | {ms(eff['mono'].get(e), digits=1)} |")
    unclassified = sorted({r["epoch"] for r in rows} - set(epochs))
    if unclassified:
        lines += ["", f"Epoch{'s' if len(unclassified) > 1 else ''} {', '.join(map(str, unclassified))} "
                      f"{'were' if len(unclassified) > 1 else 'was'} trained but not classified "
                      "(their losses are in the CSV and the loss figure)."]
    fp, fm = v["final_epochs"]
    lines += ["", "Each method at its last epoch (parallel: the epochs it trains; monolithic: stopped by "
                  "patience or its cap): " + "; ".join(
                      f"seed {s}: parallel epoch {fp[s]}, monolithic epoch {fm.get(s, '–')}" for s in sorted(fp)) + ".",
              ""]
    fin = {m: stats([r["validation_accuracy"] for r in final_rows(rows, m).values()]) for m, _ in METHODS}
    fin_t = {m: stats([r["test_accuracy"] for r in final_rows(rows, m).values()]) for m, _ in METHODS}
    fin_e = {m: stats([r["effective_s"] for r in final_rows(rows, m).values()]) for m, _ in METHODS}
    lines += ["| at its last epoch | validation acc. (%) | test acc. (%) | effective s |", "| --- | --- | --- | --- |"]
    for m, label in METHODS:
        lines.append(f"| {label} | {ms(fin[m], 100)} | {ms(fin_t[m], 100)} | {ms(fin_e[m], digits=1)} |")
    lines += ["", "Runs (wall time of the whole command, start-up and every classification included):", ""]
    for name, meta in runs:
        wall = f"{meta['wall_s']:.0f} s" if meta.get("wall_s") is not None else "time unknown (reused or continued)"
        lines.append(f"- `{name}`: {wall}, run {meta.get('date') or 'on an unknown date'}"
                     + (f" on {meta['machine']}" if meta.get("machine") else ""))
    lines.append("")
    return lines, v


def verdict_lines(title, v, regime) -> list[str]:
    low = "; ".join(f"epoch {e}: {_g(g)}" for e, g in v["low"].items()) or "no epoch 1-3 classified for both"
    last = _g(v["last"])
    ahead = "holds" if v["ahead_low"] else "does not hold"
    conv = "holds" if v["converged"] else "does not hold"
    lines = [f"**{title}.** Gap in validation accuracy, parallel combined − monolithic (points, mean over seeds): "
             f"{low}; at each method's last epoch {last}.", "",
             f"- *Parallel ahead of monolithic at low epochs* (mean gap > 0 at every classified epoch of 1-3): "
             f"**{ahead}**.",
             "- At equal effective wall time (parallel interpolated at the monolithic CAE's epoch-1/2/3 times; "
             "not the paper's wording, which compares epochs): " + ("; ".join(
                 f"monolithic epoch {e}: {_g(g)}" for e, g in v["timed"].items()) or "no overlap") + ".",
             "- The vote of the per-model classifiers instead of the combined codes, vote − monolithic: " + (
                 "; ".join(f"epoch {e}: {_g(g)}" for e, g in v["vote_low"].items()) or "–") + ".",
             f"- At the last epoch both were classified after (epoch {v['last_common']}): "
             f"{_g(v['last_common_gaps'])}.",
             f"- *The two converged by the last epoch* (|mean gap| ≤ {CONVERGED_POINTS:g} point at each method's last "
             f"epoch): **{conv}**" + (f"; the gap {'narrowed' if v['narrowed'] else 'did not narrow'} from "
                                     f"{v['low_mean']:+.2f} (mean over epochs 1-3) to {v['last_mean']:+.2f}."
                                     if v["low_mean"] is not None and v["last_mean"] is not None else "."), ""]
    return lines


def study(sections, verdicts, notes, args, dates=(), machines=()):
    """eager_study.md; ``dates``: the runs' own (a reused run keeps the date it ran on);
    ``machines``: the CPUs they ran on, when some were read back from records (default this
    machine)."""
    m = common.machine_columns()
    here = f"{m['cpu_model']} ({m['isa']}), {m['cores']} cores, BLAS {m['blas']}, {m['mpi']}"
    machines = {cpu for cpu in machines if cpu}
    where = (f"Machine: {here}" if not machines - {m["cpu_model"]} else
             "Machines (each run's is listed under its regime): " + "; ".join(sorted(machines)))
    lines = ["# Eager training of parallel CAEs: the study (Bhargava & Surana, Sections 5-6)", "",
             f"{where}; {args.np} ranks x {threads_per_rank(args.np)} thread(s); "
             f"measured {common.dates_text(dates)} by "
             f"`python -m bench.eager {' '.join(sys.argv[1:])}`.".replace(" `.", "`."), "",
             "The paper's claim: with little data the parallel CAEs, stopped eagerly, classify better than the "
             "monolithic CAE (K times the filters) at low epochs; with more data (or more epochs) the two converge. "
             "Every number below is read from the runs' summary.json by bench/eager.py; the verdicts are computed "
             "from them.", "", "## Verdicts", ""]
    small_low = verdicts.get("small", {}).get("low_mean")
    for regime, title, v in [(r, t, verdicts[r]) for r, t in (("small", "Small regime (MNIST digits, 3,600 train)"),
                                                               ("large", "Large regime (Fashion-MNIST, 48k train)"),
                                                               ("cifar", "CIFAR-10")) if r in verdicts]:
        lines += verdict_lines(title, v, regime)
        if regime == "small":
            lines += [f"Small regime: the paper's claim (parallel ahead at low epochs with little data) "
                      f"**{'holds' if v['ahead_low'] else 'does not hold'}** here.", ""]
        elif regime == "large":
            more = ""
            if small_low is not None and v["low_mean"] is not None:
                smaller = abs(v["low_mean"]) < abs(small_low)
                more = (f" The low-epoch gap is {'smaller' if smaller else 'not smaller'} than in the small regime "
                        f"({v['low_mean']:+.2f} against {small_low:+.2f} points).")
            lines += [f"Large regime: the paper's claim (with more data the two converge) "
                      f"**{'holds' if v['converged'] else 'does not hold'}** here.{more}", ""]
    for n in notes:
        lines += [n, ""]
    for sec in sections:
        lines += sec
    (RESULTS / "eager_study.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def threads_per_rank(np_):
    from aepar._threads import usable_cores

    env = os.environ.get("AEPAR_THREADS")
    return int(env) if env else max(1, usable_cores() // np_)


def run_regime(name, preset_args, seeds, args, work, extra_name="", records=common.Records("bench.eager")):
    """Every seed's run of one regime, launched or read back from ``work`` or ``records``:
    (rows, runs); each run's launch record names the machine it ran on."""
    rows, runs = [], []
    for seed in seeds:
        run_name = f"{name}-seed{seed}{extra_name}"
        s, meta = launch([*preset_args, "--seed", seed], args.np, work, run_name, threads_per_rank(args.np), records)
        rows += [dict(row, date=meta.get("date")) for row in run_rows(name, s)]
        runs.append((run_name, dict(meta, machine=machine_columns(s)["cpu_model"])))
    return rows, runs


def publish_regime(name, title, preset_args, seeds, work, rows, runs, extra_name=""):
    """One regime's CSV, figures and study section (lines, verdict, the runs' dates)."""
    # one run's reconstructions: the first seed run here (a run read back from a record has none)
    for src in (work / f"{name}-seed{seed}{extra_name}" / "reconstructions.png" for seed in seeds):
        if src.exists():
            shutil.copyfile(src, RESULTS / f"eager_{name}_reconstructions.png")
            break
    write_csv(rows, RESULTS / f"eager_{name}.csv")
    figures(rows, name, title, len(seeds))
    options = " ".join(map(str, preset_args))
    lines, v = regime_section(name, title, rows, runs, options)
    return lines, v, [meta.get("date") for _, meta in runs]


def _ints(text):
    return [int(t) for t in text.split(",") if t]


def main(argv=None) -> int:
    global RESULTS
    ap = argparse.ArgumentParser(prog="python -m bench.eager", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--stages", default="small,large,cifar", help="any of small,large,cifar (default all)")
    ap.add_argument("--np", type=int, default=2, help="ranks of every run (default 2)")
    ap.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="seeds of the small regime (default 0,1,2)")
    ap.add_argument("--large-seeds", type=_ints, default=[0, 1, 2],
                    help="seeds of the large regime and CIFAR-10 (default 0,1,2)")
    ap.add_argument("--large-epochs", type=int, default=None, help="epochs of the parallel CAEs (default the "
                                                                   "preset's 10)")
    ap.add_argument("--large-mono-epochs", type=int, default=None,
                    help="most epochs of the monolithic CAE (default the preset's 10)")
    ap.add_argument("--large-curve", default="all",
                    help="epochs to classify after, 'all' or like 1,2,5 (default all); the last epoch is "
                         "classified anyway (the run's final pick)")
    ap.add_argument("--data-dir", default=os.environ.get("AEPAR_DATA"),
                    help="where CIFAR-10's python batches are (default $AEPAR_DATA)")
    ap.add_argument("--work", default=None,
                    help="directory of the runs (default a new runs/bench-eager-DATE); runs already done in it "
                         "are read back, not repeated; one stopped half-way (Ctrl-C, a time limit) goes on from its "
                         "checkpoint")
    ap.add_argument("--records", default=None, metavar="DIR",
                    help="keep every finished run's summary in DIR (one JSON per run, to commit) and read a run "
                         "recorded there back instead of repeating it: the study done in pieces, on several "
                         "machines or days, each row with its own run's machine and date (default: no records)")
    ap.add_argument("--results", default=str(RESULTS),
                    help="where the CSVs, figures and eager_study.md go (default bench/results)")
    args = ap.parse_args(argv)
    RESULTS = Path(args.results)
    work = Path(args.work) if args.work else REPO / "runs" / f"bench-eager-{time.strftime('%Y%m%d-%H%M%S')}"
    stages = args.stages.split(",")
    RESULTS.mkdir(parents=True, exist_ok=True)
    sections, verdicts, notes, dates = [], {}, [], []

    large_args, large_name = [], ""
    if args.large_epochs:
        large_args += ["--epochs", args.large_epochs]
        large_name += f"-epochs{args.large_epochs}"
    if args.large_mono_epochs is not None:
        large_args += ["--mono-epochs", args.large_mono_epochs]
        large_name += f"-mono{args.large_mono_epochs}"
    large_args += ["--curve"] + ([] if args.large_curve == "all" else [args.large_curve])
    if args.large_curve != "all":
        large_name += f"-curve{args.large_curve}"

    plans = []  # (name, title, preset args, seeds, run-name suffix)
    if "small" in stages:
        plans.append(("small", "Small regime: embedded MNIST digits", ["--preset", "small", "--curve"], args.seeds, ""))
    if "large" in stages:
        if not FASHION.is_dir():
            notes.append("Large regime skipped: Fashion-MNIST is not installed (`make fashion`).")
        else:
            plans.append(("large", "Large regime: Fashion-MNIST", ["--preset", "full", *large_args], args.large_seeds,
                          large_name))
    if "cifar" in stages:
        from aepar.data.cifar import find_cifar10

        where = find_cifar10(args.data_dir) if args.data_dir else None
        if where is None:
            notes.append("CIFAR-10 skipped: its python batches (data_batch_1..5, test_batch) are not in "
                         f"--data-dir ({args.data_dir or 'not given; $AEPAR_DATA unset'}). Put them there and run "
                         "`python -m bench.eager --stages cifar --data-dir DIR` (the large regime's options).")
        else:
            plans.append(("cifar", "CIFAR-10", ["--preset", "full", "--dataset", "cifar10", "--data-dir", where,
                                                *large_args], args.large_seeds, large_name))
    # every run first, then every file: a study stopped half-way leaves bench/results as it was
    records = common.Records("bench.eager", args.records)
    ran = [run_regime(name, preset, seeds, args, work, suffix, records) for name, _, preset, seeds, suffix in plans]
    for (name, title, preset, seeds, suffix), (rows, runs) in zip(plans, ran):
        sec, verdicts[name], when = publish_regime(name, title, preset, seeds, work, rows, runs, suffix)
        sections.append(sec)
        dates += when
    study(sections, verdicts, notes, args, dates, [meta["machine"] for _, runs in ran for _, meta in runs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
