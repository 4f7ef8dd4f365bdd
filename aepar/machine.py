"""What machine a benchmark row was measured on.

Every scaling/peer row carries these columns so that a number is never separated from
the hardware, BLAS build and thread setting that produced it (a DGEMM on one CPU runs at
very different rates depending on which OpenBLAS kernels were picked).

Cheap to call: reads /proc and the environment, asks NumPy for its build configuration
and, only if it is already installed, threadpoolctl for the OpenBLAS core type. The MPI
library comes from :func:`aepar.comm.library` (pass ``mpi=`` to skip that import in a
process that has no use for MPI).
"""
from __future__ import annotations

import os
import platform
import socket
import sys

from aepar import _threads

#: The columns :func:`describe` returns, in the order benchmark CSVs write them.
FIELDS = ("hostname", "cores", "cpu_model", "isa", "blas", "blas_coretype", "threads", "blas_threads", "mpi",
          "python", "numpy", "numba", "aepar")

#: The ``mpi`` field of a process that runs alone and never starts MPI (a serial run's
#: summary, a one-process benchmark's rows).
ONE_PROCESS = "not used (one process)"

# the vector instruction sets that decide which kernels are fast (widest first)
ISA_FLAGS = ("avx512f", "avx512bw", "avx512_vnni", "avx2", "fma", "avx", "sse4_2", "neon", "asimd", "sve")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (platform.processor() elsewhere), with
    its x86 family/model/stepping and cache sizes when the system gives them, e.g.
    "Intel(R) Xeon(R) Processor (family 6 model 207 stepping 2, L2 2 MiB, L3 300 MiB)":
    hypervisors often report every Xeon by one bare name, so that without the numbers a
    Sapphire Rapids (6/143) and an Emerald Rapids (6/207) would share their rows."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    name = cpu_name(text) or platform.processor() or platform.machine() or "unknown"
    details = ", ".join(filter(None, [cpu_id(text)] + [_cache_size(level) for level in (2, 3)]))
    return f"{name} ({details})" if details else name


def cpu_name(cpuinfo: str) -> str:
    """The first processor's name in /proc/cpuinfo's text ('' if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        # x86: "model name"; some ARM kernels: "Model" or "Hardware"
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return ""


def cpu_id(cpuinfo: str) -> str:
    """"family F model M stepping S" of the first x86 processor in /proc/cpuinfo's text
    ('' elsewhere): what tells two CPUs with one marketing name apart."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor" and fields:
            break  # the first processor's block only
        if key in ("cpu family", "model", "stepping") and value.strip().isdigit():
            fields[key] = value.strip()
    if "cpu family" not in fields or "model" not in fields:
        return ""
    stepping = f" stepping {fields['stepping']}" if "stepping" in fields else ""
    return f"family {fields['cpu family']} model {fields['model']}{stepping}"


def _cache_size(level: int, root: str = "/sys/devices/system/cpu/cpu0/cache") -> str:
    """"L2 2 MiB": the size of cpu0's unified (or data) cache of ``level`` from sysfs, '' if unknown."""
    try:
        for entry in sorted(os.listdir(root)):
            base = os.path.join(root, entry)
            with open(os.path.join(base, "level")) as f:
                if f.read().strip() != str(level):
                    continue
            with open(os.path.join(base, "type")) as f:
                if f.read().strip() not in ("Unified", "Data"):
                    continue
            with open(os.path.join(base, "size")) as f:
                size = f.read().strip()
            if size.endswith("K") and size[:-1].isdigit():
                kib = int(size[:-1])
                size = f"{kib // 1024} MiB" if kib % 1024 == 0 else f"{kib} KiB"
            return f"L{level} {size}"
    except OSError:
        pass
    return ""


