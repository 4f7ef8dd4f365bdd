"""aepar: autoencoders trained in parallel with hand-written kernels and explicit MPI.

Importing aepar fixes the BLAS/Numba thread count per rank before NumPy loads
(see aepar._threads); import aepar before numpy in scripts that care.
"""
import importlib.util
import os
import sys

from aepar import _threads

THREADS = _threads.configure()
__version__ = "0.1.0"


def _checkout_kernels():
    """In a source checkout kernels/ sits beside aepar/ (setup.py installs it as
    aepar.kernels); register it so `python -m aepar.X` run from the checkout finds it."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(os.path.dirname(here), "kernels")
    if os.path.isdir(os.path.join(here, "kernels")) or not os.path.isfile(os.path.join(src, "__init__.py")):
        return
    spec = importlib.util.spec_from_file_location("aepar.kernels", os.path.join(src, "__init__.py"),
                                                  submodule_search_locations=[src])
    module = importlib.util.module_from_spec(spec)
    sys.modules["aepar.kernels"] = module
    spec.loader.exec_module(module)


_checkout_kernels()
