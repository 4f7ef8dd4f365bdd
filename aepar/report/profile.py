"""Where each rank's time went, per operation: profile.csv and profile.png of a pre-training
run, read from its trace (trace.json, :mod:`aepar.trace`).

An epoch's span carries its phases (aepar.parallel.data_parallel: ``gradient_s``,
``block_sums_s``, ``reduction_s``, ``update_s`` or ``fused_step_s``); what the epoch span holds beyond them
(gathering a batch's rows, Python between the kernels) is ``other``. The pipeline schemes'
``handover`` and ``recompute`` spans are hand-overs, their ``wait`` spans waiting, ``eval``
the validation error after an epoch. Everything else in a run (loading, fine-tuning, the
task, a ``--compare-greedy`` run: its events carry a ``part``) is not in these bars. CMU 15-618 drew the same split per scheme.
"""
from __future__ import annotations

__all__ = ["PHASES", "profile_rows", "profile_csv", "draw_profile", "profile_png"]

# (key in a row, label) in the order the bars stack
PHASES = (("gradient", "forward + backward"), ("block_sums", "weight gradients + blocks' tree"),
          ("fused_step", "fused step (one kernel call)"), ("reduction", "sum over ranks"), ("update", "update"),
          ("handover", "hand-over"), ("wait", "wait"), ("eval", "validation"), ("other", "other in the epoch"))
_SPAN_PHASE = {"handover": "handover", "recompute": "handover", "wait": "wait", "eval": "eval"}


def profile_rows(doc: dict) -> list[dict]:
    """One row per rank, {"rank", "epochs", "<phase>_s" for each of :data:`PHASES`,
    "total_s"}, from a Chrome trace document as :meth:`aepar.trace.Trace.to_chrome_json`
    writes it (times in microseconds)."""
    rows = {}
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X" or "part" in (e.get("args") or {}):  # another part of the run (a comparison)
            continue
        row = rows.setdefault(int(e["pid"]), dict({"rank": int(e["pid"]), "epochs": 0},
                                                  **{f"{k}_s": 0.0 for k, _ in PHASES}))
        args, seconds = e.get("args") or {}, float(e.get("dur", 0.0)) / 1e6
        measured = {k: float(args[f"{k}_s"]) for k, _ in PHASES if f"{k}_s" in args}
        if measured:
            row["epochs"] += 1
            for k, v in measured.items():
                row[f"{k}_s"] += v
            row["other_s"] += max(0.0, seconds - sum(measured.values()))
        elif e.get("name") in _SPAN_PHASE:
            row[f"{_SPAN_PHASE[e['name']]}_s"] += seconds
    out = []
    for rank in sorted(rows):
        row = rows[rank]
        row["total_s"] = sum(row[f"{k}_s"] for k, _ in PHASES)
        out.append(row)
    return out


def profile_csv(rows: list[dict]) -> str:
    """profile.csv: a line per rank, seconds per phase."""
    fields = ["rank", "epochs"] + [f"{k}_s" for k, _ in PHASES] + ["total_s"]
    lines = [",".join(fields)]
    for r in rows:
        lines.append(",".join(str(r[f]) if f in ("rank", "epochs") else f"{r[f]:.6f}" for f in fields))
    return "\n".join(lines) + "\n"


def draw_profile(ax, rows: list[dict], *, predicted: dict | None = None, legend: bool = True):
    """A stacked bar per rank (seconds per phase) on the matplotlib axes ``ax``; with
    ``predicted`` (the planner's split of a rank's time, :data:`aepar.parallel.planner.SPLIT`:
    training, reduction, hand-over, wait) a hatched bar of its parts beside them, each
    part in its phase's colour (training: the epochs' whole work, grey)."""
    bars = [(str(r["rank"]), {k: r[f"{k}_s"] for k, _ in PHASES}) for r in rows]
    shown = [(k, label) for k, label in PHASES if any(b[k] > 0 for _, b in bars)]
    keys = [key for key, _ in PHASES]
    bottom = [0.0] * len(bars)
    for k, label in shown:
        heights = [b[k] for _, b in bars]
        ax.bar(range(len(bars)), heights, bottom=bottom, label=label, color=f"C{keys.index(k)}")
        bottom = [a + h for a, h in zip(bottom, heights)]
    names = [name for name, _ in bars]
    if predicted is not None:
        level = 0.0
        for k, v in predicted.items():
            if v > 0:
                ax.bar([len(bars)], [v], bottom=[level], color="0.75" if k == "training" else f"C{keys.index(k)}",
                       edgecolor="0.2", hatch="//", label=f"predicted {dict(PHASES).get(k, k)}")
                level += v
        names.append("plan")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_xlabel("rank" + (" (plan: the planner's prediction)" if predicted is not None else ""), fontsize=8)
    ax.set_ylabel("seconds")
    ax.grid(axis="y", alpha=0.3)
    if legend:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def profile_png(rows: list[dict], path, *, title: str = "", predicted: dict | None = None):
    """:func:`draw_profile` as a PNG of its own (a run's profile.png)."""
    from aepar.report.figures import figure

    fig = figure(4.5 + 0.6 * (len(rows) + (predicted is not None)), 4.0)  # the legend right of the bars
    ax = fig.add_subplot(1, 1, 1)
    draw_profile(ax, rows, predicted=predicted)
    ax.set_title(title or "time per operation")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return path
