"""TreeSum's messages between ranks, every rank a thread of this process: the fixed-tree sum
is the one-process tree_sum, bit for bit, for any block count, rank count and shares."""
import queue
import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aepar.parallel.blocks import TreeSum
from aepar.rows import tree_sum


class ThreadRanks:
    """Mailboxes between ``size`` thread ranks: one FIFO per (sender, receiver), as MPI
    orders the messages of one pair and tag."""

    def __init__(self, size):
        self.size = size
        self.box = {(a, b): queue.Queue() for a in range(size) for b in range(size)}


class ThreadComm:
    """What TreeSum calls of aepar.comm.Comm, over :class:`ThreadRanks`."""

    def __init__(self, ranks, rank):
        self.ranks, self.rank, self.size, self.is_root = ranks, rank, ranks.size, rank == 0

    def Send(self, buf, dest, tag=0):
        self.ranks.box[(self.rank, dest)].put(np.array(buf, copy=True))

    def Recv(self, buf, source, tag=0):
        buf[...] = self.ranks.box[(source, self.rank)].get(timeout=5)
        return buf

    def Bcast(self, buf, root=0):
        if self.rank == root:
            for r in range(self.size):
                if r != root:
                    self.ranks.box[(root, r)].put(np.array(buf, copy=True))
        else:
            buf[...] = self.ranks.box[(root, self.rank)].get(timeout=5)
        return buf


def on_every_rank(size, fn):
    """``fn(comm)`` on ``size`` thread ranks at once; their results in rank order."""
    ranks, out, errors = ThreadRanks(size), [None] * size, []

    def run(r):
        try:
            out[r] = fn(ThreadComm(ranks, r))
        except BaseException as exc:  # noqa: BLE001  (re-raised below, in the test's thread)
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    if errors:
        raise errors[0]
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(count=st.integers(1, 120), ranks=st.integers(1, 16), seed=st.integers(0, 2 ** 31))
def test_the_sum_over_ranks_is_the_one_process_sum_bit_for_bit(count, ranks, seed):
    """reduce (a list of vectors, or the rows of one array) and allreduce, on equal shares
    and on uneven ones: the same bytes as tree_sum of every block in one process."""
    ranks = min(ranks, count)
    rng = np.random.default_rng(seed)
    every = rng.standard_normal((count, 6)) * 10.0 ** rng.integers(-8, 8, (count, 1))
    want = tree_sum([v.copy() for v in every]).tobytes()
    cuts = rng.choice(np.arange(1, count), ranks - 1, replace=False) if ranks > 1 else []
    bounds = [0, *sorted(int(c) for c in cuts), count]
    uneven = list(zip(bounds[:-1], bounds[1:]))  # any contiguous shares, as balancing makes
    for shares in (None, uneven):
        def reduce_list(comm):
            tree = TreeSum(comm, count, shares)
            return tree.reduce([v.copy() for v in every[tree.first:tree.stop]])

        def reduce_rows(comm):
            tree = TreeSum(comm, count, shares)
            return tree.reduce(every[tree.first:tree.stop].copy())

        def allreduce_rows(comm):
            tree = TreeSum(comm, count, shares)
            return tree.allreduce(every[tree.first:tree.stop].copy(), np.empty(6))
        for fn in (reduce_list, reduce_rows):
            got = on_every_rank(ranks, fn)
            assert got[0].tobytes() == want, (fn.__name__, shares)
            assert all(g is None for g in got[1:])
        assert all(g.tobytes() == want for g in on_every_rank(ranks, allreduce_rows)), shares
