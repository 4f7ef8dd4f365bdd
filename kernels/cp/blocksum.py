"""The blocks' tree-summed outer products on the GPU: small blocks by the row kernels
(:mod:`.rowprod`), the others one cuBLAS product each."""
import sys

import cupy as cp
import numpy as np

from ..ref.blocksum import (as_parts, blocks_sgd_step_via, check_block_outer_sum, check_rows_tree, interleaved,
                            most_rows, outer_term, tree_of_products)
from ..ref.blocksum import rows_tree_sum as _rows_by_numpy
from .rowprod import MAX_ROWS, on_device
from .rowprod import block_outer_sum as rows_block_outer_sum
from .rowprod import block_outer_sum_sgd as rows_block_outer_sum_sgd
from .c_types import C_TYPE
from .gemm import matmul
from .update import sgd_momentum_update

__all__ = ["block_outer_sum", "block_outer_sum_sgd", "rows_tree_sum", "blocks_sgd_step"]

# a block's factors stack two of its chains (the RBM's [vk; v0])
_FACTOR_ROWS = 2 * MAX_ROWS


def block_outer_sum(A, D, starts, merges, alphas, out):
    """See :func:`kernels.ref.blocksum.block_outer_sum`. Each block's product is chosen by
    its own rows, so that it has the same bits whatever blocks share the call (and on any
    number of ranks): float32 blocks of at most 2 :data:`.rowprod.MAX_ROWS` rows take the
    row kernels, the whole call one launch where every block does; the others cuBLAS, and
    one such block with alpha 1 (a whole batch on one process) is written straight into
    ``out`` (no temporary, scaling or copy)."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, out)
    if starts.ndim == 2:  # a row of starts per part (several threads' blocks: not on a GPU): one chain
        A, D, starts = interleaved(A, D, starts)
    small = _small_blocks(A, D, starts, out)
    if small.all() and len(as_parts(A)) <= 2:  # a tied autoencoder's two parts as they are
        return rows_block_outer_sum(A, D, starts, merges, alphas, out)
    A, D, starts = interleaved(A, D, starts)  # the parts as one array each
    if len(alphas) == 1 and float(alphas[0]) == 1.0:
        return matmul(A.T, D, out=out)

    def term(A_b, D_b, alpha):  # a large block's by cuBLAS, a small one's by the row kernels
        if A_b.shape[0] > _FACTOR_ROWS or not small.any():
            return outer_term(A_b, D_b, alpha)
        return rows_block_outer_sum(A_b, D_b, [0, A_b.shape[0]], [0], [alpha], cp.empty(out.shape, np.float32))
    return tree_of_products(A, D, starts, merges, alphas, out, term)


def _small_blocks(A, D, starts, out):
    """Which blocks the row kernels take: none unless the call is float32 throughout, then
    each by its rows (of all its parts)."""
    parts = as_parts(A) + as_parts(D)
    if any(p.dtype != np.float32 for p in parts) or out.dtype != np.float32 or not out.flags.c_contiguous:
        return np.zeros(len(starts) - 1, bool)
    if most_rows(starts) * len(as_parts(A)) <= _FACTOR_ROWS:  # all small: the usual step, no NumPy
        return np.ones(len(starts) - 1, bool)
    return np.diff(starts) * len(as_parts(A)) <= _FACTOR_ROWS


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0):
    """See :func:`kernels.ref.blocksum.block_outer_sum_sgd`: where the row kernels take every
    block, the sum and the step in one launch (each element stepped where its sum ends, as
    the numba set's tiles); else the sum into a buffer from the memory pool, then the step."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, p)
    if starts.ndim == 2:
        A, D, starts = interleaved(A, D, starts)
    if v.shape == p.shape and v.dtype == p.dtype and v.flags.c_contiguous and len(as_parts(A)) <= 2 \
            and _small_blocks(A, D, starts, p).all():
        return rows_block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay)
    g = block_outer_sum(A, D, starts, merges, alphas, cp.empty_like(p))
    sgd_momentum_update(p, g, v, lr, momentum, weight_decay)


def blocks_sgd_step(A, D, starts, merges, alphas, W, vW, bias_rows, biases, velocities, lr, momentum, weight_cost=0.0):
    """See :func:`kernels.ref.blocksum.blocks_sgd_step`: this set's kernels one after
    another (W's sum and step one launch where the row kernels take every block, the
    rows' tree one, the biases' steps one)."""
    return blocks_sgd_step_via(sys.modules[__package__], A, D, starts, merges, alphas, W, vW, bias_rows, biases,
                               velocities, lr, momentum, weight_cost)


# rows_tree_sum in one launch: a thread per column runs the postfix tree down the blocks'
# rows, its partial sums on a stack, and writes the total into row 0 (left + right, in the
# rows' type: the bits of NumPy's additions, row by row)
_ROWS_TREE_SOURCE = r"""
#define MAX_DEPTH 16
extern "C" __global__ void aepar_rows_tree_sum_NAME(T *rows, long long ld, long long cols, int blocks,
                                                    const long long *merges) {
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    T stack[MAX_DEPTH];
    int top = 0;
    for (int b = 0; b < blocks; ++b) {
        T v = rows[b * ld + j];
        for (long long q = 0; q < merges[b]; ++q) v = stack[--top] + v;
        stack[top++] = v;
    }
    rows[j] = stack[0];
}
"""
_rows_tree_kernels = {dt: cp.RawKernel(f"typedef {name} T;" + _ROWS_TREE_SOURCE.replace("NAME", name),
                                       f"aepar_rows_tree_sum_{name}") for dt, name in C_TYPE.items()}
_ROWS_TREE_DEPTH = 16


def rows_tree_sum(rows, merges):
    """See :func:`kernels.ref.blocksum.rows_tree_sum`: one launch where the rows are a
    float array of unit column stride (the trainer's blocks' vectors), else NumPy's
    additions row by row."""
    tree = check_rows_tree(rows, merges)
    kernel = _rows_tree_kernels.get(rows.dtype)
    if kernel is None or tree.depth > _ROWS_TREE_DEPTH or (rows.shape[1] > 1 and rows.strides[1] != rows.itemsize) \
            or rows.strides[0] % rows.itemsize:
        return _rows_by_numpy(rows, merges)
    blocks, cols = rows.shape
    if blocks > 1 and cols:
        kernel((-(-cols // 256),), (256,), (rows, np.int64(rows.strides[0] // rows.itemsize), np.int64(cols),
                                            np.int32(blocks), on_device(tuple(tree.array.tolist()), np.int64)))
    return rows[0]
