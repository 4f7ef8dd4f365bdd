"""The fixed-tree sum spread over ranks.

aepar cuts the rows into fixed blocks and adds per-block sums in one fixed binary tree over
the block indices (aepar.rows: the decomposition, the tree, the sum in one process). When
the blocks are shared by ranks, each rank owning a contiguous run of them
(:func:`aepar.rows.rank_blocks`), :class:`TreeSum` adds the same tree's nodes: a rank adds
the nodes inside its own run; nodes that straddle ranks are added by the owner of their
left half after a point-to-point message. The result is bitwise the same on 1 rank or on
any number of ranks up to ``count``.

Everyone's copy of the sum comes from rank 0's by a Bcast, except where a power-of-two
number of ranks each hold one node of the same size (8 blocks on 2, 4 or 8 ranks) and the
vector is long: there the nodes above the ranks' are the pairs of a butterfly, and the
sum is taken by recursive halving, then doubling (Rabenseifner's Allreduce), each rank
adding its part of every pair of siblings. Each rank then sends about twice its vector in
all, where the messages up the tree and the Bcast send a vector per level (the figures:
docs/performance-notes.md, `make bench-tree-sum`).
"""
from __future__ import annotations

import operator

import numpy as np

from aepar.comm import TAG_TREE

from aepar.rows import rank_blocks, tree_cover, tree_node, tree_node_from, tree_sum_rows, tree_top

__all__ = ["TreeSum", "halving_pairs", "HALVING_BYTES"]

# allreduce by halving from vectors of this many bytes: shorter ones, whose time is the
# messages' latency, take the tree and the Bcast (twice log2(ranks) messages either way;
# 64 KB on 2 ranks of Zen 3: 31 us against 34, 4 KB 11 against 12, 100 B 10 against 4)
HALVING_BYTES = 64 << 10


