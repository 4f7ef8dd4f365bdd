"""The fixed-tree sum of blocks' outer products: a weight gradient of a batch cut into blocks.

A batch cut into blocks (aepar.rows) gives a dense layer's weight gradient as a sum over
blocks of ``alpha_b * A_b.T @ D_b`` (A_b: the block's layer inputs, D_b: its output
gradients), added in a fixed binary tree so that the result does not depend on which
rank or thread computed which block. The tree is given in postfix: after block b's
product come ``merges[b]`` additions, each of the newest partial sum into the one below
it on a stack (:func:`aepar.rows.tree_merges`). Computing every block's product apart
and adding them in that tree with NumPy gives the same bits as one call over all of them.
"""
import sys
from typing import NamedTuple

import numpy as np

from .update import sgd_momentum_update

__all__ = ["block_outer_sum", "block_outer_sum_sgd", "rows_tree_sum", "blocks_sgd_step"]


def check_starts(what, rows, starts):
    """A batch's blocks as offsets, returned as int64 (the array :func:`offsets` keeps for
    them: read, never written): from 0 to every one of ``rows`` rows, never back (the
    stacked-blocks kernels of the dense and rbm families)."""
    found = offsets(starts)
    if found is None or found.rows != rows:
        raise ValueError(f"{what}: offsets {np.ravel(starts).tolist()} do not split {rows} rows into blocks")
    return found.array


def check_block_outer_sum(A, D, starts, merges, alphas, out):
    """Shared by every kernel set; returns (starts, merges) as int64 arrays (those that
    :func:`offsets`, :func:`part_offsets` and :func:`postfix_tree` keep: read, never
    written), starts 2-D where it was given one row per part. A and D may be tuples of
    parts (see :func:`block_outer_sum`)."""
    tree = postfix_tree(merges)
    n = tree.array.size if tree is not None else len(merges)
    a_parts, d_parts = as_parts(A), as_parts(D)
    a, d = a_parts[0], d_parts[0]  # every part has A's and D's columns; a part of A, its D's rows
    per_part = _per_part(starts)
    if type(A) is tuple or type(D) is tuple:
        fits = _parts_fit(a_parts, d_parts, per_part)
    else:  # the common call: two arrays
        fits = a.ndim == 2 and d.ndim == 2 and a.shape[0] == d.shape[0]
    if not fits or out.shape != (a.shape[1], d.shape[1]):
        raise ValueError(f"block_outer_sum: A {_shapes(A)}, D {_shapes(D)} -> out {out.shape} do not match "
                         "(A: rows x m, D: rows x n, out: m x n; as many parts of A as of D, each part of A "
                         "with its part of D's rows, all with the same rows unless starts has a row per part)")
    rows = [p.shape[0] for p in a_parts]
    found = part_offsets(starts, rows) if per_part else offsets(starts)
    size = len(starts[0] if per_part else starts)
    if n < 1 or len(alphas) != n or size != n + 1:
        raise ValueError(f"block_outer_sum: {n} blocks need {n + 1} starts and {n} alphas, got "
                         f"{size} and {len(alphas)}")
    if found is None or (not per_part and found.rows != rows[0]):
        listed = [np.ravel(row).tolist() for row in starts] if per_part else np.ravel(starts).tolist()
        raise ValueError(f"block_outer_sum: starts {listed} must rise from 0 to "
                         f"{rows if per_part else rows[0]}" + (" (a row per part)" if per_part else ""))
    if tree is None:
        raise ValueError(f"block_outer_sum: merges {np.ravel(merges).tolist()} are not one postfix tree")
    return (found if per_part else found.array), tree.array


def _parts_fit(a_parts, d_parts, per_part) -> bool:
    """Whether parts of A and D are 2-D, as many of each, every part of A with A's
    columns and its part of D's rows, every part of D with D's columns, and (unless
    ``per_part``) every part of A with the first one's rows. One loop: a step checks a
    band's parts on the host's critical path (both threads' in turn, at two threads)."""
    if len(a_parts) != len(d_parts):
        return False
    a, d = a_parts[0], d_parts[0]
    if a.ndim != 2 or d.ndim != 2:
        return False
    m, n, rows = a.shape[1], d.shape[1], a.shape[0]
    for p, q in zip(a_parts, d_parts):
        if p.ndim != 2 or q.ndim != 2:
            return False
        (pr, pc), (qr, qc) = p.shape, q.shape
        if pc != m or qc != n or pr != qr or (not per_part and pr != rows):
            return False
    return True


# A step checks the same few offsets and trees in every kernel of every layer: each is
# checked once a process, in Python (whose loops over a few numbers cost less than NumPy's
# calls), and kept here (:func:`_checked`), KEPT at the most.
KEPT = 256
_OFFSETS: dict = {}
_TREES: dict = {}
_PART_OFFSETS: dict = {}
_CHAIN_ROWS: dict = {}  # id of a table _PART_OFFSETS keeps -> (that table, its chain_rows)


