"""One CAE epoch, aepar's Numba kernels against PyTorch on the CPU: ``python -m bench.cae_speed``.

The network of :class:`aepar.models.cae.ConvAutoencoder` (1x28x28; conv 3x3 1->16, ReLU,
max-pool; conv 3x3 16->32, ReLU, max-pool; transposed conv 2x2/2 32->16, ReLU; transposed
conv 2x2/2 16->1, sigmoid; loss Σ_pixels (x − x̂)² averaged over the images; Adam lr 1e-3),
float32, batch 100, one epoch over 4,800 real MNIST digits (the embedded 5k subset, train
then test rows). The PyTorch peer is the same network written with ``torch.nn.Conv2d`` /
``ConvTranspose2d`` (PyTorch's own CPU convolutions), starting from aepar's initial
weights (the layouts are PyTorch's), ``torch.optim.Adam``, the same batch size and epoch
length (its own shuffle).

Each thread count runs in its own child process (AEPAR_THREADS there, and
``torch.set_num_threads``): aepar's threads take whole blocks of each batch (8 blocks,
single-threaded BLAS inside), PyTorch's are its intra-op threads. A warm-up epoch each,
then ``--repeats`` epochs each, taken in turns (aepar, torch, aepar, ...); the best
counts, all are recorded. The child also measures the machine's float32 GEMM rate at
that thread count (an n x n product, best of 5, OpenBLAS threads set by threadpoolctl),
before and after the epochs (the better counts); GFLOP/s = ``flops_per_sample()`` ·
samples / seconds, against that rate.

With ``--profile`` (default on) the 1-thread child also times every kernel of one
block's step (13 images) on its exact shapes, and the first convolution's backward with
the input gradient the model does not ask for (``need_dx=True``), beside its own.

Rows go to bench/results/peers.csv (the columns it lacks are added; rows of an earlier
run of this benchmark on the same host and CPU are replaced); bench/results/cae_speed.md
gets the table. Needs PyTorch (``make bench-peers``); without it only aepar's rows are
written and the file says the peer is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("AEPAR_THREADS", "1")

import aepar  # noqa: E402,F401  (threads before numpy)
import numpy as np  # noqa: E402

from bench.common import ONE_PROCESS, machine_columns, time_call, time_calls  # noqa: E402
from bench.epoch_peers import TorchPeer, epoch_call, run_and_publish, sgemm_gflops, table_head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BENCHMARK = "cae_epoch"
NAMES = {"aepar": "aepar CAE (numba kernels, 8 blocks)",
         "pytorch": "pytorch CAE (torch.nn Conv2d/ConvTranspose2d, torch.optim.Adam)"}
NETWORK = "1x28x28 conv3x3 16, pool, conv3x3 32, pool, tconv2x2/2 16, tconv2x2/2 1"
CHILD_TAG = "CAE-SPEED "


# ---- measurements inside one child ---------------------------------------------------------------
def load_rows(rows: int) -> tuple[np.ndarray, str]:
    """The first ``rows`` of the embedded MNIST 5k subset (train, then test), float32 rows."""
    from aepar.data.sources import load_digits

    d = load_digits("mnist5k", seed=0, dtype=np.float32)
    x = np.concatenate([d.train_x, d.test_x])
    if rows > x.shape[0]:
        raise SystemExit(f"bench.cae_speed: --rows {rows}: the mnist5k subset has {x.shape[0]} images")
    return np.ascontiguousarray(x[:rows], dtype=np.float32), f"mnist5k train+test[:{rows}]"


class TorchCAE(TorchPeer):
    """The same network, loss and optimiser in PyTorch, from the aepar model's weights."""

    def __init__(self, model, threads: int, seed: int = 0, device: str = "cpu", fused: bool = False):
        import torch
        from torch import nn

        torch.set_num_threads(int(threads))
        self.torch, self.device = torch, device
        c = model.shape[0]
        f1, f2 = model.filters
        self.net = nn.Sequential(
            nn.Conv2d(c, f1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(f1, f2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.ConvTranspose2d(f2, f1, 2, stride=2), nn.ReLU(),
            nn.ConvTranspose2d(f1, c, 2, stride=2), nn.Sigmoid())
        layers = [m for m in self.net if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
        host = {k: model.be.to_host(v) for k, v in model.params.items()}
        with torch.no_grad():
            for i, layer in enumerate(layers, 1):  # aepar keeps PyTorch's layouts
                layer.weight.copy_(torch.from_numpy(np.asarray(host[f"W{i}"], dtype=np.float32)))
                layer.bias.copy_(torch.from_numpy(np.asarray(host[f"b{i}"], dtype=np.float32)))
        self.net.to(device)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3, **({"fused": True} if fused else {}))
        self.shape, self.batch = model.shape, model.batch
        self.gen = torch.Generator().manual_seed(seed)

    def summed_loss(self, xb):
        """Σ_pixels (x − x̂)² summed over the images."""
        return self.torch.nn.functional.mse_loss(self.net(xb), xb, reduction="sum")


def aepar_epoch(x, blocks=8, be=None, batch: int = 100, first_epoch: int = 0):
    """(model, a call that trains one epoch of it on ``x``: :func:`bench.epoch_peers.epoch_call`)
    of aepar's CAE, on the backend ``be`` (default: the numba kernels, float32)."""
    from aepar import backend
    from aepar.models.cae import ConvAutoencoder
    from aepar.optim import Adam

    be = be or backend.select("cpu", "numba", "float32")
    model = ConvAutoencoder(be, (1, 28, 28), seed=0, batch=batch)
    return model, epoch_call(model, Adam(be, model.params, lr=1e-3), x, blocks, first_epoch)


def kernel_profile(model, block_rows: int, reps: int = 30) -> list[tuple[str, float]]:
    """Seconds per call of every kernel of one block's step (``block_rows`` images), on the
    exact shapes of the model's forward/backward, and conv1's backward with the input
    gradient the model does not ask for."""
    K, p = model.be.K, model.params
    rng = np.random.default_rng(0)
    x = rng.random((block_rows, 784), dtype=np.float32)
    t = model.forward(x)
    g = {k: np.zeros_like(v) for k, v in p.items()}

    def like(a):
        return rng.standard_normal(a.shape, dtype=np.float32) * np.float32(0.01)
    dy, da3, da2, da1 = like(t["y"]), like(t["a3"]), like(t["a2"]), like(t["a1"])
    dp2, dp1 = like(t["p2"]), like(t["p1"])
    cases = [
        ("conv1 forward", lambda: K.conv2d_forward(t["x"], p["W1"], p["b1"], 1, 1)),
        ("conv2 forward", lambda: K.conv2d_forward(t["p1"], p["W2"], p["b2"], 1, 1)),
        ("tconv3 forward", lambda: K.conv2d_transpose_forward(t["p2"], p["W3"], p["b3"], 2, 0)),
        ("tconv4 forward", lambda: K.conv2d_transpose_forward(t["a3"], p["W4"], p["b4"], 2, 0)),
        ("tconv4 backward", lambda: K.conv2d_transpose_backward(dy, t["a3"], p["W4"], 2, 0, g["W4"], g["b4"])),
        ("tconv3 backward", lambda: K.conv2d_transpose_backward(da3, t["p2"], p["W3"], 2, 0, g["W3"], g["b3"])),
        ("conv2 backward", lambda: K.conv2d_backward(da2, t["p1"], p["W2"], 1, 1, g["W2"], g["b2"])),
        ("conv1 backward (no input gradient)", lambda: K.conv2d_backward(da1, t["x"], p["W1"], 1, 1, g["W1"],
                                                                         g["b1"], need_dx=False)),
        ("  with its input gradient (not made)", lambda: K.conv2d_backward(da1, t["x"], p["W1"], 1, 1, g["W1"],
                                                                           g["b1"])),
        ("maxpool forward (both)", lambda: (K.maxpool2x2_forward(t["a1"]), K.maxpool2x2_forward(t["a2"]))),
        ("maxpool backward (both)", lambda: (K.maxpool2x2_backward(dp1, t["i1"], t["a1"].shape),
                                             K.maxpool2x2_backward(dp2, t["i2"], t["a2"].shape))),
        ("relu forward (three)", lambda: (K.relu_forward(da1), K.relu_forward(da2), K.relu_forward(da3))),
        ("relu backward (three)", lambda: (K.relu_backward(da1, t["a1"]), K.relu_backward(da2, t["a2"]),
                                           K.relu_backward(da3, t["a3"]))),
        ("sigmoid + loss, forward and backward", lambda: (
            K.sigmoid_backward(K.mse_backward(K.sigmoid_forward(dy), t["x"], scale=0.02), t["y"]),
            K.mse_forward(t["y"], t["x"], scale=2.0))),
    ]
    cases.append(("whole block step (loss_and_grad)", lambda: model.loss_and_grad(x, g)))
    return [(name, time_call(fn, 3, calls=reps).seconds) for name, fn in cases]


def child(args) -> int:
    """Time this process's thread count (AEPAR_THREADS) and print one JSON line."""
    threads = aepar.THREADS
    x, what = load_rows(args.rows)
    load_before = os.getloadavg()[0]
    peak0, method = sgemm_gflops(threads)
    model, ours = aepar_epoch(x)
    ours()  # warm-up (epoch 0): JIT (cached), scratch buffers, BLAS
    epochs = {"aepar": ours}
    if args.torch:
        try:
            peer = TorchCAE(model, threads)
        except ImportError:
            peer = None
        if peer is not None:
            peer.train_epoch(x)  # warm-up
            epochs["pytorch"] = lambda: peer.train_epoch(x)
    times = {k: list(t.samples) for k, t in time_calls(epochs, args.repeats, warmup=0).items()}
    peak1, _ = sgemm_gflops(threads)
    profile = kernel_profile(model, -(-model.batch // 8)) if args.profile else []
    machine = machine_columns(mpi=ONE_PROCESS, threads=threads)
    if "torch" in sys.modules:
        machine["torch_threads"] = sys.modules["torch"].get_num_threads()
    print(CHILD_TAG + json.dumps({
        "times": times, "data": what, "samples": int(x.shape[0]), "threads": threads,
        "flops_per_sample": model.flops_per_sample(), "sgemm": max(peak0, peak1), "sgemm_method": method,
        "load_1min": [load_before, os.getloadavg()[0]], "profile": profile, "machine": machine,
        "torch_missing": args.torch and "pytorch" not in times}), flush=True)
    return 0


# ---- the driver ----------------------------------------------------------------------------------
def markdown(results: list[dict], rows: list[dict]) -> str:
    m = rows[0]
    lines = table_head("One CAE epoch: aepar (Numba kernels) vs PyTorch on the CPU", "bench.cae_speed", m) + [
        f"Network: {NETWORK}; float32, batch 100, Adam lr 1e-3, {m['data']} ({m['samples']} images). "
        f"FLOPs per epoch {float(m['gflop_per_epoch']):.2f} GFLOP (`flops_per_sample()`: 2 forward + 4 backward "
        "per multiply-add of each convolution, 2 for conv1's backward: its input gradient is not made, "
        "nor by PyTorch).", "",
        f"Each thread count in its own process; warm-up epoch each, then {m['repeats']} epochs each in turns; "
        "best shown (all in peers.csv). SGEMM: float32 2000x2000 product at the same thread count, same run.", "",
        "| threads | implementation | seconds / epoch (best) | median | GFLOP/s | SGEMM GFLOP/s | of SGEMM | seconds / aepar's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['implementation']} | {r['seconds']} | {r['median_seconds']} | "
                     f"{r['gflops']} | {r['sgemm_peak_gflops']} | {float(r['fraction_of_peak']):.1%} | "
                     f"{r['seconds_over_aepar']} |")
    if any(res.get("torch_missing") for res in results):
        lines += ["", "PyTorch is not installed (`make bench-peers`): its rows are missing."]
    prof = next((res for res in results if res["profile"]), None)
    if prof is not None:
        blocks = -(-prof["samples"] // 100) * 8
        lines += ["", f"Per kernel, 1 thread, one block of one step ({-(-100 // 8)} images; "
                      f"{blocks} blocks per epoch), best of 3 x 30 calls:", "",
                  "| kernel | µs per block | s per epoch (x blocks) |", "| --- | --- | --- |"]
        for name, s in prof["profile"]:
            lines.append(f"| {name} | {s * 1e6:.1f} | {s * blocks:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cae_speed", description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="thread counts, one process each (default %(default)s)")
    p.add_argument("--rows", type=int, default=4800, help="images per epoch (default %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed epochs per implementation (default %(default)s)")
    p.add_argument("--no-torch", action="store_true", help="aepar only")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the per-kernel table")
    p.add_argument("--out", default=str(RESULTS / "peers.csv"), help="CSV to append to (default %(default)s)")
    p.add_argument("--md", default=str(RESULTS / "cae_speed.md"), help="markdown table (default %(default)s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.torch, args.profile = not args.no_torch, args.profile_child
        return child(args)
    threads = [int(v) for v in args.threads.split(",")]

    def extra_for(t):
        extra = ["--rows", str(args.rows), "--repeats", str(args.repeats)] + (["--no-torch"] if args.no_torch else [])
        return extra + (["--profile-child"] if args.profile and t == 1 else [])
    return run_and_publish("bench.cae_speed", CHILD_TAG, threads, extra_for, benchmark=BENCHMARK, names=NAMES,
                           network=NETWORK, reference="aepar", out=args.out, md=args.md, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
