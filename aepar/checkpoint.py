"""Checkpoints: one HDF5 file per snapshot, written atomically.

Layout::

    /                attrs: format="aepar-checkpoint", version, scheme, epoch,
                            config (JSON), rng_state (JSON, optional)
    /params/<name>   one dataset per parameter (a name with "/" nests groups)
    /opt_state/<name>  optimiser state (momentum, Adam moments, step), optional

A checkpoint is written to a temporary file in the target directory, flushed and
fsync'ed, then renamed over the target with os.replace: readers (and restarts after a
crash) see the old checkpoint or the new one, never a partial file. Loading checks that
the file belongs to the scheme and the parameter shapes of the model that asks for it.

Only one rank should save (the root, after the collectives that make parameters equal).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from aepar.errors import CheckpointError, one_line
from aepar.models.stacked import StackedAutoencoder

__all__ = ["save", "load", "Checkpoint", "restore_rng", "FORMAT", "VERSION", "layers_to_params",
           "layers_from_params", "finetuned_from_params", "layer_state", "restore_layers"]

FORMAT = "aepar-checkpoint"
VERSION = 1
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_MAX_JSON_ITEMSIZE = 4096  # bytes per element of an array stored in a JSON attribute


@dataclass
class Checkpoint:
    """What :func:`load` returns.

    Attributes
    ----------
    scheme : str
        The scheme that wrote it (e.g. ``"sparse"``, ``"greedy"``, ``"eager"``).
    params, opt_state : dict of str -> numpy.ndarray
        Host arrays; ``opt_state`` is None when none was saved. 0-d entries come back as
        0-d arrays.
    rng_state : dict or None
        As saved (a numpy ``bit_generator.state`` dict for a Generator); see
        :func:`restore_rng`.
    epoch : int
    config : dict
    path : Path
    """

    scheme: str
    params: dict
    opt_state: dict | None = None
    rng_state: dict | None = None
    epoch: int = 0
    config: dict = field(default_factory=dict)
    path: Path | None = None

    def rng(self) -> np.random.Generator:
        """A Generator that continues the stream saved in ``rng_state``."""
        if self.rng_state is None:
            raise CheckpointError(f"{self.path}: holds no random-generator state")
        return restore_rng(self.rng_state, self.path)


def restore_rng(state: dict, path=None) -> np.random.Generator:
    """Rebuild a numpy Generator from ``Generator.bit_generator.state``."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise CheckpointError(f"{path}: rng_state is not a numpy bit-generator state "
                              f"(bit_generator={name!r})")
    bit_generator = getattr(np.random, name)()
    try:
        bit_generator.state = state
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: rng_state does not restore a {name} ({e})") from None
    return np.random.Generator(bit_generator)


# ---- JSON for attributes: numpy arrays and scalars survive the round trip ----------------

def _json_default(obj):
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _json_hook(d):
    if "__ndarray__" in d and "dtype" in d and len(d) == 2:
        dtype = np.dtype(d["dtype"])
        if dtype.itemsize > _MAX_JSON_ITEMSIZE:  # a corrupt dtype such as 'V4000000000'
            raise ValueError(f"array dtype {dtype} in JSON is implausibly large")
        return np.array(d["__ndarray__"], dtype=dtype)
    return d


def _to_json(obj, what: str, path: Path) -> str:
    try:
        return json.dumps(obj, default=_json_default)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {what} cannot be stored as JSON ({e})") from None


def _host(value, what: str, path: Path) -> np.ndarray:
    """A host numpy copy of a numpy/CuPy array or scalar."""
    if hasattr(value, "get") and not isinstance(value, (np.ndarray, dict)):
        value = value.get()  # CuPy -> numpy
    a = np.asarray(value)
    if a.dtype.kind not in "biufc":
        raise CheckpointError(f"{path}: {what} has dtype {a.dtype}, not numbers")
    return a


def _host_dict(arrays, what: str, path: Path) -> dict:
    if not isinstance(arrays, dict):
        raise CheckpointError(f"{path}: {what} must be a dict of name -> array, got {type(arrays).__name__}")
    out = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name.strip("/") or name != name.strip("/") or "//" in name:
            raise CheckpointError(f"{path}: {what} name {name!r} must be a non-empty path like 'W1' or 'layer1/W'")
        out[name] = _host(value, f"{what} {name!r}", path)
    return out


