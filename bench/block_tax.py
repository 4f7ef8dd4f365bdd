"""The price of the same bits on any rank count, per workload and CPU:
``python -m bench.block_tax`` (``make bench-block-tax``).

aepar's default cuts every batch into 8 fixed blocks and adds their gradients in one fixed
tree, so 1 to 8 ranks train the same weights bit for bit. This benchmark measures what
that costs and where aepar stands against PyTorch, side by side in one run on one CPU:

- workloads: the CD-1 epoch of the stack's 784x1000 RBM layer (``rbm``), the 784x1000
  tied autoencoder layer (``ae``), one fine-tuning epoch of the unrolled
  784-1000-500-250-30 autoencoder (``finetune``), one epoch of the convolutional
  autoencoder (``cae``) and one CD-1 epoch of every RBM of the 784-1000-500-250-30 stack, each
  on the rows the layer below gives (``greedy``: greedy pre-training's work per epoch;
  Bernoulli hidden units throughout, as the PyTorch peer has no Gaussian layer), and each
  of the stack's upper RBMs alone (``rbm1000x500``, ``rbm500x250``, ``rbm250x30``), and the
  top layer of the stack of autoencoder layers alone (``ae250x30``, identity code units, on
  the rows the autoencoder layers below give), float32,
  batch 100 (``--batch``: larger batches make longer blocks, 125 rows each at 1000), on the
  embedded MNIST digits (or the first ``--rows`` Fashion-MNIST images when installed:
  ``make fashion``);
- for each: aepar with the default 8 blocks, aepar with the batch as one block (one
  process only: no guarantee across rank counts), and the PyTorch peers of bench/
  (``bench.torch_rbm``'s careful and plain styles for the layers, ``bench.finetune_speed``
  and ``bench.cae_speed``'s networks), all timed in turns (``bench.common.time_calls``),
  the fastest of ``--repeats`` epochs counting;
- each thread count in its own process (AEPAR_THREADS, ``torch.set_num_threads``), with an
  SGEMM rate measured before and after the epochs in that process.

Rows (one per workload, thread count, batch and implementation, with the machine: CPU,
ISA, BLAS) are merged into ``bench/results/block_tax.csv`` per machine; ``block_tax.md`` is
rebuilt from every machine's rows there, a table per machine and batch: the 8-block/1-block
ratio (target <= 1.10) and 8 blocks against the faster PyTorch peer (target <= 1.00) per
workload.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("AEPAR_THREADS", "1")

import aepar  # noqa: E402,F401  (threads before numpy)
import numpy as np  # noqa: E402

from aepar.cli import positive_int  # noqa: E402
from bench.common import KEY, ONE_PROCESS, fastest, machine_columns, merge_rows, read_rows, time_calls  # noqa: E402
from bench.epoch_peers import run_child, sgemm_gflops  # noqa: E402
from bench.finetune_speed import load_rows  # noqa: E402  (Fashion-MNIST if installed, else the digits)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BENCHMARK = "block_tax"
CHILD_TAG = "BLOCK-TAX "
STACK = (784, 1000, 500, 250, 30)  # the greedy workload's layers
# the stack's upper RBMs one at a time, each on the rows the layers below give (the first is "rbm"):
# a narrow layer's epoch is mostly the work around its small products, which the whole stack hides
LAYERS = {f"rbm{a}x{b}": i for i, (a, b) in enumerate(zip(STACK[:-1], STACK[1:])) if i}
# the autoencoder stack's top layer: its identity code units take other kernels than the sigmoid ones
AE_LAYERS = {f"ae{STACK[-2]}x{STACK[-1]}": len(STACK) - 2}
WORKLOADS = ("rbm", "ae", "finetune", "cae", "greedy", *LAYERS, *AE_LAYERS)
TITLES = {"rbm": "CD-1 epoch, 784x1000 RBM layer", "ae": "epoch, 784x1000 autoencoder layer",
          "finetune": "fine-tuning epoch, 784-1000-500-250-30 unrolled", "cae": "CAE epoch, 28x28 16/32 filters",
          "greedy": "greedy pre-training epoch, 784-1000-500-250-30 RBMs",
          **{name: f"CD-1 epoch, {name[3:]} RBM layer of the stack" for name in LAYERS},
          **{name: f"epoch, {name[2:]} autoencoder top layer of the stack (identity code)" for name in AE_LAYERS}}
# what the ratios are held to (issue: the 8-block epoch within 1.10x of one block, and at
# least as fast as the faster PyTorch peer)
TAX_TARGET, PEER_TARGET = 1.10, 1.00
BATCH = 100  # the seed's recipe
EIGHT, ONE = "aepar, 8 blocks", "aepar, 1 block"


def workload_epochs(workload: str, x, threads: int, torch: bool, batch: int = BATCH) -> tuple[dict, float]:
    """({implementation: a call that trains one epoch}, FLOPs per image) of one workload at
    ``batch`` rows a step, each implementation warmed up by one epoch."""
    if workload in ("rbm", "ae"):
        from bench.stacked import AEPAR_NAME, ONE_BLOCK_NAME, TORCH_NAMES, layer_epochs

        epochs, model = layer_epochs(x, tuple(TORCH_NAMES) if torch else (), numpy_peer=False, batch=batch,
                                     layer=workload, threads=threads)
        names = {AEPAR_NAME: EIGHT, ONE_BLOCK_NAME: ONE}
        names.update({v: f"pytorch {k}" for k, v in TORCH_NAMES.items()})
        return {names[k]: fn for k, fn in epochs.items()}, model.flops_per_sample()
    if workload == "greedy" or workload in LAYERS:
        return greedy_epochs(x, threads, torch, LAYERS.get(workload), batch)
    if workload in AE_LAYERS:
        return greedy_epochs(x, threads, torch, AE_LAYERS[workload], batch, kind="ae")
    if workload == "finetune":
        from bench.finetune_speed import TorchUnrolled as Peer
        from bench.finetune_speed import aepar_epoch
    else:
        from bench.cae_speed import TorchCAE as Peer
        from bench.cae_speed import aepar_epoch
    model, eight = aepar_epoch(x, 8, batch=batch)
    _, one = aepar_epoch(x, 1, batch=batch)
    epochs = {EIGHT: eight, ONE: one}
    if torch:
        try:
            peer = Peer(model, threads)
        except ImportError:
            peer = None
        if peer is not None:
            epochs["pytorch"] = lambda: peer.train_epoch(x)
    for fn in epochs.values():
        fn()  # warm-up: JIT (cached), buffers, BLAS
    return epochs, model.flops_per_sample()


def greedy_epochs(x, threads: int, torch: bool, only: int | None = None, batch: int = BATCH,
                  kind: str = "rbm") -> tuple[dict, float]:
    """:func:`workload_epochs` of ``greedy``: one CD-1 epoch of every layer of :data:`STACK`,
    in order, each layer on its own input rows (``only``: of that layer alone, one of
    :data:`LAYERS`; ``kind="ae"``: autoencoder layers, the top one with identity code units,
    as ``--pretrainer ae`` stacks them). The upper layers' rows are made once, untimed, by
    the 8-block aepar layers after their warm-up epoch, and every implementation trains on
    the same rows."""
    from aepar import backend
    from aepar.models.ae_layer import AELayer
    from aepar.models.rbm import RBM
    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import DEFAULT_BLOCKS, Shard
    from bench import torch_rbm

    be = backend.select("cpu", "numba", "float32")
    shapes = list(zip(STACK[:-1], STACK[1:]))
    top = len(shapes) - 1

    def layers():  # the RBM's defaults are the seed's recipe (Bernoulli units)
        if kind == "rbm":
            return [RBM(be, n_in, n_out, batch=batch, seed=i, layer_index=i) for i, (n_in, n_out) in enumerate(shapes)]
        return [AELayer(be, n_in, n_out, batch=batch, seed=i, layer_index=i,
                        hidden="gaussian" if i == top else "bernoulli") for i, (n_in, n_out) in enumerate(shapes)]

    chosen = range(len(shapes)) if only is None else [only]
    stacks = {EIGHT: (layers(), DEFAULT_BLOCKS), ONE: (layers(), 1)}
    inputs, rows = [], x
    # warm-up epochs (JIT, buffers) and the rows of the layer above, up to the last layer timed
    for layer in stacks[EIGHT][0][:chosen[-1] + 1]:
        inputs.append(rows)
        train_epoch(layer, Shard.of(be, rows, DEFAULT_BLOCKS), 0)
        rows = np.ascontiguousarray(layer.transform(Shard.of(be, rows, DEFAULT_BLOCKS)).x)
    for i in chosen:
        train_epoch(stacks[ONE][0][i], Shard.of(be, inputs[i], 1), 0)
    epochs = {}
    for name, (stack, blocks) in stacks.items():
        shards = [Shard.of(be, rows, blocks) for rows in inputs]

        def epoch(stack=stack, shards=shards, counter=itertools.count(6)):  # past the momentum switch
            e = next(counter)
            for i in chosen:
                train_epoch(stack[i], shards[i], e)
        epochs[name] = epoch
    if torch and torch_rbm.available():
        for style in torch_rbm.STYLES:
            peers = {i: torch_rbm.TorchRBM(*shapes[i], batch=batch, threads=threads, seed=i, style=style)
                     if kind == "rbm" else
                     torch_rbm.TorchAE(*shapes[i], batch=batch, threads=threads, seed=i, style=style,
                                       code="identity" if i == top else "sigmoid")
                     for i in chosen}

            def epoch(peers=peers):
                for i in chosen:
                    peers[i].train_epoch(inputs[i])
            epoch()  # warm-up
            epochs[f"pytorch {style}"] = epoch
    return epochs, sum(stacks[EIGHT][0][i].flops_per_sample() for i in chosen)


def child(args) -> int:
    """Time every workload at this process's thread count; print one JSON line."""
    threads = aepar.THREADS
    x, what = load_rows(args.rows)
    load_before = os.getloadavg()[0]
    sgemm0, method = sgemm_gflops(threads)
    results = {}
    for workload in args.workloads.split(","):
        epochs, flops = workload_epochs(workload, x, threads, args.torch, args.batch)
        times = time_calls(epochs, args.repeats, warmup=0)
        results[workload] = {"times": {k: list(t.samples) for k, t in times.items()}, "flops_per_sample": flops}
    sgemm1, _ = sgemm_gflops(threads)
    machine = machine_columns(mpi=ONE_PROCESS, threads=threads)
    print(CHILD_TAG + json.dumps({
        "results": results, "data": what, "samples": int(x.shape[0]), "threads": threads, "batch": args.batch,
        "sgemm": max(sgemm0, sgemm1), "sgemm_method": method,
        "load_1min": [load_before, os.getloadavg()[0]], "machine": machine}), flush=True)
    return 0


