"""What the epoch-against-PyTorch benchmarks share (bench.cae_speed, bench.finetune_speed):
aepar's epoch as a call to time, one child process per thread count, the SGEMM rate
measured beside the epochs, and the rows they merge into peers.csv.

Each benchmark's child prints one line ``TAG {json}`` with ``times`` ({key: [seconds]}),
``flops_per_sample``, ``samples``, ``data``, ``sgemm``, ``sgemm_method``, ``load_1min`` and
``machine``; the driver turns it into rows with :func:`peer_rows`.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import fastest, merge_rows, time_call

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["sgemm_gflops", "epoch_call", "TorchPeer", "run_child", "peer_rows", "table_head", "run_and_publish"]


def sgemm_gflops(threads: int, n: int = 2000, repeats: int = 5) -> tuple[float, str]:
    """Best-of-``repeats`` rate of an n x n float32 product at ``threads`` BLAS threads.

    threadpoolctl sets OpenBLAS's threads for the measurement (aepar keeps them at 1);
    without it, ``threads`` Python threads run one single-threaded product each at once,
    aepar's own way of using the cores, and their rates add up. Returns (GFLOP/s, method).
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None or threads == 1:
        c = np.empty((n, n), dtype=np.float32)
        if threadpool_limits is None:
            seconds = time_call(lambda: np.matmul(a, b, out=c), repeats).seconds
            return 2.0 * n ** 3 / seconds / 1e9, "numpy matmul, 1 thread"
        with threadpool_limits(limits=threads, user_api="blas"):
            seconds = time_call(lambda: np.matmul(a, b, out=c), repeats).seconds
        return 2.0 * n ** 3 / seconds / 1e9, f"numpy matmul {n}x{n}, {threads} BLAS threads (threadpoolctl)"
    from concurrent.futures import ThreadPoolExecutor

    outs = [np.empty((n, n), dtype=np.float32) for _ in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        seconds = time_call(lambda: list(pool.map(lambda c: np.matmul(a, b, out=c), outs)), repeats).seconds
    return threads * 2.0 * n ** 3 / seconds / 1e9, f"{threads} concurrent 1-thread numpy matmuls {n}x{n}"


def epoch_call(model, optimizer, x, blocks: int, first_epoch: int = 0):
    """A call that trains one data-parallel epoch of ``model`` on the rows ``x`` cut into
    ``blocks`` blocks, in this process: epochs ``first_epoch``, then the next, and so on
    (the epoch number sets the shuffle). On a GPU, time it with ``sync=model.be.synchronize``."""
    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import Shard

    shard = Shard.of(model.be, x, blocks)
    epochs = itertools.count(first_epoch)
    return lambda: train_epoch(model, shard, next(epochs), optimizer=optimizer)


class TorchPeer:
    """A PyTorch model trained the way aepar trains its own: minibatches of ``batch`` rows
    in a shuffled order, the summed loss divided by the batch, one optimiser step each.
    Subclasses set ``torch``, ``opt``, ``batch``, ``gen`` and ``shape`` (a row's shape as
    the network takes it) and give :meth:`summed_loss`; ``device`` ("cpu" unless set) is
    where the network lives, and the rows go there (a tensor already there stays)."""

    device = "cpu"

    def summed_loss(self, xb):
        """The loss of a batch summed over its images (targets are the inputs)."""
        raise NotImplementedError

    def train_epoch(self, x) -> float:
        """One epoch over rows ``x``; the mean over images of the summed loss."""
        torch = self.torch
        xt = (x if torch.is_tensor(x) else torch.from_numpy(x)).to(self.device)
        xt = xt.reshape((x.shape[0],) + tuple(self.shape))
        n, total = xt.shape[0], torch.zeros((), dtype=torch.float64, device=self.device)
        perm = torch.randperm(n, generator=self.gen).to(self.device)  # one copy, not one per batch
        for start in range(0, n, self.batch):
            xb = xt[perm[start:start + self.batch]]
            self.opt.zero_grad(set_to_none=True)
            loss = self.summed_loss(xb)
            (loss / xb.shape[0]).backward()
            self.opt.step()
            total += loss.detach()
        return float(total) / n


def run_child(module: str, tag: str, threads: int, extra: list[str]) -> dict:
    """Run ``python -m module --child *extra`` at ``threads`` threads (AEPAR_THREADS) and
    return the JSON of its ``tag`` line."""
    env = dict(os.environ, AEPAR_THREADS=str(threads))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env.pop(var, None)  # aepar sets them from AEPAR_THREADS
    proc = subprocess.run([sys.executable, "-m", module, "--child", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag)]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{module}: the child at {threads} thread(s) failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(found[-1][len(tag):])


def peer_rows(res: dict, benchmark: str, names: dict, network: str, reference: str) -> list[dict]:
    """peers.csv rows of one child's result: the fastest and the median seconds, GFLOP/s
    against the SGEMM rate, and seconds over aepar's default (the ``reference`` key's) in
    ``seconds_over_aepar``."""
    flop = res["flops_per_sample"] * res["samples"]
    best = {k: fastest(ts) for k, ts in res["times"].items()}
    out = []
    for k, ts in res["times"].items():
        gflops = flop / best[k] / 1e9
        out.append({
            "benchmark": benchmark, "implementation": k, "description": names[k], "network": network,
            "data": res["data"], "samples": res["samples"], "batch": 100, "dtype": "float32",
            "seconds": f"{best[k]:.4f}", "median_seconds": f"{float(np.median(ts)):.4f}",
            "repeats": len(ts), "all_seconds": " ".join(f"{v:.3f}" for v in ts),
            "gflop_per_epoch": f"{flop / 1e9:.3f}", "gflops": f"{gflops:.2f}",
            "sgemm_peak_gflops": f"{res['sgemm']:.2f}", "fraction_of_peak": f"{gflops / res['sgemm']:.3f}",
            "sgemm_method": res["sgemm_method"], "seconds_over_aepar": f"{best[k] / best[reference]:.3f}",
            "load_1min": " ".join(f"{v:.2f}" for v in res["load_1min"]), **res["machine"]})
    return out


def table_head(title: str, module: str, row: dict) -> list[str]:
    """The first lines of a benchmark's markdown: title and the machine it ran on."""
    return [f"# {title}", "",
            f"Measured {time.strftime('%Y-%m-%d')} by `python -m {module}` on {row['cpu_model']} ({row['isa']}), "
            f"{row['cores']} cores, {row['blas']} ({row['blas_coretype'] or 'core type unknown'}), numba {row['numba']}"
            + (f", torch {row['torch']}" if row.get("torch") else "") + ".", ""]


def run_and_publish(module: str, tag: str, threads: list[int], extra_for, *, benchmark: str, names: dict,
                    network: str, reference: str, out, md, markdown) -> int:
    """The driver: a child per thread count (``extra_for(t)``: its arguments), a line per
    implementation as each ends, then the rows merged into ``out`` (peers.csv) and
    ``markdown(results, rows)`` written to ``md``."""
    results = []
    for t in threads:
        res = run_child(module, tag, t, extra_for(t))
        results.append(res)
        for key, ts in res["times"].items():
            print(f"{t} thread(s)  {names[key]:78s} best {fastest(ts):.3f} s  ({' '.join(f'{v:.3f}' for v in ts)})",
                  flush=True)
    rows = [r for res in results for r in peer_rows(res, benchmark, names, network, reference)]
    merge_rows(rows, Path(out), benchmark)
    text = markdown(results, rows)
    Path(md).write_text(text)
    print(text)
    return 0
