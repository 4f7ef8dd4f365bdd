"""Hybrid: the synchronized pipeline whose ranks beyond one per layer become replicas.

The pipeline of the sync scheme (Santara et al. 2016), with P > layers ranks: the extra
ranks become data-parallel replicas inside the stages, allotted by each stage's planned
work (FLOPs x rows x epochs, extras included), so the 784x1000 layer gets the most. One
rank per layer cannot beat greedy by more than total work / layer 1's work; replicas can.
A stage's replicas add its fixed blocks in the fixed tree, so the weights are the same
bits as sync's on any number of ranks: the two share their checkpoints.
"""
from __future__ import annotations

from aepar.errors import UserError
from aepar.parallel import synchronized

CHECKPOINT_AS = "sync"
prepare, setup, pretrain, summarize, tables = (synchronized.prepare, synchronized.setup, synchronized.pretrain,
                                               synchronized.summarize, synchronized.tables)


def check(args, ranks, n_layers, n_rows):
    synchronized.check(args, n_layers, n_rows)
    if ranks <= n_layers:
        raise UserError(f"--scheme hybrid needs more ranks than layers ({n_layers}), not {ranks}: "
                        "use --scheme sync")
