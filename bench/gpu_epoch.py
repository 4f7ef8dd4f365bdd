"""Epochs on the GPU, aepar's CuPy kernels vs PyTorch CUDA: the stack's first layer (CD-1 or
the autoencoder layer), fine-tuning the unrolled stack, the convolutional autoencoder.

    python -m bench.gpu_epoch [--rows 50000] [--batches 100,5000] [--repeats 3]
                              [--layers rbm,ae,finetune,cae] [--data-dir DIR] [--out DIR]

The 784x1000 Bernoulli RBM of bench.stacked's rbm_epoch.csv (the seed's recipe, float32,
momentum 0.9), trained on the GPU: aepar's model on ``backend.select("gpu", "cupy")`` with
8 blocks per batch (the bits of 1-8 ranks) and with 1, against bench/torch_rbm.py's
"careful" and "plain" loops on ``torch.device("cuda")``. The data are put on the GPU
before any timing; each implementation gets a warm-up epoch on 500 rows (compilation,
cuBLAS handles, the memory pools), then ``--repeats`` rounds of one epoch each taken in
turns, the device drained before and after each; best of the rounds counts.
ratio = this row's seconds / aepar's 8-block seconds (> 1: aepar faster). ``--layers ae``
times the autoencoder layer of ``--pretrainer ae`` the same way, against TorchAE.
``--layers finetune`` times a whole epoch of fine-tuning the unrolled 784-1000-500-250-30
stack (bench.finetune_speed's network, Adam lr 1e-3) and ``--layers cae`` one of the
convolutional autoencoder (bench.cae_speed's), each against the same network in PyTorch
CUDA from aepar's initial weights, with ``torch.optim.Adam`` as it comes and ``fused=True``;
the CAE's one block also with its convolutions through cuBLAS (the GPU set's bound for the
row kernels, ``kernels.cp.conv.MAX_IMAGES``, at 0 for its epochs), so that the bound is
judged side by side in one run; and every workload's 8 blocks also with the row kernels'
mid tiles where they would take the thin ones (``kernels.cp.rowprod.TILES``), which
``tiles_for`` does not take before they have been timed on a GPU.

Data: the first ``--rows`` training images of the IDX files in ``--data-dir`` (Fashion-
MNIST's, say), else of Debian's Fashion-MNIST, else of the embedded mnist5k repeated to
``--rows`` (the rows say which). Rows go to OUT/gpu_epoch.csv (default bench/results),
replacing this benchmark's earlier rows from the same host and GPU, with the machine
columns, the GPU's name, the CuPy, CUDA and PyTorch versions, the date and the command.
Exits 2 when there is no usable GPU (nothing written).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("AEPAR_THREADS", "1")

import aepar  # noqa: E402,F401  (threads before numpy)
import numpy as np  # noqa: E402

from bench.common import ONE_PROCESS, fastest, machine_columns, merge_rows, time_calls, with_machine  # noqa: E402
from bench.torch_rbm import LAYERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
HIDDEN = 1000
AEPAR_8 = "aepar (cupy kernels, 8 blocks: bit-identical on 1-8 ranks)"
AEPAR_1 = "aepar (cupy kernels, 1 block)"
# the CAE's one block with its convolutions through cuBLAS, as before aepar 0.8.29 (MAX_IMAGES
# 0 for its epochs): the row kernels' bound for images decided side by side in one run
AEPAR_1_CUBLAS = "aepar (cupy kernels, 1 block, convolutions through cuBLAS)"
# the 8 blocks again with the row kernels' mid tiles wherever tiles_for takes the thin ones
# (aepar 0.8.30's mid instance, which tiles_for does not take before a GPU has timed it)
AEPAR_8_MID = "aepar (cupy kernels, 8 blocks, mid tiles where the thin are taken)"
TORCH = {"careful": "pytorch cuda careful (bench/torch_rbm.py)", "plain": "pytorch cuda plain (bench/torch_rbm.py)"}
KEY = ("hostname", "gpu", "layer", "batch")
TORCH_ADAM = "pytorch cuda (torch.nn, torch.optim.Adam)"
TORCH_FUSED = "pytorch cuda (torch.nn, torch.optim.Adam fused=True)"
# whole networks trained with Adam: (the rows' layer column, the CPU bench with its peer, the peer)
NETWORKS = {"finetune": ("784-1000-500-250-30-250-500-1000-784 fine-tuning (Adam)", "bench.finetune_speed",
                         "TorchUnrolled"),
            "cae": ("CAE 1x28x28 conv16-pool-conv32-pool-tconv16-tconv1 (Adam)", "bench.cae_speed", "TorchCAE")}


def load_rows(rows: int, data_dir: str | None):
    """(x float32 of ``rows`` rows, where they came from)."""
    from aepar.data.sources import load_digits

    for name, where in ([("idx", data_dir)] if data_dir else []) + [("fashion", None)]:
        try:
            x = load_digits(name, data_dir=where, seed=0, dtype=np.float32).train_x
        except Exception:  # not installed here: try the next source
            continue
        if x.shape[0] >= rows:
            return np.ascontiguousarray(x[:rows]), f"{name} {where or ''} train[:{rows}]".replace("  ", " ")
    x = load_digits("mnist5k", seed=0, dtype=np.float32).train_x
    reps = -(-rows // x.shape[0])
    return np.ascontiguousarray(np.tile(x, (reps, 1))[:rows]), f"embedded mnist5k train x{reps}, first {rows} rows"


def gpu_columns() -> dict:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"gpu": name, "cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion()}


def epochs(x, batch: int, repeats: int, layer: str = "rbm") -> dict:
    """{implementation: [seconds]} for one batch size, the implementations taken in turns
    (``layer``: rbm, ae, or one of :data:`NETWORKS`)."""
    from aepar import backend
    from aepar.models.ae_layer import AELayer
    from aepar.models.rbm import RBM
    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import Shard
    from bench import torch_rbm

    be = backend.select("gpu", "cupy", "float32")
    warm = min(x.shape[0], max(500, 2 * batch))
    if layer in NETWORKS:
        return network_epochs(be, x, batch, repeats, layer, warm)
    model, peer_class = (RBM, torch_rbm.TorchRBM) if layer == "rbm" else (AELayer, torch_rbm.TorchAE)

    def ours(blocks):
        trained = model(be, 784, HIDDEN, hidden="bernoulli", lr=0.1, weight_cost=2e-4, momentum=(0.5, 0.9),
                        momentum_switch_epoch=5, batch=batch, seed=0, layer_index=0)
        train_epoch(trained, Shard.of(be, x[:warm], blocks), 0)
        xb = Shard.of(be, x, blocks)
        epochs = itertools.count(6)  # past the momentum switch, like most of a run
        return lambda: train_epoch(trained, xb, next(epochs))

    impls = {AEPAR_8: ours(8), AEPAR_1: ours(1)}
    _add_mid_tiles(be, impls, ours)
    if torch_rbm.available():
        import torch

        xt = torch.as_tensor(x, device="cuda")
        for style, name in TORCH.items():
            peer = peer_class(784, HIDDEN, batch=batch, seed=0, style=style, device="cuda")
            peer.train_epoch(xt[:warm])
            impls[name] = lambda peer=peer: peer.train_epoch(xt)
    return in_turns(be, impls, repeats)


def network_epochs(be, x, batch: int, repeats: int, name: str, warm: int, peer_device: str = "cuda") -> dict:
    """{implementation: [seconds]} of a whole network trained with Adam (the unrolled
    stack's fine-tuning, the CAE): aepar's model with 8 blocks and 1 block against the same
    network in PyTorch on ``peer_device`` from the same initial weights, Adam with and
    without ``fused``."""
    from bench import torch_rbm

    module = importlib.import_module(NETWORKS[name][1])
    impls = {}
    for blocks, label in ((8, AEPAR_8), (1, AEPAR_1)):
        module.aepar_epoch(x[:warm], blocks, be=be, batch=batch)[1]()  # a throwaway model: compile, pools
        model, impls[label] = module.aepar_epoch(x, blocks, be=be, batch=batch, first_epoch=1)
    _add_mid_tiles(be, impls, lambda blocks: module.aepar_epoch(x, blocks, be=be, batch=batch, first_epoch=1)[1])
    conv = sys.modules.get(be.K.__name__ + ".conv")
    if name == "cae" and hasattr(conv, "MAX_IMAGES"):  # the GPU set's convolutions
        through_cublas = _with(conv, "MAX_IMAGES", 0)
        through_cublas(module.aepar_epoch(x[:warm], 1, be=be, batch=batch)[1])()
        impls[AEPAR_1_CUBLAS] = through_cublas(module.aepar_epoch(x, 1, be=be, batch=batch, first_epoch=1)[1])
    if torch_rbm.available():
        import torch

        xt = torch.as_tensor(x, device=peer_device)
        peer_class = getattr(module, NETWORKS[name][2])
        for fused, label in ((False, TORCH_ADAM), (True, TORCH_FUSED)):
            peer = peer_class(model, 1, device=peer_device, fused=fused)
            peer.train_epoch(xt[:warm])
            impls[label] = lambda peer=peer: peer.train_epoch(xt)
    return in_turns(be, impls, repeats)


def _add_mid_tiles(be, impls: dict, make):
    """Where the kernel set's row kernels have a mid instance (the GPU set's rowprod), add
    :data:`AEPAR_8_MID`: ``make(8)``'s epoch with ``tiles_for`` giving the mid tiles where
    it gives the thin (made, and so warmed up, with them too), the set's kept launch plans,
    which hold the instance, dropped around each call."""
    rowprod = sys.modules.get(be.K.__name__ + ".rowprod")
    if "_mid" in getattr(rowprod, "TILES", ()):
        thin_or = rowprod.tiles_for
        mid = _with(rowprod, "tiles_for", lambda *a: "_mid" if thin_or(*a) == "_thin" else thin_or(*a),
                    reset=rowprod._plan.cache_clear)
        impls[AEPAR_8_MID] = mid(mid(lambda: make(8))())


def _with(module, name: str, value, reset=None):
    """A wrapper that runs a call with ``module.name`` set to ``value``, restored after;
    ``reset()``, if given, before and after (what keeps the attribute's effects)."""
    def wrap(call):
        def run():
            kept = getattr(module, name)
            setattr(module, name, value)
            if reset is not None:
                reset()
            try:
                return call()
            finally:
                setattr(module, name, kept)
                if reset is not None:
                    reset()
        return run
    return wrap


def in_turns(be, impls: dict, repeats: int) -> dict:
    """{implementation: [seconds]}: ``repeats`` rounds of one epoch of each, taken in turns
    (each warmed up already), the device drained around every epoch: aepar's queue and,
    when loaded, PyTorch's."""
    def drain():
        be.synchronize()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()
    return {name: list(t.samples) for name, t in time_calls(impls, repeats, warmup=0, sync=drain).items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_epoch", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=50_000, help="training rows per epoch (default %(default)s)")
    p.add_argument("--batches", default="100,5000", help="batch sizes, comma-separated (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed epochs per implementation (best counts)")
    p.add_argument("--layers", default="rbm", help="what to time, comma-separated: rbm (CD-1), ae (the "
                   "autoencoder layer), finetune (the unrolled stack), cae (default %(default)s)")
    p.add_argument("--data-dir", default=None, help="a directory with the four IDX files (Fashion-MNIST's)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where gpu_epoch.csv goes (default bench/results)")
    args = p.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches must be integers separated by commas, not {args.batches!r}")
    if args.rows < 1 or args.repeats < 1 or not batches or min(batches) < 1:
        p.error("--rows, --repeats and every batch must be at least 1")
    layers = [name.strip() for name in args.layers.split(",") if name.strip()]
    if not layers or any(name not in LAYERS and name not in NETWORKS for name in layers):
        p.error(f"--layers must name some of {', '.join([*LAYERS, *NETWORKS])}, not {args.layers!r}")
    try:
        gpu = gpu_columns()
    except Exception as e:  # no CuPy, no driver, no device
        print(f"bench.gpu_epoch: error: no usable GPU ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
              file=sys.stderr)
        return 2
    x, what = load_rows(args.rows, args.data_dir)
    print(f"bench.gpu_epoch: {gpu['gpu']}, {what}", flush=True)
    out, machine = [], None
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    stamp = {"date": time.strftime("%Y-%m-%d"), "command": f"python -m bench.gpu_epoch {shown}"}
    for layer, batch in ((layer, batch) for layer in layers for batch in batches):
        times = epochs(x, batch, args.repeats, layer)
        if machine is None:  # after the first epochs: PyTorch is loaded by now
            here = machine_columns(mpi=ONE_PROCESS)
            torch = here.pop("torch", "")
            machine = {**here, **gpu, "torch": torch}
        ours = fastest(times[AEPAR_8])
        for name, ts in times.items():
            out += with_machine([{
                "implementation": name, "data": what, "samples": int(x.shape[0]),
                "layer": NETWORKS[layer][0] if layer in NETWORKS else f"784x{HIDDEN} {LAYERS[layer]}",
                "batch": batch, "dtype": "float32", "seconds": round(fastest(ts), 5),
                "ratio": round(fastest(ts) / ours, 4), "repeats": args.repeats,
                "all_seconds": " ".join(f"{v:.4f}" for v in ts), "kind": "measured", **stamp}], machine)
            print(f"  {layer} batch {batch:5d}  {name:62s} {fastest(ts):8.3f} s  ratio {fastest(ts) / ours:5.2f}",
                  flush=True)
    merge_rows(out, args.out / "gpu_epoch.csv", "gpu_epoch", key=KEY)
    print(f"bench.gpu_epoch: wrote {args.out / 'gpu_epoch.csv'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
