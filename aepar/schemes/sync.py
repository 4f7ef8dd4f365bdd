"""Synchronized layer-wise pre-training (Santara et al. 2016, §3.1), at most one rank per layer.

Every layer is a pipeline stage on its own rank: stage l waits for stage l-1's first epoch,
then trains every next epoch on the newest version of its input that l-1 has handed over;
after its own epochs it sleeps and wakes for an extra epoch whenever its input changes, at
most ``--extra`` times (the paper: 0, 5, 20, 40 for layers 1-4). Fewer ranks than layers
share ranks by work; one process runs the same schedule. The schedule is planned on a
FLOP clock, so every rank count gives the same weights (aepar.parallel.synchronized).
"""
from __future__ import annotations

from aepar.errors import UserError
from aepar.parallel import synchronized

CHECKPOINT_AS = "sync"
prepare, setup, pretrain, summarize, tables = (synchronized.prepare, synchronized.setup, synchronized.pretrain,
                                               synchronized.summarize, synchronized.tables)


def check(args, ranks, n_layers, n_rows):
    synchronized.check(args, n_layers, n_rows)
    if ranks > n_layers:
        raise UserError(f"--scheme sync runs at most one rank per layer: {ranks} ranks for {n_layers} layers; "
                        f"use --scheme hybrid (replicas) or at most {n_layers} ranks")
