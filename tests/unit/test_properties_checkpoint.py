"""Property-based tests of checkpoint loading.

Generated checkpoints are valid, or carry one named fault (NaN/Inf or integer, bool,
complex, text parameters; a parameter never written; corrupt attributes; another scheme;
a foreign HDF5 file), or damaged bytes (truncated file, flipped bits in a parameter's
stored values, garbage). Loading must give back what was saved or raise a CheckpointError
whose one-line message names the file; nothing else may escape.

Bytes are flipped only inside a parameter's stored values, never in HDF5's own metadata:
libhdf5 is C, and metadata it was never meant to see can crash it rather than raise.
"""
import json

import h5py
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import aepar  # noqa: F401  (thread settings before numpy work)
from aepar import checkpoint
from tests.unit.test_properties_readers import cases, read_or_refuse, workdir  # noqa: F401 (a fixture)

SCHEMES = ["sparse", "greedy", "sync", "finetune", "eager"]


def _first_param(f) -> str:
    names = []
    f["params"].visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names[0]


def _retype(dtype):
    def fault(f, value):
        name = _first_param(f)
        shape = f["params"][name].shape
        del f["params"][name]
        f["params"].create_dataset(name, data=np.zeros(shape, dtype))
    return fault


def _set_first(value):
    def fault(f, _):
        f["params"][_first_param(f)][()] = value
    return fault


def _unwritten(f, rows):
    name = _first_param(f)
    del f["params"][name]
    f["params"].create_dataset(name, shape=(rows, 1000), dtype="f8")  # the fill value stands in


def _replace_group(name):
    def fault(f, _):
        if name in f:
            del f[name]
        f.create_dataset(name, data=[1.0])
    return fault


def _set_attr(name):
    return lambda f, value: f.attrs.__setitem__(name, value)


def _del_attr(name):
    return lambda f, _: f.attrs.__delitem__(name)


_NOT_INTEGERS = st.one_of(st.text(max_size=3), st.floats(0.5, 2.0), st.just(np.array([1, 2])),
                          st.just(b"\xff\xfe"))
_BAD_JSON = st.sampled_from(["{not json", "[1, 2]", "3", "null", '"text"',
                             '{"a": {"__ndarray__": [1], "dtype": "V4000000000"}}',
                             '{"a": {"__ndarray__": [1], "dtype": "no such dtype"}}',
                             '{"a": {"__ndarray__": [[1], [1, 2]], "dtype": "<f8"}}'])
# fault -> (how to apply it to a saved file, values to apply it with: all of them wrong)
FAULTS = {
    "NaN parameter": (_set_first(np.nan), st.none()),
    "Inf parameter": (_set_first(-np.inf), st.none()),
    "integer parameter": (_retype(np.int64), st.none()),
    "bool parameter": (_retype(bool), st.none()),
    "complex parameter": (_retype(np.complex64), st.none()),
    "text parameter": (_retype("S4"), st.none()),
    "unwritten parameter": (_unwritten, st.sampled_from([10 ** 6, 2 ** 40])),
    "NaN optimiser state": (lambda f, _: f.create_dataset("opt_state/nan", data=[1.0, np.nan]), st.none()),
    "no format mark": (_del_attr("format"), st.none()),
    "other format mark": (_set_attr("format"), st.one_of(_NOT_INTEGERS, st.integers())),
    "no version": (_del_attr("version"), st.none()),
    "version": (_set_attr("version"), st.one_of(_NOT_INTEGERS, st.integers(-5, 0), st.integers(2, 10 ** 6))),
    "epoch": (_set_attr("epoch"), st.one_of(_NOT_INTEGERS, st.integers(-10 ** 6, -1))),
    "scheme attribute": (_set_attr("scheme"), st.one_of(_NOT_INTEGERS, st.integers(), st.just(""))),
    "config": (_set_attr("config"), _BAD_JSON),
    "rng_state": (_set_attr("rng_state"), _BAD_JSON.filter(lambda t: t != "null")),
    "params not a group": (_replace_group("params"), st.none()),
    "opt_state not a group": (_replace_group("opt_state"), st.none()),
    "other scheme": (None, st.none()),  # a sound file, loaded for another scheme
    "foreign HDF5": (None, st.none()),  # an HDF5 file aepar did not write
}
DAMAGE = ["truncate", "flipped values", "garbage"]


