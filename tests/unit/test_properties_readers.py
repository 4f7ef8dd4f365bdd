"""Property-based tests of the readers: IDX (raw and gzip), CIFAR-10 batches, IMAGES.mat
(v5 and v7.3), and the digit sources over a directory of generated IDX files.

Every generated file, valid or damaged, must give either the right result or a UserError
whose one-line message names the file; nothing else may escape (no ValueError,
MemoryError, struct.error, ...). IDX files are judged by an independent oracle (the
layout read with struct); the other generators make a valid file or one with a single
named fault, so the verdict is known too; only damaged bytes may go either way.
Derandomized, so CI sees the same cases.
"""
import gzip
import math
import pickle
import re
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import aepar  # noqa: F401  (thread settings before numpy work)
from aepar.data import load_digits, read_cifar10_batch, read_idx, read_images_mat
from aepar.errors import UserError


def cases(n):
    """Settings for ``n`` reproducible generated cases (no example database written)."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def read_or_refuse(read, path):
    """``read()``, or None when it raised a UserError naming ``path`` in one line.

    Any other exception propagates and fails the test.
    """
    try:
        result = read()
    except UserError as e:
        msg = str(e)
        assert str(path) in msg, msg
        assert "\n" not in msg, msg
        # the kind of refusal, for --hypothesis-show-statistics: its words, without names or numbers
        words = re.sub(r"'[^']*'|0x[0-9a-f]+|\d+", "_", msg.split(": ", 1)[-1])
        event("refused: " + words.split(" (")[0].split(":")[0][:50])
        return None
    event("accepted")
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("generated files")


# ---- IDX ----------------------------------------------------------------------------------

CODES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def idx_oracle(raw: bytes):
    """What a reader must return for these (uncompressed) bytes, or None if it must refuse:
    the IDX layout read with struct, independently of aepar's reader."""
    if len(raw) < 4 or raw[0] or raw[1] or raw[2] not in CODES or raw[3] == 0:
        return None
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        return None
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(CODES[raw[2]])
    if math.prod(dims) == 0 or len(raw) - header != math.prod(dims) * dtype.itemsize:
        return None
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


