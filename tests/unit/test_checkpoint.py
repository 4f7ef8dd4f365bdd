"""aepar.checkpoint: round trip, refusals, corrupt files, atomic writes."""
import json
import os

import h5py
import numpy as np
import pytest

import aepar  # noqa: F401
from aepar import checkpoint
from aepar.checkpoint import Checkpoint, load, restore_rng, save
from aepar.errors import CheckpointError, UserError
from tests.conftest import HAVE_GPU


@pytest.fixture
def params(rng):
    return {"W1": rng.standard_normal((25, 64)), "b1": np.zeros(25),
            "layer2/W": rng.standard_normal((3, 4)).astype(np.float32), "layer2/b": np.arange(3.0)}


def _one_line(excinfo, path):
    msg = str(excinfo.value)
    assert str(path) in msg and "\n" not in msg, msg
    return msg


def _listing(directory):
    return sorted(p.name for p in directory.iterdir())


def test_round_trip(tmp_path, params, rng):
    gen = np.random.default_rng(42)
    gen.random(10)  # mid-stream
    opt = {"velocity/W1": rng.standard_normal((25, 64)), "step": 17, "lr": np.float32(0.5)}
    config = {"layers": [784, 1000, 500], "lr": np.float64(0.1), "beta": 3, "name": "x",
              "nested": {"rho": 0.01, "flags": [True, None]}, "mask": np.array([1, 0, 1], np.int8)}
    path = save(tmp_path / "run" / "ck.h5", scheme="sparse", params=params, opt_state=opt,
                rng_state=gen.bit_generator.state, epoch=7, config=config)
    assert path == tmp_path / "run" / "ck.h5" and path.is_file()
    c = load(path, scheme="sparse", shapes={k: v.shape for k, v in params.items()})
    assert isinstance(c, Checkpoint) and c.scheme == "sparse" and c.epoch == 7 and c.path == path
    assert sorted(c.params) == sorted(params)
    for k, v in params.items():
        assert c.params[k].dtype == v.dtype
        np.testing.assert_array_equal(c.params[k], v)
    np.testing.assert_array_equal(c.opt_state["velocity/W1"], opt["velocity/W1"])
    assert int(c.opt_state["step"]) == 17 and c.opt_state["step"].shape == ()
    assert c.opt_state["lr"].dtype == np.float32
    assert c.config["layers"] == [784, 1000, 500] and c.config["lr"] == 0.1
    assert c.config["nested"] == {"rho": 0.01, "flags": [True, None]}
    np.testing.assert_array_equal(c.config["mask"], [1, 0, 1])
    assert c.config["mask"].dtype == np.int8
    # the restored generator continues the saved stream
    expect = gen.random(5)
    np.testing.assert_array_equal(c.rng().random(5), expect)
    np.testing.assert_array_equal(restore_rng(c.rng_state).random(5), expect)
    # stored as JSON attributes, readable by anything that reads HDF5
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs["rng_state"])["bit_generator"] == "PCG64"
        assert json.loads(f.attrs["config"])["beta"] == 3


def test_generator_and_mt19937_state(tmp_path, params):
    gen = np.random.Generator(np.random.MT19937(3))
    gen.integers(0, 100, size=7)
    save(tmp_path / "a.h5", scheme="s", params=params, rng_state=gen)  # a Generator is accepted
    c = load(tmp_path / "a.h5")
    assert isinstance(c.rng().bit_generator, np.random.MT19937)
    np.testing.assert_array_equal(c.rng().integers(0, 1 << 30, size=20), gen.integers(0, 1 << 30, size=20))


def test_defaults_and_no_state(tmp_path, params):
    save(tmp_path / "a.h5", scheme="greedy", params=params)
    c = load(tmp_path / "a.h5")
    assert c.opt_state is None and c.rng_state is None and c.epoch == 0 and c.config == {}
    with pytest.raises(CheckpointError, match="no random-generator state"):
        c.rng()


def test_overwrite_replaces(tmp_path, params):
    path = tmp_path / "ck.h5"
    save(path, scheme="s", params=params, epoch=1)
    save(path, scheme="s", params={"W1": np.ones((2, 2))}, epoch=2)
    c = load(path)
    assert c.epoch == 2 and list(c.params) == ["W1"]
    assert _listing(tmp_path) == ["ck.h5"]


def test_refuses_other_scheme(tmp_path, params):
    path = save(tmp_path / "ck.h5", scheme="greedy", params=params)
    with pytest.raises(CheckpointError) as e:
        load(path, scheme="sync")
    msg = _one_line(e, path)
    assert "'greedy'" in msg and "'sync'" in msg
    assert load(path, scheme=("sync", "greedy")).scheme == "greedy"
    with pytest.raises(CheckpointError) as e:
        load(path, scheme=("sync", "finetune"))
    assert "not 'sync' or 'finetune'" in _one_line(e, path)


