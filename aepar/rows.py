"""The fixed decomposition of a data set's rows, and sums that do not depend on it.

Floating-point addition is not associative, so a sum over samples depends on how the
samples are split: an MPI_Allreduce over 2 ranks and over 4 ranks round differently, and
after 400 L-BFGS iterations the difference shows in the fourth digit. aepar therefore
fixes the decomposition first and the hardware second:

- the samples (rows) are cut into ``count`` **blocks** that depend only on the data size
  (:func:`block_bounds`); a rank owns a contiguous run of whole blocks
  (:func:`rank_blocks`, :class:`Blocks`; its rows are a :class:`Shard`), so any number
  of ranks up to ``count`` can share the work;
- every per-sample sum is first taken per block (each block computed alone, with
  single-threaded BLAS, so its value does not depend on who computes it), then the blocks
  are combined in **one fixed binary tree** over the block indices: node
  [a, a + 2^j) = node [a, a + 2^(j-1)) + node [a + 2^(j-1), a + 2^j), a missing right half
  leaving the left one as it is (:func:`tree_node`, :func:`tree_sum`, :func:`local_sums`).

Threads take whole blocks (:func:`parallel_map`). This module knows no ranks: where the
blocks are spread over ranks, :class:`aepar.parallel.blocks.TreeSum` adds the same tree's
nodes across them, so the result is bitwise the same on 1 rank or on any number up to
``count``, with any number of threads per rank.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aepar.errors import UserError

__all__ = ["mean_squared_error", "block_bounds", "rank_blocks", "Blocks", "Shard", "tree_top", "tree_node",
           "tree_node_from", "tree_cover", "cover_merges", "tree_merges", "tree_sum", "tree_sum_rows", "local_sums",
           "parallel_map", "each", "threads", "one_thread", "thread_bands", "weight_bands", "calls_in_turns",
           "check_blocks", "stacked_rows", "BlockRows", "BlockFactor", "factor_rows", "factor_starts", "as_parts",
           "weighted_ranges", "CHUNK", "DEFAULT_BLOCKS"]

# Blocks per data set unless --reduce-blocks says otherwise: up to 8 ranks share the work.
DEFAULT_BLOCKS = 8
# rows per call when a whole block is transformed or evaluated: bounds temporaries
CHUNK = 4096


def block_bounds(n: int, count: int) -> np.ndarray:
    """Offsets (count + 1,) of ``count`` contiguous blocks of ``n`` rows; sizes differ by
    at most one, the larger ones first."""
    return np.array(_bounds(n, count), dtype=np.int64)


def _bounds(n: int, count: int) -> list[int]:
    """:func:`block_bounds` as a list of ints (made without NumPy: :func:`thread_bands`
    asks for them several times a step, on the host's critical path)."""
    n, count = int(n), int(count)
    if count < 1:
        raise ValueError(f"need at least one block, got {count}")
    base, extra = divmod(n, count)
    return [i * base + min(i, extra) for i in range(count + 1)]  # the first ``extra`` blocks one row longer


def rank_blocks(count: int, rank: int, size: int) -> tuple[int, int]:
    """(first, stop): the blocks of ``rank`` among ``size`` ranks, contiguous, the counts
    differing by at most one."""
    b = block_bounds(count, size)
    return int(b[rank]), int(b[rank + 1])


def weighted_ranges(count: int, speeds) -> list[tuple[int, int]]:
    """Each rank's (first, stop) of ``count`` blocks, contiguous and in rank order, the
    counts near-proportional to ``speeds`` (blocks per second, one per rank), at least one
    each: ranks that compute faster take more blocks. The fixed tree over the blocks does
    not change, so neither do the bits."""
    speeds = np.asarray(speeds, dtype=np.float64)
    size = speeds.size
    if size < 1 or count < size or not np.all(np.isfinite(speeds)) or np.any(speeds <= 0):
        raise ValueError(f"{count} blocks for speeds {list(speeds)}: need positive speeds and a block per rank")
    cuts = np.rint(count * np.cumsum(speeds)[:-1] / speeds.sum()).astype(np.int64)
    bounds = [0]
    for k, cut in enumerate(cuts, start=1):  # every rank keeps a block, the last ones too
        bounds.append(int(min(max(cut, bounds[-1] + 1), count - (size - k))))
    bounds.append(int(count))
    return list(zip(bounds[:-1], bounds[1:]))


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

    @property
    def whole(self) -> bool:
        """Whether this share is every block (one process holding the data set)."""
        return self.first == 0 and self.stop == self.count

    def local(self, block: int) -> slice:
        """Rows of ``block`` (one of mine) within this rank's rows."""
        b = self.bounds
        return slice(int(b[block] - b[self.first]), int(b[block + 1] - b[self.first]))


@dataclass
class Shard:
    """This rank's rows of a data set: whole blocks of the fixed decomposition.

    Attributes
    ----------
    x : backend array (rows, features)
        The rows of ``blocks.first`` .. ``blocks.stop``.
    blocks : Blocks
    """

    x: object
    blocks: Blocks

    @classmethod
    def of(cls, be, x_all, count: int, rank: int = 0, size: int = 1) -> "Shard":
        """Rank ``rank`` of ``size``'s blocks of the host array ``x_all`` (``count`` blocks)."""
        blocks = Blocks.of(np.shape(x_all)[0], count, rank, size)
        return cls(be.asarray(x_all[blocks.rows]), blocks)

    @property
    def n(self) -> int:
        """Rows in all blocks of the data set (all ranks)."""
        return self.blocks.n

    def map_rows(self, fn, width: int, xp, dtype) -> "Shard":
        """``fn`` applied to every block in chunks of :data:`CHUNK` rows (so each row's result
        is the same whoever computes it), as a Shard with the same blocks."""
        out = xp.empty((self.x.shape[0], width), dtype=dtype)

        def run(b):
            rows = self.blocks.local(b)
            for lo in range(rows.start, rows.stop, CHUNK):
                hi = min(lo + CHUNK, rows.stop)
                out[lo:hi] = fn(self.x[lo:hi])
        parallel_map(run, self.blocks.mine)
        return Shard(out, self.blocks)

    def block_sums(self, fn) -> list:
        """Per own block, Σ over its rows of ``fn(rows) -> float64 vector`` (in chunks of
        :data:`CHUNK` rows, added in order), every vector of the same width; the leaves of
        :func:`local_sums` and of the sums over ranks (aepar.parallel.data_parallel)."""
        def run(b):
            rows = self.blocks.local(b)
            total = None
            for lo in range(rows.start, rows.stop, CHUNK):
                # float(): a loss may be a 0-d array on the GPU (the kernels' contract)
                part = np.array([float(v) for v in fn(self.x[lo:min(lo + CHUNK, rows.stop)])])
                total = part if total is None else total + part
            return total
        return parallel_map(run, self.blocks.mine)


# ---- the tree ---------------------------------------------------------------------------
def tree_top(count: int) -> int:
    """Level of the root of the tree over ``count`` blocks: the smallest L with 2^L >= count."""
    return max(0, int(count - 1).bit_length())


def tree_node(level: int, start: int, leaves, count: int, add=operator.iadd):
    """Value of node (level, start) of the tree over ``count`` blocks, from ``leaves``
    (block index -> vector: all the blocks under the node), computed into its leftmost
    leaf with ``add(a, b)`` (a += b)."""
    return tree_node_from(level, start, _BlockNodes(leaves), count, add)


class _BlockNodes:
    """Block vectors as the known values of the tree's level-0 nodes."""

    def __init__(self, leaves):
        self.leaves = leaves

    def __contains__(self, node) -> bool:
        return node[0] == 0

    def __getitem__(self, node):
        return self.leaves[node[1]]


def tree_node_from(level: int, start: int, known: dict, count: int, add=operator.iadd):
    """:func:`tree_node` from the values of some of its nodes (``known``: (level, start) ->
    vector, each block under exactly one of them), into the leftmost one's vector."""
    if (level, start) in known:
        return known[(level, start)]
    if level == 0:
        raise KeyError(f"block {start} is under none of the known nodes")
    half = 1 << (level - 1)
    left = tree_node_from(level - 1, start, known, count, add)
    if start + half < count:
        add(left, tree_node_from(level - 1, start + half, known, count, add))
    return left


def tree_cover(first: int, stop: int, count: int) -> list[tuple[int, int]]:
    """The largest tree nodes (level, start) covering blocks [first, stop), left to right.

    A node covers [start, start + 2^level) clipped to ``count``; it is inside the range
    when its clipped span is.
    """
    nodes, a, top = [], first, tree_top(count)
    while a < stop:
        j = 0
        while j < top and a % (1 << (j + 1)) == 0 and min(a + (1 << (j + 1)), count) <= stop:
            j += 1
        nodes.append((j, a))
        a += 1 << j
    return nodes


def cover_merges(first: int, stop: int, count: int) -> tuple[list, tuple[int, ...]]:
    """(:func:`tree_cover`'s nodes, the postfix merges that add blocks [first, stop) into
    them: one count per block, :func:`tree_merges` of each node in turn)."""
    nodes = tree_cover(first, stop, count)
    return nodes, tuple(m for level, start in nodes for m in tree_merges(level, start, count))


def tree_merges(level: int, start: int, count: int) -> list[int]:
    """Node (level, start)'s tree in postfix, for one call that adds its blocks' values
    (kernels' ``block_outer_sum``): for each of its blocks in order, how many additions of
    the two newest partial sums follow it, so that the result is :func:`tree_node`'s."""
    merges: list[int] = []

    def visit(level, start):
        if level == 0:
            merges.append(0)
            return
        half = 1 << (level - 1)
        visit(level - 1, start)
        if start + half < count:
            visit(level - 1, start + half)
            merges[-1] += 1
    visit(level, start)
    return merges


def tree_sum(vectors, add=None):
    """The fixed-tree sum of a full list of block vectors in one process (into the first)."""
    count = len(vectors)
    return tree_node(tree_top(count), 0, dict(enumerate(vectors)), count, add or operator.iadd)


def tree_sum_rows(rows):
    """:func:`tree_sum` of the rows of a 2-D array (NumPy or CuPy), into its first row,
    which it returns: the same additions, a level of the tree at a time, each level one
    vectorised add (79 rows: 7 calls instead of 78 and the recursion's Python)."""
    count, step = rows.shape[0], 1
    while step < count:
        right = rows[step::2 * step]              # each node's right half at this level
        rows[0:len(right) * 2 * step:2 * step] += right
        step *= 2
    return rows[0]


def local_sums(shard: Shard, fn) -> np.ndarray:
    """Σ over all rows of ``fn(rows) -> float64 vector``, taken per block in chunks and added
    in the fixed tree, in one process (the shard must hold every block): the same bits as
    the sum over any number of ranks (aepar.parallel.data_parallel.blockwise_sums)."""
    if not shard.blocks.whole:
        raise ValueError(f"a local sum needs every block on this process; this shard holds blocks "
                         f"[{shard.blocks.first}, {shard.blocks.stop}) of {shard.blocks.count} "
                         f"(sum over the ranks instead)")
    parts = shard.block_sums(fn)
    width = next((p.size for p in parts if p is not None), 0)
    parts = [np.zeros(width) if p is None else p for p in parts]
    out = np.zeros(width)
    out[...] = tree_sum(parts)
    return out


# ---- threads take whole blocks ------------------------------------------------------------
_CREW = None
_ALONE = [0]  # one_thread() blocks under way


def threads() -> int:
    """Threads this rank uses for its blocks (aepar.THREADS: cores / ranks on the node; one
    inside :func:`one_thread`)."""
    import aepar

    return 1 if _ALONE[0] else max(1, int(getattr(aepar, "THREADS", 1)))


@contextlib.contextmanager
def one_thread():
    """Inside, this rank's work runs on the calling thread alone (:func:`threads` is 1):
    for work too small to share, whose hand-offs to the other threads would cost more than
    it. The results are the same on any number of threads."""
    _ALONE[0] += 1
    try:
        yield
    finally:
        _ALONE[0] -= 1


def thread_bands(n: int) -> list[int]:
    """Offsets of the bands that ``n`` items are cut into, one per thread (at most ``n``,
    at least one): :func:`block_bounds` of them, as a list."""
    return _bounds(n, max(1, min(threads(), n)))


# a thread's share of whole weights may exceed an even share by this much before the
# weights are cut into bands instead
WHOLE_SHARE_SLACK = 1.05


def weight_bands(shapes) -> list[list[int]]:
    """Per weight of ``shapes`` ((rows, columns) each), the offsets of the bands of rows
    that the threads take (:func:`calls_in_turns`): each weight whole where the weights,
    largest first, each to the thread with the least so far, give no thread more than
    :data:`WHOLE_SHARE_SLACK` times an even share (a stack's encoder and decoder layers
    pair up), else :func:`thread_bands`. A band's sums are the whole weight's rows', so
    either gives the same bits; a weight cut in bands has each thread copy all of the
    other factor's panels, and step its own part of the optimiser's arrays
    (docs/performance-notes.md)."""
    count, sizes = threads(), tuple(int(r) * int(c) for r, c in shapes)
    if count > 1 and max(_least_loaded(sizes, count)[1]) <= WHOLE_SHARE_SLACK * sum(sizes) / count:
        return [[0, int(r)] for r, _ in shapes]
    return [thread_bands(r) for r, _ in shapes]


def calls_in_turns(calls, sizes) -> list:
    """``calls`` (of no arguments) in the order in which :func:`parallel_map`, thread k
    taking items k, k + n, ..., gives every thread about an even share of their ``sizes``
    (largest first, each to the thread with the least so far), with calls that do nothing
    where a thread has fewer."""
    count = min(threads(), len(calls))
    if count <= 1:
        return list(calls)
    shares, _ = _least_loaded(tuple(sizes), count)
    turns = max(map(len, shares))
    return [calls[s[j]] if j < len(s) else _nothing for j in range(turns) for s in shares]


@functools.lru_cache(maxsize=64)
def _least_loaded(sizes: tuple, count: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """(the indices of ``sizes`` each of ``count`` shares takes, each share's total): the
    largest first (ties in order), each to the share with the least so far (the first of
    equals). Kept per sizes: a run's steps ask for the same few, step after step."""
    shares, loads = [[] for _ in range(count)], [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = loads.index(min(loads))
        shares[k].append(i)
        loads[k] += sizes[i]
    return tuple(map(tuple, shares)), tuple(loads)


def _nothing():
    return None


class BlockRows(Sequence):
    """Blocks whose rows lie one after another in one array: item k is the view
    ``rows[starts[k]:starts[k + 1]]``, made when it is read. Consecutive items (a slice)
    are a BlockRows of the same array, which :func:`stacked_rows` returns as one view of it
    without looking up where each view lies (a view or a look-up costs host microseconds,
    and a step of 8 blocks made dozens of each). ``rows`` may be a tuple of such arrays,
    the parts of a factor (kernels' ``block_outer_sum``): an item is then the tuple of
    each part's view, and so is :meth:`stacked`."""

    __slots__ = ("rows", "starts")

    def __init__(self, rows, starts):
        self.rows = rows
        self.starts = starts.tolist() if isinstance(starts, np.ndarray) else [int(s) for s in starts]

    def __len__(self):
        return len(self.starts) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step == 1:
                part = BlockRows.__new__(BlockRows)  # offsets already a list of ints: no second pass
                part.rows, part.starts = self.rows, self.starts[lo:max(lo, hi) + 1]
                return part
            return [self[k] for k in range(lo, hi, step)]
        starts = self.starts
        k = index + len(starts) - 1 if index < 0 else index  # a negative index as a list's
        if not 0 <= k < len(starts) - 1:
            raise IndexError("BlockRows index out of range")
        rows, lo, hi = self.rows, starts[k], starts[k + 1]  # _rows, written out: a step reads dozens
        return tuple([part[lo:hi] for part in rows]) if type(rows) is tuple else rows[lo:hi]

    def __iter__(self):
        rows, starts = self.rows, self.starts
        return (_rows(rows, lo, hi) for lo, hi in zip(starts[:-1], starts[1:]))

    def stacked(self):
        """All the items' rows: one view of the array (of each part)."""
        return _rows(self.rows, self.starts[0], self.starts[-1])


def _rows(rows, lo: int, hi: int):
    """Rows lo:hi of an array, or of each part of a tuple of them (:class:`BlockRows`)."""
    return tuple([part[lo:hi] for part in rows]) if type(rows) is tuple else rows[lo:hi]


def _of_width(rows, width: int) -> bool:
    """Whether ``rows`` (an array, or a tuple of them) are 2-D rows of ``width`` columns."""
    if type(rows) is tuple:
        return all(r.ndim == 2 and r.shape[1] == width for r in rows)
    return rows.ndim == 2 and rows.shape[1] == width


def as_parts(a) -> tuple:
    """A factor's parts (see :class:`BlockRows`): its tuple, or the array alone. The kernels
    read them the same way (kernels' ``block_outer_sum``), which aepar reaches through its
    backend only."""
    return a if isinstance(a, tuple) and a else (a,)


class BlockFactor:
    """One block's factors (A, D, alpha) (see aepar.parallel.data_parallel) whose rows are
    item ``k`` of two :class:`BlockRows`: the trainer stacks consecutive blocks' factors as
    views of those arrays (:func:`factor_rows`). Read as the tuple (A, D, alpha); A's and
    D's views are made when read, as the trainer reads none of them (on a GPU each costs
    the host microseconds, and a step of 8 blocks made 16 to 32)."""

    __slots__ = ("source", "alpha")

    def __init__(self, a_rows: BlockRows, d_rows: BlockRows, k: int, alpha):
        self.source, self.alpha = (a_rows, d_rows, k), alpha

    def __len__(self):
        return 3

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        i = operator.index(index)
        i = i + 3 if i < 0 else i
        if i == 2:
            return self.alpha
        if i in (0, 1):
            return self.source[i][self.source[2]]
        raise IndexError("BlockFactor index out of range")

    def __iter__(self):
        return iter((self[0], self[1], self.alpha))

    @property
    def rows(self) -> int:
        """The block's rows (in each part of its factors)."""
        starts, k = self.source[0].starts, self.source[2]
        return starts[k + 1] - starts[k]


def factor_starts(parts) -> list:
    """Where each block's rows start in :func:`factor_rows`' arrays when they are stacked
    in one, and where they end: ``parts`` as factor_rows takes them (None: no rows)."""
    return list(itertools.accumulate(
        (0 if not p else p.rows if isinstance(p, BlockFactor) else as_parts(p[0])[0].shape[0] for p in parts),
        initial=0))


def factor_rows(xp, parts, widths, dtype) -> tuple:
    """(A, D, starts): consecutive blocks' factors ``parts`` ((A, D, alpha) or None: no
    rows), each of ``widths`` columns, as kernels' ``block_outer_sum`` takes them.
    BlockFactors of the same arrays, in order (the blocks one thread stacked), are views
    of those arrays; several threads' such runs are each read where they lie, as parts
    side by side (every part of A, each thread's, with a row of starts per part: block b's
    rows in its own thread's, none in the others'), not copied into one array. Anything
    else is stacked (:func:`stacked_rows`) with one row of starts (:func:`factor_starts`)."""
    runs = _factor_runs(parts)
    if runs is None:
        return (*(stacked_rows(xp, [p[j] if p else None for p in parts], widths[j], dtype) for j in (0, 1)),
                factor_starts(parts))
    views = [(stacked_rows(xp, a_rows[k:k + count], widths[0], dtype),
              stacked_rows(xp, d_rows[k:k + count], widths[1], dtype), a_rows.starts[k:k + count + 1])
             for a_rows, d_rows, k, count in runs]
    if len(views) == 1:
        a, d, at = views[0]
        return a, d, [s - at[0] for s in at]
    rows, first = [], 0  # each run's row of starts over all the blocks
    for _, _, at in views:
        own = [s - at[0] for s in at]
        rows.append([0] * first + own + [own[-1]] * (len(parts) - first - len(own) + 1))
        first += len(own) - 1
    count = len(as_parts(views[0][0]))
    return (tuple(as_parts(a)[j] for j in range(count) for a, _, _ in views),
            tuple(as_parts(d)[j] for j in range(count) for _, d, _ in views),
            np.array([row for _ in range(count) for row in rows], dtype=np.int64))


def _factor_runs(parts):
    """``parts`` as runs of BlockFactors of the same arrays in order, [(A's BlockRows, D's,
    the first item, items)], or None where any is not a BlockFactor or the runs' parts
    differ in number."""
    runs = []
    for p in parts:
        source = getattr(p, "source", None)
        if source is None:
            return None
        a_rows, d_rows, k = source
        if runs and runs[-1][0] is a_rows and runs[-1][1] is d_rows and runs[-1][2] + runs[-1][3] == k:
            runs[-1][3] += 1
        else:
            runs.append([a_rows, d_rows, k, 1])
    if not runs or len({len(as_parts(r[0].rows)) for r in runs}) != 1:
        return None
    return runs


def stacked_rows(xp, parts, width: int, dtype):
    """The rows of ``parts`` (2-D arrays of ``width`` columns; None or empty: no rows) one
    after another. Where they already lie so in one allocation (consecutive blocks' factors
    sliced from the array a kernel stacked them in) those rows are returned as they are, a
    view; otherwise one copy. On a GPU a copy is a launch per part. Items that are tuples
    (a factor's parts, see :class:`BlockRows`) are stacked part by part, into a tuple."""
    if isinstance(parts, BlockRows) and _of_width(parts.rows, width):
        return parts.stacked()
    if any(isinstance(p, tuple) for p in parts):
        count = next(len(p) for p in parts if isinstance(p, tuple))
        return tuple(stacked_rows(xp, [None if p is None else p[i] for p in parts], width, dtype) for i in range(count))
    live = [p for p in parts if p is not None and p.shape[0]]
    if not live:
        return xp.empty((0, width), dtype)
    first = live[0]
    if len(live) == 1:
        return first
    if any(p.shape[1] != width for p in live) or not _one_after_another(live, first.base):
        return xp.concatenate(live)
    # the owner may hold another dtype (kernels.memory's aligned arrays are views of bytes):
    # the rows are found by their byte offset in it
    start = _address(first) - _address(first.base)
    nbytes = sum(p.shape[0] for p in live) * width * first.itemsize
    return first.base.reshape(-1).view(xp.uint8)[start:start + nbytes].view(first.dtype).reshape(-1, width)


def _one_after_another(parts, base) -> bool:
    """Whether ``parts`` are C-ordered views of one C-ordered array ``base`` (of any dtype),
    each starting where the one before it ends."""
    if not isinstance(base, type(parts[0])) or not base.flags.c_contiguous:
        return False
    if any(p.base is not base or not p.flags.c_contiguous or p.dtype != parts[0].dtype for p in parts):
        return False
    at = [_address(p) for p in parts]
    return all(at[i + 1] == at[i] + p.nbytes for i, p in enumerate(parts[:-1]))


def _address(a) -> int:
    """Where an array's first element lies (a NumPy or a CuPy array)."""
    return a.data.ptr if hasattr(a.data, "ptr") else a.__array_interface__["data"][0]


def parallel_map(fn, items) -> list:
    """``[fn(x) for x in items]``, the items spread over this rank's threads.

    BLAS runs single-threaded (aepar._threads), so each item's arithmetic is the same
    whichever thread runs it: results do not depend on the number of threads.
    Thread k takes items k, k + n, ... (n threads; the calling thread is thread 0): one
    hand-off per helper thread and call rather than one per item (a fine-tuning step on 2
    threads made 152), and blocks of 13 and 12 rows shared evenly. A call made while
    another is under way (from inside an item, or from a second thread of the caller's)
    takes all its items itself: the same results, one thread.
    """
    items = list(items)
    n = min(threads(), len(items))
    if n <= 1:
        return [fn(x) for x in items]
    global _CREW
    if _CREW is None or _CREW.size != threads() - 1 or _CREW.broken:
        if _CREW is not None:
            _CREW.close()
        _CREW = _Crew(threads() - 1)
    crew = _CREW
    if not crew.busy.acquire(blocking=False):
        return [fn(x) for x in items]
    try:
        crew.start(fn, [items[k::n] for k in range(1, n)])
        try:
            mine = [fn(x) for x in items[::n]]
        finally:
            shares = crew.finish()  # none still writes into shared buffers when an error goes up
    finally:
        crew.busy.release()
    out = [None] * len(items)
    out[::n] = mine
    for k, (done, share) in enumerate(shares, start=1):
        if not done:
            raise share
        out[k::n] = share
    return out


class _Crew:
    """Helper threads, each waiting on a lock of its own. A hand-off is one lock released
    and the wait for the share one lock acquired, where a thread pool made, queued and
    waited on a future for each share: work on the host's path of every step (a sparse
    autoencoder's evaluation makes two such calls, a layer's step several)."""

    def __init__(self, size: int):
        self.size = size
        self.busy = threading.Lock()  # one call at a time
        self._go = [threading.Lock() for _ in range(size)]  # held while helper k has nothing to do
        self._done = [threading.Lock() for _ in range(size)]  # held until helper k's share is done
        self._work = [None] * size
        self._results = [None] * size
        self._busy_helpers, self.broken = 0, False
        for k in range(size):
            self._go[k].acquire()
            self._done[k].acquire()
            threading.Thread(target=self._serve, args=(k,), name=f"aepar-block-{k + 1}", daemon=True).start()

    def _serve(self, k: int):
        go, done = self._go[k], self._done[k]
        while True:
            go.acquire()
            work = self._work[k]
            if work is None:  # closed
                return
            fn, share = work
            try:
                self._results[k] = (True, [fn(x) for x in share])
            except BaseException as exc:  # handed to the caller, which raises it
                self._results[k] = (False, exc)
            self._work[k] = None
            done.release()

    def start(self, fn, shares: list):
        """Helper k takes ``shares[k]`` (at most one share each)."""
        for k, share in enumerate(shares):
            self._work[k] = (fn, share)
            self._go[k].release()
        self._busy_helpers = len(shares)

    def finish(self) -> list:
        """(True, list) or (False, its error) per helper, once every helper is done."""
        results, count = [], self._busy_helpers
        for k in range(count):
            try:
                self._done[k].acquire()
            except BaseException:  # interrupted while helpers still run: this crew is not used again
                self.broken = True
                raise
            results.append(self._results[k])
            self._results[k] = None
        self._busy_helpers = 0
        return results

    def close(self):
        """Stops the helpers (once idle)."""
        if not self.busy.acquire(blocking=False):
            return  # in use (or broken): its helpers stay, asleep
        for k in range(self.size):
            self._work[k] = None
            self._go[k].release()


def each(fn, *columns) -> list:
    """``[fn(*args) for args in zip(*columns)]`` through :func:`parallel_map`: one step of
    several blocks at once (e.g. one layer of every block), the blocks spread over the threads."""
    return parallel_map(lambda args: fn(*args), list(zip(*columns)))


def _fork_safe():
    global _CREW
    _CREW = None  # its threads are not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fork_safe)


def mean_squared_error(shard: Shard, reconstruct, mse_forward, reduce=None) -> float:
    """Mean over all rows of Σ_units (x − reconstruct(x))², the error every layer and stack
    reports. ``reduce(shard, fn) -> vector`` sums over every rank's rows; None: this process
    holds every block (:func:`local_sums`)."""
    total = (reduce or local_sums)(shard, lambda x: [mse_forward(reconstruct(x), x, scale=2.0)])
    return float(total[0] / max(shard.n, 1))


def check_blocks(comm_size: int, count: int, n_rows: int, what: str = "--reduce-blocks"):
    """UserError unless ``count`` blocks of ``n_rows`` rows can give every one of
    ``comm_size`` ranks a non-empty block."""
    if count < comm_size:
        raise UserError(f"{what} {count} cannot be shared by {comm_size} ranks (each needs a whole block): "
                        f"use at most {count} ranks or {what} {comm_size}")
    if n_rows < count:
        raise UserError(f"{n_rows} rows cannot fill {count} blocks: use {what} {max(1, n_rows)} or fewer")
