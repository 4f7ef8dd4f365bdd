"""cupy.cuda's stand-in: one device, one stream, every call done when it returns."""
import time
import types

from .._build import CompileException

__all__ = ["Device", "Stream", "Event", "runtime", "device", "compiler", "get_current_stream", "get_elapsed_time"]


class Device:
    compute_capability = "90"
    # an H100's or H200's multiprocessors (kernels/cp/rowprod.py picks its tiles by them)
    attributes = {"MultiProcessorCount": 132}

    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} (the emulated machine has one)")

    def use(self):
        pass

    def synchronize(self):
        pass

    @property
    def mem_info(self):
        return runtime.memGetInfo()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Stream:
    ptr = 0

    def __init__(self, null=False, non_blocking=False, ptds=False):
        pass

    def synchronize(self):
        pass

    def use(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


Stream.null = Stream(null=True)


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        pass


def get_elapsed_time(start, end):
    return (end.at - start.at) * 1000.0


def get_current_stream():
    return Stream.null


class _Runtime:
    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDeviceProperties(i):
        Device(i)
        return {"name": b"emulated GPU (aepar's CPU stand-in for CuPy)", "totalGlobalMem": 1 << 34,
                "multiProcessorCount": 1, "major": 9, "minor": 0, "clockRate": 0}

    @staticmethod
    def runtimeGetVersion():
        return 12000

    @staticmethod
    def driverGetVersion():
        return 12000

    @staticmethod
    def memGetInfo():
        return 1 << 33, 1 << 34

    @staticmethod
    def deviceSynchronize():
        pass


runtime = _Runtime()
device = types.SimpleNamespace(Device=Device, get_cublas_handle=lambda: 0)
compiler = types.SimpleNamespace(CompileException=CompileException)