@st.composite
def idx_files(draw):
    """(file bytes, the uncompressed bytes or None for a broken gzip stream)."""
    code = draw(st.sampled_from(sorted(CODES)))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    size = math.prod(shape) * np.dtype(CODES[code]).itemsize
    raw = (bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)
           + draw(st.binary(min_size=size, max_size=size)))
    damage = draw(st.sampled_from(["none", "none", "truncate", "append", "header byte", "dimension",
                                   "no values", "overflow", "garbage"]))
    if damage == "truncate":
        raw = raw[:draw(st.integers(0, max(0, len(raw) - 1)))]
    elif damage == "append":
        raw += draw(st.binary(min_size=1, max_size=8))
    elif damage == "header byte":
        i = draw(st.integers(0, min(len(raw), 16) - 1))
        raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1:]
    elif damage == "dimension":  # small, zero, or large enough to overflow any product
        i = draw(st.integers(0, len(shape) - 1))
        d = draw(st.one_of(st.just(0), st.integers(0, 6), st.integers(2 ** 16, 2 ** 32 - 1)))
        raw = raw[:4 + 4 * i] + struct.pack(">I", d) + raw[8 + 4 * i:]
    elif damage == "no values":  # a zero dimension and, rightly, no data
        i = draw(st.integers(0, len(shape) - 1))
        raw = raw[:4 + 4 * i] + bytes(4) + raw[8 + 4 * i:4 + 4 * len(shape)]
    elif damage == "overflow":  # a product of dimensions that wraps to a small number in 64 bits
        dims = draw(st.sampled_from([(2 ** 31, 2 ** 31, 4), (2 ** 16,) * 4, (2 ** 32 - 1,) * 3]))
        raw = bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + draw(st.binary(max_size=16))
    elif damage == "garbage":
        raw = draw(st.binary(max_size=64))
    packing = draw(st.sampled_from(["raw", "raw", "gzip", "gzip truncated", "gzip byte"]))
    if packing == "raw":
        return raw, raw
    data = gzip.compress(raw, mtime=0)
    if packing == "gzip truncated":
        data = data[:draw(st.integers(2, len(data) - 1))]
    elif packing == "gzip byte":
        i = draw(st.integers(2, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    try:
        return data, gzip.decompress(data)
    except (EOFError, OSError, zlib.error):
        return data, None


@cases(500)
@given(idx_files())
def test_idx_reader_agrees_with_oracle(workdir, generated):
    data, raw = generated
    path = workdir / "images-idx.ubyte"
    path.write_bytes(data)
    got = read_or_refuse(lambda: read_idx(path), path)
    expect = None if raw is None else idx_oracle(raw)
    if expect is None:
        assert got is None, "a malformed IDX file was accepted"
    else:
        assert got is not None, "a valid IDX file was refused"
        assert got.shape == expect.shape and got.dtype == expect.dtype.newbyteorder("=")
        assert got.astype(expect.dtype).tobytes() == expect.tobytes()


DIGIT_FAULTS = ["27 columns", "fewer labels", "more labels", "label 10", "label -1", "float labels",
                "2-D labels", "pixels above 1", "NaN pixels"]


@st.composite
def digit_dirs(draw):
    """(the four IDX arrays of a digits directory, fault): valid, or with one named fault."""
    fault = draw(st.sampled_from(["none"] * 8 + DIGIT_FAULTS))
    n = {"train": draw(st.integers(1, 4)), "t10k": draw(st.integers(1, 4))}
    part = draw(st.sampled_from(["train", "t10k"]))  # the part the fault is in
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    pixel_type = draw(st.sampled_from([np.uint8, np.uint8, np.float32, np.float64]))
    label_type = draw(st.sampled_from([np.uint8, np.int8, np.int16, np.int32]))
    arrays = {}
    for p in ("train", "t10k"):
        x = rng.integers(0, 256, size=(n[p], 28, 28)).astype(np.uint8)
        x = x if pixel_type == np.uint8 else (x / 255.0).astype(pixel_type)
        y = rng.integers(0, 10, size=n[p]).astype(label_type)
        if p == part:
            x = {"27 columns": x[:, :, :27], "pixels above 1": x.astype(np.float32) + 1.5,
                 "NaN pixels": np.where(x == x.flat[0], np.nan, x).astype(np.float32)}.get(fault, x)
            y = {"fewer labels": y[:-1], "more labels": np.append(y, y[:1]),
                 "label 10": np.append(y[:-1], label_type(10)), "label -1": np.append(y[:-1], -1).astype(np.int8),
                 "float labels": y.astype(np.float32), "2-D labels": y[:, None]}.get(fault, y)
        arrays[p] = (x, y)
    return arrays, fault


@cases(150)
@given(digit_dirs())
def test_digits_directory_loads_or_names_the_file(workdir, generated):
    from aepar.data import write_idx

    arrays, fault = generated
    directory = workdir / "digits"
    directory.mkdir(exist_ok=True)
    for p, (x, y) in arrays.items():
        write_idx(directory / f"{p}-images-idx3-ubyte", x)
        write_idx(directory / f"{p}-labels-idx1-ubyte", y)
    got = read_or_refuse(lambda: load_digits("idx", data_dir=directory), directory)
    if fault != "none":
        assert got is None, f"a digits directory with {fault} was accepted"
        return
    assert got is not None, "a valid digits directory was refused"
    for x, y, (want_x, want_y) in ((got.train_x, got.train_y, arrays["train"]),
                                   (got.test_x, got.test_y, arrays["t10k"])):
        want_x = want_x / 255.0 if want_x.dtype == np.uint8 else want_x
        np.testing.assert_allclose(x, want_x.reshape(len(want_x), -1))
        np.testing.assert_array_equal(y, want_y)


# ---- CIFAR-10 ---------------------------------------------------------------------------------

CIFAR_FAULTS = ["no images", "width", "float data", "1-D data", "data list", "data none", "fewer labels",
                "more labels", "label 10", "label -1", "float labels", "bool labels", "nested labels",
                "text labels", "huge label", "no data key", "no labels key", "not a dict"]
DAMAGE = ["truncate", "byte", "garbage"]  # to the bytes: the reader may accept what survives


@st.composite
def cifar_batches(draw):
    """(pickle bytes, fault): a valid batch, one with one named fault, or damaged bytes."""
    fault = draw(st.sampled_from(["none"] * 8 + CIFAR_FAULTS + DAMAGE))
    n = 0 if fault == "no images" else draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    values = rng.integers(0, 10, size=n).tolist()
    labels = draw(st.sampled_from([list, tuple, lambda v: np.array(v, np.int64), lambda v: np.array(v, np.uint8),
                                   lambda v: [np.int32(x) for x in v]]))(values)
    data = {"width": data[:, :3071], "float data": data.astype(np.float32), "1-D data": data.ravel(),
            "data list": data.tolist(), "data none": None}.get(fault, data)
    labels = {"fewer labels": values[:-1], "more labels": values + [0], "label 10": values[:-1] + [10],
              "label -1": [-1] + values[1:], "float labels": [float(v) for v in values],
              "bool labels": [v % 2 == 0 for v in values], "nested labels": [[v] for v in values],
              "text labels": "".join(map(str, values)), "huge label": values[:-1] + [2 ** 70]}.get(fault, labels)
    key = draw(st.sampled_from([str.encode, str]))  # Python 2's pickles: bytes keys
    batch = {key("data"): data, key("labels"): labels, key("batch_label"): key("synthetic")}
    if fault in ("no data key", "no labels key"):
        del batch[key(fault.split()[1])]
    obj = list(batch.items()) if fault == "not a dict" else batch
    blob = pickle.dumps(obj, protocol=draw(st.integers(2, 5)))
    if fault == "truncate":
        blob = blob[:draw(st.integers(0, len(blob) - 1))]
    elif fault == "byte":
        i = draw(st.integers(0, len(blob) - 1))
        blob = blob[:i] + bytes([blob[i] ^ draw(st.integers(1, 255))]) + blob[i + 1:]
    elif fault == "garbage":
        blob = draw(st.binary(max_size=200))
    return blob, fault, data, values


@cases(400)
@given(cifar_batches())
def test_cifar_reader(workdir, generated):
    blob, fault, data, values = generated
    path = workdir / "data_batch_1"
    path.write_bytes(blob)
    got = read_or_refuse(lambda: read_cifar10_batch(path), path)
    if fault == "none":
        assert got is not None, "a valid CIFAR batch was refused"
        np.testing.assert_array_equal(got[0], data.reshape(-1, 3, 32, 32))
        np.testing.assert_array_equal(got[1], values)
        assert got[1].dtype == np.int64
    elif fault in CIFAR_FAULTS:
        assert got is None, f"a CIFAR batch with {fault} was accepted"
    elif got is not None:  # damage that still unpickles to a batch: a checked batch
        images, labels = got
        assert images.shape[1:] == (3, 32, 32) and images.dtype == np.uint8 and len(images) > 0
        assert labels.shape == (len(images),) and labels.dtype == np.int64
        assert labels.min() >= 0 and labels.max() <= 9


# ---- IMAGES.mat ---------------------------------------------------------------------------------

_V73_HEADER = (b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 .".ljust(116)
               + bytes(8) + b"\x00\x02IM")


MAT_FAULTS = ["other name", "1-D", "2-D", "4-D", "empty", "complex", "text", "NaN", "Inf", "struct", "unwritten"]


@st.composite
def mat_files(draw):
    """(version, name, array, fault): a valid IMAGES.mat, one named fault, or damaged bytes."""
    version = draw(st.sampled_from(["v5", "v7.3"]))
    # bytes are damaged only in v5 files: libhdf5 is C, and corrupt metadata can crash it
    # rather than raise, so v7.3 files are only truncated (which HDF5 detects on opening)
    fault = draw(st.sampled_from(["none"] * 6 + MAT_FAULTS + (["truncate", "byte"] if version == "v5"
                                                              else ["truncate"])))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=3, max_size=3)))
    shape = {"1-D": shape[:1], "2-D": shape[:2], "4-D": shape + (2,), "empty": shape[:2] + (0,)}.get(fault, shape)
    dtype = {"complex": np.complex128, "text": "U3"}.get(
        fault, draw(st.sampled_from([np.float64, np.float32, np.int16, np.uint8, bool])))
    array = (np.arange(math.prod(shape)).reshape(shape) % 7).astype(dtype)
    if fault in ("NaN", "Inf"):
        array = array.astype(np.float64)
        array.flat[draw(st.integers(0, array.size - 1))] = np.nan if fault == "NaN" else -np.inf
    if version == "v7.3" and array.dtype == bool:  # h5py writes numpy bool as an enum, not MATLAB's uint8
        array = array.astype(np.uint8)
    return version, "other" if fault == "other name" else "IMAGES", array, fault, draw(st.floats(0, 1))