def rows_of(res: dict, date: str, command: str) -> list[dict]:
    """block_tax.csv rows of one child's result: one per workload and implementation, with
    the ratios to aepar's 8-block epoch."""
    out = []
    for workload, r in res["results"].items():
        best = {k: fastest(ts) for k, ts in r["times"].items()}
        flop = r["flops_per_sample"] * res["samples"]
        for impl, ts in r["times"].items():
            out.append({
                "workload": workload, "implementation": impl, "data": res["data"], "samples": res["samples"],
                "batch": res["batch"], "dtype": "float32", "seconds": f"{best[impl]:.4f}",
                "median_seconds": f"{float(np.median(ts)):.4f}", "repeats": len(ts),
                "all_seconds": " ".join(f"{v:.3f}" for v in ts),
                "over_aepar_8_blocks": f"{best[impl] / best[EIGHT]:.3f}",
                "gflops": f"{flop / best[impl] / 1e9:.2f}", "sgemm_peak_gflops": f"{res['sgemm']:.2f}",
                "fraction_of_sgemm": f"{flop / best[impl] / 1e9 / res['sgemm']:.3f}",
                "sgemm_method": res["sgemm_method"], "date": date, "command": command,
                "load_1min": " ".join(f"{v:.2f}" for v in res["load_1min"]), **res["machine"]})
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Per machine, batch, workload and thread count: the 8-block and 1-block seconds, the
    faster PyTorch peer's, and the two ratios with their targets."""
    groups = {}
    for r in rows:
        batch = int(r["batch"])
        groups.setdefault((r["cpu_model"], r["isa"], r["blas"], batch, r["workload"], str(r["threads"])), {})[
            r["implementation"]] = r
    out = []
    for (cpu, isa, blas, batch, workload, threads), impls in groups.items():
        if EIGHT not in impls or ONE not in impls:
            continue
        eight, one = float(impls[EIGHT]["seconds"]), float(impls[ONE]["seconds"])
        peers = {k: float(v["seconds"]) for k, v in impls.items() if k.startswith("pytorch")}
        peer = min(peers, key=peers.get) if peers else None
        out.append({"cpu": cpu, "isa": isa, "blas": blas, "batch": batch, "workload": workload, "threads": threads,
                    "eight": eight, "one": one, "tax": eight / one, "peer": peer,
                    "peer_seconds": peers.get(peer), "vs_peer": eight / peers[peer] if peer else None,
                    "of_sgemm": float(impls[EIGHT]["fraction_of_sgemm"]),
                    "peer_of_sgemm": float(impls[peer]["fraction_of_sgemm"]) if peer else None,
                    "date": impls[EIGHT].get("date", ""), "command": impls[EIGHT].get("command", "")})
    return out


