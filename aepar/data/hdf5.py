"""A check shared by the readers of HDF5 files (MAT v7.3 images, checkpoints).

An HDF5 dataset declares its shape in a header; the bytes behind it may never have been
written (the fill value stands in) or may live in another file. Reading such a dataset
allocates what the header says, so it is measured against what the file stores first.
"""
from __future__ import annotations

__all__ = ["storage_problem"]

# deflate expands at most 1032:1, a bound for any compressed (filtered) dataset
_MAX_FILTER_RATIO = 1032


def storage_problem(dset) -> str | None:
    """Why reading ``dset`` would allocate more than its file holds, or None if it would not.

    Parameters
    ----------
    dset : h5py.Dataset

    Returns
    -------
    str or None
        A phrase such as ``"declares (1000000, 784) float64 (6272000000 bytes) but stores
        0 bytes (truncated or never written)"``.
    """
    if dset.shape is None:
        return "holds no data (an empty dataspace)"
    stored = dset.id.get_storage_size()
    filtered = dset.id.get_create_plist().get_nfilters() > 0
    if dset.nbytes > stored * (_MAX_FILTER_RATIO if filtered else 1):
        return (f"declares {dset.shape} {dset.dtype} ({dset.nbytes} bytes) but stores {stored} "
                "bytes (truncated or never written)")
    return None
