"""Work on some of the ranks while the others sleep: the data-parallel phases of a
pipeline run (fine-tuning, the greedy comparison), which take no more ranks than the cores."""
from __future__ import annotations

import pickle

import numpy as np

import aepar
from aepar import _threads, errors
from aepar.comm import TAG_IDLE_DONE, TAG_IDLE_NOTE, wait_until

__all__ = ["data_parallel_ranks", "Subset"]


def data_parallel_ranks(comm, requested=None) -> list[int]:
    """Ranks for the data-parallel phases (fine-tuning, the greedy comparison).

    ``requested``: the first that many ranks. Default: every rank, except where a node
    has more ranks x threads than cores - there only as many as fit. A collective's
    waiting ranks spin inside MPI, so oversubscribed data parallelism (4 ranks on 2 cores:
    `make run`) mostly times the spinning; the pipeline's waiting stages sleep instead.
    Collective.
    """
    info = comm.allgather((_threads.placement(comm), int(aepar.THREADS)))
    if requested:
        return list(range(min(int(requested), comm.size)))
    # a node's cores: all its ranks' CPUs together (a rank bound to one core sees only its own)
    cores = _threads.cores_per_node([place for place, _ in info])
    used, members = {}, []
    for rank, ((node, _), threads) in enumerate(info):
        if used.get(node, 0) < max(1, cores[node] // max(threads, 1)):
            members.append(rank)
            used[node] = used.get(node, 0) + 1
    return members


class Subset:
    """Run work on some ranks (world rank 0 among them) while the others sleep.

    The idle ranks poll for a message from rank 0 with sleeps backing off (MPI's own
    waits would spin and take the cores the working ranks need).
    """

    def __init__(self, comm, members):
        self.comm, self.members = comm, sorted(members)
        if 0 not in self.members:
            raise ValueError("rank 0 must be a member")
        self.member = comm.rank in self.members
        self.sub = comm.split(0 if self.member else 1, comm.rank)
        self.size = len(self.members)

    def run(self, fn):
        """``fn(sub_comm)`` on the members; returns its result there, None elsewhere.

        A user-facing error the members raise together (an interruption, a divergence)
        is raised on the idle ranks too, so that every rank ends with its exit code.
        """
        comm = self.comm
        idle = [r for r in range(comm.size) if r not in self.members]
        if self.member:
            error = None
            try:
                result = fn(self.sub)
            except errors.UserError as exc:
                if not getattr(exc, "collective", False):
                    raise
                error = exc
            if comm.is_root and idle:
                note = np.frombuffer(pickle.dumps(errors.describe(error)), dtype=np.uint8) if error else np.zeros(0, np.uint8)
                token = np.array([float(error is not None), note.size])
                reqs = [comm.Isend(token, r, TAG_IDLE_DONE) for r in idle]
                if error is not None:
                    reqs += [comm.Isend(note, r, TAG_IDLE_NOTE) for r in idle]
                wait_until(lambda: all(r.test() for r in reqs))
            if error is not None:
                raise error
            return result
        token = np.empty(2)
        req = comm.Irecv(token, 0, TAG_IDLE_DONE)
        wait_until(req.test)
        if token[0]:
            note = np.empty(int(token[1]), dtype=np.uint8)
            req = comm.Irecv(note, 0, TAG_IDLE_NOTE)
            wait_until(req.test)
            raise errors.rebuild(pickle.loads(note.tobytes()))
        return None
