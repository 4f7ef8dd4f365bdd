"""Per-rank timelines: spans and instants recorded on every rank, gathered to rank 0 and
written as a Chrome trace (opens in https://ui.perfetto.dev or chrome://tracing).

Each rank records its own events with :meth:`aepar.comm.Comm.wtime`, relative to the
moment the :class:`Trace` was created (a barrier first, so the ranks' zeros agree to
within a barrier's skew). Recording is a list append; nothing is communicated until
:meth:`Trace.gather`.

Example
-------
>>> tr = Trace(comm)
>>> with tr.span("epoch", stage=1, epoch=3):
...     train_epoch(layer, x, 3)
>>> tr.instant("handover", stage=1, version=4)
>>> events = tr.gather()            # all ranks' events on rank 0, None elsewhere
>>> tr.to_chrome_json("trace.json")  # rank 0 writes; other ranks do nothing
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

__all__ = ["Trace", "span", "chrome_events", "validate_chrome"]


class Trace:
    """Events of this rank: spans (name, start, duration, args) and instants.

    Parameters
    ----------
    comm : aepar.comm.Comm
        Used for the clock, the start barrier and the gather. Creating a Trace is
        collective when ``comm.size > 1`` (a barrier).
    enabled : bool
        False records nothing (``span`` still works as a context manager).
    """

    def __init__(self, comm, enabled: bool = True, labels: dict | None = None):
        self.comm = comm
        self.enabled = enabled
        self.events: list[dict] = []
        self.labels = dict(labels or {})  # per-rank metadata: shown as the process name
        self.part = None  # set by :meth:`within`: the part of the run every event now belongs to
        self._gathered = None
        comm.barrier()
        self.t0 = comm.wtime()

    def now(self) -> float:
        """Seconds since this trace began (this rank's clock)."""
        return self.comm.wtime() - self.t0

    @contextmanager
    def within(self, part: str):
        """Every event recorded inside the ``with`` block gets the argument ``part`` (e.g. a
        comparison run after the main one), so that readers can tell the parts apart."""
        outer, self.part = self.part, part
        try:
            yield
        finally:
            self.part = outer

    def _args(self, args: dict) -> dict:
        if self.part is not None:
            args.setdefault("part", self.part)
        return args

    @contextmanager
    def span(self, name: str, cat: str = "", **args):
        """Record the time spent in the ``with`` block; yields the args dict, which the
        block may extend (e.g. with a result known only at the end)."""
        start = self.now()
        cpu0 = time.process_time()
        try:
            yield args
        finally:
            if self.enabled:
                end = self.now()
                args.setdefault("cpu_s", time.process_time() - cpu0)
                self.events.append({"name": name, "cat": cat, "ph": "X", "t": start,
                                    "dur": end - start, "args": self._args(args)})

    def add_span(self, name: str, start: float, end: float, cat: str = "", **args):
        """Record a span whose times (seconds, this trace's clock) were taken elsewhere."""
        if self.enabled:
            self.events.append({"name": name, "cat": cat, "ph": "X", "t": float(start),
                                "dur": float(end - start), "args": self._args(args)})

    def instant(self, name: str, cat: str = "", **args):
        """Record a point in time (a hand-over, a message)."""
        if self.enabled:
            self.events.append({"name": name, "cat": cat, "ph": "i", "t": self.now(), "args": self._args(args)})

    def label(self, **labels):
        """Describe this rank (e.g. its stage); shown in the viewer's process name."""
        self.labels.update(labels)

    def gather(self, root: int = 0):
        """All ranks' events on ``root`` as a list of dicts with a "rank" key; None elsewhere.

        Collective.
        """
        mine = {"rank": self.comm.rank, "labels": self.labels, "events": self.events}
        everyone = self.comm.gather(mine, root=root)
        if self.comm.rank != root:
            return None
        out = []
        for part in everyone:
            for e in part["events"]:
                out.append(dict(e, rank=part["rank"]))
        self._gathered = (everyone, out)
        return out

    def to_chrome_json(self, path, root: int = 0, extra: dict | None = None):
        """Gather (if not done yet) and write the Chrome trace on ``root``.

        Collective unless :meth:`gather` was already called. Returns the path on the
        root, None elsewhere.
        """
        doc = self.chrome_doc(root, extra)
        if doc is None:
            return None
        path = Path(path)
        path.write_text(json.dumps(doc, default=_plain) + "\n")
        return path

    def chrome_doc(self, root: int = 0, extra: dict | None = None) -> dict | None:
        """The Chrome trace document on ``root`` (what :meth:`to_chrome_json` writes), None
        elsewhere. Collective unless :meth:`gather` was already called."""
        if self._gathered is None:
            self.gather(root)
        if self.comm.rank != root:
            return None
        everyone, _ = self._gathered
        return {"traceEvents": chrome_events(everyone), "displayTimeUnit": "ms",
                "otherData": dict(extra or {}, ranks=len(everyone))}


def span(trace, name, **meta):
    """A trace span when tracing, else nothing (the trace object's ``span`` context manager)."""
    if trace is None or not hasattr(trace, "span"):
        return nullcontext()
    return trace.span(name, **meta)


def chrome_events(parts) -> list[dict]:
    """Chrome trace events from gathered per-rank parts ({"rank", "labels", "events"}).

    One process per rank (pid = rank), its name from the labels; times in microseconds.
    """
    out = []
    for part in parts:
        rank = part["rank"]
        labels = part.get("labels") or {}
        name = f"rank {rank}" + (" (" + ", ".join(f"{k} {v}" for k, v in labels.items()) + ")" if labels else "")
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": name}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        for e in part["events"]:
            ev = {"name": e["name"], "cat": e.get("cat") or "aepar", "ph": e["ph"], "pid": rank,
                  "tid": 0, "ts": round(e["t"] * 1e6, 3), "args": e.get("args", {})}
            if e["ph"] == "X":
                ev["dur"] = round(max(e["dur"], 0.0) * 1e6, 3)
            else:
                ev["s"] = "p"  # instant scoped to its process: a mark on that rank's row
            out.append(ev)
    return out


def validate_chrome(doc) -> list[str]:
    """Problems with a Chrome trace document (empty list: valid). Used by tests and tools."""
    problems = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["no traceEvents list"]
    for i, e in enumerate(doc["traceEvents"]):
        for key in ("name", "ph", "pid", "tid"):
            if key not in e:
                problems.append(f"event {i}: no {key!r}")
        ph = e.get("ph")
        if ph not in ("X", "i", "M", "B", "E", "C"):
            problems.append(f"event {i}: unknown phase {ph!r}")
        if ph in ("X", "i") and not isinstance(e.get("ts"), (int, float)):
            problems.append(f"event {i}: ts is not a number")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            problems.append(f"event {i}: bad dur")
    return problems


def _plain(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)