class Offsets(NamedTuple):
    """Blocks' offsets as the kernels take them (:func:`offsets`)."""

    array: np.ndarray  # int64
    rows: int  # the last offset: the rows of all the blocks
    most_rows: int  # of any block


class PostfixTree(NamedTuple):
    """A postfix tree as the kernels take it (:func:`postfix_tree`)."""

    array: np.ndarray  # int64
    depth: int  # the most partial sums it holds at once (stack_depth)


def _checked(kept: dict, values, make):
    """``make(int64 array, list)`` of a flat list of integers ``values``, or None: looked up
    in ``kept`` by the values, made once (and kept unless ``make`` refuses them with None)."""
    try:
        key = tuple(values.tolist() if isinstance(values, np.ndarray) else values)
        found = kept.get(key)
    except TypeError:  # a number, or a nested list
        return None
    if found is None:
        array = np.asarray(values, dtype=np.int64)
        listed = array.tolist() if array.ndim == 1 else None
        if listed is None or tuple(listed) != key:  # nested, or numbers that only round to integers
            return None
        found = make(array, listed)
        if found is not None:
            if len(kept) >= KEPT:  # a run repeats a few; anything else is not kept for long
                kept.clear()
            kept[key] = found
    return found


def offsets(starts) -> Offsets | None:
    """:class:`Offsets` of integers that rise from 0, never back (at least two), else None."""
    return _checked(_OFFSETS, starts, lambda a, v: Offsets(a, v[-1], max(hi - lo for lo, hi in zip(v, v[1:])))
                    if len(v) >= 2 and v[0] == 0 and v == sorted(v) else None)


def _per_part(starts) -> bool:
    """Whether ``starts`` has a row per part (a 2-D array, or a list of lists)."""
    if isinstance(starts, np.ndarray):
        return starts.ndim == 2
    return len(starts) > 0 and np.ndim(starts[0]) == 1


def part_offsets(starts, rows) -> np.ndarray | None:
    """One row of :func:`offsets` per part, part p's rising to ``rows[p]``, as a 2-D int64
    array (kept, as :func:`offsets` keeps its rows), else None."""
    try:
        key = (tuple(map(tuple, np.asarray(starts).tolist())), tuple(rows))
    except (TypeError, ValueError):  # not a table of numbers (rows of different lengths)
        return None
    found = _PART_OFFSETS.get(key)
    if found is None:
        each = [offsets(row) for row in key[0]]
        if len(each) != len(rows) or any(o is None or o.rows != r for o, r in zip(each, rows)):
            return None
        found = np.array([o.array for o in each], dtype=np.int64)
        if len(_PART_OFFSETS) >= KEPT:
            _PART_OFFSETS.clear()
            _CHAIN_ROWS.clear()
        _PART_OFFSETS[key] = found
        # held with the table, so its id names it while it is kept
        _CHAIN_ROWS[id(found)] = (found, max(sum(row[b + 1] - row[b] for row in key[0])
                                             for b in range(len(key[0][0]) - 1)))
    return found


def postfix_tree(merges) -> PostfixTree | None:
    """:class:`PostfixTree` of integers that are one postfix tree (see the module
    docstring), else None."""
    def make(array, v):
        depth = stack_depth(v) if v and v[0] == 0 and min(v) >= 0 else 0
        return PostfixTree(array, depth) if depth >= 1 and len(v) - sum(v) == 1 else None
    return _checked(_TREES, merges, make)


def as_parts(A) -> tuple:
    """A factor's parts: its tuple, or the array alone (see :func:`block_outer_sum`)."""
    return A if isinstance(A, tuple) and A else (A,)


def _shapes(A):
    return [p.shape for p in A] if isinstance(A, tuple) else A.shape


def interleaved(A, D, starts):
    """(A, D, starts) as one array each, where A and D are tuples of parts or ``starts`` has
    a row per part: each block's rows of every part, one part after another, block after
    block (the one chain of rows that a block's product runs over), and the blocks'
    offsets in those arrays. Arrays with one row of starts are returned as they are.
    NumPy's concatenate, which CuPy's arrays take too."""
    if not isinstance(A, tuple) and not _per_part(starts):
        return A, D, starts
    a_parts, d_parts = as_parts(A), as_parts(D)
    bounds = np.asarray(starts, dtype=np.int64)
    if bounds.ndim == 1:
        bounds = np.tile(bounds, (len(a_parts), 1))
    blocks = [[(int(bounds[p, b]), int(bounds[p, b + 1])) for p in range(len(a_parts))]
              for b in range(bounds.shape[1] - 1)]
    chain = np.concatenate([[0], np.cumsum([sum(hi - lo for lo, hi in block) for block in blocks])]).astype(np.int64)
    return tuple(np.concatenate([part[lo:hi] for block in blocks for part, (lo, hi) in zip(parts, block)])
                 for parts in (a_parts, d_parts)) + (chain,)


