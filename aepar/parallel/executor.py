"""Executing the synchronized schedule on ranks: hand-over transport, safe points, resume.

:class:`Pipeline` runs the layers of a stack as pipeline stages on groups of ranks
(:class:`aepar.parallel.pipeline.Layout`): ``handover="plan"`` executes a plan made on a
logical clock (a stage ahead of the plan waits for its planned input version; arrivals
are kept until used), ``handover="newest"`` is the literal real-time newest-wins of
Santara et al. (not reproducible). Inside a stage with several ranks every epoch is
data-parallel over fixed blocks of rows (aepar.parallel.data_parallel): the same weights
whatever the layout.

Hand-over (``mode``): ``"data"`` sends the transformed rows h = transform(x) from the
producer's replicas to the overlapping rows of the consumer's replicas; ``"weights"`` sends
the parameters (W, b_h) of every layer below (the chain that made the version) and the
consumer recomputes its input from its own copy of x, reusing the activations of the
unchanged bottom of the chain. Both give identical inputs. Every version also carries the
(W, b_h) snapshots of its chain, which is what a checkpoint needs to rebuild it.

Transport: non-blocking Isend/Irecv through aepar.comm, a small header then the payload;
waiting ranks poll with sleeps backing off (MPI_Wait busy-polls in Open MPI).

Safe points and checkpoints: a rank that gets a stop signal (or rank 0, when a periodic
checkpoint is due) announces it to every rank with a control message; each stage then
pauses at its next step (the replicas of a stage agree through their step's reduction), a
stage waiting for input stops waiting, every link is drained, and the stages' positions
(epochs done, a paused epoch's state), layers, momenta and the snapshots of the input
versions they will still use are gathered to rank 0 (:meth:`Pipeline.state`). A new
Pipeline built from that state (``resume=``) continues every stage where it stopped, on
any layout, with the same weights as an uninterrupted run.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np

from aepar.comm import TAG_CTRL, TAG_DECIDE, TAG_HDR, TAG_PAY, TAG_PROGRESS, wait_until
from aepar.guard import STOP
from aepar.parallel.data_parallel import EpochState, reducer, train_epoch
from aepar.parallel.pipeline import HANDOVERS, MODES, Layout, Plan
from aepar.rows import Blocks, Shard

__all__ = ["Pipeline", "PipelineResult", "InputRecord"]

# message tags on the world communicator; one (source, destination) pair carries one
# stage boundary only, so these do not collide
KIND_VERSION, KIND_FINAL = 0, 1


# ==== hand-over transport ===================================================================
@dataclass
class InputRecord:
    """One version of a stage's input, as this rank holds it (its blocks only).

    ``chain``: ((layer, version), ...) of the layers whose transforms made it from x;
    ``params``: their (W, bh) snapshots, one dict per chain element.
    """

    version: int
    train: Shard
    val: Shard
    chain: tuple = ()
    params: tuple = ()


def _frozen(layer, params):
    """A shallow copy of ``layer`` whose transform uses ``params`` (W, bh)."""
    f = copy.copy(layer)
    f.params = dict(layer.params, **params)
    return f


def _overlap(a: slice, b: slice) -> tuple[slice, slice] | None:
    """(piece in a's local rows, same piece in b's local rows) or None."""
    lo, hi = max(a.start, b.start), min(a.stop, b.stop)
    if hi <= lo:
        return None
    return slice(lo - a.start, hi - a.start), slice(lo - b.start, hi - b.start)


class _Source:
    """Receiving end of one (producer rank -> this rank) link: header, then payload."""

    def __init__(self, comm, xp, dtype, rank: int, size: int, hdr_len: int):
        self.comm, self.xp, self.dtype, self.rank, self.size, self.hdr_len = comm, xp, dtype, rank, size, hdr_len
        self.got = {}          # version -> (header, payload)
        self.final = False
        self.stop = False
        self.pay_req = self.pay_buf = self.pay_hdr = None
        self.hdr_req = None
        self.nbytes = 0
        self._post_header()

    def _post_header(self):
        self.hdr_buf = np.empty(self.hdr_len, dtype=np.int64)
        self.hdr_req = self.comm.Irecv(self.hdr_buf, self.rank, TAG_HDR)

    def poll(self):
        while True:
            if self.pay_req is not None:
                if not self.pay_req.test():
                    return
                self.got[int(self.pay_hdr[1])] = (self.pay_hdr, self.pay_buf)
                self.nbytes += int(self.pay_buf.nbytes)
                self.pay_req = self.pay_buf = self.pay_hdr = None
            if self.hdr_req is None or not self.hdr_req.test():
                return
            hdr = self.hdr_buf.copy()
            if hdr[0] == KIND_FINAL:
                self.final, self.stop, self.hdr_req = True, bool(hdr[2]), None
                return
            self.pay_hdr = hdr
            self.pay_buf = self.xp.empty(self.size, dtype=self.dtype)
            self.pay_req = self.comm.Irecv(self.pay_buf, self.rank, TAG_PAY)
            self._post_header()


@dataclass
class PipelineResult:
    """What :meth:`Pipeline.run` returns on every rank (records complete on rank 0 only).

    ``paused``: the run stopped at a safe point (a checkpoint request); :meth:`Pipeline.state`
    then holds where every stage is, and ``stop`` says whether a signal asked to end the run.
    """

    time_s: float
    epochs: list          # per epoch (group leaders'): stage, epoch, version, extra, start, end, errors
    handovers: list       # per hand-over (producer leaders'): stage, version, t, seconds, bytes, remote
    receives: list        # per received version (consumer leaders'): stage, version, t, recompute_s, bytes
    waits: list           # per rank: wall and CPU seconds spent waiting for input
    layout: dict
    mode: str
    handover: str
    paused: bool = False
    stop: bool = False


@dataclass
class StagePosition:
    """Where a stage is: epochs done, a paused epoch's state, the newest-wins counters."""

    done: int = 0
    paused: EpochState | None = None
    counters: dict = field(default_factory=dict)


