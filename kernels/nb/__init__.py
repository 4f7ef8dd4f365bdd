"""CPU kernels compiled with Numba (@njit, cache=True); BLAS for the matrix products.

Numba checks a cached kernel against its own file's time stamp only, so a kernel that
inlines a helper from another file (nbmath, simd, sparse_tiles) would load stale machine
code after that helper changed. The kernels are therefore cached in a directory named
after a hash of every source file here: any change starts a fresh cache. The directory
lies under NUMBA_CACHE_DIR when the user set one, else in this package's __pycache__
(Numba falls back to its user-wide cache when that is not writable). The package's import
name is part of the hash: a cached kernel records the module it came from, and one cached
by ``import kernels.nb`` from a checkout's root could not be loaded as ``aepar.kernels.nb``
(ModuleNotFoundError: No module named 'kernels').
The same directory keeps the compiled code of the generated tile sources (``generated/``,
see :mod:`.codegen`).

Every kernel's cache is adapted (:mod:`.caching`): loads skip the compiler's registries,
and saves hold a lock, so that processes compiling one kernel for different types at
once keep each one's entry.
"""
import hashlib
import os
import sys
from pathlib import Path

from numba.core import config as _numba_config


def _keyed_cache_dir() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(__name__.encode() + b"\0")
    for path in sorted(here.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    base = os.environ.get("NUMBA_CACHE_DIR") or str(here / "__pycache__")
    return os.path.join(base, "aepar-kernels-" + digest.hexdigest()[:16])


# Numba picks a function's cache directory when it is decorated: set it for these
# modules only and give the user's setting back afterwards.
_user_cache_dir = _numba_config.CACHE_DIR
_numba_config.CACHE_DIR = _keyed_cache_dir()
try:
    from .activation import *  # noqa: F401,F403,E402
    from .conv import *  # noqa: F401,F403,E402
    from .rowprod import block_outer_sum, block_outer_sum_sgd, blocks_sgd_step, rows_tree_sum  # noqa: F401,E402
    from .dense import *  # noqa: F401,F403,E402
    from .draws import uniform_rows  # noqa: F401,E402  (drawn on the host, as NumPy does)
    from .loss import *  # noqa: F401,F403,E402
    from .rbm import *  # noqa: F401,F403,E402
    from .sparsity import *  # noqa: F401,F403,E402
    from .sparse_ae import *  # noqa: F401,F403,E402
    from .update import *  # noqa: F401,F403,E402
    from . import lbfgs  # noqa: F401,E402  (the host's L-BFGS direction, aepar.optim.LBFGS; not a set kernel)
finally:
    _numba_config.CACHE_DIR = _user_cache_dir


def _adapt_caches():
    """:func:`.caching.adapt` every kernel of this package's modules."""
    from numba.core.dispatcher import Dispatcher

    from .caching import adapt

    for name, module in list(sys.modules.items()):
        if name != __name__ and not name.startswith(__name__ + "."):
            continue
        for kernel in list(vars(module).values()):
            if isinstance(kernel, Dispatcher):
                adapt(kernel)


_adapt_caches()