def chain_rows(A, starts) -> int:
    """The most rows of any block's chain (its rows of every part of A; see
    :func:`block_outer_sum`), ``starts`` one row for every part or one per part (for the
    table :func:`part_offsets` keeps, found again without NumPy: a step asks for it in
    every band)."""
    if _per_part(starts):
        kept = _CHAIN_ROWS.get(id(starts))
        if kept is not None and kept[0] is starts:
            return kept[1]
        return int(np.diff(np.asarray(starts), axis=1).sum(axis=0).max())
    return most_rows(starts) * len(as_parts(A))


def most_rows(starts) -> int:
    """The most rows of any block of the offsets ``starts`` (rising from 0, as every kernel
    checks them)."""
    found = offsets(starts)
    if found is None:
        bounds = starts.tolist() if isinstance(starts, np.ndarray) else list(starts)
        return max(b - a for a, b in zip(bounds, bounds[1:]))
    return found.most_rows


def stack_depth(merges) -> int:
    """The most partial sums the postfix tree holds at once (0 if it pops an empty stack)."""
    depth = most = 0
    for m in merges:
        depth += 1 - int(m)
        if depth < 1:
            return 0
        most = max(most, depth + int(m))
    return most


def block_outer_sum(A, D, starts, merges, alphas, out):
    """out = Σ_tree alphas[b] * A[starts[b]:starts[b+1]].T @ D[starts[b]:starts[b+1]].

    Parameters
    ----------
    A : array (rows, m), D : array (rows, n)
        The blocks' rows one after another; or tuples of parts, arrays of those shapes,
        as many of A as of D: block b's rows are then its rows of every part, one part
        after another (what :func:`interleaved` makes of them; a tied autoencoder's
        gradient x.T @ dz1 + dz2.T @ h, A = (x, dz2) and D = (dz1, h), without first
        copying the parts into one array).
    starts : ints (blocks + 1,), or (parts, blocks + 1)
        Block b is rows starts[b]:starts[b+1] (of every part; it may be empty: a zero
        product). With a row per part, block b is rows starts[p, b]:starts[p, b+1] of
        part p, and the parts may have different rows: blocks stacked in several arrays
        (one per thread that made them) are then read where they lie, a block with no
        rows in the others' (every part of A with its part of D's rows).
    merges : ints (blocks,)
        The tree in postfix: after block b's product, that many times the two newest
        partial sums are replaced by their sum (left + right).
    alphas : floats (blocks,)
        Each block's product is scaled before it is added.
    out : array (m, n), written.

    Works on CuPy arrays as well (the GPU set uses it as it is).
    """
    return tree_of_products(A, D, starts, merges, alphas, out, outer_term)


def outer_term(A_b, D_b, alpha):
    """One block's term of :func:`block_outer_sum`: the product, then the scaling."""
    return (A_b.T @ D_b) * alpha


def tree_of_products(A, D, starts, merges, alphas, out, product):
    """:func:`block_outer_sum` with each block's term ``product(A_b, D_b, alpha_b)`` (alpha_b
    of out's dtype): the GPU set picks each block's product by its rows."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, out)
    A, D, starts = interleaved(A, D, starts)
    stack = []
    for b in range(merges.size):
        s, e = int(starts[b]), int(starts[b + 1])
        value = product(A[s:e], D[s:e], out.dtype.type(alphas[b]))
        for _ in range(int(merges[b])):
            value = stack.pop() + value
        stack.append(value)
    out[...] = stack[0]
    return out


def check_rows_tree(rows, merges):
    """:func:`rows_tree_sum`'s arguments checked; returns the tree (:func:`postfix_tree`)."""
    tree = postfix_tree(merges)
    if rows.ndim != 2 or tree is None or tree.array.size != rows.shape[0]:
        raise ValueError(f"rows_tree_sum: merges {np.ravel(merges).tolist()} are not one postfix tree over the "
                         f"{rows.shape[0] if rows.ndim == 2 else rows.shape} rows")
    return tree


