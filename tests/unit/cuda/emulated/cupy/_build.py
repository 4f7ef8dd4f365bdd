"""C++ sources built once into shared libraries (g++), cached by their text's hash."""
import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

HEADER_DIR = Path(__file__).resolve().parents[2]  # tests/unit/cuda: cuda_host.h
# -U_FORTIFY_SOURCE: a fortified longjmp refuses a jump to another stack, which is how
# cuda_host.h's fibers switch (some distributions' g++ fortify by default)
FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-U_FORTIFY_SOURCE", "-pthread", "-shared",
         "-fPIC", "-w"]


def _cache_dir() -> Path:
    path = Path(os.environ.get("AEPAR_EMULATED_CUPY_CACHE")
                or Path(tempfile.gettempdir()) / f"aepar-emulated-cupy-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=None)
def build(source: str) -> ctypes.CDLL:
    """The library of ``source`` (C++, cuda_host.h on the include path)."""
    header = (HEADER_DIR / "cuda_host.h").read_text()  # a library built with another header is another library
    key = hashlib.sha256("\0".join([source, header, *FLAGS]).encode()).hexdigest()[:24]
    lib = _cache_dir() / f"{key}.so"
    if not lib.exists():
        src = _cache_dir() / f"{key}.{os.getpid()}.cpp"
        src.write_text(source)
        part = lib.with_suffix(f".{os.getpid()}.part")
        done = subprocess.run(["g++", *FLAGS, "-I", str(HEADER_DIR), str(src), "-o", str(part)],
                              capture_output=True, text=True)
        src.unlink()
        if done.returncode != 0:
            # what NVRTC would say: the kernel does not compile
            raise CompileException(done.stderr[-4000:])
        os.replace(part, lib)  # whole or not at all, for another process building the same
    return ctypes.CDLL(str(lib))


class CompileException(Exception):
    """cupy.cuda.compiler.CompileException's stand-in."""