def isa() -> str:
    """The CPU's vector instruction sets that matter to the kernels, e.g. "avx512f avx2 fma",
    and the code Numba was told to generate when that is not the host's (NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES, e.g. "avx512f avx2 fma [numba target: haswell -avx512f]")."""
    target = " ".join(os.environ.get(var, "") for var in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")).strip()
    suffix = f" [numba target: {target}]" if target else ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    have = set(value.split())
                    return " ".join(flag for flag in ISA_FLAGS if flag in have) + suffix
    except OSError:
        pass
    return platform.machine() + suffix


def threads_per_rank() -> int:
    """aepar's threads per rank (each takes whole blocks; AEPAR_THREADS, else cores / ranks)."""
    return _threads.threads_per_rank()


def blas_threads() -> int:
    """BLAS threads inside each of them (aepar leaves it at 1 unless the user set it)."""
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def _threadpool_blas():
    """threadpoolctl's record of the loaded BLAS, or None (threadpoolctl is optional)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for info in threadpool_info():
        if info.get("user_api") == "blas":
            return info
    return None


def blas_info() -> tuple[str, str]:
    """(name and version of NumPy's BLAS, the OpenBLAS core type or '').

    The core type is OPENBLAS_CORETYPE when the user forced one, else what the loaded
    OpenBLAS reports (its runtime CPU dispatch), else ''.
    """
    import numpy as np

    name = version = ""
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name, version = cfg.get("name", ""), cfg.get("version", "")
    except Exception:  # NumPy < 1.26 has no mode="dicts"; fall back to threadpoolctl below
        pass
    info = _threadpool_blas()
    if info is not None:
        name = name or info.get("internal_api", "")
        version = version or info.get("version") or ""
    coretype = os.environ.get("OPENBLAS_CORETYPE", "")
    if not coretype and info is not None and info.get("internal_api") == "openblas":
        coretype = info.get("architecture") or ""
    blas = f"{name} {version}".strip() or "unknown"
    return blas, coretype


def _numba_version() -> str:
    if "numba" in sys.modules:
        return sys.modules["numba"].__version__
    try:  # the distribution metadata, without importing numba (seconds of LLVM set-up)
        from importlib.metadata import version
        return version("numba")
    except Exception:
        return ""


def torch_peer() -> str:
    """The PyTorch a benchmark's peer ran on, when that process loaded it: version and the
    vector ISA of ATen's own loops ("2.13.0+cpu AVX2"); "" without it. aepar never
    imports PyTorch: this only reads what the benchmark loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    return f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()}"


def describe(mpi: str | None = None, threads: int | None = None) -> dict:
    """The machine columns for one benchmark row.

    Parameters
    ----------
    mpi : str, optional
        The MPI library line; default :func:`aepar.comm.library` (imports mpi4py, which
        initialises MPI in a process that had not).
    threads : int, optional
        Threads per rank to record; default from the environment (see
        :func:`threads_per_rank`).

    Returns
    -------
    dict
        Keys :data:`FIELDS`: hostname, cores (usable by this process), cpu_model, isa (vector
        instruction sets), blas (name + version), blas_coretype, threads (aepar's, per
        rank), blas_threads (inside each), mpi, python, numpy, numba, aepar (the version
        that ran: a model of the code, such as bench.scaling_model's, prices a record as
        the code of its day ran it).
    """
    import numpy as np

    import aepar

    if mpi is None:
        from aepar.comm import library
        mpi = library()
    blas, coretype = blas_info()
    return {
        "hostname": socket.gethostname(),
        "cores": _threads.usable_cores(),
        "cpu_model": cpu_model(),
        "isa": isa(),
        "blas": blas,
        "blas_coretype": coretype,
        "threads": int(threads) if threads is not None else threads_per_rank(),
        "blas_threads": blas_threads(),
        "mpi": mpi,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _numba_version(),
        "aepar": aepar.__version__,
    }


def describe_run(ranks: int) -> dict:
    """:func:`describe` for a run's own records (summary.json, run.json): the MPI library
    where the run's ranks use one, :data:`ONE_PROCESS` for a run alone (naming the library
    would start MPI in that process for this one field)."""
    return describe(mpi=None if ranks > 1 else ONE_PROCESS)


if __name__ == "__main__":  # `python -m aepar.machine`: print the row as key: value
    for key, value in describe().items():
        print(f"{key}: {value}")