class Pipeline:
    """Run the synchronized pre-training of ``layers`` over the ranks of ``comm``.

    Parameters
    ----------
    be : aepar.backend.Backend
    comm : aepar.comm.Comm
        All ranks; every rank holds all layers (the same initial weights) and the whole
        of ``x_train``/``x_val`` (host arrays; each rank takes its blocks).
    layers : list of RBM or AELayer
    layout : Layout
    epochs, extras : sequence of int
        Base and extra epochs per stage.
    blocks : int
        Fixed blocks the rows are cut into (>= the replicas of any stage).
    mode : {"data", "weights"}
    handover : {"plan", "newest"}
    plan : Plan
        Required for ``handover="plan"``.
    end_with_first : bool
        No extra epoch starts after stage 0 has finished.
    trace : aepar.trace.Trace, optional
    on_epoch : callable(dict), optional
        Called on rank 0 for every finished epoch of every stage (as the records arrive).
    guard : aepar.guard.Guard, optional
        Steps, faults, divergence checks, stop and checkpoint requests.
    resume : dict, optional
        :meth:`state` of a paused pipeline (on every rank): continue from it. The layers'
        parameters and momenta must be restored by the caller.
    """

    def __init__(self, be, comm, layers, layout: Layout, x_train, x_val, *, epochs, extras, blocks,
                 mode="data", handover="plan", plan: Plan | None = None, end_with_first=False,
                 trace=None, on_epoch=None, guard=None, resume=None):
        if mode not in MODES or handover not in HANDOVERS:
            raise ValueError(f"mode {mode!r} / handover {handover!r}")
        if handover == "plan" and plan is None:
            raise ValueError("handover='plan' needs a plan")
        if layout.n_ranks != comm.size or layout.n_stages != len(layers):
            raise ValueError(f"layout {layout.describe()} does not fit {comm.size} ranks / {len(layers)} layers")
        if max(len(r) for r in layout.ranks) > blocks:
            raise ValueError(f"a stage has more replicas than the {blocks} blocks of rows")
        from aepar.trace import Trace

        self.be, self.comm, self.layers, self.layout = be, comm, layers, layout
        self.mode, self.handover, self.plan = mode, handover, plan
        self.epochs, self.extras = [int(e) for e in epochs], [int(x) for x in extras]
        self.end_with_first = bool(end_with_first)
        self.trace = trace if trace is not None else Trace(comm, enabled=False)
        self.on_epoch, self.guard = on_epoch, guard
        self.n = len(layers)
        self.count = int(blocks)
        self.g = layout.group_of_rank(comm.rank)
        self.my_stages = layout.groups[self.g]
        self.my_ranks = layout.ranks[self.g]
        self.stage_comm = comm.split(self.g, comm.rank)
        self.rep, self.n_rep = self.stage_comm.rank, self.stage_comm.size
        self.leader = self.rep == 0
        self.n_train, self.n_val = int(x_train.shape[0]), int(x_val.shape[0])
        self.tblocks = Blocks.of(self.n_train, self.count, self.rep, self.n_rep)
        self.vblocks = Blocks.of(self.n_val, self.count, self.rep, self.n_rep)
        self.x_train = Shard(be.asarray(x_train[self.tblocks.rows]), self.tblocks)
        self.x_val = Shard(be.asarray(x_val[self.vblocks.rows]), self.vblocks)
        self.store = {s: {} for s in self.my_stages}   # stage -> version -> InputRecord
        if self.my_stages[0] == 0:
            self.store[0][0] = InputRecord(0, self.x_train, self.x_val, (), ())
        self.position = {s: StagePosition() for s in self.my_stages}
        self.trace.label(stages="-".join(str(s + 1) for s in self.my_stages),
                         replica=f"{self.rep + 1}/{self.n_rep}")
        self._sends = []            # pending (Request, keepalive)
        self._chain_cache = []      # ((layer, version), train act, val act)
        self.records, self.handover_records, self.receive_records = [], [], []
        self.wait_wall = self.wait_cpu = 0.0
        self._paused = False
        self._setup_links()
        self._setup_progress()
        self._setup_control()
        if resume is not None:
            self._resume(resume)

    # ---- links between groups ------------------------------------------------------------
    def _hdr_len(self):
        return 4 + 2 * self.n

    def _chain_size(self, stage: int) -> int:
        """Elements of the (W, b_h) of layers 0..stage-1."""
        return sum(l.n_in * l.n_out + l.n_out for l in self.layers[:stage])

    def _links_between(self, g_from: int):
        """[(sender rank, receiver rank, train pieces, val pieces)] from group g_from to g_from+1.

        Pieces are (sender-local slice, receiver-local slice) or None.
        """
        senders, receivers = self.layout.ranks[g_from], self.layout.ranks[g_from + 1]
        ns, nr = len(senders), len(receivers)
        links = []
        for j, rr in enumerate(receivers):
            if self.mode == "weights":
                links.append((senders[j % ns], rr, None, None))
                continue
            for i, sr in enumerate(senders):
                pt = _overlap(Blocks.of(self.n_train, self.count, i, ns).rows,
                              Blocks.of(self.n_train, self.count, j, nr).rows)
                pv = _overlap(Blocks.of(self.n_val, self.count, i, ns).rows,
                              Blocks.of(self.n_val, self.count, j, nr).rows)
                if pt is not None or pv is not None:
                    links.append((sr, rr, pt, pv))
        return links

    def _piece_rows(self, piece):
        return 0 if piece is None else piece[0].stop - piece[0].start

    def _setup_links(self):
        be = self.be
        first, last = self.my_stages[0], self.my_stages[-1]
        self.sources, self.out_links = [], []
        if first > 0:
            n_in = self.layers[first].n_in
            for sr, rr, pt, pv in self._links_between(self.g - 1):
                if rr != self.comm.rank:
                    continue
                rows = 0 if self.mode == "weights" else (self._piece_rows(pt) + self._piece_rows(pv)) * n_in
                src = _Source(self.comm, be.xp, be.dtype, sr, rows + self._chain_size(first), self._hdr_len())
                src.pieces = (pt, pv)
                src.rows = rows
                self.sources.append(src)
        if last + 1 < self.n:
            self.out_links = [(rr, pt, pv) for sr, rr, pt, pv in self._links_between(self.g)
                              if sr == self.comm.rank]

    # ---- progress records to rank 0 ------------------------------------------------------
    _REC = 10  # kind, stage, epoch, version, extra, train, val, start, end, rank

    def _setup_progress(self):
        self._progress_in = {}
        self._done_from = set()
        if self.comm.is_root and self.comm.size > 1:
            for r in range(1, self.comm.size):
                self._post_progress(r)

    def _post_progress(self, r):
        buf = np.empty(self._REC)
        self._progress_in[r] = (buf, self.comm.Irecv(buf, r, TAG_PROGRESS))

    def _report(self, rec: dict | None):
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
        self._sends.append((self.comm.Isend(arr, 0, TAG_PROGRESS), arr))

    def _drain_progress(self):
        for r, (buf, req) in list(self._progress_in.items()):
            while req is not None and req.test():
                if buf[0] == 1:
                    self._done_from.add(r)
                    del self._progress_in[r]
                    req = None
                    break
                rec = {"stage": int(buf[1]), "epoch": int(buf[2]), "version": int(buf[3]),
                       "extra": bool(buf[4]), "train_error": float(buf[5]),
                       "val_error": None if np.isnan(buf[6]) else float(buf[6]),
                       "start": float(buf[7]), "end": float(buf[8]), "rank": int(buf[9])}
                if self.on_epoch is not None:
                    self.on_epoch(rec)
                self._post_progress(r)
                buf, req = self._progress_in[r]

    # ---- control: stop and checkpoint requests between all ranks ------------------------------
    def _setup_control(self):
        self._ctrl_in = {}
        self._announced = 0.0
        if self.guard is None or self.comm.size == 1:
            return
        for r in range(self.comm.size):
            if r != self.comm.rank:
                self._post_control(r)

    def _post_control(self, r):
        buf = np.zeros(1)
        self._ctrl_in[r] = (buf, self.comm.Irecv(buf, r, TAG_CTRL))

    def _control(self):
        """Announce this rank's own request to every rank once; take in the others'."""
        g = self.guard
        mine = g.local_request()
        if mine > self._announced and self.comm.size > 1:
            for r in range(self.comm.size):
                if r != self.comm.rank:
                    token = np.array([mine])
                    self._sends.append((self.comm.Isend(token, r, TAG_CTRL), token))
        self._announced = max(self._announced, mine)
        for r, (buf, req) in list(self._ctrl_in.items()):
            if req.test():
                g.request(float(buf[0]))
                self._post_control(r)

    def _requested(self) -> bool:
        return self.guard is not None and self.guard.flags() > 0

    def _agree(self) -> tuple[bool, bool]:
        """(checkpoint, stop) agreed by the ranks of this stage group, at an epoch boundary."""
        if self.guard is None:
            return False, False
        self._poll()
        flags = np.array([self.guard.flags()])
        if self.n_rep > 1:
            self.stage_comm.Allreduce(flags)
        return self.guard.decide(float(flags[0]))

    def _all_have(self, record) -> bool:
        """Whether every replica of this stage has its input (they go on, or stop, together)."""
        have = np.array([0.0 if record is None else 1.0])
        if self.n_rep > 1:
            self.stage_comm.Allreduce(have, op="min")
        return bool(have[0])

    def _poll(self):
        """Advance every pending transfer once (never blocks)."""
        for src in self.sources:
            src.poll()
        if self._sends:
            self._sends = [(req, keep) for req, keep in self._sends if not req.test()]
        if self._progress_in:
            self._drain_progress()
        if self.guard is not None:
            self._control()

    def _wait(self, ready, what: str, **args):
        """Wait (sleeping, not spinning) until ``ready()``; recorded as a "wait" span."""
        self._poll()
        if ready():
            return 0.0
        cpu0 = time.process_time()
        with self.trace.span("wait", "wait", what=what, **args):
            waited = wait_until(ready, self._poll)
        self.wait_wall += waited
        self.wait_cpu += time.process_time() - cpu0
        return waited

    # ---- inputs ----------------------------------------------------------------------------
    def _local_producer(self, stage: int) -> bool:
        return stage == 0 or (stage - 1) in self.my_stages

    def _complete_versions(self) -> list:
        """Versions whose pieces have arrived from every source (sorted)."""
        if not self.sources:
            return []
        common = set(self.sources[0].got)
        for src in self.sources[1:]:
            common &= set(src.got)
        return sorted(common)

    def _assemble(self, stage: int, version: int) -> InputRecord:
        """Take version ``version`` out of the sources; older ones are dropped."""
        be, xp = self.be, self.be.xp
        t0 = self.trace.now()
        parts = []
        for src in self.sources:
            parts.append(src.got.pop(version))
            for v in [v for v in src.got if v < version]:
                del src.got[v]
        header = parts[0][0]
        chain = tuple((int(header[4 + 2 * k]), int(header[5 + 2 * k])) for k in range(int(header[3])))
        nbytes = sum(int(p.nbytes) for _, p in parts)
        params = self._unpack_chain(parts[0][1][self.sources[0].rows:], stage)
        recompute = 0.0
        if self.mode == "weights":
            r0 = self.trace.now()
            with self.trace.span("recompute", "handover", stage=stage + 1, version=version):
                train, val = self._recompute(chain, params)
            recompute = self.trace.now() - r0
        else:
            n_in = self.layers[stage].n_in
            tx = xp.empty((self.x_train.x.shape[0], n_in), dtype=be.dtype)
            vx = xp.empty((self.x_val.x.shape[0], n_in), dtype=be.dtype)
            for src, (_, payload) in zip(self.sources, parts):
                pt, pv = src.pieces
                nt = self._piece_rows(pt)
                if pt is not None:
                    tx[pt[1]] = payload[:nt * n_in].reshape(nt, n_in)
                if pv is not None:
                    vx[pv[1]] = payload[nt * n_in:src.rows].reshape(-1, n_in)
            train, val = Shard(tx, self.tblocks), Shard(vx, self.vblocks)
        if self.leader:
            self.receive_records.append({"stage": stage, "version": version, "t": t0,
                                         "recompute_s": recompute, "bytes": nbytes})
        return InputRecord(version, train, val, chain, params)

    def _unpack_chain(self, flat, stage: int) -> tuple:
        """The (W, b_h) snapshots of layers 0..stage-1 from a flat payload."""
        params, off = [], 0
        for layer in self.layers[:stage]:
            w = flat[off:off + layer.n_in * layer.n_out].reshape(layer.n_in, layer.n_out)
            off += layer.n_in * layer.n_out
            params.append({"W": w, "bh": flat[off:off + layer.n_out]})
            off += layer.n_out
        return tuple(params)

    def _recompute(self, chain, params):
        """This rank's input rows through the chain, reusing the cached activations of its
        unchanged bottom."""
        k = 0
        while k < min(len(chain), len(self._chain_cache)) and self._chain_cache[k][0] == chain[k]:
            k += 1
        del self._chain_cache[k:]
        xt, xv = (self._chain_cache[k - 1][1], self._chain_cache[k - 1][2]) if k else (self.x_train, self.x_val)
        for idx in range(k, len(chain)):
            f = _frozen(self.layers[chain[idx][0]], params[idx])
            xt, xv = f.transform(xt), f.transform(xv)
            self._chain_cache.append((chain[idx], xt, xv))
        return xt, xv

    def _input(self, stage: int, version: int) -> InputRecord | None:
        """The planned input of ``stage`` (waiting for it if it has not arrived); None if a
        stop or checkpoint request came while waiting."""
        store = self.store[stage]
        if version not in store:
            if self._local_producer(stage):
                raise RuntimeError(f"stage {stage + 1}: version {version} from the same rank is missing")
            self._wait(lambda: all(version in s.got for s in self.sources) or self._requested(),
                       "input", stage=stage + 1, version=version)
            if not all(version in s.got for s in self.sources):
                return None
            store[version] = self._assemble(stage, version)
        for v in [v for v in store if v < version]:
            del store[v]
        return store[version]

    # ---- one epoch and its hand-over -------------------------------------------------------
    def _epoch(self, stage: int, epoch: int, record: InputRecord, extra: bool, resume=None):
        """Train one epoch; returns (record dict or None, EpochResult)."""
        layer, be = self.layers[stage], self.be
        start = self.trace.now()
        with self.trace.span("epoch", "train", stage=stage + 1, epoch=epoch + 1, version=record.version,
                             extra=extra) as info:
            result = train_epoch(layer, record.train, epoch, self.stage_comm, guard=self.guard, resume=resume)
            be.synchronize()
        if not result.complete:
            return None, result
        err = result.means[0]
        info["train_error"] = err
        end = self.trace.now()
        if self.guard is not None:
            where = f"sync pre-training, layer {stage + 1} ({layer.n_in}-{layer.n_out}), epoch {epoch + 1}"
            self.guard.check(err, "the reconstruction error", where, comm=self.stage_comm)
            self.guard.check_params(layer.params, where, comm=self.stage_comm)
        val_err = None
        if self.n_val:
            with self.trace.span("eval", "eval", stage=stage + 1, epoch=epoch + 1):
                val_err = layer.recon_error(record.val, reducer(self.stage_comm))
        rec = {"stage": stage, "epoch": epoch, "version": record.version, "extra": bool(extra),
               "train_error": float(err), "val_error": val_err, "start": start, "end": end,
               "rank": self.comm.rank}
        if self.leader:
            self.records.append(rec)
            self._report(rec)
        return rec, result

    def _handover(self, stage: int, version: int, record: InputRecord, local_wanted: bool = True):
        """After ``stage``'s epoch ``version``: make input ``version`` of stage+1."""
        layer, be, xp = self.layers[stage], self.be, self.be.xp
        remote = (stage + 1) not in self.my_stages
        if not remote and not local_wanted:
            return
        t0 = self.trace.now()
        nbytes = 0
        with self.trace.span("handover", "handover", stage=stage + 1, version=version,
                             mode=self.mode if remote else "local") as info:
            chain = record.chain + ((stage, version),)
            snap = {"W": layer.params["W"].copy(), "bh": layer.params["bh"].copy()}
            params = tuple(record.params) + (snap,)
            if not remote or self.mode == "data":
                ht, hv = layer.transform(record.train), layer.transform(record.val)
            if not remote:
                self.store[stage + 1][version] = InputRecord(version, ht, hv, chain, params)
            else:
                header = np.zeros(self._hdr_len(), dtype=np.int64)
                header[0], header[1], header[3] = KIND_VERSION, version, len(chain)
                for k, (lay, ver) in enumerate(chain):
                    header[4 + 2 * k], header[5 + 2 * k] = lay, ver
                weights = xp.concatenate([a for p in params for a in (p["W"].reshape(-1), p["bh"])])
                for rr, pt, pv in self.out_links:
                    if self.mode == "data":
                        empty = xp.empty(0, be.dtype)
                        payload = xp.concatenate([ht.x[pt[0]].reshape(-1) if pt is not None else empty,
                                                  hv.x[pv[0]].reshape(-1) if pv is not None else empty, weights])
                    else:
                        payload = weights
                    be.synchronize()
                    self._sends.append((self.comm.Isend(header, rr, TAG_HDR), header))
                    self._sends.append((self.comm.Isend(payload, rr, TAG_PAY), payload))
                    nbytes += int(payload.nbytes)
            info["bytes"] = nbytes
        if self.leader:
            self.handover_records.append({"stage": stage, "version": version, "t": t0,
                                          "seconds": self.trace.now() - t0, "bytes": nbytes,
                                          "remote": remote})

    def _send_final(self, stop: bool):
        if self.my_stages[-1] + 1 >= self.n or getattr(self, "_final_sent", False):
            return
        self._final_sent = True
        header = np.zeros(self._hdr_len(), dtype=np.int64)
        header[0], header[2] = KIND_FINAL, int(stop)
        for rr, _, _ in self.out_links:
            self._sends.append((self.comm.Isend(header, rr, TAG_HDR), header))

    # ---- the schedules ---------------------------------------------------------------------
    def _pause(self, stage: int, result) -> bool:
        """Record a paused epoch (its streams gathered on the stage leader); True."""
        from aepar.resume import Checkpointer

        self.position[stage].paused = Checkpointer.gather(result.state, self.stage_comm)
        self._paused = True
        return True

    def _count_epoch(self, stage: int, done: int):
        """--checkpoint-every N counts the first layer's epochs (rank 0 leads that stage)."""
        if self.guard is not None and stage == 0 and self.comm.is_root and self.guard.epoch_due(done):
            self.guard.ask_checkpoint()

    def _boundary(self, result=None) -> bool:
        """At an epoch boundary: True (and paused) if the stage group agrees to stop here."""
        checkpoint, stop = self._agree()
        if result is not None:
            checkpoint, stop = checkpoint or result.checkpoint, stop or result.stop
        if checkpoint or stop:
            self._paused = True
        return checkpoint or stop

    def _run_plan(self):
        for e in self.plan.order:
            if e.stage not in self.my_stages:
                continue
            pos = self.position[e.stage]
            if e.epoch < pos.done:
                continue
            resume, pos.paused = pos.paused, None
            if resume is None and self._boundary():
                break
            record = self._input(e.stage, e.version)
            if not self._all_have(record):  # a request came while a replica waited for its input
                self._boundary()
                break
            rec, result = self._epoch(e.stage, e.epoch, record, e.extra, resume)
            if rec is None:
                self._pause(e.stage, result)
                break
            pos.done = e.epoch + 1
            self._count_epoch(e.stage, pos.done)
            if e.stage + 1 < self.n and (e.epoch + 1) in self.plan.needed(e.stage):
                self._handover(e.stage, e.epoch + 1, record)
            self._poll()
            if e.epoch + 1 == self.plan.epochs(e.stage) and e.stage == self.my_stages[-1]:
                self._send_final(False)
            if (result.checkpoint or result.stop) and self._boundary(result):
                break

    def _run_newest(self):
        """Real-time newest-wins. The group leader decides which stage runs next on which
        version and tells its replicas (point-to-point, so that waiting replicas sleep);
        stages sharing a rank take turns by least time used, like threads sharing a core."""
        st = {s: dict({"base": 0, "extra": 0, "last": 0, "done": False, "busy": 0.0},
                      **self.position[s].counters) for s in self.my_stages}

        def available(s):
            if s == 0:
                return [0]
            if (s - 1) in self.my_stages:
                return sorted(self.store[s])
            return sorted(set(self.store[s]) | set(self._complete_versions()))

        def producer_done(s):
            if (s - 1) in self.my_stages:
                return st[s - 1]["done"]
            return all(src.final for src in self.sources)

        def first_done():
            return st[0]["done"] if 0 in st else any(src.stop for src in self.sources)

        def stop(s):
            return self.end_with_first and s > 0 and first_done()

        def finished(s):
            x = st[s]
            if s == 0:
                return x["base"] >= self.epochs[0]
            if x["base"] < self.epochs[s]:
                return False
            if x["extra"] >= self.extras[s] or stop(s):
                return True
            newest = available(s)
            return producer_done(s) and (not newest or newest[-1] <= x["last"])

        def runnable(s):
            x = st[s]
            if x["done"]:
                return None
            if s == 0:
                return 0
            vs = available(s)
            if x["base"] < self.epochs[s]:
                return vs[-1] if vs else None
            return vs[-1] if vs and vs[-1] > x["last"] else None

        def choose():
            for s in self.my_stages:  # in order: a stage's end can end the next one
                if not st[s]["done"] and finished(s):
                    st[s]["done"] = True
            options = [(st[s]["busy"], s, v) for s in self.my_stages if (v := runnable(s)) is not None]
            return min(options) if options else None

        pending = {s: self.position[s].paused for s in self.my_stages}
        for s in self.my_stages:
            self.position[s].paused = None
        while True:
            if self.leader:
                pick = None

                def ready():
                    nonlocal pick
                    pick = choose()
                    return pick is not None or all(x["done"] for x in st.values()) or self._requested()

                self._wait(ready, "input")
                if pick is None and not all(x["done"] for x in st.values()):
                    decision = np.array([-2, 0], dtype=np.int64)  # a request: stop here
                else:
                    decision = np.array([-1, int(self.end_with_first and first_done())] if pick is None
                                        else [pick[1], pick[2]], dtype=np.int64)
                for r in self.my_ranks[1:]:
                    self._sends.append((self.comm.Isend(decision, r, TAG_DECIDE), decision))
            else:
                decision = np.empty(2, dtype=np.int64)
                req = self.comm.Irecv(decision, self.my_ranks[0], TAG_DECIDE)
                self._wait(req.test, "decision")
            s, v = int(decision[0]), int(decision[1])
            if s == -1:
                self._send_final(bool(v))
                break
            if (s == -2 or pending.get(s) is None) and self._boundary():
                break
            record = self.store[0][0] if s == 0 else (
                self.store[s][v] if (s - 1) in self.my_stages else self._input(s, v))
            if not self._all_have(record):
                self._boundary()
                break
            for old in [u for u in self.store[s] if u < v]:
                del self.store[s][old]
            x = st[s]
            extra = x["base"] >= self.epochs[s]
            t0 = self.trace.now()
            rec, result = self._epoch(s, x["base"] + x["extra"], record, extra, pending.pop(s, None))
            if rec is None:
                self._pause(s, result)
                self.position[s].counters = {k: x[k] for k in ("base", "extra", "last", "busy")}
                break
            x["extra" if extra else "base"] += 1
            x["last"] = v
            self.position[s].done = x["base"] + x["extra"]
            self._count_epoch(s, self.position[s].done)
            if s + 1 < self.n:
                self._handover(s, x["base"] + x["extra"], record,
                               local_wanted=(s + 1) in st and not st[s + 1]["done"])
            x["busy"] += self.trace.now() - t0
            if (result.checkpoint or result.stop) and self._boundary(result):
                break
        for s in self.my_stages:
            if not self.position[s].counters or self.position[s].paused is None:
                self.position[s].counters = {k: st[s][k] for k in ("base", "extra", "last", "busy")}

    # ---- run -------------------------------------------------------------------------------
    def run(self) -> PipelineResult:
        """Pre-train until done or a safe point; afterwards every rank holds every layer's
        parameters as they are. Collective over ``comm``."""
        comm = self.comm
        comm.barrier()
        t0 = comm.wtime()
        if self.handover == "plan":
            self._run_plan()
        else:
            self._run_newest()
        self._send_final(False)
        elapsed = comm.wtime() - t0
        self._finish()
        paused = bool(comm.allreduce(float(self._paused), op="max"))
        stop = paused and bool(comm.allreduce(float(self.guard is not None and self.guard.flags() >= STOP), op="max"))
        time_s = comm.allreduce(elapsed, op="max")
        self._share_params()
        waits = comm.gather({"rank": comm.rank, "wait_s": self.wait_wall, "wait_cpu_s": self.wait_cpu,
                                 "group": self.g})
        gathered = comm.gather((self.records, self.handover_records, self.receive_records))
        epochs, handovers, receives = [], [], []
        if comm.is_root:
            for e, h, r in gathered:
                epochs += e
                handovers += h
                receives += r
            epochs.sort(key=lambda r: (r["stage"], r["epoch"]))
            handovers.sort(key=lambda r: (r["stage"], r["version"]))
            receives.sort(key=lambda r: (r["stage"], r["version"]))
        return PipelineResult(time_s, epochs, handovers, receives, waits or [], self.layout.to_dict(),
                              self.mode, self.handover, paused, stop)

    def _finish(self):
        """Let every transfer complete: producers' sends, consumers' drains to the final
        markers, progress records to rank 0, control messages."""
        self._wait(lambda: all(src.final for src in self.sources), "drain")
        self._report(None)
        if self.comm.is_root:
            self._wait(lambda: len(self._done_from) == self.comm.size - 1, "progress")
        self._wait(lambda: not self._sends, "sends")
        self.comm.barrier()  # every announced control message has arrived
        for buf, req in self._ctrl_in.values():
            if req.test():
                if self.guard is not None:
                    self.guard.request(float(buf[0]))
            else:
                req.cancel()
        self._ctrl_in.clear()

    def _share_params(self):
        """Every rank gets every layer's parameters from the leader of its group."""
        for s, layer in enumerate(self.layers):
            root = self.layout.ranks[self.layout.group_of_stage(s)][0]
            for k in sorted(layer.params):
                self.comm.Bcast(layer.params[k], root=root)

    # ---- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict | None:
        """Every stage's position, momentum and the input versions it will still use, on rank 0
        (None elsewhere). Collective; call after :meth:`run` paused. The layers' parameters
        are the same on every rank after run()."""
        mine = {}
        if self.leader:
            for s in self.my_stages:
                pos = self.position[s]
                self._take_arrivals(s)
                inputs = {}
                for v, rec in self.store.get(s, {}).items():
                    if s > 0 and v in self._still_needed(s, pos):
                        inputs[int(v)] = {"chain": [list(c) for c in rec.chain],
                                          "params": [{k: self.be.to_host(a) for k, a in p.items()}
                                                     for p in rec.params]}
                mine[s] = {"done": pos.done, "paused": pos.paused.to_dict() if pos.paused else None,
                           "counters": pos.counters, "inputs": inputs,
                           "velocity": {k: self.be.to_host(v) for k, v in self.layers[s].optimizer.state().items()}}
        parts = self.comm.gather(mine)
        if not self.comm.is_root:
            return None
        stages = {}
        for p in parts:
            stages.update(p)
        return {"stages": [stages[s] for s in range(self.n)]}

    def _take_arrivals(self, stage: int):
        """Complete versions still in the sources go into the store (for the checkpoint)."""
        if stage == 0 or self._local_producer(stage):
            return
        for v in self._complete_versions():
            self.store[stage][v] = self._assemble(stage, v)

    def _still_needed(self, stage: int, pos: StagePosition) -> set:
        if self.plan is not None and self.handover == "plan":
            return {e.version for e in self.plan.stages[stage][pos.done:]}
        last = pos.counters.get("last", 0)
        return {v for v in self.store.get(stage, {}) if v >= last}

    def _resume(self, state: dict):
        """Positions from :meth:`state`, and the input versions rebuilt from their snapshots."""
        for s in self.my_stages:
            st = state["stages"][s]
            pos = self.position[s]
            pos.done = int(st["done"])
            pos.paused = EpochState.from_dict(st["paused"]) if st.get("paused") else None
            pos.counters = dict(st.get("counters") or {})
            self.layers[s].optimizer.load_state(st["velocity"])
            for v, inp in sorted((int(v), i) for v, i in st["inputs"].items()):
                chain = tuple(tuple(int(a) for a in c) for c in inp["chain"])
                params = tuple({k: self.be.asarray(np.asarray(a)) for k, a in p.items()} for p in inp["params"])
                train, val = self._recompute(chain, params)
                self.store[s][v] = InputRecord(v, train, val, chain, params)
            if pos.done >= (self.plan.epochs(s) if self.plan is not None and self.handover == "plan"
                            else self.epochs[s] + self.extras[s]) and s == self.my_stages[-1]:
                self._send_final(False)

