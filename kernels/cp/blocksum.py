"""The blocks' tree-summed outer products on the GPU: the reference's loop over cuBLAS products."""
from ..ref.blocksum import block_outer_sum

__all__ = ["block_outer_sum"]
