"""The blocks' tree-summed outer products on the GPU: the reference's loop over cuBLAS products."""
from ..ref.blocksum import block_outer_sum as _by_tree, check_block_outer_sum
from .gemm import matmul

__all__ = ["block_outer_sum"]


def block_outer_sum(A, D, starts, merges, alphas, out):
    """See :func:`kernels.ref.blocksum.block_outer_sum`. One block with alpha 1 (a whole batch
    on one process) is its own product, written straight into ``out`` by cuBLAS: no
    temporary, scaling or copy."""
    if len(alphas) == 1 and float(alphas[0]) == 1.0:
        check_block_outer_sum(A, D, starts, merges, alphas, out)
        return matmul(A.T, D, out=out)
    return _by_tree(A, D, starts, merges, alphas, out)
