"""Figures every program shares: the training curves of ``metrics.csv`` and originals over
reconstructions.

The curves are drawn with Pillow (:mod:`aepar.report.chart`), the reconstructions with
matplotlib; each is imported only to draw (matplotlib's Agg canvas, no pyplot state), so
aepar runs without them: a missing one raises ImportError, which
:func:`aepar.finish.finish` reports in one line and skips.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["NothingToDraw", "figure", "metrics_png", "image_shape", "reconstructions_png"]

CURVES = (("train_loss", "train loss", "-"), ("val_loss", "validation loss", "--"),
          ("train_error", "train error", "-"), ("val_error", "validation error", "--"))
X_LABEL = {"lbfgs": "L-BFGS iteration"}


class NothingToDraw(ValueError):
    """A figure's data holds no finite value: the figure is left out, the run goes on."""


def figure(width, height):
    """A matplotlib Figure on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _number(text):
    """A finite float, or None (an empty cell, a NaN or an infinity: nothing to draw)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def metrics_png(rows: list, path, *, title: str = ""):
    """The curves of ``metrics.csv`` rows (aepar.metrics): one panel per phase and per
    kind of value (losses, errors), one line per stage and value, against the epoch (the
    L-BFGS iteration); a logarithmic axis where the values span more than a decade.
    Drawn by :mod:`aepar.report.chart` (Pillow), not matplotlib: every run draws it."""
    from aepar.report.chart import Line, Panel, line_chart_png

    panels = []
    for phase in dict.fromkeys(r["phase"] for r in rows):
        mine = [r for r in rows if r["phase"] == phase]
        for kind in ("loss", "error"):
            cols = [c for c in CURVES if c[0].endswith(kind) and any(_number(r[c[0]]) is not None for r in mine)]
            if not cols:
                continue
            stages = list(dict.fromkeys(r["stage"] for r in mine))
            panel = Panel(f"{phase}: {kind}", X_LABEL.get(phase, "epoch"), kind,
                          legend_columns=2 if len(stages) > 4 else 1)
            for s, stage in enumerate(stages):
                part = [r for r in mine if r["stage"] == stage]
                for col, label, style in cols:
                    pts = [(_number(r["epoch"]), _number(r[col])) for r in part]
                    pts = [p for p in pts if p[0] is not None and p[1] is not None]
                    if pts:
                        name = f"{'layer ' if stage.isdigit() else ''}{stage} {label}" if stage else label
                        panel.lines.append(Line([p[0] for p in pts], [p[1] for p in pts], name, color=s,
                                                dashed=style == "--"))
            values = [y for line in panel.lines for y in line.ys]
            positive = [v for v in values if v > 0]
            panel.log_y = bool(positive) and len(positive) == len(values) and max(positive) > 10 * min(positive)
            if panel.lines:
                panels.append(panel)
    if not panels:
        raise NothingToDraw("metrics.csv has no finite values to draw")
    line_chart_png(panels, path, title=title)


def image_shape(n_features: int) -> tuple | None:
    """(channels, height, width) of rows that are square images: 784 -> (1, 28, 28),
    3072 -> (3, 32, 32), any k*k -> (1, k, k) and 3*k*k -> (3, k, k); None otherwise."""
    for c in (1, 3):
        side = int(round((n_features / c) ** 0.5))
        if side > 1 and c * side * side == n_features:
            return c, side, side
    return None


def _image(row, shape):
    c, h, w = shape
    img = np.clip(np.asarray(row, dtype=np.float64).reshape(c, h, w), 0, 1)
    return img[0] if c == 1 else img.transpose(1, 2, 0)


def reconstructions_png(originals, rows: list, shape, path):
    """Originals in the first row, then one row per (label, reconstructions)."""
    n = len(originals)
    fig = figure(1.1 * n + 1.6, 1.15 * (len(rows) + 1))
    axes = np.atleast_2d(fig.subplots(len(rows) + 1, n))
    cmap = "gray" if shape[0] == 1 else None
    for r, (label, images) in enumerate([("original", originals)] + list(rows)):
        for i in range(n):
            ax = axes[r, i]
            ax.imshow(_image(images[i], shape), cmap=cmap, vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
