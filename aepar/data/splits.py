"""Deterministic disjoint splits of ``range(n)`` (train / validation / test ...)."""
from __future__ import annotations

import numbers

import numpy as np

from aepar.errors import UserError

__all__ = ["split_indices"]


def _counts(n: int, parts) -> list[int]:
    if all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in parts):
        counts = [int(p) for p in parts]
        if any(c < 0 for c in counts):
            raise UserError(f"split sizes must not be negative, got {list(parts)}")
        return counts
    if all(isinstance(p, numbers.Real) and not isinstance(p, (bool, numbers.Integral)) for p in parts):
        fractions = [float(p) for p in parts]
        if any(not 0.0 <= f <= 1.0 for f in fractions):
            raise UserError(f"split fractions must lie in [0, 1], got {fractions}")
        total = sum(fractions)
        if total > 1.0 + 1e-9:
            raise UserError(f"split fractions add up to {total:g} > 1")
        # round the cumulative boundaries, not each part, so fractions adding to 1 cover all n
        bounds = np.rint(np.cumsum(fractions) * n).astype(np.int64)
        bounds = np.minimum(bounds, n)
        return np.diff(np.concatenate([[0], bounds])).tolist()
    raise UserError(f"split sizes must be all integer counts or all float fractions, got {list(parts)}")


def split_indices(n: int, counts_or_fractions, seed=0, *, sort: bool = False) -> tuple[np.ndarray, ...]:
    """Split ``range(n)`` at random into disjoint parts.

    Parameters
    ----------
    n : int
        Number of samples.
    counts_or_fractions : sequence of int or sequence of float
        Either the size of each part (e.g. ``(4000, 1000)``), their sum at most ``n``, or
        the fraction of ``n`` in each part (e.g. ``(0.8, 0.2)``), their sum at most 1; the
        cumulative boundaries are rounded, so fractions adding to 1 use every sample.
    seed : int or numpy.random.Generator
        The same seed gives the same split.
    sort : bool
        Return each part's indices ascending (stored order; h5py needs increasing
        indices). By default they come in random order, so the first k of a part are a
        random subset even when the data is stored sorted by class.

    Returns
    -------
    tuple of numpy.ndarray
        One int64 index array per part; parts are disjoint.

    Raises
    ------
    UserError
        Sizes that exceed ``n``, a part that would be empty, mixed or negative sizes.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise UserError(f"number of samples must be a non-negative integer, got {n!r}")
    n = int(n)
    parts = list(counts_or_fractions)
    if not parts:
        raise UserError("a split needs at least one part")
    counts = _counts(n, parts)
    if sum(counts) > n:
        raise UserError(f"split sizes {counts} need {sum(counts)} samples, only {n} available")
    empty = [i for i, c in enumerate(counts) if c == 0]
    if empty:
        raise UserError(f"split part {empty[0]} of {parts} would be empty for {n} samples")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    perm = rng.permutation(n)
    bounds = np.cumsum([0] + counts)
    parts = tuple(perm[a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:]))
    return tuple(np.sort(p) for p in parts) if sort else parts
