"""A user's own data files: ``--data PATH`` for every program.

What PATH may be (the format is told by its name):

- ``.npy``: the samples X, unlabelled; read through a memory map, so a rank that is
  handed only its rows reads only those;
- ``.npz``: X under ``x``, ``X``, ``data`` or ``images`` (or ``--data-x NAME``), labels,
  optional, under ``y``, ``Y``, ``labels`` or ``targets`` (``--data-y NAME``); a test part
  under ``x_test``/``X_test``/``test_x`` (labels ``y_test``/``Y_test``/``test_y``) is used
  as the test set; read whole;
- ``.h5`` / ``.hdf5``: the dataset ``--data-x`` (default ``x``, else the file's only
  dataset of two or more dimensions) and ``--data-y`` (optional); read by row slices;
- ``.csv`` / ``.tsv``: a table of numbers, one sample per line, comma- or tab-separated;
  a first line with a field that is not a number names the columns. ``--data-y COLUMN``
  (a name, or a number from 0) is the labels' column, the others are X; read whole;
- a folder of PNG/JPEG images, all of one size (``--image-size HxW`` resizes them); with
  one sub-folder per class the sub-folders' sorted names are the classes; read whole.

Samples are rows (the stacked programs flatten each one) or images (N, H, W),
(N, C, H, W) or (N, H, W, C) with C in 1, 3, 4 (the convolutional and sparse
autoencoders). uint8 values are scaled to [0, 1]; other numbers are used as they are;
NaN, Inf and non-numbers are refused, naming the file. Labels are integers or strings,
mapped to 0..K-1 in sorted order (the names are kept).

The test set is ``--test-data PATH`` (same format), else the file's test part, else a
fraction ``--test-fraction`` (default 0.2) of the rows chosen by the seed. Train and test
keep the stored order of their rows, so a rank's contiguous block of training rows
(aepar.rows) is a narrow span of the file and reading it touches about 1/P of the file.
"""
from __future__ import annotations

import csv
import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepar.data.sources import Digits, Images
from aepar.data.splits import split_indices
from aepar.errors import DataError, UserError

__all__ = ["Rows", "UserData", "read_data", "load_user", "user_images", "require_labels", "check_source",
           "from_args", "images_from_args", "as_images", "natural_from", "labels_to_classes", "fingerprinted", "X_NAMES", "Y_NAMES", "TEST_FRACTION"]

X_NAMES = ("x", "X", "data", "images")
Y_NAMES = ("y", "Y", "labels", "targets")
X_TEST_NAMES = ("x_test", "X_test", "test_x", "test_images")
Y_TEST_NAMES = ("y_test", "Y_test", "test_y", "test_labels")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
TEST_FRACTION = 0.2
# a read is cut into spans of at most this many bytes of the file (bounds temporaries)
_SPAN_BYTES = 1 << 25
_CHANNELS = (1, 3, 4)
_ALIGNMENT = 64  # aepar.kernels.memory.ALIGNMENT
TAB = "\t"  # a .tsv's separator
TABLE_ENCODING = "utf-8-sig"  # UTF-8, without the byte-order mark some spreadsheets write first