def _seconds(v: float) -> str:
    """An epoch's seconds for the table: three decimals, four below a tenth of a second
    (a narrow layer's epoch takes about 15 ms)."""
    return f"{v:.3f}" if v >= 0.1 else f"{v:.4f}"


def markdown(rows: list[dict]) -> str:
    """block_tax.md from every machine's rows."""
    lines = ["# The price of the same bits: 8 blocks against 1 block and against PyTorch", "",
             "Each workload's epoch with aepar's default 8 blocks (the same weights on 1-8 ranks), with the "
             "batch as one block (one process only), and with the faster PyTorch peer, timed in turns in one "
             "process per thread count; the fastest of the repeats counts (every sample is in "
             "`block_tax.csv`). Targets: 8 blocks / 1 block <= "
             f"{TAX_TARGET:.2f}, 8 blocks / PyTorch <= {PEER_TARGET:.2f}. `of SGEMM`: the 8-block epoch's "
             "GFLOP/s over a float32 2000x2000 SGEMM at the same threads in the same process, and the faster "
             "PyTorch peer's (what a batch's products and the work between them leave of that rate for any "
             "implementation). A table per machine and batch (100, the seed's, unless the heading says "
             "otherwise). aepar's threads "
             "take whole blocks (BLAS single-threaded inside each), so one block runs on one thread at any "
             "thread count.", ""]
    by_machine = {}
    for s in summary(rows):
        by_machine.setdefault((s["cpu"], s["isa"], s["blas"], s["batch"]), []).append(s)
    for (cpu, isa, blas, batch), group in sorted(by_machine.items(), key=lambda kv: kv[0][3]):
        dates = sorted({s["date"] for s in group if s["date"]})
        commands = sorted({s["command"] for s in group if s["command"]})
        lines += [f"## {cpu} ({isa}), {blas}" + ("" if batch == BATCH else f", batch {batch}"), "",
                  f"Measured {', '.join(dates) or '(date not recorded)'} with "
                  f"`{'`, `'.join(commands) or 'python -m bench.block_tax'}`.", "",
                  "| workload | threads | 8 blocks (s) | 1 block (s) | 8 / 1 | faster PyTorch (s) | 8 / PyTorch "
                  "| of SGEMM (PyTorch's) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s in sorted(group, key=lambda s: (WORKLOADS.index(s["workload"]) if s["workload"] in WORKLOADS
                                              else 99, s["threads"])):
            tax = f"{s['tax']:.2f}" + ("" if s["tax"] <= TAX_TARGET else " (over)")
            if s["peer"]:
                peer = f"{_seconds(s['peer_seconds'])} ({s['peer']})"
                vs = f"{s['vs_peer']:.2f}" + ("" if s["vs_peer"] <= PEER_TARGET else " (slower)")
            else:
                peer = vs = "not measured"
            share = f"{s['of_sgemm']:.0%}" + (f" ({s['peer_of_sgemm']:.0%})" if s["peer"] else "")
            lines.append(f"| {TITLES.get(s['workload'], s['workload'])} | {s['threads']} | {_seconds(s['eight'])} | "
                         f"{_seconds(s['one'])} | {tax} | {peer} | {vs} | {share} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.block_tax", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", default="1,2", help="thread counts, one process each")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="which epochs, comma-separated: "
                   + ", ".join(WORKLOADS))
    p.add_argument("--rows", type=positive_int, default=5000, help="images per epoch (at most the data set's)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed epochs per implementation")
    p.add_argument("--batch", type=positive_int, default=BATCH,
                   help="rows a step (8 blocks of a batch of 1000 have 125 rows each)")
    p.add_argument("--no-torch", dest="torch", action="store_false", default=argparse.SUPPRESS,
                   help="aepar only (default: the PyTorch peers too, where PyTorch is installed)")
    p.add_argument("--out", default=str(RESULTS / "block_tax.csv"), help="CSV the rows are merged into")
    p.add_argument("--md", default=str(RESULTS / "block_tax.md"), help="the table, rebuilt from the CSV")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.torch = getattr(args, "torch", True)  # SUPPRESS above: the help states this default in words
    unknown = sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)} (choose from {', '.join(WORKLOADS)})")
    try:
        threads = [positive_int(v) for v in args.threads.split(",")]
    except ValueError:
        p.error(f"--threads: {args.threads!r} is not a list of positive integers")
    if args.child:
        return child(args)
    import datetime

    date = datetime.date.today().isoformat()
    command = "python -m bench.block_tax " + " ".join((argv if argv is not None else sys.argv[1:]))
    extra = ["--rows", str(args.rows), "--repeats", str(args.repeats), "--workloads", args.workloads,
             "--batch", str(args.batch)] + \
        ([] if args.torch else ["--no-torch"])
    rows = []
    for t in threads:
        res = run_child("bench.block_tax", CHILD_TAG, t, extra)
        for workload, r in res["results"].items():
            for impl, ts in r["times"].items():
                print(f"{t} thread(s)  {workload:8s} {impl:18s} best {fastest(ts):.3f} s  "
                      f"({' '.join(f'{v:.3f}' for v in ts)})", flush=True)
        rows += rows_of(res, date, command.strip())
    # a run of some workloads or thread counts replaces those rows of this machine, no others
    merge_rows(rows, Path(args.out), BENCHMARK, key=KEY + ("workload", "threads", "batch"))
    text = markdown([r for r in read_rows(args.out) if r.get("benchmark") == BENCHMARK])
    Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
