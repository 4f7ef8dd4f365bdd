"""What a sparse-autoencoder run leaves behind: the learned features (the paper's
Figure 1.1) and a one-row summary as JSON and CSV."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from aepar.report.png import gray_png

__all__ = ["SUMMARY_FIELDS", "features_mosaic", "features_png", "summary_csv"]

# The columns of summary.csv, in order (summary.json holds these and may hold more).
SUMMARY_FIELDS = ("final_cost", "iterations", "evaluations", "processes", "samples", "hidden",
                  "patch", "dtype", "kernels", "total_s", "compute_s", "comm_s",
                  "collectives_per_evaluation", "seed", "source")


def features_mosaic(W1, patch: int, order: str = "F", border: int = 1) -> np.ndarray:
    """One tile per hidden unit, tiles in a near-square grid (UFLDL's display_network).

    Parameters
    ----------
    W1 : (patch*patch, hidden) array
        Input weights; column j is what hidden unit j responds to most.
    patch : int
        Side of a patch.
    order : "F" or "C"
        How a patch was flattened (aepar.data.patches.ORDER: column-major).
    border : int
        Pixels between tiles (drawn at -1, black).

    Returns
    -------
    numpy.ndarray
        2-D float64 image in [-1, 1]: the weights minus their overall mean, each tile
        divided by its own largest magnitude.
    """
    W = np.asarray(W1, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != patch * patch:
        raise ValueError(f"W1 must be ({patch * patch}, hidden), got {W.shape}")
    hidden = W.shape[1]
    W = W - W.mean()
    cols = int(math.ceil(math.sqrt(hidden)))
    rows = int(math.ceil(hidden / cols))
    step = patch + border
    image = -np.ones((border + rows * step, border + cols * step))
    for j in range(hidden):
        tile = W[:, j].reshape((patch, patch), order=order)
        scale = np.abs(tile).max()
        r, c = divmod(j, cols)
        image[border + r * step:border + r * step + patch,
              border + c * step:border + c * step + patch] = tile / scale if scale > 0 else tile
    return image


def features_png(W1, patch: int, path, *, order: str = "F", title: str | None = None) -> Path:
    """Write the features mosaic of ``W1`` to ``path``: a grayscale PNG about 480 pixels wide,
    -1 black and 1 white, ``title`` in its Title text."""
    image = features_mosaic(W1, patch, order)
    return gray_png(image, path, lo=-1.0, hi=1.0, scale=max(1, 480 // max(image.shape)), title=title)


def summary_csv(summary: dict, fields=SUMMARY_FIELDS) -> str:
    """``summary.csv``: one header row and one value row, the columns ``fields``
    (``summary.json`` holds everything)."""
    missing = [f for f in fields if f not in summary]
    if missing:
        raise KeyError(f"summary lacks {', '.join(missing)}")
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(fields)
    writer.writerow([_plain(summary[k]) for k in fields])
    return out.getvalue()


def _plain(value):
    if hasattr(value, "item") and np.ndim(value) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return value
