"""aepar: autoencoders trained in parallel with hand-written kernels and explicit MPI.

Importing aepar fixes the BLAS/Numba thread count per rank before NumPy loads
(see aepar._threads); import aepar before numpy in scripts that care.
"""
from aepar import _threads

THREADS = _threads.configure()
__version__ = "0.8.60"
