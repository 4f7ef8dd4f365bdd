"""What every runnable scheme shares: an argument parser that speaks once per job,
common options, and the run directory that is written atomically."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from aepar.comm import world
from aepar.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that prints help on rank 0 only and turns bad options into UserError.

    Every rank parses the same argv, so a bad option is a collective error: rank 0 prints
    one line and every rank exits 2.
    """

    def error(self, message):
        error = UserError(message)
        error.collective = True
        raise error

    def print_help(self, file=None):
        if world().is_root:
            super().print_help(file)

    def print_usage(self, file=None):
        if world().is_root:
            super().print_usage(file)


def add_common(parser: argparse.ArgumentParser, *, out_default: str):
    """Options every scheme takes."""
    g = parser.add_argument_group("run")
    g.add_argument("--device", choices=["cpu", "gpu"], default=os.environ.get("AEPAR_DEVICE", "cpu"),
                   help="cpu: Numba kernels; gpu: CuPy kernels, one GPU per local rank "
                        "(default: $AEPAR_DEVICE or cpu)")
    g.add_argument("--kernels", choices=["auto", "numpy", "numba", "cupy"], default="auto",
                   help="force a kernel set (numpy = the reference oracle); auto follows --device")
    g.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    g.add_argument("--seed", type=int, default=0, help="one seed for data, weights and sampling")
    g.add_argument("--data-dir", default=os.environ.get("AEPAR_DATA"),
                   help="directory with your own data files (default: $AEPAR_DATA, else the "
                        "embedded real data)")
    g.add_argument("--out", default=out_default,
                   help=f"run directory for results (default: {out_default})")
    g.add_argument("--quiet", action="store_true", help="no progress lines")
    return g


class RunDir:
    """A run directory that appears whole or not at all.

    Rank 0 writes into a hidden temporary sibling and renames it into place on
    ``commit()``; on failure the temporary directory is removed, so a failed run leaves
    nothing half-written where the README says results go.
    """

    def __init__(self, final: str | os.PathLike, comm=None):
        self.comm = comm or world()
        self.final = Path(final)
        self.path = None
        if self.comm.is_root:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", dir=self.final.parent))

    def file(self, name: str) -> Path | None:
        """Path to write ``name`` to (rank 0), None on other ranks."""
        return None if self.path is None else self.path / name

    def write_json(self, name: str, obj):
        if self.path is not None:
            (self.path / name).write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")

    def commit(self) -> Path:
        if self.path is not None:
            if self.final.exists():
                shutil.rmtree(self.final)
            os.replace(self.path, self.final)
            self.path = None
        return self.final

    def discard(self):
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.discard()
        return False


def _jsonable(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def progress(comm, quiet: bool, message: str):
    """One progress line, rank 0 only."""
    if comm.is_root and not quiet:
        print(message, flush=True)
