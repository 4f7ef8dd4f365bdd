"""Real-time newest-wins (Santara et al. §3.1, literally): which stage of a rank group
trains next, and on which version of its input.

A stage trains its base epochs on the newest input there is, then an extra epoch whenever
a newer input than the last one it used has come, up to its extra epochs; it is finished
when its producer is and it has used the newest input (or, ``end_with_first``, as soon as
the first stage is finished). Stages sharing a rank take turns by least time used, like
threads sharing a core. Not reproducible: what is newest depends on timing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StageCounters:
    """Epochs a stage has trained (base and extra), the input version it used last, whether
    it is finished, and its seconds of training so far."""

    base: int = 0
    extra: int = 0
    last: int = 0
    done: bool = False
    busy: float = 0.0

    def saved(self) -> dict:
        """What a checkpoint keeps (a finished stage is found finished again)."""
        return {"base": self.base, "extra": self.extra, "last": self.last, "busy": self.busy}


class NewestWins:
    """The choice for the stages of one rank group (made on the group's leader).

    Parameters
    ----------
    stages : list of int
        The group's stages, in order.
    epochs, extras : list of int
        Base and extra epochs of every stage.
    end_with_first : bool
    saved : dict
        stage -> :meth:`StageCounters.saved` of a checkpoint ({} for a new run).
    versions : callable(stage) -> sorted list
        The versions of a stage's input at hand now.
    upstream_final : callable() -> bool
        The group below has sent its last version.
    upstream_stopped : callable() -> bool
        The group below says the first stage has finished.
    """

    def __init__(self, stages, epochs, extras, end_with_first, saved, versions, upstream_final, upstream_stopped):
        self.stages = list(stages)
        self.epochs, self.extras, self.end_with_first = epochs, extras, end_with_first
        self.at = {s: StageCounters(**saved.get(s, {})) for s in self.stages}
        self.versions, self.upstream_final, self.upstream_stopped = versions, upstream_final, upstream_stopped
        self.picked = None  # (busy, stage, version) of the last choice, or None

    def producer_done(self, s: int) -> bool:
        return self.at[s - 1].done if (s - 1) in self.at else self.upstream_final()

    def first_done(self) -> bool:
        return self.at[0].done if 0 in self.at else self.upstream_stopped()

    def all_done(self) -> bool:
        return all(c.done for c in self.at.values())

    def wants_input(self, s: int) -> bool:
        """Stage ``s`` is in this group and will still train (a local hand-over is worth it)."""
        return s in self.at and not self.at[s].done

    def _stopped(self, s: int) -> bool:
        return self.end_with_first and s > 0 and self.first_done()

    def _finished(self, s: int) -> bool:
        c = self.at[s]
        if s == 0:
            return c.base >= self.epochs[0]
        if c.base < self.epochs[s]:
            return False
        if c.extra >= self.extras[s] or self._stopped(s):
            return True
        newest = self.versions(s)
        return self.producer_done(s) and (not newest or newest[-1] <= c.last)

    def _runnable(self, s: int):
        """The version stage ``s`` would train on now, or None."""
        c = self.at[s]
        if c.done:
            return None
        if s == 0:
            return 0
        vs = self.versions(s)
        if c.base < self.epochs[s]:
            return vs[-1] if vs else None
        return vs[-1] if vs and vs[-1] > c.last else None

    def choose(self):
        """(busy, stage, version) to train next, or None (kept in :attr:`picked`)."""
        for s in self.stages:  # in order: a stage's end can end the next one
            if not self.at[s].done and self._finished(s):
                self.at[s].done = True
        options = [(self.at[s].busy, s, v) for s in self.stages if (v := self._runnable(s)) is not None]
        self.picked = min(options) if options else None
        return self.picked

    def trained(self, s: int, version: int, extra: bool) -> int:
        """Stage ``s`` trained an epoch on ``version``; returns its epochs done."""
        c = self.at[s]
        if extra:
            c.extra += 1
        else:
            c.base += 1
        c.last = version
        return c.base + c.extra
