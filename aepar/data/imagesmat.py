"""The whitened natural images of Olshausen & Field as UFLDL ships them: IMAGES.mat.

The file holds one variable ``IMAGES`` of shape (512, 512, 10) (rows, columns, image).
MATLAB v4-v7.2 files are read with scipy.io.loadmat; v7.3 files are HDF5 and are read
with h5py (MATLAB stores them column-major, so the axes come back reversed).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from aepar.errors import DataError

__all__ = ["read_images_mat", "VARIABLE"]

VARIABLE = "IMAGES"


def _read_v73(path: Path, variable: str):
    import h5py

    from aepar.data.hdf5 import storage_problem

    with h5py.File(path, "r") as f:
        if variable not in f:
            raise DataError(path, f"no {variable} variable (has: {', '.join(sorted(f)) or 'none'})")
        dset = f[variable]
        # checked from the header, before reading: a struct, cell, string or complex
        # variable, or one whose data the file does not hold, allocates nothing
        if not isinstance(dset, h5py.Dataset) or dset.dtype.kind not in "fiu":
            what = f"{dset.dtype}" if isinstance(dset, h5py.Dataset) else "a group (struct or cell)"
            raise DataError(path, f"{variable} is {what}, need real numbers")
        problem = storage_problem(dset)
        if problem:
            raise DataError(path, f"{variable} {problem}")
        # MATLAB writes column-major: h5py sees (K, W, H)
        return np.asarray(dset[()]).T


def read_images_mat(path, variable: str = VARIABLE) -> np.ndarray:
    """Read the image stack from a MATLAB IMAGES.mat.

    Parameters
    ----------
    path : str or Path
    variable : str
        Name of the variable holding the stack (UFLDL: ``IMAGES``).

    Returns
    -------
    numpy.ndarray
        float64, (H, W, K): K images of H rows and W columns.

    Raises
    ------
    DataError
        Missing file, not a MAT file, no such variable, not a finite real 3-D array.
    """
    import scipy.io

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "missing (no such file)" if not path.exists() else "not a file")
    try:
        mat = scipy.io.loadmat(path, variable_names=[variable])
        if variable not in mat:
            names = [n for n, *_ in scipy.io.whosmat(path)]
            raise DataError(path, f"no {variable} variable (has: {', '.join(names) or 'none'})")
        images = mat[variable]
    except NotImplementedError:  # scipy's answer to a v7.3 (HDF5) MAT file
        try:
            images = _read_v73(path, variable)
        except DataError:
            raise
        except Exception as e:
            raise DataError(path, f"not a readable MAT v7.3 file ({type(e).__name__}: {e})") from None
    except DataError:
        raise
    except Exception as e:  # loadmat raises ValueError/TypeError/OSError on garbage
        msg = str(e).splitlines()[0] if str(e) else ""
        raise DataError(path, f"not a MAT file ({type(e).__name__}: {msg})") from None
    images = np.asarray(images)
    if images.dtype.kind not in "fiu":
        raise DataError(path, f"{variable} is {images.dtype}, need real numbers")
    if images.ndim != 3:
        raise DataError(path, f"{variable} has shape {images.shape}, need 3-D (rows, columns, images)")
    if images.size == 0:
        raise DataError(path, f"{variable} is empty {images.shape}")
    images = images.astype(np.float64)
    if not np.isfinite(images).all():
        raise DataError(path, f"{variable} holds NaN or infinite values")
    return images
