"""The array module and kernel set, chosen once per run.

Models receive a :class:`Backend` and use ``be.xp`` for arrays and ``be.K`` for kernels;
they never ask which device they are on.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from aepar import _threads, kernels
from aepar.kernels import memory
from aepar.errors import UserError, one_line


@dataclass(frozen=True)
class Backend:
    device: str          # "cpu" | "gpu"
    kernel_set: str      # "numpy" | "numba" | "cupy"
    xp: object           # numpy or cupy
    K: object            # the kernel module
    dtype: object        # numpy dtype of parameters and activations

    def asarray(self, a, dtype=None):
        """Host or device array -> this backend's array of ``dtype`` (default: the run's).
        On the CPU a C-contiguous one on a 64-byte boundary (:mod:`aepar.kernels.memory`):
        ``a`` itself when it is one, else a copy."""
        dtype = self.dtype if dtype is None else dtype
        return memory.aligned(a, dtype) if self.xp is np else self.xp.asarray(a, dtype=dtype)

    def to_host(self, a) -> np.ndarray:
        return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)

    def zeros(self, shape, dtype=None):
        """Zeros of ``dtype`` (default: the run's); on the CPU on a 64-byte boundary."""
        dtype = self.dtype if dtype is None else dtype
        return memory.zeros(shape, dtype) if self.xp is np else self.xp.zeros(shape, dtype=dtype)

    @property
    def line(self) -> int:
        """Elements of the run's dtype in one alignment line (:mod:`aepar.kernels.memory`):
        arrays packed side by side start on these boundaries, as the kernels want them."""
        return max(1, memory.ALIGNMENT // np.dtype(self.dtype).itemsize)

    def synchronize(self):
        """Wait for queued device work (timings must include it)."""
        if self.device == "gpu":
            self.xp.cuda.get_current_stream().synchronize()


_FMA_NOTED = [False]


def _note_software_fma():
    """One line, once a process and on a node's first rank, where Numba compiles for a CPU
    without FMA instructions (:func:`aepar.kernels.nb.simd.hardware_fma`): the kernels'
    bits there are not those of the CPUs with FMA that every figure and check in the docs
    came from, which a user comparing results across machines needs to know. Where this
    CPU has FMA and NUMBA_CPU_NAME or NUMBA_CPU_FEATURES took it away (``generic``, which
    Numba's docs suggest for a cache shared by different machines), the line names them:
    Numba's cache keeps a copy of the kernels for each CPU already."""
    from aepar.kernels.nb.simd import hardware_fma, host_fma

    if _FMA_NOTED[0] or hardware_fma():
        return
    _FMA_NOTED[0] = True
    if _threads.local_rank() != 0:
        return
    asked = [f"{name}={os.environ[name]}" for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES") if name in os.environ]
    why = (f" ({' '.join(asked)} asks for it; this CPU has FMA: unset, Numba compiles for each machine's CPU and "
           f"keeps a copy for each in one cache)") if asked and host_fma() else ""
    print(f"aepar: note: Numba compiles for a CPU without fused multiply-add (FMA) instructions here{why}: the "
          "kernels round each product before its sum, so results differ in their last bits from those of a "
          "CPU with FMA (they are the same on any number of ranks of CPUs without FMA), and products run "
          "slower (docs/performance.md, \"CPUs without FMA\")", file=sys.stderr, flush=True)


def host_kernels():
    """The CPU's kernel set (Numba) for work that runs on the host whatever the run's
    device: the root optimiser's L-BFGS direction, float64 (``host_kernels().lbfgs``,
    :class:`aepar.optim.LBFGS`)."""
    return kernels.load("numba")


def select(device: str | None = None, kernel_set: str = "auto", dtype="float64",
           local_rank: int | None = None) -> Backend:
    """Pick xp and kernels once. GPU runs bind GPU = local rank % number of GPUs."""
    device = device or os.environ.get("AEPAR_DEVICE", "cpu")
    if device not in ("cpu", "gpu"):
        raise UserError(f"--device must be cpu or gpu, not {device!r}")
    if kernel_set == "auto":
        kernel_set = "cupy" if device == "gpu" else "numba"
    if (device == "gpu") != (kernel_set == "cupy"):
        raise UserError(f"kernel set {kernel_set!r} does not run on device {device!r}")
    if device == "gpu":
        try:
            import cupy as xp
            ngpu = xp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no cupy, no driver, no device
            raise UserError(f"--device gpu: no usable GPU ({one_line(exc)})") from None
        if ngpu == 0:
            raise UserError("--device gpu: no GPU found")
        xp.cuda.Device((local_rank if local_rank is not None else _threads.local_rank()) % ngpu).use()
        # one host thread queues a GPU's work: aepar's block threads (aepar.rows) would only
        # contend for the GIL and CuPy's launches (many of them made the autoencoder layer's
        # step several times slower). The bits do not depend on the thread count.
        import aepar
        aepar.THREADS = 1
        _threads.fix_threads()
    else:
        xp = np
    chosen = Backend(device, kernel_set, xp, kernels.load(kernel_set), np.dtype(dtype))
    if kernel_set == "numba":
        _note_software_fma()
    from aepar.comm import resume_collector

    resume_collector()  # a command's heavy imports are done (aepar.comm.run_main)
    return chosen