def test_refuses_other_shape_and_missing_parameter(tmp_path, params):
    path = save(tmp_path / "ck.h5", scheme="s", params=params)
    shapes = {k: v.shape for k, v in params.items()}
    with pytest.raises(CheckpointError, match="shape") as e:
        load(path, shapes=dict(shapes, W1=(64, 25)))
    msg = _one_line(e, path)
    assert "'W1'" in msg and "(25, 64)" in msg and "(64, 25)" in msg
    with pytest.raises(CheckpointError, match="missing") as e:
        load(path, shapes=dict(shapes, W2=(64, 25)))
    assert "'W2'" in _one_line(e, path)
    assert issubclass(CheckpointError, UserError)  # a CLI reports it as one line, exit 2


@pytest.mark.parametrize("kind", ["missing", "garbage", "truncated", "empty", "foreign_hdf5"])
def test_refuses_corrupt_or_foreign_file(tmp_path, params, kind):
    path = tmp_path / "ck.h5"
    if kind == "garbage":
        path.write_bytes(os.urandom(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        save(path, scheme="s", params=params)
        path.write_bytes(path.read_bytes()[:1500])
    elif kind == "foreign_hdf5":
        with h5py.File(path, "w") as f:
            f["W1"] = np.ones(3)
    with pytest.raises(CheckpointError) as e:
        load(path)
    _one_line(e, path)


def _edit(path, change):
    with h5py.File(path, "r+") as f:
        change(f)


def _replace(group, name, data=None, **kwargs):
    del group[name]
    group.create_dataset(name, data=data, **kwargs)


@pytest.mark.parametrize("case,match", [
    ("nan", "NaN or infinite"), ("inf", "NaN or infinite"), ("int", "int64"), ("bool", "bool"),
    ("complex", "complex"), ("text", "need floating point"), ("never_written", "never written"),
    ("opt_nan", "optimiser state 'm' holds NaN"), ("opt_text", "optimiser state 'm'"),
])
def test_refuses_bad_parameters(tmp_path, params, case, match):
    path = save(tmp_path / "ck.h5", scheme="s", params=params, opt_state={"m": np.ones(3), "step": 4})
    edits = {
        "nan": lambda f: f["params/W1"].__setitem__((0, 0), np.nan),
        "inf": lambda f: f["params/layer2/W"].__setitem__((1, 1), -np.inf),
        "int": lambda f: _replace(f["params"], "b1", np.zeros(25, np.int64)),
        "bool": lambda f: _replace(f["params"], "b1", np.zeros(25, bool)),
        "complex": lambda f: _replace(f["params"], "b1", np.zeros(25, np.complex128)),
        "text": lambda f: _replace(f["params"], "b1", "not numbers"),
        "never_written": lambda f: _replace(f["params"], "W1", shape=(10 ** 6, 10 ** 4), dtype="f8"),
        "opt_nan": lambda f: f["opt_state/m"].__setitem__(1, np.nan),
        "opt_text": lambda f: _replace(f["opt_state"], "m", "abc"),
    }
    _edit(path, edits[case])
    with pytest.raises(CheckpointError, match=match) as e:
        load(path)
    _one_line(e, path)


def test_integer_optimiser_state_is_kept(tmp_path, params):
    path = save(tmp_path / "ck.h5", scheme="s", params=params, opt_state={"step": 4, "flags": np.array([True])})
    c = load(path)
    assert c.opt_state["step"] == 4 and c.opt_state["flags"].dtype == bool


@pytest.mark.parametrize("case,match", [
    ("no_version", "'version' missing"), ("version_text", "'version'"), ("version_zero", "version 0"),
    ("version_new", "newer"), ("epoch_text", "'epoch'"), ("epoch_negative", "epoch -3"),
    ("epoch_array", "'epoch'"), ("scheme_number", "'scheme'"), ("scheme_empty", "empty scheme"),
    ("config_garbage", "'config'"), ("config_list", "'config' is not a JSON object"),
    ("config_dtype", "'config'"), ("rng_list", "'rng_state' is not a JSON object"),
    ("format_array", "not an aepar checkpoint"), ("params_dataset", "not an aepar checkpoint"),
    ("opt_dataset", "'opt_state' is not a group"),
])
def test_refuses_corrupt_attributes(tmp_path, params, case, match):
    path = save(tmp_path / "ck.h5", scheme="s", params=params, epoch=2)

    def setattr_(name, value):
        return lambda f: f.attrs.__setitem__(name, value)

    edits = {
        "no_version": lambda f: f.attrs.__delitem__("version"),
        "version_text": setattr_("version", "one"),
        "version_zero": setattr_("version", 0),
        "version_new": setattr_("version", 99),
        "epoch_text": setattr_("epoch", "2"),
        "epoch_negative": setattr_("epoch", -3),
        "epoch_array": setattr_("epoch", np.array([1, 2])),
        "scheme_number": setattr_("scheme", 5),
        "scheme_empty": setattr_("scheme", ""),
        "config_garbage": setattr_("config", "{not json"),
        "config_list": setattr_("config", "[1, 2]"),
        "config_dtype": setattr_("config", json.dumps({"a": {"__ndarray__": [1], "dtype": "V4000000000"}})),
        "rng_list": setattr_("rng_state", "[1]"),
        "format_array": setattr_("format", np.array([1, 2])),
        "params_dataset": lambda f: (f.__delitem__("params"), f.create_dataset("params", data=np.ones(2))),
        "opt_dataset": lambda f: f.create_dataset("opt_state", data=np.ones(2)),
    }
    _edit(path, edits[case])
    with pytest.raises(CheckpointError, match=match) as e:
        load(path)
    _one_line(e, path)


class _FakeDeviceArray:
    """Stands in for a CuPy array: np.asarray on it fails, .get() gives the host copy."""

    def __init__(self, a):
        self._a = a

    def get(self):
        return self._a.copy()

    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion to a NumPy array is not allowed")


def test_device_arrays_are_copied_to_host(tmp_path, rng):
    w = rng.standard_normal((4, 5))
    save(tmp_path / "d.h5", scheme="s", params={"W": _FakeDeviceArray(w)},
         opt_state={"m": _FakeDeviceArray(w * 2)})
    c = load(tmp_path / "d.h5")
    np.testing.assert_array_equal(c.params["W"], w)
    np.testing.assert_array_equal(c.opt_state["m"], w * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")
def test_cupy_arrays(tmp_path, rng):
    import cupy

    w = rng.standard_normal((4, 5))
    save(tmp_path / "g.h5", scheme="s", params={"W": cupy.asarray(w)})
    np.testing.assert_array_equal(load(tmp_path / "g.h5").params["W"], w)


@pytest.mark.parametrize("bad", [
    dict(params={"": np.ones(2)}), dict(params={"/W": np.ones(2)}), dict(params={"W": np.array(["a"])}),
    dict(params=[np.ones(2)]), dict(params={"W": np.ones(2)}, config={"f": object()}),
    dict(params={"W": np.ones(2)}, scheme=""), dict(params={"W": np.ones(2)}, epoch=-1),
])
def test_bad_input_writes_nothing(tmp_path, bad):
    kwargs = dict(scheme="s", **bad) if "scheme" not in bad else bad
    with pytest.raises(CheckpointError):
        save(tmp_path / "ck.h5", **kwargs)
    assert _listing(tmp_path) == []


def _fail_after(n_ok, monkeypatch, target=h5py.Group, name="create_dataset"):
    """Make the n_ok+1-th call of target.name raise, as a full disk would mid-write."""
    real = getattr(target, name)
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(args[0] if args else None)
        if len(calls) > n_ok:
            raise OSError("No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(target, name, failing)
    return calls


def test_failure_mid_write_leaves_old_checkpoint(tmp_path, params, monkeypatch):
    path = save(tmp_path / "ck.h5", scheme="s", params=params, epoch=1)
    before = path.read_bytes()
    calls = _fail_after(2, monkeypatch)
    with pytest.raises(OSError, match="No space"):
        save(path, scheme="s", params={k: v * 2 for k, v in params.items()}, epoch=2)
    assert len(calls) == 3  # it did fail part-way through the parameters
    assert _listing(tmp_path) == ["ck.h5"], "a temporary or partial file was left behind"
    assert path.read_bytes() == before
    monkeypatch.undo()
    c = load(path)
    assert c.epoch == 1
    np.testing.assert_array_equal(c.params["W1"], params["W1"])


def test_failure_mid_write_leaves_no_file(tmp_path, params, monkeypatch):
    _fail_after(1, monkeypatch)
    with pytest.raises(OSError):
        save(tmp_path / "new.h5", scheme="s", params=params)
    assert _listing(tmp_path) == []


def test_failure_at_rename_leaves_no_temporary(tmp_path, params, monkeypatch):
    path = save(tmp_path / "ck.h5", scheme="s", params=params, epoch=1)

    def no_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(checkpoint.os, "replace", no_replace)
    with pytest.raises(OSError, match="rename failed"):
        save(path, scheme="s", params=params, epoch=2)
    monkeypatch.undo()
    assert _listing(tmp_path) == ["ck.h5"]
    assert load(path).epoch == 1
