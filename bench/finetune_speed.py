"""One fine-tuning epoch of the unrolled 784-1000-500-250-30 autoencoder, aepar's Numba
kernels against PyTorch on the CPU: ``python -m bench.finetune_speed``.

The network of :class:`aepar.models.stacked.StackedAutoencoder` with ``loss="xent"`` (what
``aepar.finetune`` trains by default): eight dense layers 784-1000-500-250-30-250-500-1000-784,
logistic units, a linear code, pixel cross-entropy from the logits summed over pixels and
averaged over the batch, Adam lr 1e-3, float32, batch 100. The PyTorch peer is the same
network as ``torch.nn.Linear`` layers with ``torch.sigmoid`` between them,
``binary_cross_entropy_with_logits`` and ``torch.optim.Adam``, starting from aepar's
initial weights.

aepar runs twice: with the default 8 blocks per batch (the same weights on 1-8 ranks; each
block's products have 12-13 rows) and with the batch as 1 block (``--reduce-blocks 1``,
one process only). Each thread count runs in its own child process (AEPAR_THREADS there,
``torch.set_num_threads``); a warm-up epoch each, then ``--repeats`` epochs each in turns.
The best counts; all are recorded. FLOPs: three products per weight matrix per image
(``flops_per_sample()``), against an SGEMM measured in the same child.

Rows go to bench/results/peers.csv (benchmark ``finetune_epoch``: earlier rows from the
same machine and code path are replaced) and bench/results/finetune_speed.md. Needs
PyTorch for the peer (``make bench-peers``).
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

from bench.common import ONE_PROCESS, machine_columns, time_calls  # noqa: E402
from bench.epoch_peers import TorchPeer, epoch_call, run_and_publish, sgemm_gflops, table_head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BENCHMARK = "finetune_epoch"
SIZES = [784, 1000, 500, 250, 30]
NETWORK = "784-1000-500-250-30-250-500-1000-784 sigmoid, linear code, pixel cross-entropy"
NAMES = {"aepar8": "aepar (numba kernels, 8 blocks: the same weights on 1-8 ranks)",
         "aepar1": "aepar (numba kernels, 1 block: one process only)",
         "torch": "pytorch (torch.nn.Linear, binary_cross_entropy_with_logits, torch.optim.Adam)"}
CHILD_TAG = "FINETUNE-SPEED "


def load_rows(rows: int) -> tuple[np.ndarray, str]:
    """The first ``rows`` Fashion-MNIST training images when installed (``make fashion``),
    else the embedded MNIST 5k subset (train, then test)."""
    from aepar.data.sources import load_digits
    from bench.stacked import fashion_installed

    name = "fashion" if fashion_installed() else "mnist5k"
    d = load_digits(name, seed=0, dtype=np.float32)
    x = d.train_x if name == "fashion" else np.concatenate([d.train_x, d.test_x])
    if rows > x.shape[0]:
        raise SystemExit(f"bench.finetune_speed: --rows {rows}: {name} has {x.shape[0]} images")
    return np.ascontiguousarray(x[:rows]), f"{name} train[:{rows}]"


class TorchUnrolled(TorchPeer):
    """The same network, loss and optimiser in PyTorch, from the aepar model's weights."""

    def __init__(self, model, threads: int, seed: int = 0, device: str = "cpu", fused: bool = False):
        import torch
        from torch import nn

        torch.set_num_threads(int(threads))
        self.torch, self.device = torch, device
        host = {k: model.be.to_host(v) for k, v in model.params.items()}
        self.linears = []
        for i in range(model.n_layers):
            lin = nn.Linear(model.dims[i], model.dims[i + 1])
            with torch.no_grad():  # aepar's W_i is (in, out); torch keeps (out, in)
                lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(host[f"W{i + 1}"].T)))
                lin.bias.copy_(torch.from_numpy(np.asarray(host[f"b{i + 1}"])))
            self.linears.append(lin.to(device))
        self.acts = list(model.acts)
        self.opt = torch.optim.Adam([p for lin in self.linears for p in lin.parameters()], lr=1e-3,
                                    **({"fused": True} if fused else {}))
        self.batch, self.shape = model.batch, (model.dims[0],)
        self.gen = torch.Generator().manual_seed(seed)

    def _logits(self, x):
        for lin, act in zip(self.linears, self.acts):
            x = lin(x)
            if act == "sigmoid":
                x = self.torch.sigmoid(x)
        return x

    def summed_loss(self, xb):
        """Pixel cross-entropy from the logits, summed over the images."""
        return self.torch.nn.functional.binary_cross_entropy_with_logits(self._logits(xb), xb, reduction="sum")


