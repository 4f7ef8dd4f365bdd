"""Executing the synchronized schedule on ranks: hand-over, safe points, resume.

:class:`Pipeline` runs the layers of a stack as pipeline stages on groups of ranks
(:class:`aepar.parallel.pipeline.Layout`): ``handover="plan"`` executes a plan made on a
logical clock (a stage ahead of the plan waits for its planned input version; arrivals
are kept until used), ``handover="newest"`` is the literal real-time newest-wins of
Santara et al. (not reproducible; the choice is aepar.parallel.executor_newest). Inside a
stage with several ranks every epoch is data-parallel over fixed blocks of rows
(aepar.parallel.data_parallel): the same weights whatever the layout.

Hand-over between groups (aepar.parallel.handover): ``mode="data"`` sends the transformed
rows, ``"weights"`` the (W, b_h) of the layers below, from which the consumer recomputes
its input; both give identical inputs. Transport: non-blocking Isend/Irecv through
aepar.comm, a small header then the payload; waiting ranks poll with sleeps backing off
(MPI_Wait busy-polls in Open MPI). Epoch records and stop/checkpoint requests travel the
same way (aepar.parallel.executor_messages).

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

import time
from dataclasses import dataclass, field

import numpy as np

from aepar.comm import TAG_DECIDE, TAG_HDR, TAG_PAY, wait_until
from aepar.guard import STOP
from aepar.parallel import handover as wire  # the hand-over's links and messages
from aepar.parallel.data_parallel import EpochState, reducer, train_epoch
from aepar.parallel.executor_messages import EpochRecords, Outbox, Requests
from aepar.parallel.executor_newest import NewestWins
from aepar.parallel.handover import InputRecord, Recompute, Source
from aepar.parallel.pipeline import HANDOVERS, MODES, Layout, Plan
from aepar.rows import Blocks, Shard

__all__ = ["Pipeline", "PipelineResult", "InputRecord"]


@dataclass
class PipelineResult:
    """What :meth:`Pipeline.run` returns on every rank (records complete on rank 0 only).

    ``paused``: the run stopped at a safe point (a checkpoint request); :meth:`Pipeline.state`
    then holds where every stage is, and ``stop`` says whether a signal asked to end the run.
    """

    time_s: float
    epochs: list          # per epoch (group leaders'): stage, epoch, version, extra, start, end, errors
    handovers: list       # per hand-over (producer leaders'): stage, version, t, send_s, bytes, remote
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
        self._outbox = Outbox(comm)
        self._recompute = Recompute(layers, self.x_train, self.x_val)  # weights mode's inputs
        self.records, self.handover_records, self.receive_records = [], [], []
        self.wait_wall = self.wait_cpu = 0.0
        self._paused = False
        self._final_sent = False
        self._setup_links()
        self._progress = EpochRecords(comm, self._outbox, on_epoch)
        self._requests = Requests(comm, guard, self._outbox)
        if resume is not None:
            self._resume(resume)

    # ---- links between groups ------------------------------------------------------------
    def _setup_links(self):
        be = self.be
        first, last = self.my_stages[0], self.my_stages[-1]
        self.sources, self.out_links = [], []
        if first > 0:
            n_in = self.layers[first].n_in
            for sr, rr, pt, pv in self._links_between(self.g - 1):
                if rr != self.comm.rank:
                    continue
                rows = 0 if self.mode == "weights" else (wire.piece_rows(pt) + wire.piece_rows(pv)) * n_in
                src = Source(self.comm, be.xp, be.dtype, sr, rows + wire.chain_size(self.layers[:first]),
                             wire.header_len(self.n))
                src.pieces = (pt, pv)
                src.rows = rows
                self.sources.append(src)
        if last + 1 < self.n:
            self.out_links = [(rr, pt, pv) for sr, rr, pt, pv in self._links_between(self.g)
                              if sr == self.comm.rank]

    def _links_between(self, g_from: int):
        return wire.links_between(self.layout, self.mode, self.n_train, self.n_val, self.count, g_from)

    # ---- requests, agreement, polling -----------------------------------------------------------
    def _requested(self) -> bool:
        return self._requests.pending()

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
        self._outbox.poll()
        self._progress.poll()
        self._requests.poll()

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
        be = self.be
        t0 = self.trace.now()
        parts = []
        for src in self.sources:
            parts.append(src.got.pop(version))
            for v in [v for v in src.got if v < version]:
                del src.got[v]
        chain = wire.chain_of(parts[0][0])
        nbytes = sum(int(p.nbytes) for _, p in parts)
        params = wire.unpack_chain(parts[0][1][self.sources[0].rows:], self.layers[:stage])
        recompute = 0.0
        if self.mode == "weights":
            r0 = self.trace.now()
            with self.trace.span("recompute", "handover", stage=stage + 1, version=version):
                train, val = self._recompute(chain, params)
            recompute = self.trace.now() - r0
        else:
            tx, vx = wire.place_rows(be.xp, be.dtype, self.sources, [p for _, p in parts], self.layers[stage].n_in,
                                self.x_train.x.shape[0], self.x_val.x.shape[0])
            train, val = Shard(tx, self.tblocks), Shard(vx, self.vblocks)
        if self.leader:
            self.receive_records.append({"stage": stage, "version": version, "t": t0,
                                         "recompute_s": recompute, "bytes": nbytes})
        return InputRecord(version, train, val, chain, params)

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
            info.update(result.phase_args)
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
            self._progress.report(rec)
        return rec, result

    def _handover(self, stage: int, version: int, record: InputRecord, local_wanted: bool = True):
        """After ``stage``'s epoch ``version``: make input ``version`` of stage+1."""
        layer = self.layers[stage]
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
            ht = hv = None
            if not remote or self.mode == "data":
                ht, hv = layer.transform(record.train), layer.transform(record.val)
            if not remote:
                self.store[stage + 1][version] = InputRecord(version, ht, hv, chain, params)
            else:
                nbytes = self._send_version(version, chain, params, ht, hv)
            info["bytes"] = nbytes
        if self.leader:
            self.handover_records.append({"stage": stage, "version": version, "t": t0,
                                          "send_s": self.trace.now() - t0, "bytes": nbytes,
                                          "remote": remote})

    def _send_version(self, version: int, chain: tuple, params: tuple, ht, hv) -> int:
        """Input ``version`` to every consumer rank of the next group: header, then payload;
        returns the payload bytes."""
        be, xp = self.be, self.be.xp
        header = wire.version_header(self.n, version, chain)
        weights = wire.pack_chain(xp, params)
        nbytes = 0
        for rr, pt, pv in self.out_links:
            payload = wire.rows_payload(xp, be.dtype, ht, hv, pt, pv, weights) if self.mode == "data" else weights
            be.synchronize()
            self._outbox.send(header, rr, TAG_HDR)
            self._outbox.send(payload, rr, TAG_PAY)
            nbytes += int(payload.nbytes)
        return nbytes

    def _send_final(self, stop: bool):
        if self.my_stages[-1] + 1 >= self.n or self._final_sent:
            return
        self._final_sent = True
        header = wire.final_header(self.n, stop)
        for rr, _, _ in self.out_links:
            self._outbox.send(header, rr, TAG_HDR)

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
        """Real-time newest-wins (aepar.parallel.executor_newest). The group leader decides
        which stage runs next on which version and tells its replicas (point-to-point, so that
        waiting replicas sleep)."""
        policy = NewestWins(self.my_stages, self.epochs, self.extras, self.end_with_first,
                            {s: self.position[s].counters for s in self.my_stages}, self._versions_at,
                            upstream_final=lambda: all(src.final for src in self.sources),
                            upstream_stopped=lambda: any(src.stop for src in self.sources))
        pending = {s: self.position[s].paused for s in self.my_stages}
        for s in self.my_stages:
            self.position[s].paused = None
        while True:
            s, v = self._choose_and_tell(policy) if self.leader else self._leaders_choice()
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
            if not self._newest_epoch(policy, s, v, record, pending.pop(s, None)):
                break
        for s in self.my_stages:
            self.position[s].counters = policy.at[s].saved()

    def _versions_at(self, stage: int) -> list:
        """The versions of ``stage``'s input at hand now (arrived whole, or made here)."""
        if stage == 0:
            return [0]
        if (stage - 1) in self.my_stages:
            return sorted(self.store[stage])
        return sorted(set(self.store[stage]) | set(self._complete_versions()))

    def _choose_and_tell(self, policy: NewestWins) -> tuple[int, int]:
        """Leader: wait for a stage that can train (or the end, or a request) and tell the
        replicas. (stage, version); (-1, stop) when every stage is finished; (-2, 0) to stop
        here for a request."""
        self._wait(lambda: policy.choose() is not None or policy.all_done() or self._requested(), "input")
        pick = policy.picked
        if pick is None and not policy.all_done():
            decision = np.array([-2, 0], dtype=np.int64)  # a request: stop here
        else:
            decision = np.array([-1, int(self.end_with_first and policy.first_done())] if pick is None
                                else [pick[1], pick[2]], dtype=np.int64)
        for r in self.my_ranks[1:]:
            self._outbox.send(decision, r, TAG_DECIDE)
        return int(decision[0]), int(decision[1])

    def _leaders_choice(self) -> tuple[int, int]:
        """Replica: what the leader decided (see :meth:`_choose_and_tell`)."""
        decision = np.empty(2, dtype=np.int64)
        req = self.comm.Irecv(decision, self.my_ranks[0], TAG_DECIDE)
        self._wait(req.test, "decision")
        return int(decision[0]), int(decision[1])

    def _newest_epoch(self, policy: NewestWins, s: int, v: int, record: InputRecord, resume) -> bool:
        """Stage ``s``'s next epoch on input version ``v``, then its hand-over; False when the
        stage stops at a safe point."""
        for old in [u for u in self.store[s] if u < v]:
            del self.store[s][old]
        c = policy.at[s]
        extra = c.base >= self.epochs[s]
        t0 = self.trace.now()
        rec, result = self._epoch(s, c.base + c.extra, record, extra, resume)
        if rec is None:
            self._pause(s, result)
            return False
        done = self.position[s].done = policy.trained(s, v, extra)
        self._count_epoch(s, done)
        if s + 1 < self.n:
            self._handover(s, done, record, local_wanted=policy.wants_input(s + 1))
        c.busy += self.trace.now() - t0
        return not ((result.checkpoint or result.stop) and self._boundary(result))

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
        self._progress.report(None)
        if self.comm.is_root:
            self._wait(self._progress.all_done, "progress")
        self._wait(self._outbox.empty, "sends")
        self.comm.barrier()  # every announced control message has arrived
        self._requests.close()

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