def _write_group(f, group_name: str, arrays: dict):
    group = f.create_group(group_name)
    for name, array in arrays.items():
        group.create_dataset(name, data=array)


def _file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save(path, *, scheme: str, params: dict, opt_state: dict | None = None,
         rng_state=None, epoch: int = 0, config: dict | None = None) -> Path:
    """Write a checkpoint atomically.

    Parameters
    ----------
    path : str or Path
        Target file (e.g. ``run/checkpoint.h5``); parent directories are created.
    scheme : str
        Name of the scheme writing it; :func:`load` can insist on it.
    params : dict of str -> array
        Model parameters; numpy or CuPy arrays (copied to the host).
    opt_state : dict of str -> array, optional
        Optimiser state (momentum buffers, Adam moments, step count).
    rng_state : dict or numpy.random.Generator, optional
        ``Generator.bit_generator.state`` (a Generator is converted), stored as JSON.
    epoch : int
        Epochs completed.
    config : dict, optional
        Run configuration, stored as JSON (numpy values and paths allowed).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    CheckpointError
        Unstorable input (bad names, non-numeric arrays, config not JSON-able). Any
        failure while writing leaves no temporary file and the old checkpoint untouched.
    """
    import h5py

    path = Path(path)
    if not isinstance(scheme, str) or not scheme:
        raise CheckpointError(f"{path}: scheme must be a non-empty string, got {scheme!r}")
    if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
        raise CheckpointError(f"{path}: epoch must be a non-negative integer, got {epoch!r}")
    host_params = _host_dict(params, "parameter", path)
    host_opt = None if opt_state is None else _host_dict(opt_state, "optimiser state", path)
    if isinstance(rng_state, np.random.Generator):
        rng_state = rng_state.bit_generator.state
    rng_json = None if rng_state is None else _to_json(rng_state, "rng_state", path)
    config_json = _to_json(config or {}, "config", path)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        # libver v110+ stores attributes of any size (a large config or MT19937 state)
        with h5py.File(tmp, "w", libver=("v110", "latest")) as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            f.attrs["scheme"] = scheme
            f.attrs["epoch"] = int(epoch)
            f.attrs["config"] = config_json
            if rng_json is not None:
                f.attrs["rng_state"] = rng_json
            _write_group(f, "params", host_params)
            if host_opt is not None:
                _write_group(f, "opt_state", host_opt)
            f.flush()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path):
    # makes the rename itself durable; not possible on every OS/file system
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_REQUIRED = object()


def _attr(f, name: str, path: Path, kind: str, default=_REQUIRED):
    """Root attribute ``name`` as ``kind`` ("text", "int" or "json"); ``default`` when
    absent (none: required); CheckpointError when present but not of that kind."""
    if name not in f.attrs:
        if default is _REQUIRED:
            raise CheckpointError(f"{path}: corrupt checkpoint (attribute {name!r} missing)")
        return default
    value = f.attrs[name]
    if isinstance(value, (bytes, np.bytes_)):
        value = bytes(value).decode("utf-8")
    if kind == "int":
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise CheckpointError(f"{path}: corrupt checkpoint (attribute {name!r} is "
                                  f"{type(value).__name__} {value!r:.40}, need an integer)")
        return int(value)
    if not isinstance(value, str):
        raise CheckpointError(f"{path}: corrupt checkpoint (attribute {name!r} is "
                              f"{type(value).__name__}, need text)")
    if kind == "json":
        try:
            return json.loads(value, object_hook=_json_hook)
        except (ValueError, TypeError, RecursionError) as e:
            raise CheckpointError(f"{path}: corrupt checkpoint (attribute {name!r} is not the "
                                  f"JSON aepar writes: {one_line(e)})") from None
    return value