def _write_mat(path, version, name, array, fault):
    import h5py
    import scipy.io

    if version == "v5":
        scipy.io.savemat(path, {name: {"x": array} if fault == "struct" else array})
        return
    with h5py.File(path, "w", userblock_size=512) as f:
        if fault == "struct":
            f.create_group(name).create_dataset("x", data=array)
        elif fault == "unwritten":
            f.create_dataset(name, shape=array.T.shape, dtype=array.dtype)
        elif fault == "text":
            f.create_dataset(name, data=array.astype("S3").T)
        else:
            f.create_dataset(name, data=array.T)  # MATLAB's column-major order
    with open(path, "r+b") as f:
        f.write(_V73_HEADER)


@cases(300)
@given(mat_files())
def test_images_mat_reader(workdir, generated):
    version, name, array, fault, where = generated
    path = workdir / "IMAGES.mat"
    path.unlink(missing_ok=True)
    _write_mat(path, version, name, array, fault)
    if fault == "truncate":
        path.write_bytes(path.read_bytes()[:int(where * path.stat().st_size)])
    elif fault == "byte":
        blob = bytearray(path.read_bytes())
        blob[int(where * (len(blob) - 1))] ^= 0x5A
        path.write_bytes(bytes(blob))
    got = read_or_refuse(lambda: read_images_mat(path), path)
    if got is not None:
        assert got.dtype == np.float64 and got.ndim == 3 and got.size and np.isfinite(got).all()
    valid = fault == "none" or (fault == "unwritten" and version == "v5")  # savemat writes the data
    if valid:
        assert got is not None, f"a valid IMAGES.mat was refused ({version}, {array.dtype} {array.shape})"
        np.testing.assert_array_equal(got, array.astype(np.float64))
    elif fault in MAT_FAULTS:
        assert got is None, f"an IMAGES.mat with {fault} was accepted ({version})"
