"""The one list of schemes: ``--help``, the engine, the planner and the tests read it.

A scheme is one file in this package that reads like its paper's algorithm. The five
stacked-autoencoder schemes run under one engine (:mod:`aepar.engine`, ``python -m
aepar.pretrain``), which loads their data, builds their layers, keeps their checkpoints,
applies the task (fine-tuning or classification, :mod:`aepar.tasks`) and writes the run's
results (:func:`aepar.finish.finish`); each such file provides

    check(args, ranks, n_layers, n_rows)   raise UserError for a combination it cannot run
    setup(job)                             its first line (job.announce), summary and weights entries
    pretrain(job) -> dict                  train ``job.layers`` in place; the record that
                                           goes into summary.json under "pretrain"

and may provide ``prepare(digits, args) -> (digits, x_val)`` (rows held out to watch
while training), ``summarize(job, record) -> dict`` (the summary's entries from the
record), ``tables(summary) -> str`` (text after the standard tables) and
``CHECKPOINT_AS`` (the scheme whose checkpoints it shares: hybrid resumes sync's). The
sparse autoencoder and the eager ensemble train other models and have programs of their
own (``engine``).

Adding a scheme: one new file and one :func:`register` line below (docs/architecture.md
walks through a toy scheme; tests/unit/test_toy_scheme.py runs it).

Schemes never import each other (tests/unit/test_imports.py): what two share lives in
:mod:`aepar.parallel`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Scheme", "SCHEMES", "register", "names", "get"]

STACKED = "aepar.pretrain"


@dataclass(frozen=True)
class Scheme:
    name: str
    about: str          # the line --help prints
    engine: str         # the program that runs it
    module: str         # where its algorithm is

    def load(self):
        return importlib.import_module(self.module)


SCHEMES: dict[str, Scheme] = {}


def register(name: str, about: str, engine: str = STACKED, module: str | None = None) -> Scheme:
    """Add a scheme (its file: ``module``, default aepar.schemes.<name>)."""
    if name in SCHEMES or name == "auto":
        raise ValueError(f"scheme {name!r} is registered already")
    SCHEMES[name] = Scheme(name, about, engine, module or f"{__name__}.{name}")
    return SCHEMES[name]


def names(engine: str | None = STACKED) -> list[str]:
    """The schemes ``engine`` runs, in registration order (None: all)."""
    return [s.name for s in SCHEMES.values() if engine is None or s.engine == engine]


def get(name: str) -> Scheme:
    return SCHEMES[name]


register("greedy", "one layer after another (Hinton & Salakhutdinov); data-parallel over the ranks with a "
                   "fixed-tree sum, so the weights are the same on any number of ranks")
register("data", "CMU 15-618: greedy layer by layer, each batch split over the ranks, one MPI Allreduce "
                 "of the packed gradient per step; --lr-scaling/--warmup-epochs/--lars for large batches")
register("model", "CMU 15-618: a layer per rank, layer n one epoch behind n-1, on frozen copies of the "
                  "layers below refreshed every epoch; groups of --layer-group layers (default: the ranks)")
register("sync", "Santara et al.: a pipeline stage per layer trained on the newest input of the stage "
                 "below, extra epochs while it changes; at most one rank per layer")
register("hybrid", "sync whose ranks beyond one per layer become data-parallel replicas of the stages, "
                   "allotted by cost; needs more ranks than layers")
register("sparse", "Ng's sparse autoencoder on image patches, data-parallel L-BFGS with fixed-tree sums "
                   "(the same bits on 1-16 processes)", engine="aepar.sparse")
register("eager", "Bhargava & Surana: K convolutional autoencoders stopped early, their codes combined "
                  "into one classifier, against one wide CAE", engine="aepar.eager")
