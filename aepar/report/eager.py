"""What ``aepar.eager`` writes for people to read: the accuracy table, the epochs CSV, the
loss and accuracy curves (the paper's Figures 8-9) and the reconstructions (Figures 6-7).

matplotlib is imported only to draw (Agg canvas), so aepar runs without it.
"""
from __future__ import annotations

import csv
import io

from aepar.report.figures import figure, reconstructions_png

__all__ = ["epochs_csv", "curve_csv", "accuracy_table", "losses_png", "curve_png", "reconstructions_png"]

MONO = "mono"


def _csv(rows: list, fields: list) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items() if k in fields})
    return out.getvalue()


def epochs_csv(records: dict) -> str:
    """One row per model and epoch: losses (the paper's: mean over images of the summed
    squared error), seconds of that epoch and since the model started."""
    rows = [{"model": name, "kind": "monolithic" if name == MONO else "parallel", **e}
            for name, r in sorted(records.items()) for e in r["epochs"]]
    return _csv(rows, ["model", "kind", "epoch", "train_loss", "val_loss", "epoch_s", "cum_s"])


def curve_csv(curve: list) -> str:
    """Accuracy after every epoch: parallel (combined, vote) and monolithic, with the
    effective wall time of each."""
    rows = []
    for c in curve:
        row = {"epoch": c["epoch"], "parallel_validation": c["combined"]["validation"],
               "parallel_test": c["combined"]["test"], "parallel_effective_s": c["effective_s"],
               "parallel_train_s": c["train_s"]}
        if "vote" in c:
            row.update(vote_validation=c["vote"]["validation"], vote_test=c["vote"]["test"])
        if MONO in c:
            row.update(mono_validation=c[MONO]["validation"], mono_test=c[MONO]["test"],
                       mono_effective_s=c[MONO]["effective_s"], mono_train_s=c[MONO]["train_s"])
        rows.append(row)
    fields = ["epoch", "parallel_validation", "parallel_test", "vote_validation", "vote_test",
              "parallel_train_s", "parallel_effective_s", "mono_validation", "mono_test", "mono_train_s",
              "mono_effective_s"]
    return _csv(rows, [f for f in fields if any(f in r for r in rows)])


def _pct(a) -> str:
    return f"{100.0 * a:.2f}%"


def accuracy_table(summary: dict) -> str:
    """Markdown: each way of classifying, its accuracy and effective wall time."""
    f = summary["final"]
    recs = summary["records"]
    picks = f["picked_epochs"]
    lines = [f"## Eager CAEs: {summary['models']} parallel vs one monolithic ({summary['source'].split(',')[0]})", "",
             f"{summary['n_train']} train / {summary['n_validation']} validation / {summary['n_test']} test "
             f"images; {summary['ranks']} rank(s) in {summary['groups']} group(s); filters "
             f"{'-'.join(map(str, summary['filters']))} (monolithic {'-'.join(map(str, summary['mono_filters']))}); "
             f"{summary['dtype']}, {summary['kernels']} kernels.", "",
             "| classifier on | epochs used | validation acc. | test acc. | training s | effective wall s |",
             "| --- | --- | --- | --- | --- | --- |"]
    used = ", ".join(str(picks[n]) for n in sorted(picks))
    lines.append(f"| {len(picks)} parallel CAEs, codes concatenated | {used} | {_pct(f['combined']['validation'])} | "
                 f"{_pct(f['combined']['test'])} | {f['train_s']:.1f} | {f['effective_s']:.1f} |")
    if "vote" in f:
        lines.append(f"| {len(picks)} parallel CAEs, vote of per-model classifiers | {used} | "
                     f"{_pct(f['vote']['validation'])} | {_pct(f['vote']['test'])} | {f['train_s']:.1f} | "
                     f"{f['train_s'] + f['vote']['time_s']:.1f} |")
        for n in sorted(f["each"]):
            e = f["each"][n]
            lines.append(f"| {n} alone | {picks[n]} | {_pct(e['validation'])} | {_pct(e['test'])} | "
                         f"{recs[n]['epochs'][picks[n] - 1]['cum_s']:.1f} | |")
    if MONO in f:
        m = f[MONO]
        lines.append(f"| monolithic CAE | {m['epoch']} | {_pct(m['validation'])} | {_pct(m['test'])} | "
                     f"{m['train_s']:.1f} | {m['effective_s']:.1f} |")
    lines += ["", "Stopped: " + "; ".join(f"{n}: {r['stopped']} (val loss {r['epochs'][-1]['val_loss']:.3f})"
                                         for n, r in sorted(recs.items())),
              "", "Effective wall time as the paper counts it: the slowest rank's training up to the epochs used, "
                  "plus the combining classifier's training.", ""]
    return "\n".join(lines)


def losses_png(records: dict, path, *, title: str = ""):
    """Validation loss against epochs and against the model's own wall time: parallel CAEs
    thin, the monolithic one thick black."""
    fig = figure(10, 4)
    axes = fig.subplots(1, 2)
    for name, r in sorted(records.items()):
        ep = r["epochs"]
        mono = name == MONO
        style = dict(color="black", lw=2.5, label="monolithic") if mono else dict(lw=1, alpha=0.8, label=name)
        axes[0].plot([e["epoch"] for e in ep], [e["val_loss"] for e in ep], marker=".", **style)
        axes[1].plot([e["cum_s"] for e in ep], [e["val_loss"] for e in ep], marker=".", **style)
    axes[0].set_xlabel("epoch")
    axes[1].set_xlabel("training wall time of the model (s)")
    for ax in axes:
        ax.set_ylabel("validation loss (squared error per image)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Reconstruction loss, parallel vs monolithic CAE {title}".strip())
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)


def curve_png(curve: list, path):
    """Classification accuracy (validation) against epochs and effective wall time."""
    fig = figure(10, 4)
    axes = fig.subplots(1, 2)
    ep = [c["epoch"] for c in curve]
    par = [100 * c["combined"]["validation"] for c in curve]
    axes[0].plot(ep, par, marker="o", label="parallel, combined")
    axes[1].plot([c["effective_s"] for c in curve], par, marker="o", label="parallel, combined")
    if all("vote" in c for c in curve):
        axes[0].plot(ep, [100 * c["vote"]["validation"] for c in curve], marker="s", ls="--", label="parallel, vote")
    if all(MONO in c for c in curve):
        mono = [100 * c[MONO]["validation"] for c in curve]
        axes[0].plot(ep, mono, marker="o", color="black", label="monolithic")
        axes[1].plot([c[MONO]["effective_s"] for c in curve], mono, marker="o", color="black", label="monolithic")
    axes[0].set_xlabel("epoch")
    axes[1].set_xlabel("effective wall time (s)")
    for ax in axes:
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
