"""The C type each float dtype's RawKernels are compiled for: one table for the set."""
import numpy as np

__all__ = []  # the set's own helper, not a kernel

C_TYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
