"""CPU kernels compiled with Numba (@njit, cache=True); BLAS for the matrix products."""
from .activation import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .dense import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .rbm import *  # noqa: F401,F403
from .sparsity import *  # noqa: F401,F403
from .sparse_ae import *  # noqa: F401,F403
from .update import *  # noqa: F401,F403
