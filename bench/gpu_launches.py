"""What a GPU training step asks of the host: ``python -m bench.gpu_launches``.

At batch 100 a GPU step waits on the host, which pays for every launch, cuBLAS call and
CuPy operation it makes (on the H200 machine an 8-block step and a one-block step cost about
the same host time per call: docs/performance-gpu.md). This counts those calls per step of
the data-parallel trainer with 8 blocks and with one, for a CD-1 layer, an autoencoder
layer, the fine-tuning stack, a classifier and the CAE, on the emulated GPU (tests/unit/cuda/emulated:
aepar's GPU code as it runs, on the CPU). The counts are the code's, the same on any
machine; they are not times. Written to ``bench/results/gpu/launches.md`` (``--md``).

Beside the counts, aepar's own Python per step (``--host``): the same epochs with the raw
kernels not run, timed, less the time inside the stand-in's calls (its kernels, GEMMs,
ufuncs, array functions, copies and indexing). What is left is aepar's code between the
calls, with the stand-in's cheaper attribute reads (an array's ``data``, ``shape``) counted
in: an upper bound on what the same code costs a GPU's host besides CuPy's calls. It is a
time, so it depends on the CPU it ran on.

Counted: element-wise, reduction and raw kernel launches, cuBLAS GEMMs, CuPy's ufuncs and
array functions (a concatenate, a gather, a stack), copies into device arrays, and the
copies that ``cupy.ascontiguousarray`` and ``cupy.zeros`` make.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMULATED = ROOT / "tests" / "unit" / "cuda" / "emulated"
MD = ROOT / "bench" / "results" / "gpu" / "launches.md"
# the fine-tuning stack's shape, 784-1000-500-250-30 unrolled (eight weight layers, as many
# calls a step), narrower so that the emulated GPU counts it fast
FINE_TUNING = (784, 32, 16, 8, 4)
WORKLOADS = ("CD-1 step", "autoencoder layer step", "fine-tuning step", "classifier step", "CAE step")


def count_calls(cupy, counts: collections.Counter) -> list:
    """Wrap the emulated CuPy's entry points so that each call adds to ``counts`` by kind;
    returns what undoes it ((owner, name, the real one) each)."""
    from cupy import _kernels
    from cupy_backends.cuda.libs import cublas

    wrapped = []

    def wrap(owner, name, kind, copies_only=False):
        real = getattr(owner, name)
        wrapped.append((owner, name, real))

        def call(*args, **kwargs):
            out = real(*args, **kwargs)
            if not copies_only or _address(out) != _address(args[0]):
                counts[kind] += 1
            return out
        setattr(owner, name, call)
    # a RawKernel launches through its module's function: that call counts, once
    for owner, kind in ((_kernels.ElementwiseKernel, "element-wise"), (_kernels.ReductionKernel, "reduction"),
                        (_kernels._Function, "raw kernel")):
        wrap(owner, "__call__", kind)
    wrap(cublas, "_gemm", "cuBLAS")
    wrap(cupy.ndarray, "__array_ufunc__", "ufunc")
    wrap(cupy.ndarray, "__array_function__", "array function")
    wrap(cupy.ndarray, "__setitem__", "copy")
    wrap(cupy, "zeros", "copy")
    wrap(cupy, "ascontiguousarray", "copy", copies_only=True)
    return wrapped


def _address(a) -> int:
    return getattr(a, "__array_interface__", {"data": (None,)})["data"][0]


def per_step(layers=(784, 64), rows: int = 500, host_epochs: int = 0, host_rows: int = 4000,
             workloads=WORKLOADS, cae_side: int = 28) -> list[dict]:
    """[{workload, blocks, calls, by kind, host µs}] per step of each of ``workloads``, 8
    blocks and one, averaged over an epoch after a first one (whose calls include one-time
    set-up); host µs: aepar's own Python per step, the fastest of ``host_epochs`` epochs of
    ``host_rows`` rows (an epoch's set-up shared out over its steps; None for none). The
    CAE's images are the digits' top-left ``cae_side`` x ``cae_side`` pixels (its calls do
    not depend on their size; the emulated GPU's convolutions do)."""
    added = str(EMULATED) not in sys.path  # the stand-in's cupy and cupy_backends, for this call
    if added:
        sys.path.insert(0, str(EMULATED))
    try:
        return _counted(layers, rows, host_epochs, host_rows, workloads, cae_side)
    finally:
        if added:
            sys.path.remove(str(EMULATED))


def time_outside(cupy, inside: list) -> list:
    """Wrap the emulated CuPy's entry points so that the time spent in their outermost
    calls adds to ``inside[0]``, and stop its raw kernels from running (a launch then costs
    what marshalling its arguments costs); returns what undoes it, as :func:`count_calls`."""
    import time

    from cupy import _kernels
    from cupy_backends.cuda.libs import cublas

    wrapped, depth = [], [0]

    def timed(fn):
        def call(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - t0
                depth[0] -= 1
        return call

    def wrap(owner, name, make=timed):
        real = getattr(owner, name)
        wrapped.append((owner, name, real))
        setattr(owner, name, make(real))
    for owner in (_kernels.ElementwiseKernel, _kernels.ReductionKernel):
        wrap(owner, "__call__")
    wrap(_kernels.RawModule, "get_function")
    wrap(_kernels._Function, "__call__", lambda real: timed(lambda *a, **k: None))
    wrap(cublas, "_gemm")
    for name in ("__array_ufunc__", "__array_function__", "__setitem__", "__getitem__"):
        wrap(cupy.ndarray, name)
    for name in ("zeros", "empty", "empty_like", "asnumpy"):
        wrap(cupy, name)
    # the functions the stand-in takes from NumPy (cupy.take, cupy.stack, ...), each made per lookup
    wrap(cupy, "_wrap", lambda real: lambda name, fn: timed(real(name, fn)))
    return wrapped


def _counted(layers, rows, host_epochs, host_rows, workloads, cae_side):
    import cupy
    import numpy as np

    from aepar import backend
    from aepar.data.sources import load_digits
    from aepar.models.ae_layer import AELayer
    from aepar.models.classifier import with_labels
    from aepar.models.rbm import RBM
    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import Shard

    if "emulated" not in cupy.__version__:
        raise SystemExit("bench.gpu_launches counts on the emulated GPU only; a CuPy is already imported")
    counts = collections.Counter()
    loaded = load_digits("mnist5k", seed=0, dtype=np.float32)
    digits = loaded.train_x
    labelled = with_labels(digits, loaded.train_y).astype(np.float32)  # the classifier's rows
    be = backend.select("gpu", "cupy", "float32")
    out = []
    made = (("CD-1 step", lambda: RBM(be, *layers, batch=100, seed=0), digits),  # (workload, model, its rows)
            ("autoencoder layer step", lambda: AELayer(be, *layers, batch=100, seed=0), digits),
            ("fine-tuning step", lambda: _fine_tuning(be), digits),
            ("classifier step", lambda: _classifier(be), labelled),
            ("CAE step", lambda: _cae(be, cae_side), np.ascontiguousarray(
                digits.reshape(-1, 28, 28)[:, :cae_side, :cae_side].reshape(digits.shape[0], -1))))
    made = [m for m in made if m[0] in workloads]
    wrapped = count_calls(cupy, counts)
    try:
        for workload, make, data in made:
            for blocks in (8, 1):
                model, shard = make(), Shard.of(be, data[:rows], blocks)
                train_epoch(model, shard, 0)
                counts.clear()
                train_epoch(model, shard, 1)
                steps = rows // 100
                out.append({"workload": workload, "blocks": blocks, "calls": sum(counts.values()) / steps,
                            "by kind": {k: v / steps for k, v in counts.most_common()}, "host µs": None})
    finally:
        _undo(wrapped)
    if host_epochs:
        inside = [0.0]
        wrapped = time_outside(cupy, inside)
        try:
            for r, (make, data) in zip(out, [(m, d) for _, m, d in made for _ in (8, 1)]):
                model, shard = make(), Shard.of(be, data[:host_rows], r["blocks"])
                train_epoch(model, shard, 0)
                best = float("inf")
                for epoch in range(1, host_epochs + 1):
                    inside[0], t0 = 0.0, time.perf_counter()
                    train_epoch(model, shard, epoch)
                    best = min(best, time.perf_counter() - t0 - inside[0])
                r["host µs"] = best / -(-min(host_rows, data.shape[0]) // 100) * 1e6
        finally:
            _undo(wrapped)
    return out


def _fine_tuning(be):
    """The unrolled stack of :data:`FINE_TUNING` with Adam, as ``bench.finetune_speed``'s."""
    from aepar.models.stacked import StackedAutoencoder
    from aepar.optim import Adam

    model = StackedAutoencoder(be, FINE_TUNING, loss="xent", seed=0, batch=100)
    model.optimizer = Adam(be, model.params, lr=1e-3)
    return model


def _classifier(be):
    """A classifier of :data:`FINE_TUNING`'s first layers' shape, ten classes, Adam."""
    from aepar.models.classifier import Classifier
    from aepar.optim import Adam

    model = Classifier(be, FINE_TUNING[:3], 10, seed=0, batch=100)
    model.optimizer = Adam(be, model.params, lr=1e-3)
    return model


def _cae(be, side=28):
    """``bench.cae_speed``'s CAE (conv16-pool-conv32-pool-tconv16-tconv1) on ``side`` x
    ``side`` images, Adam."""
    from aepar.models.cae import ConvAutoencoder
    from aepar.optim import Adam

    model = ConvAutoencoder(be, (1, side, side), seed=0, batch=100)
    model.optimizer = Adam(be, model.params, lr=1e-3)
    return model


def _undo(wrapped):
    for owner, name, real in reversed(wrapped):
        setattr(owner, name, real)


def table(rows: list[dict], command: str) -> str:
    from aepar.machine import cpu_model

    host = rows[0]["host µs"] is not None
    lines = ["# Host calls per GPU training step", "",
             f"Counted {datetime.date.today().isoformat()} with `{command}` on the emulated GPU "
             f"(`tests/unit/cuda/emulated`) on {cpu_model()}, the 784x64 layer and the 784-32-16-8-4 stack "
             "unrolled (eight weight layers, as the fine-tuning stack's), a 784-32-16-10 classifier and the CAE of "
             "`bench.cae_speed` on 500 digits, "
             "batch 100: the calls are the code's, the same on any machine, and not times. At "
             "batch 100 a GPU step costs the host about 27-44 µs a call (docs/performance-gpu.md)."]
    if host:
        lines[-1] += (" aepar's own Python: µs per step outside the stand-in's calls, its raw kernels not run "
                      "(4,000 digits, the fastest epoch; a time on this CPU, an upper bound: the stand-in's "
                      "attribute reads count in).")
    lines += ["", "| step | blocks | calls | of which |" + (" aepar's own Python (µs) |" if host else ""),
              "| --- | --- | --- | --- |" + (" --- |" if host else "")]
    for r in rows:
        kinds = ", ".join(f"{k} {v:g}" for k, v in r["by kind"].items())
        lines.append(f"| {r['workload']} | {r['blocks']} | {r['calls']:g} | {kinds} |"
                     + (f" {r['host µs']:.0f} |" if host else ""))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_launches", description=__doc__.split("\n\n")[0])
    p.add_argument("--md", type=Path, default=MD, help=f"where the table goes (default: {MD})")
    p.add_argument("--host", type=int, default=10, metavar="EPOCHS",
                   help="epochs timed for aepar's own Python per step, the fastest kept; 0: counts only "
                        "(default: 10)")
    args = p.parse_args(argv)
    rows = per_step(host_epochs=args.host)
    text = table(rows, "python -m bench.gpu_launches" + (f" --host {args.host}" if args.host != 10 else ""))
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