def halving_pairs(count: int, ranks: int) -> bool:
    """Whether ``ranks`` holding equal shares of ``count`` blocks each hold one node of the
    tree, so that the nodes above theirs pair off as a butterfly's (rank r's sibling at
    distance d is rank r ^ d): a power-of-two number of ranks, a power-of-two share each."""
    share = count // ranks if ranks > 0 else 0
    return ranks > 1 and not ranks & (ranks - 1) and share * ranks == count and not share & (share - 1)


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
    ranges : list of (first, stop), optional
        Every rank's blocks, contiguous and in rank order (default: equal shares,
        :func:`aepar.rows.rank_blocks`); the sum's bits are the same for any.
    """

    def __init__(self, comm, count: int, ranges=None):
        if count < comm.size:
            raise ValueError(f"{count} blocks cannot be shared by {comm.size} ranks")
        self.comm, self.count = comm, int(count)
        self.ranges = [rank_blocks(count, r, comm.size) for r in range(comm.size)] if ranges is None else \
            [(int(f), int(s)) for f, s in ranges]
        if len(self.ranges) != comm.size or self.ranges[0][0] != 0 or self.ranges[-1][1] != count or any(
                f >= s for f, s in self.ranges) or any(a[1] != b[0] for a, b in zip(self.ranges, self.ranges[1:])):
            raise ValueError(f"ranges {self.ranges} do not share {count} blocks among {comm.size} ranks in order")
        self.first, self.stop = self.ranges[comm.rank]
        owner = {}
        for r, (f, s) in enumerate(self.ranges):
            for node in tree_cover(f, s, count):
                owner[node] = r
        self._local = tree_cover(self.first, self.stop, count)
        self._ops = []  # (level, start, left owner, right owner), children before parents
        self._plan(tree_top(count), 0, owner)
        # each own node's rows in a 2-D array of this rank's block vectors
        self._spans = [(level, start, start - self.first, min(start + (1 << level), count) - self.first)
                       for level, start in self._local]
        self._steps = self._schedule()
        self._scratch = None
        # equal shares of one node each (not the ranges a rebalanced run gives its ranks)
        self.butterfly = halving_pairs(count, comm.size) and \
            self.ranges == [rank_blocks(count, r, comm.size) for r in range(comm.size)]

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

    def _schedule(self):
        """This rank's part of :attr:`_ops`, resolved once: (what, a, b) steps over the
        slots of its own nodes' vectors (slot i: the i-th of :attr:`nodes`).
        ``("add", a, b)``: slot a += slot b (both halves here); ``("send", a, rank)``;
        ``("recv", a, rank)``: slot a += what rank sends. A node's sum lands in its left
        half's vector, so its slot is its left half's (and the total, rank 0's slot 0)."""
        slot = {node: i for i, node in enumerate(self._local)}
        me, steps = self.comm.rank, []

        def held(level, start):  # a node's sum is in its leftmost own node's vector
            while (level, start) not in slot:
                level -= 1
            return slot[(level, start)]
        for level, start, left, right in self._ops:
            half = 1 << (level - 1)
            if left == right == me:
                steps.append(("add", held(level - 1, start), held(level - 1, start + half)))
            elif right == me:
                steps.append(("send", held(level - 1, start + half), left))
            elif left == me:
                steps.append(("recv", held(level - 1, start), right))
        return steps

    @property
    def nodes(self) -> list[tuple[int, int]]:
        """The tree nodes (level, start) that this rank's blocks make up, left to right:
        what it adds alone before any message."""
        return list(self._local)

    def node_values(self, vectors, add=None) -> dict:
        """{node: value} for :attr:`nodes`, added from this rank's block vectors (in block
        order) into the first vector of each node. ``vectors``: a list, or the rows of one
        2-D array, whose nodes are then added a tree level at a time (the same additions,
        :func:`aepar.rows.tree_sum_rows`: a few NumPy calls instead of one per block)."""
        if len(vectors) != self.stop - self.first:
            raise ValueError(f"rank {self.comm.rank} owns {self.stop - self.first} blocks, got "
                             f"{len(vectors)} vectors")
        if add is None and getattr(vectors, "ndim", 1) == 2:
            return {(level, start): tree_sum_rows(vectors[lo:hi]) for level, start, lo, hi in self._spans}
        leaves = {self.first + i: v for i, v in enumerate(vectors)}
        return {node: tree_node(*node, leaves, self.count, add or operator.iadd) for node in self._local}

    def node_values_from(self, known: dict, add=None) -> dict:
        """{node: value} for :attr:`nodes` from the values of smaller nodes under them
        (``known``: (level, start) -> vector, every own block under exactly one; e.g. the
        nodes each thread's share adds up in the kernels), into the leftmost one's vector."""
        add = add or operator.iadd
        return {node: tree_node_from(*node, known, self.count, add) for node in self._local}

    def reduce_nodes(self, values, add=None):
        """:meth:`reduce` from this rank's :attr:`nodes`' values (:meth:`node_values_from`)."""
        return self._combine(values, add or operator.iadd)

    def _combine(self, values, add):
        """The sum on rank 0 from every rank's :meth:`node_values` (messages between ranks),
        along this rank's steps of the plan (:meth:`_schedule`)."""
        held = [values[node] for node in self._local]
        comm = self.comm
        for what, a, b in self._steps:
            if what == "add":  # both halves here, one of them assembled from other ranks
                add(held[a], held[b])
            elif what == "send":
                comm.Send(held[a], b, TAG_TREE)
            else:
                mine = held[a]
                add(mine, comm.Recv(self._scratch_like(mine), b, TAG_TREE))
        return held[0] if comm.rank == 0 else None

    def _scratch_like(self, v):
        """A vector of ``v``'s shape and type for messages to land in, kept between calls."""
        if self._scratch is None or self._scratch.shape != v.shape or self._scratch.dtype != v.dtype:
            self._scratch = np.empty_like(v)
        return self._scratch

    def _halving(self, v, out, add):
        """The sum of every rank's ``v`` (its one node's) in ``out`` on every rank, by
        recursive halving and then doubling. At distance d = 1, 2, 4, ... rank r swaps half
        of the stretch of the vector it still holds with rank r ^ d, which holds the sibling
        node, and adds the half it keeps: each element gets the tree's additions (addition
        is commutative: either sibling may add). The finished stretches then travel back
        the way they came, unchanged."""
        comm, me = self.comm, self.comm.rank
        scratch = self._scratch_like(v)
        lo, hi, trail, d = 0, v.shape[0], [], 1
        while d < comm.size:
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if me & d == 0 else ((mid, hi), (lo, mid))
            got = scratch[:keep[1] - keep[0]]
            request = comm.Irecv(got, me ^ d, TAG_TREE)
            comm.Send(v[give[0]:give[1]], me ^ d, TAG_TREE)
            request.wait()
            add(v[keep[0]:keep[1]], got)
            trail.append((lo, hi))
            (lo, hi), d = keep, d * 2
        out[lo:hi] = v[lo:hi]
        while trail:
            d //= 2
            wider = trail.pop()
            mid = (wider[0] + wider[1]) // 2
            theirs = (mid, wider[1]) if me & d == 0 else (wider[0], mid)
            request = comm.Irecv(out[theirs[0]:theirs[1]], me ^ d, TAG_TREE)
            comm.Send(out[lo:hi], me ^ d, TAG_TREE)
            request.wait()
            lo, hi = wider
        return out

    def reduce(self, vectors, add=None):
        """The sum on rank 0 (a vector there, clobbering its first block's vector), None elsewhere."""
        add = add or operator.iadd
        return self._combine(self.node_values(vectors, add), add)

    def allreduce(self, vectors, out, add=None):
        """The sum in ``out`` on every rank."""
        return self.allreduce_nodes(self.node_values(vectors, add), out, add)

    def allreduce_nodes(self, values, out, add=None):
        """The sum in ``out`` on every rank, from this rank's ``{node: value}`` for
        :attr:`nodes` (:meth:`node_values`, or the nodes' sums taken some other way in the
        same tree)."""
        add = add or operator.iadd
        if self.butterfly:
            mine = values[self._local[0]]
            if mine.nbytes >= HALVING_BYTES:
                return self._halving(mine, out, add)
        total = self._combine(values, add)
        if self.comm.is_root:
            out[...] = total
        self.comm.Bcast(out)
        return out