def aepar_epoch(x, blocks: int, be=None, batch: int = 100, first_epoch: int = 0):
    """(model, a call that trains one epoch of it on ``x``: :func:`bench.epoch_peers.epoch_call`)
    of aepar's unrolled autoencoder, on the backend ``be`` (default: the numba kernels, float32)."""
    from aepar import backend
    from aepar.models.stacked import StackedAutoencoder
    from aepar.optim import Adam

    be = be or backend.select("cpu", "numba", "float32")
    model = StackedAutoencoder(be, SIZES, loss="xent", seed=0, batch=batch)
    return model, epoch_call(model, Adam(be, model.params, lr=1e-3), x, blocks, first_epoch)


def child(args) -> int:
    """Time this process's thread count (AEPAR_THREADS) and print one JSON line."""
    threads = aepar.THREADS
    x, what = load_rows(args.rows)
    load_before = os.getloadavg()[0]
    peak0, method = sgemm_gflops(threads)
    runners = {}
    model, runners["aepar8"] = aepar_epoch(x, 8)
    _, runners["aepar1"] = aepar_epoch(x, 1)
    for run in runners.values():
        run()  # warm-up (epoch 0): JIT (cached), buffers
    if args.torch:
        try:
            peer = TorchUnrolled(model, threads)
        except ImportError:
            peer = None
        if peer is not None:
            peer.train_epoch(x)  # warm-up
            runners["torch"] = lambda: peer.train_epoch(x)
    times = {k: list(t.samples) for k, t in time_calls(runners, args.repeats, warmup=0).items()}
    peak1, _ = sgemm_gflops(threads)
    machine = machine_columns(mpi=ONE_PROCESS, threads=threads)
    print(CHILD_TAG + json.dumps({
        "times": times, "data": what, "samples": int(x.shape[0]), "threads": threads,
        "flops_per_sample": model.flops_per_sample(), "sgemm": max(peak0, peak1), "sgemm_method": method,
        "load_1min": [load_before, os.getloadavg()[0]], "machine": machine,
        "torch_missing": args.torch and "torch" not in times}), flush=True)
    return 0


def markdown(results: list[dict], rows: list[dict]) -> str:
    m = rows[0]
    lines = table_head("One fine-tuning epoch: aepar (Numba kernels) vs PyTorch on the CPU",
                       "bench.finetune_speed", m) + [
        f"Network: {NETWORK}; float32, batch 100, Adam lr 1e-3, {m['data']}. "
        f"{float(m['gflop_per_epoch']):.1f} GFLOP per epoch (three products per weight matrix).", "",
        f"Each thread count in its own process; warm-up epoch each, then {m['repeats']} epochs each in turns; "
        "best shown (all in peers.csv). SGEMM: float32 2000x2000 product at the same thread count, same run.", "",
        "| threads | implementation | seconds / epoch (best) | median | GFLOP/s | of SGEMM | seconds / aepar 8 blocks |",
        "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['description']} | {r['seconds']} | {r['median_seconds']} | "
                     f"{r['gflops']} | {float(r['fraction_of_peak']):.1%} | {r['seconds_over_aepar']} |")
    if any(res.get("torch_missing") for res in results):
        lines += ["", "PyTorch is not installed (`make bench-peers`): its rows are missing."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.finetune_speed", description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="thread counts, one process each (default %(default)s)")
    p.add_argument("--rows", type=int, default=10000, help="images per epoch (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed epochs per implementation (default %(default)s)")
    p.add_argument("--no-torch", action="store_true", help="aepar only")
    p.add_argument("--out", default=str(RESULTS / "peers.csv"), help="CSV to merge into (default %(default)s)")
    p.add_argument("--md", default=str(RESULTS / "finetune_speed.md"), help="markdown table (default %(default)s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.torch = not args.no_torch
        return child(args)
    threads = [int(v) for v in args.threads.split(",")]

    def extra_for(t):
        return ["--rows", str(args.rows), "--repeats", str(args.repeats)] + (["--no-torch"] if args.no_torch else [])
    return run_and_publish("bench.finetune_speed", CHILD_TAG, threads, extra_for, benchmark=BENCHMARK, names=NAMES,
                           network=NETWORK, reference="aepar8", out=args.out, md=args.md, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
