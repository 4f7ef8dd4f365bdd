"""The fixed-tree sum of blocks' outer products: a weight gradient of a batch cut into blocks.

A batch cut into blocks (aepar.rows) gives a dense layer's weight gradient as a sum over
blocks of ``alpha_b * A_b.T @ D_b`` (A_b: the block's layer inputs, D_b: its output
gradients), added in a fixed binary tree so that the result does not depend on which
rank or thread computed which block. The tree is given in postfix: after block b's
product come ``merges[b]`` additions, each of the newest partial sum into the one below
it on a stack (:func:`aepar.rows.tree_merges`). Computing every block's product apart
and adding them in that tree with NumPy gives the same bits as one call over all of them.
"""
import numpy as np

from .update import sgd_momentum_update

__all__ = ["block_outer_sum", "block_outer_sum_sgd"]


def check_starts(what, rows, starts):
    """A batch's blocks as offsets (returned as int64): from 0 to every one of ``rows`` rows,
    never back (the stacked-blocks kernels of the dense and rbm families)."""
    s = np.asarray(starts, dtype=np.int64)
    # in Python: a step checks a few offsets several times, and NumPy's calls cost more
    values = s.tolist() if s.ndim == 1 else None
    if values is None or len(values) < 2 or values[0] != 0 or values[-1] != rows or \
            any(a > b for a, b in zip(values, values[1:])):
        raise ValueError(f"{what}: offsets {list(s.ravel())} do not split {rows} rows into blocks")
    return s


def check_block_outer_sum(A, D, starts, merges, alphas, out):
    """Shared by every kernel set; returns (starts, merges) as int64 arrays. The offsets
    and the tree are a few numbers checked on every layer of every step: in Python, whose
    loops over them cost less than NumPy's calls."""
    s, m = np.asarray(starts, dtype=np.int64), np.asarray(merges, dtype=np.int64)
    starts, merges = s.tolist(), m.ravel().tolist()
    n = len(merges)
    if A.ndim != 2 or D.ndim != 2 or A.shape[0] != D.shape[0] or out.shape != (A.shape[1], D.shape[1]):
        raise ValueError(f"block_outer_sum: A {A.shape}, D {D.shape} -> out {out.shape} do not match "
                         "(A: rows x m, D: rows x n, out: m x n)")
    if n < 1 or s.shape != (n + 1,) or len(alphas) != n:
        raise ValueError(f"block_outer_sum: {n} blocks need {n + 1} starts and {n} alphas, got "
                         f"{s.shape[0] if s.ndim else 1} and {len(alphas)}")
    if starts[0] != 0 or starts[-1] != A.shape[0] or any(a > b for a, b in zip(starts, starts[1:])):
        raise ValueError(f"block_outer_sum: starts {starts} must rise from 0 to {A.shape[0]}")
    if m.ndim != 1 or merges[0] != 0 or min(merges) < 0 or stack_depth(merges) < 1 or n - sum(merges) != 1:
        raise ValueError(f"block_outer_sum: merges {merges} are not one postfix tree")
    return s, m


def most_rows(starts) -> int:
    """The most rows of any block of the offsets ``starts`` (in Python: a few offsets, read
    on every layer of every step)."""
    bounds = starts.tolist() if isinstance(starts, np.ndarray) else list(starts)
    return max(b - a for a, b in zip(bounds, bounds[1:]))


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
        The blocks' rows one after another.
    starts : ints (blocks + 1,)
        Block b is rows starts[b]:starts[b+1] (it may be empty: a zero product).
    merges : ints (blocks,)
        The tree in postfix: after block b's product, that many times the two newest
        partial sums are replaced by their sum (left + right).
    alphas : floats (blocks,)
        Each block's product is scaled before it is added.
    out : array (m, n), written.

    Works on CuPy arrays as well (the GPU set uses it as it is).
    """
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, out)
    stack = []
    for b in range(merges.size):
        s, e = int(starts[b]), int(starts[b + 1])
        value = (A[s:e].T @ D[s:e]) * out.dtype.type(alphas[b])
        for _ in range(int(merges[b])):
            value = stack.pop() + value
        stack.append(value)
    out[...] = stack[0]
    return out


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0):
    """SGD with momentum on ``p`` and its velocity ``v`` (:func:`kernels.ref.update.sgd_momentum_update`,
    in place) with the gradient g = :func:`block_outer_sum` (A, D, starts, merges, alphas):
    here the two calls. The numba set steps each tile of g where it ends instead of writing
    g out, with these bits. Returns None."""
    g = block_outer_sum(A, D, starts, merges, alphas, np.empty(p.shape, p.dtype))
    sgd_momentum_update(p, g, v, lr, momentum, weight_decay)
