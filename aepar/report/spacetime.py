"""The space-time diagram of synchronized pre-training (Santara et al. 2016, Fig. 3).

One row per stage (layer), layer 1 at the top: a thick bar for every epoch the stage
trained (extra epochs, those after its stipulated N_l, in a lighter shade), short vertical
spikes where the stage below handed it a new input, and above each row the stage's
reconstruction error per epoch: training error as a solid line, validation error as
circles, plotted at the epochs' end times. Input records come from
:class:`aepar.parallel.pipeline.PipelineResult` (``epochs`` and ``handovers``).

matplotlib is imported lazily (Agg backend), so aepar runs without it; ``plot`` then
raises ImportError, which the CLI reports and skips.
"""
from __future__ import annotations

__all__ = ["plot_spacetime"]

_TRAIN = "#1f4e9c"
_EXTRA = "#8fb0e0"
_SPIKE = "black"


def plot_spacetime(epochs, handovers, path, *, n_stages=None, title=None, labels=None):
    """Draw the diagram into ``path`` as a PNG (whatever its name: a run draws into a temporary one).

    Parameters
    ----------
    epochs : list of dict
        ``stage`` (0-based), ``start``, ``end`` (seconds), ``extra`` (bool),
        ``train_error``, ``val_error`` (float or None), ``version``.
    handovers : list of dict
        ``stage`` (the producer, 0-based), ``t`` (seconds), ``version``.
    n_stages : int, optional
        Rows to draw (default: from the records).
    title : str, optional
    labels : list of str, optional
        Row names (default "L1", "L2", ...).

    Returns
    -------
    pathlib.Path
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    n = n_stages if n_stages is not None else 1 + max((e["stage"] for e in epochs), default=0)
    labels = labels or [f"L{i + 1}" for i in range(n)]
    t_end = max([e["end"] for e in epochs] + [h["t"] for h in handovers] + [1e-9])
    fig = plt.figure(figsize=(11, 1.9 * n + 0.8))
    grid = fig.add_gridspec(2 * n, 1, height_ratios=[2.2, 1] * n, hspace=0.08)
    ax_first = None
    for l in range(n):
        ax_err = fig.add_subplot(grid[2 * l], sharex=ax_first)
        ax_first = ax_first or ax_err
        ax_bar = fig.add_subplot(grid[2 * l + 1], sharex=ax_first)
        mine = sorted((e for e in epochs if e["stage"] == l), key=lambda e: e["end"])
        # error curves above the timeline
        if mine:
            ends = [e["end"] for e in mine]
            ax_err.plot(ends, [e["train_error"] for e in mine], "-", color=_TRAIN, lw=1.4,
                        label="training")
            vals = [(e["end"], e["val_error"]) for e in mine if e.get("val_error") is not None]
            if vals:
                ax_err.plot([v[0] for v in vals], [v[1] for v in vals], "o", mfc="none", color="#c0392b",
                            ms=4, label="validation")
        ax_err.set_ylabel(f"{labels[l]}\nerror", fontsize=8)
        ax_err.tick_params(labelsize=7, labelbottom=False)
        ax_err.grid(alpha=0.25)
        if l == 0 and mine:
            ax_err.legend(fontsize=7, loc="upper right", frameon=False)
        # the timeline: one thick bar per epoch
        for e in mine:
            ax_bar.broken_barh([(e["start"], max(e["end"] - e["start"], 1e-9))], (0.25, 0.5),
                               facecolors=_EXTRA if e.get("extra") else _TRAIN, edgecolor="white", lw=0.3)
        # spikes: the stage below handed this one a new input
        for h in handovers:
            if h["stage"] == l - 1:
                ax_bar.plot([h["t"], h["t"]], [0.75, 1.05], color=_SPIKE, lw=0.8)
        ax_bar.set_ylim(0, 1.1)
        ax_bar.set_yticks([])
        ax_bar.set_xlim(0, t_end * 1.01)
        ax_bar.tick_params(labelsize=7, labelbottom=(l == n - 1))
        for side in ("top", "right", "left"):
            ax_bar.spines[side].set_visible(False)
    ax_bar.set_xlabel("time (s)", fontsize=9)
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=_TRAIN, label="epoch"), Patch(color=_EXTRA, label="extra epoch"),
                        Patch(color=_SPIKE, label="input handed over")],
               loc="lower right", fontsize=7, ncol=3, frameon=False)
    fig.suptitle(title or "Synchronized layer-wise pre-training: space-time diagram", fontsize=10)
    path = Path(path)
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")  # path may be a .tmp name (RunDir.output)
    plt.close(fig)
    return path
