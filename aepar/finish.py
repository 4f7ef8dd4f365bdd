"""The end of every run: one function writes what a finished run leaves behind."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from aepar import checkpoint, metrics
from aepar.machine import describe_run
from aepar.report.figures import NothingToDraw

__all__ = ["Weights", "finish"]


@dataclass
class Weights:
    """What goes into weights.h5 (aepar.checkpoint's format)."""
    scheme: str
    params: dict
    epoch: int
    config: dict = field(default_factory=dict)


def finish(run, comm, summary: dict, *, weights: Weights | None = None, tables: str | None = None,
           tables_file: str = "tables.md", texts: dict | None = None, figures: dict | None = None,
           prog: str = "aepar", quiet: bool = False, plot: bool = True) -> None:
    """Write the run's results into its directory (rank 0; the others return).

    summary.json (with the machine it ran on), weights.h5, the tables (printed unless
    ``quiet``), ``texts`` {file name: text}, metrics.csv (:mod:`aepar.metrics`) and, with
    ``plot`` (``--plot``), its curves in metrics.png and ``figures`` {file name: draw(path)}.
    A figure whose library (Pillow, matplotlib) is missing, or whose data holds no finite
    value, is left out in one line on stderr: the numbers are in the other files.
    """
    if not comm.is_root:
        return
    rows = metrics.of(run)
    rows.write()  # a resumed run that trained nothing more keeps its rows too
    figures = dict(figures or {}) if plot else {}
    if rows.rows and plot:
        from aepar.report.figures import metrics_png

        title = f"{prog}: {summary.get('scheme', '')} ({os.path.basename(str(run.path))})"
        figures = {"metrics.png": lambda path: metrics_png(rows.rows, path, title=title), **figures}
    summary.setdefault("machine", describe_run(comm.size))
    if weights is not None:
        with run.output("weights.h5") as path:
            checkpoint.save(path, scheme=weights.scheme, params=weights.params, epoch=weights.epoch,
                            config=weights.config)
    run.write_json("summary.json", summary)
    if tables is not None:
        run.write_text(tables_file, tables)
    for name, text in (texts or {}).items():
        run.write_text(name, text)
    for name, draw in figures.items():
        try:
            with run.output(name) as path:
                draw(path)
        except (ImportError, NothingToDraw) as exc:
            print(f"{prog}: no {name} ({exc})", file=sys.stderr, flush=True)
    if tables is not None and not quiet:
        print(tables, flush=True)
