"""Random image patches for the sparse autoencoder, as UFLDL's sampleIMAGES.m draws them.

For each sample: an image chosen uniformly, a top-left corner chosen uniformly, the
patch flattened column-major (MATLAB's ``reshape``: element ``row + patch * col``), so
a row of the result reshaped with ``order="F"`` (or ``.reshape(p, p).T``) is the patch.
Then normalizeData: subtract each patch's own mean, truncate to +/-3 standard deviations
of all values (MATLAB's ``std``, i.e. ddof=1), divide by that bound and map [-1, 1] to
[0.1, 0.9] so the sigmoid output units can reach every value.

All draws come from one Generator in a fixed order (images, rows, columns), so the same
seed gives the same patches on every rank and in every caller: MPI ranks all sample the
full set on the shared seed and then keep their shard.
"""
from __future__ import annotations

import numpy as np

from aepar.errors import UserError

__all__ = ["sample_patches", "normalize_patches", "ORDER"]

ORDER = "F"  # patch flattening order of the rows returned by sample_patches


def normalize_patches(patches: np.ndarray) -> np.ndarray:
    """UFLDL normalizeData, in place on a float64 (n, p*p) array, which is returned.

    Subtract each row's mean, clip to +/-3 std (of all values, ddof=1), scale to [-1, 1],
    then to [0.1, 0.9].
    """
    patches -= patches.mean(axis=1, keepdims=True)
    bound = 3.0 * patches.std(ddof=1) if patches.size > 1 else 0.0
    if not bound > 0:
        raise UserError("the sampled patches have zero variance: the images are constant")
    np.clip(patches, -bound, bound, out=patches)
    patches *= 0.4 / bound  # x/bound in [-1, 1], then (x + 1) * 0.4 + 0.1
    patches += 0.5
    return patches


def sample_patches(images, n: int, patch: int = 8, seed=0) -> np.ndarray:
    """Draw ``n`` normalised ``patch`` x ``patch`` patches from an image stack.

    Parameters
    ----------
    images : array_like
        (H, W, K) stack of K images (e.g. natural_images() or IMAGES.mat).
    n : int
        Number of patches (UFLDL: 10,000; the scaling study: up to 160,000).
    patch : int
        Side of the square patch (UFLDL: 8).
    seed : int or numpy.random.Generator
        An int seeds a fresh PCG64 Generator; a Generator is drawn from (and advanced).

    Returns
    -------
    numpy.ndarray
        float64 (n, patch*patch), one patch per row, flattened column-major (see ORDER),
        values in [0.1, 0.9].
    """
    images = np.asarray(images)
    if images.ndim != 3:
        raise UserError(f"images must be 3-D (rows, columns, images), got shape {images.shape}")
    h, w, k = images.shape
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise UserError(f"number of patches must be a positive integer, got {n!r}")
    if isinstance(patch, bool) or int(patch) != patch or not 1 <= patch <= min(h, w):
        raise UserError(f"patch size {patch!r} must be an integer in 1..{min(h, w)} for {h}x{w} images")
    if k < 1:
        raise UserError("the image stack is empty")
    n, patch = int(n), int(patch)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    img = rng.integers(0, k, size=n)
    row = rng.integers(0, h - patch + 1, size=n)
    col = rng.integers(0, w - patch + 1, size=n)

    # Gather through flat indices into the stack as it lies in memory (a copy only where it
    # is not one block of float64: a large stack is read once, not copied first), in chunks
    # so the index array stays small even for 160k patches. off[q] is the offset of
    # column-major position q.
    if images.dtype != np.float64 or not (images.flags.c_contiguous or images.flags.f_contiguous):
        images = np.ascontiguousarray(images, dtype=np.float64)
    stack = images.ravel(order="K")  # a view, in memory order
    along_rows, along_cols, along_images = (step // images.itemsize for step in images.strides)
    base = img * along_images + row * along_rows + col * along_cols
    off = (np.arange(patch)[:, None] * along_rows + np.arange(patch)[None, :] * along_cols).ravel(order="F")
    out = np.empty((n, patch * patch), dtype=np.float64)
    chunk = max(1, 2 ** 19 // (patch * patch))
    for s in range(0, n, chunk):
        np.take(stack, base[s:s + chunk, None] + off[None, :], out=out[s:s + chunk])
    return normalize_patches(out)
