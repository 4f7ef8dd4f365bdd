"""Combining trained encoders into one classifier (Bhargava & Surana's last step).

The codes of several encoders, each feature standardized by its training mean and
deviation, are concatenated and one classifier is trained on them (softmax regression, or
an MLP); with several encoders, each also gets a classifier of its own and the classifiers
vote. Accuracies on the validation set (the paper's) and the test set.
"""
from __future__ import annotations

import argparse

import numpy as np

from aepar.cli import progress

__all__ = ["combine", "standardized_codes"]


def _codes(be, comm, model, rows: list) -> list:
    """The encoder's codes of each array in ``rows`` (host, the run's dtype), on every rank.

    Encoding is most of an evaluation, and every rank needs all the codes: the ranks share
    the chunks of CHUNK rows, each encodes its own and broadcasts them. A chunk holds the
    rows a single process would encode together, so the codes are the same bits on any
    number of ranks."""
    from aepar.rows import CHUNK

    codes = [np.empty((len(x), model.code_size), dtype=be.dtype) for x in rows]
    chunks = [(i, lo) for i, x in enumerate(rows) for lo in range(0, len(x), CHUNK)]
    owner = [k * comm.size // len(chunks) for k in range(len(chunks))]  # contiguous runs of chunks per rank
    for (i, lo), rank in zip(chunks, owner):
        if rank == comm.rank:
            codes[i][lo:lo + CHUNK] = be.to_host(model.encode(be.asarray(rows[i][lo:lo + CHUNK])))
    for (i, lo), rank in zip(chunks, owner):
        comm.Bcast(codes[i][lo:lo + CHUNK], root=rank)
    return codes


def standardized_codes(be, comm, model, split) -> list:
    """The codes of the train, validation and test images, each feature shifted and scaled
    by its training mean and standard deviation (constant features left at 0). Raw ReLU
    codes run to tens with very different scales per feature; on them the softmax's Adam
    steps oscillate (the test accuracy swings from one epoch to the next, below the steady
    accuracy of standardized codes; docs/performance-notes.md)."""
    parts = _codes(be, comm, model, [split.train_x, split.val_x, split.test_x])
    mean = parts[0].mean(axis=0, dtype=np.float64)
    std = np.sqrt(np.mean(np.square(parts[0] - mean.astype(parts[0].dtype), dtype=np.float64), axis=0))
    scale = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)
    for p in parts:  # in place, in the run's dtype: the codes of 60k images are gigabytes
        p -= mean.astype(p.dtype)
        p *= scale.astype(p.dtype)
    return parts


def combine(be, comm, split, models: dict, args, *, quiet=False) -> dict:
    """Classifiers on the codes of ``models`` (name -> encoder with the picked weights): the
    concatenated codes' classifier and, with several models, each model's own classifier and
    their vote. Accuracies on the validation set (the paper's) and the test set."""
    from aepar.models.classifier import with_labels
    from aepar.parallel.data_parallel import reducer
    from aepar.rows import Shard
    from aepar.tasks.classify import fit_on_features

    hidden = (args.combine_hidden,) if args.combine_hidden else ()
    codes = {n: standardized_codes(be, comm, m, split) for n, m in models.items()}
    names = sorted(models)

    def fit(parts, what):
        args_q = argparse.Namespace(**{**vars(args), "quiet": True})
        result = fit_on_features(be, comm, (parts[0], split.train_y), (parts[1], split.val_y), args_q, what=what,
                                 hidden=hidden, n_classes=split.n_classes)
        model = result.pop("model")
        test = Shard.of(be, with_labels(parts[2], split.test_y, be.dtype), min(args.reduce_blocks, len(split.test_y)),
                        comm.rank, comm.size)
        return model, {"validation": result["after"]["test"], "test": model.accuracy(test, reducer(comm)),
                       "time_s": result["time_s"]}

    joined = [np.concatenate([codes[n][i] for n in names], axis=1) for i in range(3)]
    _, out = fit(joined, "combined classifier")
    out = {"combined": out}
    if len(names) > 1:
        votes = {"validation": [], "test": []}
        each = {}
        for n in names:
            clf, each[n] = fit(codes[n], f"classifier of {n}")
            for part, x in (("validation", codes[n][1]), ("test", codes[n][2])):
                votes[part].append(be.to_host(clf.forward(be.asarray(x))[-1]))
        out["each"] = each
        out["vote"] = {part: _vote(v, split.val_y if part == "validation" else split.test_y)
                       for part, v in votes.items()}
        out["vote"]["time_s"] = max(e["time_s"] for e in each.values())
    progress(comm, quiet, f"  combined: validation {100 * out['combined']['validation']:.2f}%  test "
                          f"{100 * out['combined']['test']:.2f}%" + (
                              f"   vote: validation {100 * out['vote']['validation']:.2f}%  test "
                              f"{100 * out['vote']['test']:.2f}%" if "vote" in out else ""))
    return out


def _vote(logits: list, labels) -> float:
    """Accuracy of the majority vote of the classifiers' predictions; a tie goes to the
    class with the largest summed probability."""
    probs = [np.exp(z - z.max(axis=1, keepdims=True)) for z in logits]
    probs = [p / p.sum(axis=1, keepdims=True) for p in probs]
    n_classes = probs[0].shape[1]
    counts = sum(np.eye(n_classes)[p.argmax(axis=1)] for p in probs)
    score = counts + 1e-3 * sum(probs) / len(probs)  # probabilities < 1 vote only between tied classes
    return float(np.mean(score.argmax(axis=1) == np.asarray(labels)))
