"""Sums that do not depend on the number of ranks or threads.

Floating-point addition is not associative, so a sum over samples depends on how the
samples are split: an MPI_Allreduce over 2 ranks and over 4 ranks round differently, and
after 400 L-BFGS iterations the difference shows in the fourth digit. aepar therefore
fixes the decomposition first and the hardware second:

- the samples (rows) are cut into ``count`` **blocks** that depend only on the data size
  (:func:`block_bounds`); a rank owns a contiguous run of whole blocks
  (:func:`rank_blocks`), so any number of ranks up to ``count`` can share the work;
- every per-sample sum is first taken per block (each block computed alone, with
  single-threaded BLAS, so its value does not depend on who computes it), then the blocks
  are combined in **one fixed binary tree** over the block indices (:class:`TreeSum`):
  node [a, a + 2^j) = node [a, a + 2^(j-1)) + node [a + 2^(j-1), a + 2^j), a missing right
  half leaves the left one as it is. A rank adds the nodes inside its own run; nodes that
  straddle ranks are added by the owner of their left half after a point-to-point message.

The result is bitwise the same on 1 rank or on any number of ranks up to ``count``, with
any number of threads per rank (threads take whole blocks: :func:`parallel_map`).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = ["block_bounds", "rank_blocks", "Blocks", "TreeSum", "tree_sum", "parallel_map", "TAG_TREE"]

TAG_TREE = 5001


def block_bounds(n: int, count: int) -> np.ndarray:
    """Offsets (count + 1,) of ``count`` contiguous blocks of ``n`` rows; sizes differ by
    at most one, the larger ones first."""
    n, count = int(n), int(count)
    if count < 1:
        raise ValueError(f"need at least one block, got {count}")
    base, extra = divmod(n, count)
    sizes = np.full(count, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def rank_blocks(count: int, rank: int, size: int) -> tuple[int, int]:
    """(first, stop): the blocks of ``rank`` among ``size`` ranks, contiguous, the counts
    differing by at most one."""
    b = block_bounds(count, size)
    return int(b[rank]), int(b[rank + 1])


@dataclass(frozen=True)
class Blocks:
    """The fixed decomposition of ``n`` rows into ``count`` blocks, and this rank's share.

    Attributes
    ----------
    n, count : int
    first, stop : int
        This rank's blocks [first, stop).
    rows_per_block : int
        0: ``count`` blocks of near-equal size (:func:`block_bounds`); else blocks of
        exactly this many rows, the last one shorter.
    """

    n: int
    count: int
    first: int
    stop: int
    rows_per_block: int = 0

    @classmethod
    def of(cls, n: int, count: int, rank: int = 0, size: int = 1) -> "Blocks":
        """``count`` near-equal blocks; this rank's share among ``size``."""
        first, stop = rank_blocks(count, rank, size)
        return cls(int(n), int(count), first, stop)

    @classmethod
    def fixed(cls, n: int, rows_per_block: int, rank: int = 0, size: int = 1) -> "Blocks":
        """Blocks of ``rows_per_block`` rows (the last shorter); this rank's share."""
        count = max(1, -(-int(n) // int(rows_per_block)))
        first, stop = rank_blocks(count, rank, size)
        return cls(int(n), count, first, stop, int(rows_per_block))

    @property
    def bounds(self) -> np.ndarray:
        if self.rows_per_block:
            return np.minimum(np.arange(self.count + 1, dtype=np.int64) * self.rows_per_block, self.n)
        return block_bounds(self.n, self.count)

    @property
    def rows(self) -> slice:
        """This rank's rows of the whole data set."""
        b = self.bounds
        return slice(int(b[self.first]), int(b[self.stop]))

    @property
    def mine(self) -> range:
        return range(self.first, self.stop)

    def local(self, block: int) -> slice:
        """Rows of ``block`` (one of mine) within this rank's rows."""
        b = self.bounds
        return slice(int(b[block] - b[self.first]), int(b[block + 1] - b[self.first]))



# ---- the tree ---------------------------------------------------------------------------
def _top(count: int) -> int:
    """Level of the root: the smallest L with 2^L >= count."""
    return max(0, int(count - 1).bit_length())


def _decompose(first: int, stop: int, count: int) -> list[tuple[int, int]]:
    """The maximal tree nodes (level, start) covering blocks [first, stop), left to right.

    A node covers [start, start + 2^level) clipped to ``count``; it is inside the range
    when its clipped span is.
    """
    nodes, a, top = [], first, _top(count)
    while a < stop:
        j = 0
        while j < top and a % (1 << (j + 1)) == 0 and min(a + (1 << (j + 1)), count) <= stop:
            j += 1
        nodes.append((j, a))
        a += 1 << j
    return nodes


class TreeSum:
    """The fixed-tree sum over ``count`` blocks of vectors, spread over ``comm``.

    Every rank calls :meth:`allreduce` (or :meth:`reduce`) with the vectors of its own
    blocks, in block order; the result is the same bits whatever the number of ranks.

    Parameters
    ----------
    comm : aepar.comm.Comm
        The ranks sharing the blocks (``count >= comm.size``).
    count : int
        Number of blocks.
    """

    def __init__(self, comm, count: int):
        if count < comm.size:
            raise ValueError(f"{count} blocks cannot be shared by {comm.size} ranks")
        self.comm, self.count = comm, int(count)
        self.ranges = [rank_blocks(count, r, comm.size) for r in range(comm.size)]
        self.first, self.stop = self.ranges[comm.rank]
        owner = {}
        for r, (f, s) in enumerate(self.ranges):
            for node in _decompose(f, s, count):
                owner[node] = r
        self._local = _decompose(self.first, self.stop, count)
        self._ops = []  # (level, start, left owner, right owner), children before parents
        self._plan(_top(count), 0, owner)
        self._scratch = None

    def _plan(self, level, start, owner):
        """Owner rank of node (level, start), recording the cross-rank additions below it."""
        if (level, start) in owner:
            return owner[(level, start)]
        half = 1 << (level - 1)
        left = self._plan(level - 1, start, owner)
        if start + half >= self.count:  # no right half: the node is its left half
            return left
        right = self._plan(level - 1, start + half, owner)
        self._ops.append((level, start, left, right))
        return left

    @staticmethod
    def _local_value(level, start, leaves, count, add):
        """Value of a node inside this rank's range, computed into its leftmost leaf."""
        if level == 0:
            return leaves[start]
        half = 1 << (level - 1)
        left = TreeSum._local_value(level - 1, start, leaves, count, add)
        if start + half < count:
            add(left, TreeSum._local_value(level - 1, start + half, leaves, count, add))
        return left

    def _combine(self, vectors, add):
        if len(vectors) != self.stop - self.first:
            raise ValueError(f"rank {self.comm.rank} owns {self.stop - self.first} blocks, got "
                             f"{len(vectors)} vectors")
        leaves = {self.first + i: v for i, v in enumerate(vectors)}
        values = {node: self._local_value(*node, leaves, self.count, add) for node in self._local}
        me = self.comm.rank
        for level, start, left, right in self._ops:
            half = 1 << (level - 1)
            if left == right == me:  # both halves here, one of them assembled from other ranks
                mine = self._value(values, level - 1, start)
                add(mine, self._value(values, level - 1, start + half))
                values[(level, start)] = mine
            elif right == me:
                self.comm.send(self._value(values, level - 1, start + half), left, TAG_TREE)
            elif left == me:
                mine = self._value(values, level - 1, start)
                if self._scratch is None or self._scratch.shape != mine.shape or self._scratch.dtype != mine.dtype:
                    self._scratch = np.empty_like(mine)
                add(mine, self.comm.recv(self._scratch, right, TAG_TREE))
                values[(level, start)] = mine
        return self._value(values, _top(self.count), 0) if me == 0 else None

    def _value(self, values, level, start):
        """The value held for node (level, start): itself, or the left half it reduces to."""
        while (level, start) not in values:
            level -= 1
        return values[(level, start)]

    def reduce(self, vectors, add=None):
        """The sum on rank 0 (a vector there, clobbering its first block's vector), None elsewhere."""
        return self._combine(vectors, add or _add)

    def allreduce(self, vectors, out, add=None):
        """The sum in ``out`` on every rank."""
        total = self._combine(vectors, add or _add)
        if self.comm.is_root:
            out[...] = total
        self.comm.bcast(out)
        return out


def _add(a, b):
    a += b


def tree_sum(vectors, add=None):
    """The fixed-tree sum of a full list of block vectors in one process (into the first)."""
    count = len(vectors)
    leaves = dict(enumerate(vectors))
    return TreeSum._local_value(_top(count), 0, leaves, count, add or _add)


# ---- threads take whole blocks ------------------------------------------------------------
_POOL = None


def threads() -> int:
    """Threads this rank uses for its blocks (aepar.THREADS: cores / ranks on the node)."""
    import aepar

    return max(1, int(getattr(aepar, "THREADS", 1)))


def parallel_map(fn, items) -> list:
    """``[fn(x) for x in items]``, the items spread over this rank's threads.

    BLAS runs single-threaded (aepar._threads), so each item's arithmetic is the same
    whichever thread runs it: results do not depend on the number of threads.
    """
    items = list(items)
    n = threads()
    if n == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    global _POOL
    if _POOL is None or _POOL._max_workers != n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="aepar-block")
    return list(_POOL.map(fn, items))


def _fork_safe():
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fork_safe)
