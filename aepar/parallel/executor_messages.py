"""The pipeline's small messages besides the hand-over: sends in flight, epoch records to
rank 0, stop and checkpoint requests between all ranks. All non-blocking; the
:class:`aepar.parallel.executor.Pipeline` polls them while it works and waits.
"""
from __future__ import annotations

import numpy as np

from aepar.comm import TAG_CTRL, TAG_PROGRESS


class Outbox:
    """Sends in flight, each with the buffer it must keep alive until it completes."""

    def __init__(self, comm):
        self.comm = comm
        self.pending = []   # (Request, keepalive)

    def send(self, buf, dest: int, tag: int):
        self.pending.append((self.comm.Isend(buf, dest, tag), buf))

    def poll(self):
        if self.pending:
            self.pending = [(req, keep) for req, keep in self.pending if not req.test()]

    def empty(self) -> bool:
        return not self.pending


class EpochRecords:
    """Every rank's finished epochs to rank 0 as they happen (``on_epoch`` is called there),
    then one "done" record per rank."""

    LEN = 10  # kind, stage, epoch, version, extra, train, val, start, end, rank

    def __init__(self, comm, outbox: Outbox, on_epoch=None):
        self.comm, self.outbox, self.on_epoch = comm, outbox, on_epoch
        self.inbox = {}
        self.done_from = set()
        if comm.is_root and comm.size > 1:
            for r in range(1, comm.size):
                self._post(r)

    def _post(self, r):
        buf = np.empty(self.LEN)
        self.inbox[r] = (buf, self.comm.Irecv(buf, r, TAG_PROGRESS))

    def report(self, rec: dict | None):
        """An epoch record (or None: this rank is done) to rank 0."""
        if self.comm.is_root:
            if rec is not None and self.on_epoch is not None:
                self.on_epoch(rec)
            return
        if rec is None:
            arr = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, self.comm.rank], dtype=np.float64)
        else:
            arr = np.array([0, rec["stage"], rec["epoch"], rec["version"], rec["extra"],
                            rec["train_error"], np.nan if rec["val_error"] is None else rec["val_error"],
                            rec["start"], rec["end"], self.comm.rank], dtype=np.float64)
        self.outbox.send(arr, 0, TAG_PROGRESS)

    def poll(self):
        if self.inbox:
            self._drain()

    def all_done(self) -> bool:
        return len(self.done_from) == self.comm.size - 1

    def _drain(self):
        for r, (buf, req) in list(self.inbox.items()):
            while req is not None and req.test():
                if buf[0] == 1:
                    self.done_from.add(r)
                    del self.inbox[r]
                    req = None
                    break
                rec = {"stage": int(buf[1]), "epoch": int(buf[2]), "version": int(buf[3]),
                       "extra": bool(buf[4]), "train_error": float(buf[5]),
                       "val_error": None if np.isnan(buf[6]) else float(buf[6]),
                       "start": float(buf[7]), "end": float(buf[8]), "rank": int(buf[9])}
                if self.on_epoch is not None:
                    self.on_epoch(rec)
                self._post(r)
                buf, req = self.inbox[r]


class Requests:
    """Stop and checkpoint requests: this rank's own is announced to every rank once, the
    others' go into its guard (aepar.guard)."""

    def __init__(self, comm, guard, outbox: Outbox):
        self.comm, self.guard, self.outbox = comm, guard, outbox
        self.inbox = {}
        self.announced = 0.0
        if guard is None or comm.size == 1:
            return
        for r in range(comm.size):
            if r != comm.rank:
                self._post(r)

    def _post(self, r):
        buf = np.zeros(1)
        self.inbox[r] = (buf, self.comm.Irecv(buf, r, TAG_CTRL))

    def poll(self):
        """Announce this rank's own request to every rank once; take in the others'."""
        g = self.guard
        if g is None:
            return
        mine = g.local_request()
        if mine > self.announced and self.comm.size > 1:
            for r in range(self.comm.size):
                if r != self.comm.rank:
                    self.outbox.send(np.array([mine]), r, TAG_CTRL)
        self.announced = max(self.announced, mine)
        for r, (buf, req) in list(self.inbox.items()):
            if req.test():
                g.request(float(buf[0]))
                self._post(r)

    def close(self):
        """After a barrier (every announced request has arrived): take them in, cancel the rest."""
        for buf, req in self.inbox.values():
            if req.test():
                if self.guard is not None:
                    self.guard.request(float(buf[0]))
            else:
                req.cancel()
        self.inbox.clear()

    def pending(self) -> bool:
        """A stop or checkpoint request on this rank (its own or announced to it)."""
        return self.guard is not None and self.guard.flags() > 0
