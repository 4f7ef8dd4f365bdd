"""The ``aepar`` command: ``aepar PROGRAM [options]`` runs ``python -m aepar.PROGRAM``.

One name to remember, the same programs: ``aepar pretrain --scheme sync``, ``mpirun -np 4
aepar sync --preset quick``, ``srun aepar sparse``. ``aepar --help`` lists the programs and
the schemes, ``aepar PROGRAM --help`` a program's options, ``aepar --version`` the version.
"""
from __future__ import annotations

import importlib
import os
import sys
import textwrap

import aepar
from aepar import schemes

__all__ = ["PROGRAMS", "main"]

# program -> what it runs (the line `aepar --help` prints)
PROGRAMS = {
    "pretrain": "pre-train a stacked autoencoder with any scheme (--scheme, default auto), then the task",
    "greedy": "greedy layer-wise pre-training and fine-tuning (pretrain --scheme greedy, its own options)",
    "sync": "synchronized pipeline pre-training (pretrain --scheme sync, or hybrid on more ranks than layers)",
    "sparse": "the sparse autoencoder on image patches, data-parallel L-BFGS",
    "eager": "K convolutional autoencoders trained in parallel, stopped early, combined into one classifier",
    "finetune": "fine-tune the weights.h5 of any stacked scheme",
    "classify": "a softmax classifier on the encoder of a weights.h5",
}


def usage() -> str:
    width = max(map(len, PROGRAMS))
    lines = ["usage: aepar PROGRAM [options]   (under mpirun or srun for several ranks)", "",
             "Train autoencoders in parallel (MPI, Numba, CuPy), as four published studies did.", "",
             "programs:"]
    lines += [f"  {name:{width}s}  {about}" for name, about in PROGRAMS.items()]
    lines += ["", "schemes (aepar pretrain --scheme NAME; sparse and eager are programs of their own):"]
    width = max(map(len, schemes.names(None)))
    for s in schemes.SCHEMES.values():
        lines += textwrap.wrap(s.about, 96, initial_indent=f"  {s.name:{width}s}  ",
                               subsequent_indent=" " * (width + 4))
    lines += ["", "aepar PROGRAM --help: its options and their defaults;  aepar --version",
              "Exit codes: 0 done, 1 internal error, 2 bad input, 3 diverged, 74 a write failed, "
              "75 interrupted (--resume DIR), 124 a rank stalled."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"aepar {aepar.__version__}")
        return 0
    name = argv[0]
    if name not in PROGRAMS:
        hint = " (schemes go to 'aepar pretrain --scheme NAME')" if name in schemes.SCHEMES else ""
        print(f"aepar: error: no program {name!r}{hint}; programs: {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    from aepar.comm import run_main

    os.environ["AEPAR_COMMAND"] = "1"  # the programs' usage lines then say `aepar NAME`
    program = importlib.import_module(f"aepar.{name}")
    return run_main(program.main, program.PROG, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
