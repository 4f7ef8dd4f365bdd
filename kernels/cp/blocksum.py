"""The blocks' tree-summed outer products on the GPU: small blocks by the row kernels
(:mod:`.rowprod`), the others one cuBLAS product each."""
import cupy as cp
import numpy as np

from ..ref.blocksum import check_block_outer_sum, interleaved, tree_of_products
from . import rowprod
from .gemm import matmul
from .update import sgd_momentum_update

__all__ = ["block_outer_sum", "block_outer_sum_sgd"]

# a block's factors stack two of its chains (the RBM's [vk; v0])
_FACTOR_ROWS = 2 * rowprod.MAX_ROWS


def block_outer_sum(A, D, starts, merges, alphas, out):
    """See :func:`kernels.ref.blocksum.block_outer_sum`. Each block's product is chosen by
    its own rows, so that it has the same bits whatever blocks share the call (and on any
    number of ranks): float32 blocks of at most 2 :data:`.rowprod.MAX_ROWS` rows take the
    row kernels, the whole call one launch where every block does; the others cuBLAS, and
    one such block with alpha 1 (a whole batch on one process) is written straight into
    ``out`` (no temporary, scaling or copy)."""
    starts, merges = check_block_outer_sum(A, D, starts, merges, alphas, out)
    A, D, starts = interleaved(A, D, starts)  # a tied autoencoder's two parts: one array each
    small = _small_blocks(A, D, starts, out)
    if small.all():
        return rowprod.block_outer_sum(A, D, starts, merges, alphas, out)
    if len(alphas) == 1 and float(alphas[0]) == 1.0:
        return matmul(A.T, D, out=out)
    if not small.any():
        return tree_of_products(A, D, starts, merges, alphas, out, lambda A_b, D_b, alpha: (A_b.T @ D_b) * alpha)

    def product(A_b, D_b, alpha):
        if A_b.shape[0] <= _FACTOR_ROWS:
            return rowprod.block_outer_sum(A_b, D_b, [0, A_b.shape[0]], [0], [alpha], cp.empty(out.shape, np.float32))
        return (A_b.T @ D_b) * alpha
    return tree_of_products(A, D, starts, merges, alphas, out, product)


def _small_blocks(A, D, starts, out):
    """Which blocks the row kernels take: none unless the call is float32 throughout, then
    each by its rows."""
    if not (A.dtype == D.dtype == out.dtype == np.float32) or not out.flags.c_contiguous:
        return np.zeros(len(starts) - 1, bool)
    return np.diff(starts) <= _FACTOR_ROWS


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0):
    """See :func:`kernels.ref.blocksum.block_outer_sum_sgd`: the sum into a buffer from the
    memory pool, then the step."""
    g = block_outer_sum(A, D, starts, merges, alphas, cp.empty_like(p))
    sgd_momentum_update(p, g, v, lr, momentum, weight_decay)