def rows_tree_sum(rows, merges):
    """The rows of the 2-D array ``rows`` (one per block: what its block filled, the bias
    gradients and the step's sums) added in the postfix tree ``merges`` (as
    :func:`block_outer_sum`'s, left + right), in place: returns ``rows[0]``, which holds the
    sum; the other rows are left holding partial sums (the numpy and numba sets) or as they
    were (the GPU set, one launch). A row of NumPy additions per merge."""
    stack = []
    for b, m in enumerate(check_rows_tree(rows, merges).array.tolist()):
        right = b
        for _ in range(m):
            left = stack.pop()
            rows[left] += rows[right]
            right = left
        stack.append(right)
    return rows[0]


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0):
    """SGD with momentum on ``p`` and its velocity ``v`` (:func:`kernels.ref.update.sgd_momentum_update`,
    in place) with the gradient g = :func:`block_outer_sum` (A, D, starts, merges, alphas):
    here the two calls. The numba set steps each tile of g where it ends instead of writing
    g out, with these bits. Returns None."""
    g = block_outer_sum(A, D, starts, merges, alphas, np.empty(p.shape, p.dtype))
    sgd_momentum_update(p, g, v, lr, momentum, weight_decay)


def check_blocks_tree(what, rows, starts, merges):
    """A blocks' step's offsets (:func:`check_starts`) and its postfix tree over those
    blocks; returns both as int64 arrays (kept: read, never written)."""
    found = check_starts(what, rows, starts)
    tree = postfix_tree(merges)
    if tree is None or tree.array.size != found.size - 1:
        raise ValueError(f"{what}: merges {np.ravel(merges).tolist()} are not one postfix tree over the "
                         f"{found.size - 1} blocks")
    return found, tree.array


def blocks_sgd_step(A, D, starts, merges, alphas, W, vW, bias_rows, biases, velocities, lr, momentum, weight_cost=0.0):
    """A layer's SGD-with-momentum step from its blocks' gradients, in place: W's gradient
    :func:`block_outer_sum` (A, D, starts, merges, alphas) plus ``weight_cost * W``, as
    :func:`block_outer_sum_sgd` takes it; the biases' the rows of ``bias_rows`` (one per
    block, in block order, each holding the block's gradient of every bias of ``biases``,
    one after another, then any other sums of the block, which are added but not
    stepped) added in the same tree by :func:`rows_tree_sum`, each bias then stepped as
    :func:`kernels.ref.update.sgd_momentum_update` steps it (``velocities``: theirs).
    Returns the rows' sum (``bias_rows[0]``). The data-parallel trainer's tree and step
    for a batch whose every block one process holds, with their bits, in one call: here
    those kernels one after another; the numba set's biases in one compiled call."""
    return blocks_sgd_step_via(sys.modules[__package__], A, D, starts, merges, alphas, W, vW, bias_rows, biases,
                               velocities, lr, momentum, weight_cost)


def blocks_sgd_step_via(K, A, D, starts, merges, alphas, W, vW, bias_rows, biases, velocities, lr, momentum,
                        weight_cost):
    """:func:`blocks_sgd_step` with the kernel set ``K``'s own kernels."""
    bounds = check_bias_rows(merges, bias_rows, biases, velocities)
    K.block_outer_sum_sgd(A, D, starts, merges, alphas, W, vW, lr, momentum, weight_cost)
    total = K.rows_tree_sum(bias_rows, merges)
    K.sgd_momentum_update_many(list(biases), [total[lo:hi] for lo, hi in zip(bounds, bounds[1:])], list(velocities),
                               [lr] * len(biases), momentum)
    return total


def check_bias_rows(merges, bias_rows, biases, velocities) -> list:
    """:func:`blocks_sgd_step`'s biases (every set's check): a 2-D table with a row for each
    block of the tree and a column for each element of the biases (at least), each bias
    1-D with a velocity of its shape. Returns where each bias's columns start, and the
    end of the last."""
    tree = postfix_tree(merges)
    if tree is None:
        raise ValueError(f"blocks_sgd_step: merges {np.ravel(merges).tolist()} are not one postfix tree")
    if len(biases) != len(velocities) or any(b.ndim != 1 or v.shape != b.shape for b, v in zip(biases, velocities)):
        raise ValueError(f"blocks_sgd_step: biases {[b.shape for b in biases]} with velocities "
                         f"{[v.shape for v in velocities]}")
    bounds = [0]
    for b in biases:
        bounds.append(bounds[-1] + b.shape[0])
    if bias_rows.ndim != 2 or bias_rows.shape[0] != tree.array.size or bias_rows.shape[1] < bounds[-1]:
        raise ValueError(f"blocks_sgd_step: bias rows {bias_rows.shape} for {tree.array.size} blocks and "
                         f"{bounds[-1]} bias elements: a row per block, a column per element of the biases")
    return bounds


def write_column(xp, values, out):
    """The blocks' sums ``values`` (floats, or 0-d arrays of ``xp``: the GPU set's) into the
    column view ``out``, in its dtype, in one operation (one launch on a GPU)."""
    xp.stack(values, out=out)