def _read_group(group, what: str, path: Path, kinds: str) -> dict:
    """Every dataset under ``group``, checked from its header before it is read: dtype
    kind in ``kinds``, data really stored; then floating values must be finite."""
    import h5py

    from aepar.data.hdf5 import storage_problem

    datasets = []

    def collect(name, obj):
        if isinstance(obj, h5py.Dataset):
            datasets.append((name, obj))

    group.visititems(collect)
    out = {}
    for name, dset in datasets:
        if dset.dtype.kind not in kinds:
            raise CheckpointError(f"{path}: {what} {name!r} has dtype {dset.dtype}, "
                                  f"need {'floating point' if kinds == 'f' else 'numbers'}")
        problem = storage_problem(dset)
        if problem:
            raise CheckpointError(f"{path}: {what} {name!r} {problem}")
        # 0-d datasets read as numpy scalars: hand back 0-d arrays like every other entry
        value = np.asarray(dset[()])
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            raise CheckpointError(f"{path}: {what} {name!r} holds NaN or infinite values")
        out[name] = value
    return out


def load(path, *, scheme: str | tuple | None = None, shapes: dict | None = None) -> Checkpoint:
    """Read a checkpoint, refusing one that does not fit.

    Parameters
    ----------
    path : str or Path
    scheme : str or tuple of str, optional
        Refuse a checkpoint written by another scheme (by any other, for a tuple).
    shapes : dict of str -> tuple, optional
        The model's parameter shapes: refuse a checkpoint that lacks one of these
        parameters or stores it with another shape. Parameters in the file but not in
        ``shapes`` are returned as well.

    Returns
    -------
    Checkpoint

    Raises
    ------
    CheckpointError
        Missing, corrupt, truncated or foreign file; corrupt attributes; other scheme;
        parameters that are not floating point or hold NaN/Inf (optimiser state may be
        integer, never NaN/Inf); missing parameter; other shape. The message is one line
        naming the file and the problem.
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (no such file)" if not path.exists() else f"{path}: not a file")
    try:
        f = h5py.File(path, "r")
    except Exception as e:  # OSError mostly; h5py raises others on some damaged files
        raise CheckpointError(f"{path}: not an HDF5 checkpoint (corrupt or truncated: "
                              f"{one_line(e)})") from None
    with f:
        try:
            mark = f.attrs.get("format")
            if not (isinstance(mark, str) and mark == FORMAT) or not isinstance(f.get("params"), h5py.Group):
                raise CheckpointError(f"{path}: not an aepar checkpoint (no '{FORMAT}' format mark)")
            version = _attr(f, "version", path, "int")
            if version > VERSION:
                raise CheckpointError(f"{path}: checkpoint format version {version} is newer than "
                                      f"this aepar reads ({VERSION})")
            if version < 1:
                raise CheckpointError(f"{path}: corrupt checkpoint (format version {version})")
            file_scheme = _attr(f, "scheme", path, "text")
            if not file_scheme:
                raise CheckpointError(f"{path}: corrupt checkpoint (empty scheme attribute)")
            allowed = (scheme,) if isinstance(scheme, str) else tuple(scheme or ())
            if allowed and file_scheme not in allowed:
                raise CheckpointError(f"{path}: written by scheme {file_scheme!r}, not "
                                      f"{' or '.join(map(repr, allowed))}")
            epoch = _attr(f, "epoch", path, "int", default=0)
            if epoch < 0:
                raise CheckpointError(f"{path}: corrupt checkpoint (epoch {epoch})")
            config = _attr(f, "config", path, "json", default={})
            rng_state = _attr(f, "rng_state", path, "json", default=None)
            if not isinstance(config, dict) or not isinstance(rng_state, (dict, type(None))):
                bad = "config" if not isinstance(config, dict) else "rng_state"
                raise CheckpointError(f"{path}: corrupt checkpoint (attribute {bad!r} is not a JSON object)")
            params = _read_group(f["params"], "parameter", path, "f")
            opt_group = f.get("opt_state")
            if opt_group is not None and not isinstance(opt_group, h5py.Group):
                raise CheckpointError(f"{path}: corrupt checkpoint ('opt_state' is not a group)")
            opt_state = None if opt_group is None else _read_group(opt_group, "optimiser state", path, "biufc")
        except CheckpointError:
            raise
        except Exception as e:  # h5py raises many types on a damaged file: all mean corrupt
            raise CheckpointError(f"{path}: corrupt checkpoint ({one_line(e)})") from None
    for name, shape in (shapes or {}).items():
        if name not in params:
            raise CheckpointError(f"{path}: parameter {name!r} missing (the file has "
                                  f"{', '.join(sorted(params)) or 'none'})")
        if tuple(params[name].shape) != tuple(int(s) for s in shape):
            raise CheckpointError(f"{path}: parameter {name!r} has shape {tuple(params[name].shape)}, "
                                  f"the model needs {tuple(shape)}")
    return Checkpoint(file_scheme, params, opt_state, rng_state, epoch, config, path)


# ---- pre-trained stacks ------------------------------------------------------------------
def layers_to_params(be, layers) -> dict:
    """{"layer1/W": ..., "layer1/bv": ..., ...} as host arrays, for :func:`save`."""
    out = {}
    for i, layer in enumerate(layers):
        for k, v in layer.params.items():
            out[f"layer{i + 1}/{k}"] = be.to_host(v)
    return out


def layers_from_params(be, params, path="checkpoint") -> list:
    """Inverse of :func:`layers_to_params`: objects with ``params`` (backend arrays).

    Raises CheckpointError naming ``path`` when the layers are missing or do not fit.
    """
    layers, i = [], 1
    while f"layer{i}/W" in params:
        try:
            p = {k: be.asarray(np.asarray(params[f"layer{i}/{k}"])) for k in ("W", "bv", "bh")}
        except KeyError as e:
            raise CheckpointError(f"{path}: layer {i} lacks {e.args[0]}") from None
        if p["bv"].shape != (p["W"].shape[0],) or p["bh"].shape != (p["W"].shape[1],):
            raise CheckpointError(f"{path}: layer {i}: biases {p['bv'].shape}, {p['bh'].shape} do not fit "
                                  f"W {p['W'].shape}")
        if layers and layers[-1].params["W"].shape[1] != p["W"].shape[0]:
            raise CheckpointError(f"{path}: layer {i} takes {p['W'].shape[0]} inputs but layer {i - 1} "
                                  f"gives {layers[-1].params['W'].shape[1]}")
        layers.append(SimpleNamespace(params=p))
        i += 1
    if not layers:
        raise CheckpointError(f"{path}: no pre-trained layers (layer1/W, ...) in the checkpoint")
    return layers


def finetuned_from_params(be, params, layers, loss, path="checkpoint"):
    """The fine-tuned network stored as ``finetuned/W1..`` beside ``layers``, or None."""
    if "finetuned/W1" not in params:
        return None
    model = StackedAutoencoder.from_layers(be, layers, loss=loss)
    for k, v in model.params.items():
        key = f"finetuned/{k}"
        if key not in params:
            raise CheckpointError(f"{path}: {key} missing (the fine-tuned network is incomplete)")
        if tuple(np.shape(params[key])) != tuple(v.shape):
            raise CheckpointError(f"{path}: {key} has shape {tuple(np.shape(params[key]))}, the layers "
                                  f"make {tuple(v.shape)}")
        v[...] = be.asarray(np.asarray(params[key]))
    return model


def layer_state(be, layers, current=None, prefix="") -> tuple[dict, dict]:
    """(params, opt_state) of a stack for a checkpoint: every layer's parameters and the
    momentum of the layer being trained (``current``)."""
    params = {f"{prefix}{k}": v for k, v in layers_to_params(be, layers).items()}
    opt = {}
    if current is not None:
        opt = {f"{prefix}layer{current + 1}/{k}": be.to_host(v)
               for k, v in layers[current].optimizer.state().items()}
    return params, opt


def restore_layers(be, layers, params, opt_state, current=None, prefix=""):
    """Inverse of :func:`layer_state`."""
    for i, layer in enumerate(layers):
        for k in layer.params:
            layer.params[k][...] = be.asarray(params[f"{prefix}layer{i + 1}/{k}"])
    if current is not None:
        tag = f"{prefix}layer{current + 1}/"
        layers[current].optimizer.load_state({k[len(tag):]: v for k, v in opt_state.items() if k.startswith(tag)})
