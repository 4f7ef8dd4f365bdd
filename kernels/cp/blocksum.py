"""The blocks' tree-summed outer products on the GPU: the reference's loop over cuBLAS products."""
import cupy as cp

from ..ref.blocksum import block_outer_sum as _by_tree, check_block_outer_sum, interleaved
from .gemm import matmul
from .update import sgd_momentum_update

__all__ = ["block_outer_sum", "block_outer_sum_sgd"]


def block_outer_sum(A, D, starts, merges, alphas, out):
    """See :func:`kernels.ref.blocksum.block_outer_sum`. One block with alpha 1 (a whole batch
    on one process) is its own product, written straight into ``out`` by cuBLAS: no
    temporary, scaling or copy."""
    if len(alphas) == 1 and float(alphas[0]) == 1.0:
        check_block_outer_sum(A, D, starts, merges, alphas, out)
        A, D, _ = interleaved(A, D, starts)
        return matmul(A.T, D, out=out)
    return _by_tree(A, D, starts, merges, alphas, out)


def block_outer_sum_sgd(A, D, starts, merges, alphas, p, v, lr, momentum, weight_decay=0.0):
    """See :func:`kernels.ref.blocksum.block_outer_sum_sgd`: the sum into a buffer from the
    memory pool, then the step."""
    g = block_outer_sum(A, D, starts, merges, alphas, cp.empty_like(p))
    sgd_momentum_update(p, g, v, lr, momentum, weight_decay)