class Rows:
    """Some rows of an array stored in a file, read when sliced.

    ``rows[a:b]`` (or an index array) reads only the stored rows it names and returns them
    as a NumPy array of ``dtype``: uint8 divided by 255, other numbers converted. Anything
    that wants the whole array (``np.asarray(rows)``) reads all of them.

    Parameters
    ----------
    source : numpy.ndarray, numpy.memmap or h5py.Dataset
        (N, ...) as stored.
    index : numpy.ndarray
        Ascending stored row numbers of this set.
    dtype : numpy dtype
    flat : bool
        Each sample as one row of ``prod(sample shape)`` values (the stacked programs).
    key : str
        Names the file and its version, for :meth:`digest`.
    """

    def __init__(self, source, index, dtype, *, flat: bool, key: str):
        self.source, self.index = source, np.asarray(index, dtype=np.int64)
        self.dtype, self.flat, self.key = np.dtype(dtype), flat, key
        self.sample = tuple(int(s) for s in source.shape[1:])

    @property
    def shape(self) -> tuple:
        return (len(self.index), int(np.prod(self.sample))) if self.flat else (len(self.index),) + self.sample

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self.index)

    def unflat(self) -> "Rows":
        """The same rows as samples of their stored shape."""
        return Rows(self.source, self.index, self.dtype, flat=False, key=self.key)

    def __getitem__(self, key):
        if isinstance(key, tuple) or isinstance(key, (int, np.integer)):
            return self[:][key]  # not the engine's way in: whole then NumPy's indexing
        picked = self.index[key]
        out = _aligned((len(picked),) + self.sample, self.dtype)
        order = np.argsort(picked, kind="stable")
        stored = picked[order]
        row_bytes = max(1, int(np.prod(self.sample)) * np.dtype(self.source.dtype).itemsize)
        span = max(1, _SPAN_BYTES // row_bytes)
        i = 0
        while i < len(stored):
            j = max(i + 1, int(np.searchsorted(stored, stored[i] + span, side="left")))
            block = np.asarray(self.source[int(stored[i]):int(stored[j - 1]) + 1])
            part = block[stored[i:j] - stored[i]]
            if part.dtype == np.uint8:
                out[order[i:j]] = part / 255.0
            else:
                out[order[i:j]] = part
            _release(self.source, int(stored[i]), int(stored[j - 1]) + 1, row_bytes)
            i = j
        return out.reshape(len(picked), int(np.prod(self.sample))) if self.flat else out

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def astype(self, dtype, copy=True):
        return Rows(self.source, self.index, dtype, flat=self.flat, key=self.key)

    def digest(self) -> np.ndarray:
        """A small array standing for these rows in a run's data fingerprint: the file's
        name, size and time, the rows taken and the dtype (hashing the rows would read them)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.key}|{self.dtype.str}|{self.shape}".encode())
        h.update(self.index.tobytes())
        return np.frombuffer(h.digest(), dtype=np.uint8)


def _aligned(shape, dtype) -> np.ndarray:
    """An empty C-order array on a 64-byte boundary, the boundary aepar.backend's CPU arrays
    keep: ``be.asarray`` then takes the rows as they are instead of copying them again."""
    dtype = np.dtype(dtype)
    raw = np.empty(int(np.prod(shape)) * dtype.itemsize + _ALIGNMENT, np.uint8)
    return np.ndarray(shape, dtype, raw, -raw.ctypes.data % _ALIGNMENT)


def _release(source, start: int, stop: int, row_bytes: int):
    """Drop the pages of stored rows [start, stop) of a memory-mapped .npy from this
    process's memory once they are copied (the file keeps them): a rank then holds its
    rows once, not twice."""
    m = getattr(source, "_mmap", None)
    if m is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    base = source.offset - source.offset % mmap.ALLOCATIONGRANULARITY  # where numpy's map starts
    lo = source.offset - base + start * row_bytes
    hi = source.offset - base + stop * row_bytes
    lo -= lo % mmap.PAGESIZE
    try:
        m.madvise(mmap.MADV_DONTNEED, lo, min(hi, len(m)) - lo)
    except (OSError, ValueError):  # only memory is at stake
        pass


def fingerprinted(a):
    """What to hash for ``a`` in a run's data fingerprint (aepar.rundir.fingerprint)."""
    return a.digest() if isinstance(a, Rows) else a


@dataclass
class UserData:
    """What :func:`read_data` found in one file, before the split.

    Attributes
    ----------
    x : numpy.ndarray, numpy.memmap or h5py.Dataset
        (N, ...) as stored.
    y : numpy.ndarray or None
        (N,) labels as stored.
    test_x, test_y : optional
        The file's own test part.
    what : str
        Which arrays were used, for the run's source line.
    key : str
        The file's identity (path, size, modification time).
    """

    x: object
    y: np.ndarray | None
    test_x: object = None
    test_y: np.ndarray | None = None
    what: str = ""
    key: str = ""


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def _check_samples(x, path, what="X"):
    if x.dtype.kind not in "biuf":
        raise DataError(path, f"{what} holds {x.dtype} values, not numbers")
    if len(x.shape) < 2:
        raise DataError(path, f"{what} has shape {tuple(x.shape)}: need one sample per row, (N, features) "
                              "or images (N, H, W) / (N, C, H, W)")
    if x.shape[0] < 1 or int(np.prod(x.shape[1:])) < 1:
        raise DataError(path, f"{what} has shape {tuple(x.shape)}: no samples")


def _check_finite(x, path):
    """NaN or Inf anywhere in float ``x`` is refused, read a span at a time."""
    if x.dtype.kind != "f":
        return
    n = x.shape[0]
    step = max(1, _SPAN_BYTES // max(1, int(np.prod(x.shape[1:])) * x.dtype.itemsize))
    for lo in range(0, n, step):
        if not np.isfinite(np.asarray(x[lo:lo + step])).all():
            raise DataError(path, f"NaN or Inf in the samples (rows {lo}..{min(n, lo + step) - 1})")


def _npy_finite(path: Path, x):
    """:func:`_check_finite` for a memory-mapped .npy by plain reads, so that the scan
    leaves no mapped pages in this process's memory."""
    if x.dtype.kind != "f" or not isinstance(x, np.memmap) or not x.flags.c_contiguous:
        return _check_finite(x, path)
    row = int(np.prod(x.shape[1:]))
    step = max(1, _SPAN_BYTES // max(1, row * x.dtype.itemsize))
    buf = np.empty(step * row, dtype=x.dtype)
    with open(path, "rb") as f:
        f.seek(x.offset)
        for lo in range(0, x.shape[0], step):
            k = min(step, x.shape[0] - lo) * row
            f.readinto(memoryview(buf[:k]).cast("B"))
            if not np.isfinite(buf[:k]).all():
                raise DataError(path, f"NaN or Inf in the samples (rows {lo}..{lo + k // row - 1})")


def _pick(names, wanted, candidates, path, what, option):
    """The key to use: ``wanted`` if given (must exist), else the first candidate present."""
    if wanted is not None:
        if wanted not in names:
            raise DataError(path, f"no array {wanted!r} ({option}); it holds {', '.join(sorted(names)) or 'nothing'}")
        return wanted
    return next((c for c in candidates if c in names), None)


def _read_npy(path: Path, x_name, y_name):
    if y_name is not None:
        raise UserError(f"{path}: a .npy holds one array (X, unlabelled): --data-y is for .npz and HDF5 files")
    try:
        x = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(path, f"not a readable .npy file ({type(e).__name__}: {e})") from None
    return UserData(x, None, what=f"X {tuple(x.shape)} {x.dtype}")


def _read_npz(path: Path, x_name, y_name):
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            xk = _pick(names, x_name, X_NAMES, path, "X", "--data-x")
            if xk is None:
                raise DataError(path, f"no samples: name the array x, X, data or images (or give --data-x); it "
                                      f"holds {', '.join(sorted(names)) or 'nothing'}")
            yk = _pick(names, y_name, Y_NAMES, path, "labels", "--data-y")
            tk = next((c for c in X_TEST_NAMES if c in names), None)
            tyk = next((c for c in Y_TEST_NAMES if c in names), None)
            arrays = {k: z[k] for k in (xk, yk, tk, tyk) if k is not None}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(path, f"not a readable .npz file ({type(e).__name__}: {e})") from None
    x = arrays[xk]
    what = f"X {xk!r} {x.shape} {x.dtype}" + (f", labels {yk!r}" if yk else "")
    if tk:
        what += f", test part {tk!r}" + (f" with labels {tyk!r}" if tyk else "")
    return UserData(x, arrays.get(yk), arrays.get(tk), arrays.get(tyk), what)


def _read_h5(path: Path, x_name, y_name):
    import h5py

    from aepar.data.hdf5 import storage_problem

    try:
        f = h5py.File(path, "r")  # stays open: the rows are read when a rank takes them
    except OSError as e:
        raise DataError(path, f"not a readable HDF5 file ({e})") from None
    sets = {}

    def found(name, obj):  # a return value other than None would end the visit
        if isinstance(obj, h5py.Dataset):
            sets[name] = obj
    f.visititems(found)
    xk = _pick(sets, x_name, ("x",), path, "X", "--data-x")
    if xk is None:
        big = [k for k, d in sets.items() if d.ndim >= 2 and k not in X_TEST_NAMES]
        if len(big) != 1:
            raise DataError(path, f"name the samples with --data-x (no dataset 'x'; datasets of 2+ dimensions: "
                                  f"{', '.join(sorted(big)) or 'none'})")
        xk = big[0]
    yk = _pick(sets, y_name, (), path, "labels", "--data-y")
    tk = next((c for c in X_TEST_NAMES if c in sets), None)
    tyk = next((c for c in Y_TEST_NAMES if c in sets), None)
    for k in (xk, yk, tk, tyk):
        if k is not None:
            problem = storage_problem(sets[k])
            if problem:
                raise DataError(path, f"dataset {k!r} {problem}")
    x = sets[xk]
    y = None if yk is None else sets[yk][()]
    what = f"X {xk!r} {x.shape} {x.dtype}" + (f", labels {yk!r}" if yk else "")
    if tk:
        what += f", test part {tk!r}" + (f" with labels {tyk!r}" if tyk else "")
    return UserData(x, y, sets[tk] if tk else None, sets[tyk][()] if tyk else None, what)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_table(path: Path, x_name, y_name):
    """A .csv (commas) or .tsv (tabs): X float64 from every column but ``y_name``'s, the
    labels (integers where every one is, else names) from that one."""
    import warnings

    if x_name is not None:
        raise UserError(f"{path}: a table's samples are its columns other than --data-y: --data-x is for .npz and "
                        "HDF5 files")
    sep = TAB if path.suffix.lower() == ".tsv" else ","
    try:
        with open(path, encoding=TABLE_ENCODING, newline="") as f:
            fields = [c.strip() for c in next(csv.reader(f, delimiter=sep), [""])]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(path, f"not a readable text table ({type(e).__name__}: {e})") from None
    header = not all(_is_number(c) for c in fields)
    column = None
    if y_name is not None:
        if header and y_name in fields:
            column = fields.index(y_name)
        elif y_name.isdigit() and int(y_name) < len(fields):
            column = int(y_name)
        else:
            named = f"named {', '.join(fields)}" if header else "unnamed"
            raise DataError(path, f"no column {y_name!r} (--data-y): its {len(fields)} columns are {named} "
                                  f"(or give a column's number from 0)")
    cols = [i for i in range(len(fields)) if i != column]
    if not cols:
        raise DataError(path, "no sample columns besides the labels' (--data-y)")
    labels = []

    def label(text):  # the labels' column, kept as text row by row in the one pass over the file
        labels.append(text.strip())
        return 0.0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data": _check_samples says so
            # every column parsed, so that a line of another width is refused
            x = np.loadtxt(path, dtype=np.float64, ndmin=2, delimiter=sep, skiprows=int(header),
                           encoding=TABLE_ENCODING, comments=None, quotechar='"',
                           converters=None if column is None else {column: label})[:, cols]
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise DataError(path, _first_bad_line(path, sep, header, len(fields), cols)
                        or f"not a table of numbers ({e})") from None
    y = None if column is None else np.array(labels, dtype=str)
    if y is not None and y.size and all(_is_integer(v) for v in y):
        y = y.astype(np.int64)
    what = f"{'TSV' if sep == TAB else 'CSV'} X {x.shape}" + (", columns named on its first line" if header else "")
    if column is not None:
        what += f", labels from column {fields[column]!r}" if header else f", labels from column {column}"
    return UserData(x, y, what=what)


def _first_bad_line(path: Path, sep: str, header: bool, width: int, cols) -> str | None:
    """What is wrong on the first line of a table that numpy could not read, counted as an
    editor counts (numpy's own message counts rows in more than one way); ``header``: the
    first line names the columns."""
    with open(path, encoding=TABLE_ENCODING, newline="") as f:
        for number, fields in enumerate(csv.reader(f, delimiter=sep), 1):
            if not fields:
                continue  # a blank line, which numpy skips too
            if number == 1 and header:
                continue
            if len(fields) != width:
                return f"line {number} has {len(fields)} columns, the first line {width}"
            for c in cols:
                value = fields[c].strip()
                if not _is_number(value):
                    other = next((o for o in (";", TAB, ",") if o != sep and o in value), None)
                    hint = f" (separated by {other!r}? a {path.suffix} is read at {sep!r})" if other else ""
                    return f"line {number}, column {c + 1}: {value!r} is not a number{hint}"
    return None


def _is_integer(text: str) -> bool:
    return text.strip().lstrip("+-").isdigit()


def _image_files(folder: Path):
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _read_folder(path: Path, image_size=None):
    """All images of a folder (or of its class sub-folders) as uint8 (N, C, H, W)."""
    from PIL import Image

    loose = _image_files(path)
    subdirs = sorted(d for d in path.iterdir() if d.is_dir() and _image_files(d))
    if loose and subdirs:
        raise DataError(path, f"images both in the folder ({loose[0].name}) and in class sub-folders "
                              f"({subdirs[0].name}/): put every image in its class's sub-folder, or none")
    files, labels = (loose, None) if loose else ([], [])
    for d in subdirs:
        for p in _image_files(d):
            files.append(p)
            labels.append(d.name)
    if not files:
        raise DataError(path, f"no images ({', '.join(IMAGE_SUFFIXES)}) in the folder or its sub-folders")
    colour, first = False, None
    for p in files:  # headers only: sizes and modes before decoding anything
        try:
            with Image.open(p) as img:
                size, mode = img.size, img.mode
        except OSError as e:
            raise DataError(p, f"not a readable image ({e})") from None
        colour |= mode not in ("1", "L", "LA", "I", "I;16", "F")
        if first is None:
            first = (p, size)
        elif image_size is None and size != first[1]:
            raise DataError(p, f"{size[0]}x{size[1]} pixels (width x height) but {first[0].name} is "
                               f"{first[1][0]}x{first[1][1]}: give images of one size, or --image-size HxW to resize")
    w, h = (image_size[1], image_size[0]) if image_size else first[1]
    c = 3 if colour else 1
    out = np.empty((len(files), c, h, w), dtype=np.uint8)
    for i, p in enumerate(files):
        with Image.open(p) as img:
            img = img.convert("RGB" if colour else "L")
            if img.size != (w, h):
                img = img.resize((w, h), Image.BILINEAR)
            a = np.asarray(img)
        out[i] = a[None] if a.ndim == 2 else np.moveaxis(a, 2, 0)
    what = f"{len(files)} {'colour' if colour else 'grey'} images {h}x{w}" + (
        f" resized to --image-size {h}x{w}" if image_size else "")
    what += f", labels from {len(subdirs)} sub-folders" if labels is not None else ""
    return UserData(out, None if labels is None else np.array(labels), what=what)


def read_data(path, *, x_name=None, y_name=None, image_size=None, check=True) -> UserData:
    """One user file (or image folder) as stored, labels not yet mapped; see the module
    docstring for the formats. ``check``: also scan float samples for NaN/Inf (one rank
    may do it for all: the set-up is collective).

    Raises
    ------
    DataError
        A missing, unreadable or malformed file, naming it and what is wrong.
    UserError
        An unknown format.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(path, "missing (no such file or folder)")
    if path.is_dir():
        data = _read_folder(path, image_size)
    else:
        suffix = path.suffix.lower()
        readers = {".npy": _read_npy, ".npz": _read_npz, ".h5": _read_h5, ".hdf5": _read_h5, ".csv": _read_table,
                   ".tsv": _read_table}
        if suffix not in readers:
            raise UserError(f"{path}: unknown format {suffix or '(no suffix)'}: give a .npy, .npz, .h5/.hdf5, "
                            ".csv/.tsv file or a folder of PNG/JPEG images")
        data = readers[suffix](path, x_name, y_name)
        if image_size is not None:
            raise UserError(f"{path}: --image-size resizes the images of a folder, not the arrays of a file")
    data.key = _identity(path) if path.is_file() else f"{path.resolve()}:{len(data.x)} images"
    for x, what in ((data.x, "X"), (data.test_x, "the test part")):
        if x is None:
            continue
        _check_samples(x, path, what)
        if check:
            _npy_finite(path, x)
    for y, x, what in ((data.y, data.x, "labels"), (data.test_y, data.test_x, "test labels")):
        if y is None:
            continue
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or len(y) != x.shape[0]:
            raise DataError(path, f"{len(y) if y.ndim else 0} {what} for {x.shape[0]} samples (shape {y.shape})")
        if y.dtype.kind not in "iuUS":
            raise DataError(path, f"{what} must be integers (or class names), not {y.dtype}")
    if data.test_x is not None and tuple(data.test_x.shape[1:]) != tuple(data.x.shape[1:]):
        raise DataError(path, f"the test part's samples are {tuple(data.test_x.shape[1:])}, X's "
                              f"{tuple(data.x.shape[1:])}")
    return data


def labels_to_classes(path, train_y, test_y):
    """Labels -> 0..K-1 in sorted order of their values, and the class names."""
    parts = [np.asarray(y) for y in (train_y, test_y) if y is not None]
    if not parts:
        return None, None, None
    if len(parts) == 1 or any(y is None for y in (train_y, test_y)):
        raise DataError(path, "labels for the training samples but not for the test ones (or the other way): "
                              "give both or neither")
    parts = [p[:, 0] if p.ndim == 2 else p for p in parts]
    if {p.dtype.kind in "US" for p in parts} == {True, False}:
        raise DataError(path, "the training and test labels are of different kinds (names and numbers)")
    names = np.unique(np.concatenate(parts))
    mapped = [np.searchsorted(names, p).astype(np.int64) for p in parts]
    return mapped[0], mapped[1], [str(v) for v in names.tolist()]


def load_user(path, *, x_name=None, y_name=None, test_path=None, test_fraction=None, seed=0,
              limit: int | None = None, image_size=None, dtype=np.float64, check=True) -> Digits:
    """A user's file as the stacked programs' training and test rows.

    Parameters
    ----------
    path : str or Path
        The file or image folder (module docstring).
    x_name, y_name : str, optional
        The arrays of an .npz or HDF5 file (``--data-x``, ``--data-y``).
    test_path : str or Path, optional
        The test set in a file of its own (``--test-data``; same format).
    test_fraction : float, optional
        Held out as the test set, chosen by ``seed``, when there is no test set (default 0.2).
    limit : int, optional
        At most this many training rows, chosen by ``seed`` among them.
    image_size : (H, W), optional
        Resize a folder's images.
    dtype : numpy dtype
        Of the rows handed out.
    check : bool
        Scan float samples for NaN/Inf here.

    Returns
    -------
    Digits
        ``train_x`` and ``test_x`` are :class:`Rows` (flat; read when sliced), labels
        int64 0..K-1 or None, ``classes`` the class names, ``name`` ``"file"``.
    """
    path = Path(path)
    data = read_data(path, x_name=x_name, y_name=y_name, image_size=image_size, check=check)
    n = int(data.x.shape[0])
    if test_path is not None or data.test_x is not None:
        if test_fraction is not None:
            raise UserError(f"{test_path or path}: the test set is given (--test-data or the file's test part): "
                            "--test-fraction is for a file without one")
    if test_path is not None:
        test = read_data(test_path, x_name=x_name, y_name=y_name, image_size=image_size, check=check)
        if tuple(test.x.shape[1:]) != tuple(data.x.shape[1:]):
            raise DataError(test_path, f"samples of shape {tuple(test.x.shape[1:])}, but {path}'s are "
                                       f"{tuple(data.x.shape[1:])}")
        test_src, test_y, test_key = test.x, test.y, test.key
        test_n = int(test.x.shape[0])
        train_rows, test_rows = np.arange(n), np.arange(test_n)
        how = f"test set {test_path} ({test.what})"
    elif data.test_x is not None:
        test_src, test_y, test_key = data.test_x, data.test_y, data.key + "|test"
        train_rows, test_rows = np.arange(n), np.arange(int(data.test_x.shape[0]))
        how = "test set: the file's test part"
    else:
        f = TEST_FRACTION if test_fraction is None else float(test_fraction)
        n_test = int(round(f * n))
        if n_test < 1 or n_test >= n:
            raise DataError(path, f"{n} samples are too few to hold out --test-fraction {f:g} as a test set")
        train_rows, test_rows = split_indices(n, (n - n_test, n_test), seed)
        test_src, test_y, test_key = data.x, data.y, data.key
        how = f"--test-fraction {f:g} held out by seed {seed}"
    if test_src is data.x:  # one file split in two: its labels, mapped once
        y_all, _, classes = labels_to_classes(path, data.y, data.y)
        y_test_all = y_all
    else:
        y_all, y_test_all, classes = labels_to_classes(path, data.y, test_y)
    kept = len(train_rows)
    if limit is not None and limit < kept:
        train_rows = np.random.default_rng(seed).permutation(train_rows)[:int(limit)]
    # stored order: a rank's block of rows is a narrow span of the file
    train_rows, test_rows = np.sort(train_rows), np.sort(test_rows)
    y_train = None if y_all is None else y_all[train_rows]
    y_test = None if y_test_all is None else y_test_all[test_rows]
    train_x = Rows(data.x, train_rows, dtype, flat=True, key=data.key)
    test_x = Rows(test_src, test_rows, dtype, flat=True, key=test_key)
    scaled = ("uint8 scaled to [0, 1]" if data.x.dtype == np.uint8
              else f"{data.x.dtype} values as stored (as {np.dtype(dtype)})")
    labels = f"{len(classes)} classes ({_names(classes)})" if classes else "no labels"
    limited = f" (--limit: {len(train_rows)} of {kept})" if len(train_rows) < kept else ""
    source = (f"file {path}: {data.what}; {scaled}; {labels}; {len(train_rows)} train{limited} / "
              f"{len(test_rows)} test rows of {train_x.shape[1]}, {how}")
    return Digits(train_x, y_train, test_x, y_test, source, "file", classes=classes)


def _names(classes) -> str:
    return ", ".join(classes) if len(classes) <= 12 else f"{', '.join(classes[:10])}, ... {classes[-1]}"


def image_layout(sample: tuple, path) -> tuple:
    """(C, H, W) of a stored sample shape and whether its channels come last."""
    if len(sample) == 2:
        return (1,) + tuple(sample), False
    if len(sample) == 3:
        if sample[-1] in _CHANNELS and sample[0] not in _CHANNELS:
            return (sample[2], sample[0], sample[1]), True
        return tuple(sample), False
    raise DataError(path, f"samples of shape {tuple(sample)} are not images: need (N, H, W), (N, C, H, W) or "
                          f"(N, H, W, C) with C 1, 3 or 4")


def as_images(rows: Rows, path) -> np.ndarray:
    """All of ``rows`` as (N, C, H, W) images (read whole)."""
    chw, last = image_layout(rows.sample, path)
    x = np.asarray(rows.unflat())
    if last:
        x = np.moveaxis(x, 3, 1)
    return np.ascontiguousarray(x.reshape((len(x),) + chw))


def images_from_args(args, dtype, *, why: str) -> Images:
    """The user's labelled images (``--data`` ...) as (N, C, H, W) arrays, read whole."""
    d = from_args(args, dtype)
    require_labels(d, args.data, why)
    train, test = as_images(d.train_x, args.data), as_images(d.test_x, args.data)
    return Images(train, d.train_y, test, d.test_y, d.source.replace(f" rows of {d.train_x.shape[1]}",
                                                                     f" images {'x'.join(map(str, train.shape[1:]))}"),
                  "file", classes=d.classes)


def user_images(path, *, x_name=None, image_size=None):
    """A user's images for the sparse autoencoder (:func:`natural_from`), read from ``path``.

    Returns
    -------
    images : numpy.ndarray
        float64 (S, S, K).
    source : str
    """
    path = Path(path)
    data = read_data(path, x_name=x_name, image_size=image_size)
    rows = Rows(data.x, np.arange(int(data.x.shape[0])), np.float64, flat=False, key="")
    images, how = natural_from(as_images(rows, path), path)
    return images, f"file {path}: {data.what}; {how}"


def natural_from(x, what):
    """Images (N, C, H, W) made what the sparse autoencoder samples patches from: grey
    (Rec. 709 luminance for colour), centre-cropped to squares, each whitened and the stack
    scaled like IMAGES.mat. ``what`` names them in errors.

    Returns
    -------
    images : numpy.ndarray
        float64 (S, S, N).
    how : str
        What was done, for the run's source line.
    """
    from aepar.data.sources import _LUMA, TARGET_VARIANCE, _whiten_stack

    x = np.asarray(x, dtype=np.float64)
    colour = x.shape[1] >= 3
    x = np.tensordot(x[:, :3], _LUMA, axes=([1], [0])) if colour else x[:, 0]
    h, w = x.shape[1:]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    x = x[:, top:top + s, left:left + s]
    images = _whiten_stack(np.moveaxis(x, 0, 2), what)
    crop = f", centre-cropped to {s}x{s}" if (h, w) != (s, s) else ""
    grey = ", grey by Rec. 709 luminance" if colour else ""
    return images, (f"{len(x)} images {h}x{w}{grey}{crop}, whitened (f*exp(-(f/f0)^4), f0=0.4N), "
                    f"variance {TARGET_VARIANCE}")


def require_labels(data, path, why: str):
    """UserError (one line) when the user's data came without labels."""
    if data.train_y is None:
        raise UserError(f"{path}: no labels, and {why} needs them: put them in the .npz as y/labels, name the "
                        "HDF5 dataset with --data-y, or put the images in one sub-folder per class")


def check_source(args):
    """One line when two data sources are named at once (every rank, no communication)."""
    if getattr(args, "data", None) is None:
        for option in ("data_x", "data_y", "test_data", "test_fraction", "image_size"):
            if getattr(args, option, None) is not None:
                raise UserError(f"--{option.replace('_', '-')} describes the file of --data PATH: give --data")
        return
    if getattr(args, "dataset_given", False):
        raise UserError("--data and --dataset name two data sources: give one")
    if getattr(args, "images", None):
        raise UserError("--data and --images name two image sources: give one")


def from_args(args, dtype, *, check=True) -> Digits:
    """:func:`load_user` with the options of aepar.cli.add_common (``--data`` ...)."""
    return load_user(args.data, x_name=args.data_x, y_name=args.data_y, test_path=args.test_data,
                     test_fraction=args.test_fraction, seed=args.seed, limit=getattr(args, "limit", None),
                     image_size=args.image_size, dtype=dtype, check=check)