@st.composite
def checkpoints(draw):
    """(save() arguments, fault, the value the fault needs)."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    names = draw(st.lists(st.sampled_from(["W1", "b1", "W2", "b2", "layer1/W", "layer1/bh"]),
                          min_size=1, max_size=4, unique=True))
    params = {name: rng.standard_normal(tuple(draw(st.lists(st.integers(1, 5), max_size=2))))
              .astype(draw(st.sampled_from([np.float64, np.float32]))) for name in names}
    config = draw(st.dictionaries(st.sampled_from(["lr", "layers", "name"]),
                                  st.one_of(st.floats(allow_nan=False), st.integers(-10, 10), st.text(max_size=5),
                                            st.lists(st.integers(0, 9), max_size=3)), max_size=3))
    saved = dict(scheme=draw(st.sampled_from(SCHEMES)), params=params,
                 opt_state=draw(st.sampled_from([None, {"step": 3, "m": np.ones(2)}])),
                 rng_state=draw(st.sampled_from([None, 5])), epoch=draw(st.integers(0, 1000)), config=config)
    if saved["rng_state"] is not None:
        saved["rng_state"] = np.random.default_rng(saved["rng_state"])
    fault = draw(st.sampled_from(["none"] * 8 + sorted(FAULTS) + DAMAGE))
    if fault in FAULTS:
        value = draw(FAULTS[fault][1])
    elif fault == "garbage":
        value = draw(st.binary(max_size=300))
    else:
        value = draw(st.floats(0, 1))
    return saved, fault, value


def _flip_values(path, where: float):
    """Flip bits of a few bytes inside the first parameter's stored values."""
    with h5py.File(path, "r") as f:
        dset = f["params"][_first_param(f)]
        offset, size = dset.id.get_offset(), dset.id.get_storage_size()
    if offset is None or not size:
        return
    blob = bytearray(path.read_bytes())
    for k in range(3):
        blob[offset + int(where * (k + 1) / 4 * size)] ^= 0xA5
    path.write_bytes(bytes(blob))


@cases(400)
@given(checkpoints())
def test_checkpoint_load(workdir, generated):  # noqa: F811 (the fixture)
    saved, fault, value = generated
    path = workdir / "weights.h5"
    if fault == "foreign HDF5":
        with h5py.File(path, "w") as f:
            f["params/W1"] = np.ones(3)
            f.attrs["scheme"] = saved["scheme"]
    else:
        checkpoint.save(path, **saved)
    if FAULTS.get(fault, (None,))[0] is not None:
        with h5py.File(path, "r+") as f:
            FAULTS[fault][0](f, value)
    elif fault == "truncate":
        path.write_bytes(path.read_bytes()[:int(value * path.stat().st_size)])
    elif fault == "flipped values":
        _flip_values(path, value)
    elif fault == "garbage":
        path.write_bytes(value)
    asked = saved["scheme"] + ("-other" if fault == "other scheme" else "")
    got = read_or_refuse(lambda: checkpoint.load(path, scheme=asked), path)
    if fault in FAULTS:
        assert got is None, f"a checkpoint with {fault} ({value!r:.60}) was loaded"
    elif fault == "none":
        assert got is not None, "a valid checkpoint was refused"
        assert got.scheme == saved["scheme"] and got.epoch == saved["epoch"]
        assert json.dumps(got.config) == json.dumps(saved["config"])
        assert sorted(got.params) == sorted(saved["params"])
        for name, array in saved["params"].items():
            assert got.params[name].dtype == array.dtype
            np.testing.assert_array_equal(got.params[name], array)
        if saved["rng_state"] is not None:
            assert got.rng().random() == saved["rng_state"].random()
    if got is not None:  # what survived damage was checked like any checkpoint
        for array in got.params.values():
            assert array.dtype.kind == "f" and np.isfinite(array).all()
