"""The NumPy reference kernels: the oracle every other set is checked against."""
from .activation import *  # noqa: F401,F403
from .blocksum import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .dense import *  # noqa: F401,F403
from .draws import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .rbm import *  # noqa: F401,F403
from .sparsity import *  # noqa: F401,F403
from .sparse_ae import *  # noqa: F401,F403
from .update import *  # noqa: F401,F403
