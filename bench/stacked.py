"""Stacked-autoencoder benchmark: ``python -m bench.stacked --quick|--full``.

Writes into bench/results/ (every figure says whether it was MEASURED here or SIMULATED):

- rbm_epoch.csv: one CD-1 epoch of the stack's first layer, the 784x1000 Bernoulli RBM
  (batch 100, float32, the seed's recipe, momentum 0.9), on the first 50,000
  Fashion-MNIST training images when installed (else the run's own training rows, and
  it says so): aepar's RBM, the same model on aepar's NumPy reference kernels (the
  straightforward NumPy version) and the PyTorch peers of bench/torch_rbm.py ("plain",
  the same loop written plainly, and "careful", hand-tuned to be as hard to beat as we
  could make it) side by side in one process per thread count (1
  and 2: AEPAR_THREADS there, torch.set_num_threads), a warm-up epoch each, then the best
  of 3 epochs taken in turns; ratio = this row's seconds / aepar's (> 1: aepar faster).
  Rows carry the machine columns and the load average before/after. Measured.
  ``--rbm-only`` runs just this part (``--rbm-threads``, ``--rbm-rows``, ``--rbm-repeats``;
  ``--rbm-hidden`` and ``--rbm-batch`` for the issue's other shapes, 784x2000 and batch 5000;
  ``--rbm-layer ae`` times the autoencoder layer of ``--pretrainer ae`` instead, against
  bench/torch_rbm.py's TorchAE: rows with layer "784xN autoencoder").
Files other than rbm_epoch.csv carry the configuration in their name (_quick, _full).

- stage_times.json: every layer's epoch and transform time on one core (the greedy
  schedule's pieces). Measured.
- makespan.csv: greedy (sum) vs synchronized makespan for 1-16 ranks, both hand-over
  modes, and data-parallel greedy on the same ranks (bench/makespan.py). Simulated from stage_times.json, because this 2-core
  machine cannot give every stage its own core; plus the measured rows below.
- sync_measured.csv and handover.csv: ``mpirun -np 2|4 python -m aepar.sync`` pre-training
  wall times here, and per hand-over bytes and seconds against epoch time, for both
  modes. Measured (4 ranks on 2 cores are oversubscribed: the waiting stages sleep).
- quality.csv: error per digit of PCA-30, greedy and sync after fine-tuning, from one
  ``aepar.sync`` run with --compare-greedy per seed of ``--seeds`` (quick: mnist5k; full:
  Fashion-MNIST, 20 + 10 epochs), and their mean and half the range. ``--reuse`` reads a
  seed's finished run instead of running it again where its options are today's. Measured.
- stacked_quick.md / stacked_full.md: all of the above as tables.

The jobs' own run directories and logs go to runs/bench_stacked/.

Single-process timings use one thread (AEPAR_THREADS overrides); the MPI jobs let aepar
give each rank cores / ranks threads. --quick takes a few minutes on 2 cores; --full (Fashion-MNIST, ``apt-get install
dataset-fashion-mnist``) takes about an hour.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# One thread per process unless AEPAR_THREADS says otherwise: on a small machine busy with
# other work, multithreaded kernels (Numba's and PyTorch's alike) time the contention.
os.environ.setdefault("AEPAR_THREADS", "1")

import aepar  # noqa: E402,F401  (threads before numpy)
import numpy as np  # noqa: E402

from aepar.report.stacked import recipe  # noqa: E402
from bench.common import (KEY, fastest, machine_columns, merge_rows, mpi_env, over_seeds, python_command,  # noqa: E402
                          time_call, time_calls, with_machine, write_rows)
from bench.torch_rbm import LAYERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

CONFIGS = {
    "quick": {"dataset": "mnist5k", "preset": "quick", "epochs": 10, "val_fraction": 0.1, "limit": None,
              "ranks": (2, 4)},
    "full": {"dataset": "fashion", "preset": "full", "epochs": 20, "val_fraction": 1 / 6, "limit": None,
             "ranks": (2, 4)},
}


def _write_csv(path, rows):
    """Rows to ``path``, each with the machine columns (a row's own values win)."""
    return write_rows(path, with_machine(rows, machine_columns()), digits=5)


# ---- one CD-1 epoch: aepar vs PyTorch ------------------------------------------------------
RBM_ROWS = 50_000          # the size: 50k Fashion-MNIST training images
RBM_THREADS = (1, 2)
RBM_HIDDEN, RBM_BATCH = 1000, 100  # the stack's first layer and the seed's batch
AEPAR_NAME = "aepar (numba kernels, 8 blocks: bit-identical on 1-8 ranks)"
ONE_BLOCK_NAME = "aepar (numba kernels, 1 block: one process only)"
NUMPY_NAME = "numpy straightforward (aepar's reference kernels)"
TORCH_NAMES = {"careful": "pytorch careful (bench/torch_rbm.py)", "plain": "pytorch plain (bench/torch_rbm.py)"}


def torch_styles(skip: str) -> list[str]:
    """The PyTorch peers that ``--skip`` leaves in (it names them rbm-careful, rbm-plain)."""
    return [style for style in TORCH_NAMES if f"rbm-{style}" not in skip]


def rbm_data(spec: str):
    """(x float32, description) for a ``--rbm-child-data`` spec: ``fashion:N`` (the first N
    Fashion-MNIST training images) or the path of a .npy file of rows."""
    if spec.startswith("fashion:"):
        from aepar.data.sources import load_digits

        x = load_digits("fashion", seed=0, dtype=np.float32).train_x[:int(spec.split(":", 1)[1])]
        return np.ascontiguousarray(x), f"fashion-mnist train[:{x.shape[0]}]"
    return np.ascontiguousarray(np.load(spec), dtype=np.float32), None


def fashion_installed() -> bool:
    from aepar.data.sources import FASHION_DIR, _idx_set

    return FASHION_DIR.is_dir() and _idx_set(FASHION_DIR, required=False) is not None


def layer_epochs(x, styles=tuple(TORCH_NAMES), numpy_peer=True, hidden=RBM_HIDDEN, batch=RBM_BATCH,
                 layer="rbm", threads=None) -> tuple[dict, object]:
    """({implementation: a call that trains one epoch on ``x``}, aepar's model) for one
    process: aepar's 784 x ``hidden`` Bernoulli RBM (by default the stack's first layer;
    ``layer="ae"``: the autoencoder layer) with the seed's recipe at ``batch``, with the
    default 8 blocks and with the batch as one block, the same model on aepar's NumPy
    reference kernels (the issue's "straightforward NumPy version") and the PyTorch peers
    at ``threads`` (default aepar's), each after a warm-up epoch on 500 rows."""
    from aepar import backend
    from aepar.models.ae_layer import AELayer
    from aepar.models.rbm import RBM
    from bench import torch_rbm

    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import DEFAULT_BLOCKS, Shard

    model, peer = (RBM, torch_rbm.TorchRBM) if layer == "rbm" else (AELayer, torch_rbm.TorchAE)
    made = []

    def rbm(kernels, blocks=DEFAULT_BLOCKS):
        be = backend.select("cpu", kernels, "float32")
        trained = model(be, 784, hidden, hidden="bernoulli", lr=0.1, weight_cost=2e-4, momentum=(0.5, 0.9),
                        momentum_switch_epoch=5, batch=batch, seed=0, layer_index=0)
        made.append(trained)
        train_epoch(trained, Shard.of(be, x[:warm], blocks), 0)  # warm-up: JIT, BLAS buffers
        xb = Shard.of(be, x, blocks)
        epochs = itertools.count(6)  # past the momentum switch (0.9), like most of a run
        return lambda: train_epoch(trained, xb, next(epochs))

    warm = min(x.shape[0], max(500, 2 * batch))  # at least two full steps
    # the price of rank-independent sums: the same epoch with the batch as one block
    epochs = {AEPAR_NAME: rbm("numba"), ONE_BLOCK_NAME: rbm("numba", 1)}
    if numpy_peer:
        epochs[NUMPY_NAME] = rbm("numpy")
    if styles and torch_rbm.available():  # importing torch alone takes 1.5-2 s
        for style in styles:
            torch_layer = peer(784, hidden, batch=batch, threads=threads or aepar.THREADS, seed=0, style=style)
            torch_layer.train_epoch(x[:warm])
            epochs[TORCH_NAMES[style]] = lambda torch_layer=torch_layer: torch_layer.train_epoch(x)
    return epochs, made[0]


def rbm_epoch_here(x, repeats=3, styles=tuple(TORCH_NAMES), numpy_peer=True, hidden=RBM_HIDDEN,
                   batch=RBM_BATCH, layer="rbm") -> dict:
    """:func:`layer_epochs`' epochs timed in ``repeats`` rounds of one epoch each,
    interleaved (aepar, numpy, torch, ...) so that load from other users hits them alike.
    Returns {implementation: [seconds]}."""
    epochs, _ = layer_epochs(x, styles, numpy_peer, hidden, batch, layer)
    return {name: list(t.samples) for name, t in time_calls(epochs, repeats, warmup=0).items()}


def _rbm_child(args) -> int:
    """``--rbm-child``: time this process's thread count (AEPAR_THREADS, read when aepar was
    imported) and print the result as one JSON line for :func:`rbm_epoch`."""
    x, what = rbm_data(args.rbm_child_data)
    load_before = os.getloadavg()[0]
    times = rbm_epoch_here(x, args.rbm_repeats, torch_styles(args.skip), numpy_peer="rbm-numpy" not in args.skip,
                           hidden=args.rbm_hidden, batch=args.rbm_batch, layer=args.rbm_layer)
    # thread-pool settings that change how the two runtimes share the cores (OpenBLAS's
    # workers spin 2**OPENBLAS_THREAD_TIMEOUT cycles after each call, default 2**28)
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT") if k in os.environ)
    machine = machine_columns()
    print("RBM-EPOCH " + json.dumps({"times": times, "data": what or args.rbm_child_what,
                                     "samples": int(x.shape[0]), "load_1min": [load_before, os.getloadavg()[0]],
                                     "env": env, "machine": machine}), flush=True)
    return 0


def rbm_epoch(fallback_x, fallback_name, threads=RBM_THREADS, repeats=3, rows=RBM_ROWS, skip="", hidden=RBM_HIDDEN,
              batch=RBM_BATCH, layer="rbm") -> list[dict]:
    """CD-1 epochs of aepar and PyTorch side by side, one child process per thread count
    (AEPAR_THREADS there, and torch.set_num_threads): rows for rbm_epoch.csv.

    The data are the first ``rows`` Fashion-MNIST training images when installed, else
    ``fallback_x`` (the run's own training rows), and the run says so."""
    import tempfile

    from bench import torch_rbm

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        if fashion_installed():
            spec = f"fashion:{rows}"
        else:
            spec = str(Path(tmp) / "x.npy")
            np.save(spec, np.ascontiguousarray(fallback_x, dtype=np.float32))
            print(f"bench.stacked: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): the "
                  f"rbm epoch runs on {fallback_name}, {fallback_x.shape[0]} rows, not {rows} Fashion rows", flush=True)
        for t in threads:
            env = dict(os.environ, AEPAR_THREADS=str(t))
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
                env.pop(var, None)  # aepar sets them from AEPAR_THREADS
            cmd = [sys.executable, "-m", "bench.stacked", "--rbm-child", "--rbm-repeats", str(repeats),
                   "--rbm-child-data", spec, "--rbm-child-what", f"{fallback_name} ({fallback_x.shape[0]} rows)",
                   "--skip", skip, "--rbm-hidden", str(hidden), "--rbm-batch", str(batch), "--rbm-layer", layer]
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            lines = proc.stdout.splitlines()
            found = [ln for ln in lines if ln.startswith("RBM-EPOCH ")]
            sys.stdout.write("".join(ln + "\n" for ln in lines if not ln.startswith("RBM-EPOCH ")))
            if proc.returncode != 0 or not found:
                raise SystemExit(f"bench.stacked: the rbm epoch at {t} threads failed ({proc.returncode}):\n"
                                 f"{proc.stderr[-3000:]}")
            res = json.loads(found[-1][len("RBM-EPOCH "):])
            ours = fastest(res["times"][AEPAR_NAME])
            for name, ts in res["times"].items():
                out += with_machine([{
                    "implementation": name, "data": res["data"], "samples": res["samples"],
                    "layer": f"784x{hidden} {LAYERS[layer]}", "batch": batch, "dtype": "float32",
                    "seconds": fastest(ts), "ratio": fastest(ts) / ours, "repeats": repeats,
                    "all_seconds": " ".join(f"{v:.3f}" for v in ts),
                    "load_1min": " ".join(f"{v:.2f}" for v in res["load_1min"]), "env": res["env"],
                    "kind": "measured"}], res["machine"])
            if torch_styles(skip) and not torch_rbm.available():
                out += with_machine([{"implementation": "pytorch (not installed: .venv/bin/pip install torch==2.13.0)",
                                      "samples": res["samples"], "kind": "missing"}], res["machine"])
    return out


def rbm_table(rows) -> list[str]:
    md = ["| threads | implementation | samples | seconds (best) | seconds / aepar's (> 1: aepar faster) |",
          "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if "seconds" in r:
            md.append(f"| {r['threads']} | {r['implementation']} | {r['samples']} | {r['seconds']:.3f} | {r['ratio']:.2f} |")
    return md


# ---- per-layer times on one core -------------------------------------------------------------
def stage_times(x_train, x_val, sizes, epochs, extras, batch=100, repeats=2) -> dict:
    """Epoch and transform time of every layer on one core (float32, the greedy schedule)."""
    from aepar import backend
    from aepar.stack import make_layers

    from aepar.parallel.data_parallel import train_epoch
    from aepar.rows import DEFAULT_BLOCKS, Shard

    be = backend.select("cpu", "numba", "float32")
    layers = make_layers(be, sizes, "rbm", seed=0)
    xt, xv = Shard.of(be, x_train, DEFAULT_BLOCKS), Shard.of(be, x_val, DEFAULT_BLOCKS)
    out = []
    for i, layer in enumerate(layers):
        train_epoch(layer, Shard.of(be, be.to_host(xt.x[:batch * 2]), DEFAULT_BLOCKS), 0)  # warm-up
        epoch = itertools.count()
        timing = time_call(lambda: train_epoch(layer, xt, next(epoch)), repeats, warmup=0)
        t0 = time.perf_counter()
        nt, nv = layer.transform(xt), layer.transform(xv)
        tr = time.perf_counter() - t0
        out.append({"layer": i + 1, "n_in": layer.n_in, "n_out": layer.n_out,
                    "flops_per_sample": layer.flops_per_sample(), "epoch_s": timing.seconds,
                    "transform_s": tr, "steps": -(-xt.n // batch),
                    "param_bytes": 4 * (layer.n_in * layer.n_out + layer.n_in + layer.n_out)})
        xt, xv = nt, nv
    return {"kind": "measured", "note": "single process, one thread, float32; epoch = fastest of "
                                        f"{repeats} timed epochs after a warm-up",
            "n_train": int(x_train.shape[0]), "n_val": int(x_val.shape[0]), "batch": batch,
            "epochs": list(epochs), "extras": list(extras), "layers": out, "machine": machine_columns()}


# ---- jobs ---------------------------------------------------------------------------------------
def merge_sections(old: str, new: str) -> str:
    """``new``'s title and "## " sections, with each of ``old``'s sections that ``new`` lacks
    kept where it stood (the parts a run skipped keep their last measurement)."""
    def split(text):
        head, sections = [], []
        for line in text.splitlines():
            if line.startswith("## "):
                sections.append([line])
            elif sections:
                sections[-1].append(line)
            else:
                head.append(line)
        return head, [(lines[0], "\n".join(lines).rstrip("\n")) for lines in sections]
    _, old_sections = split(old)
    head, new_sections = split(new)
    fresh = dict(new_sections)
    merged = [fresh.pop(title, body) for title, body in old_sections]
    merged += [body for title, body in new_sections if title in fresh]  # sections the old file lacked
    return "\n".join(head).rstrip("\n") + "\n\n" + "\n\n".join(merged) + "\n"


def run_sync(np_, out: Path, args: list[str], log: Path) -> dict:
    env = mpi_env(AEPAR_THREADS=None)  # aepar sets threads from the ranks per node
    # the benchmark's own run directories: replaced run after run (a foreign directory is still refused)
    cmd = python_command("aepar.sync", ["--out", out, "--overwrite", "--quiet", *args], np_)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench.stacked: {' '.join(cmd)} failed ({proc.returncode}); see {log}")
    summary = json.loads((out / "summary.json").read_text())
    summary["_wall_s"] = time.perf_counter() - t0
    return summary


def parse_seeds(text: str) -> list[int] | None:
    """``--seeds``'s distinct non-negative integers, or None."""
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        return None
    return seeds if seeds and min(seeds) >= 0 and len(set(seeds)) == len(seeds) else None


def same_recipe(info: dict, args: list[str]) -> bool:
    """Whether a run (its run.json ``info``) started with the options ``aepar.sync args``
    resolves to today: a preset's values may have changed since the run, and its argv
    alone would not show it. Every option counts but the run controls (where it writes,
    what it prints: aepar.rundir.RUN_CONTROL), compared as run.json records them."""
    from aepar.rundir import RUN_CONTROL, started_options
    from aepar.sync import parse_args
    had = info.get("started_options") or {}
    return all(k in had and had[k] == v for k, v in started_options(parse_args(args)).items()
               if k not in RUN_CONTROL)


def quality_run(which, cfg, runs, seed: int, reuse: bool) -> dict:
    """One ``aepar.sync --compare-greedy`` run of ``seed``'s quality: its summary, with the
    day it started. With ``reuse``, a finished run already in its directory whose options
    resolve as the preset and seed do today (:func:`same_recipe`) is read instead of run again."""
    args = ["--preset", cfg["preset"], "--seed", str(seed)]
    run_dir = runs / f"{which}_quality_seed{seed}"
    meta = run_dir / "run.json"
    done = json.loads(meta.read_text()) if reuse and meta.exists() else {}
    if done.get("state") == "complete" and same_recipe(done, args):
        print(f"bench.stacked: reusing {run_dir}", flush=True)
        summary = json.loads((run_dir / "summary.json").read_text())
    else:
        summary = run_sync(4 if which == "quick" else 2, run_dir, args, runs / f"{which}_quality_seed{seed}.log")
        done = json.loads(meta.read_text())
    summary["_day"] = done.get("started", "")[:10]
    return summary


def quality(which, cfg, runs, seeds, reuse, skip_text) -> tuple[list[dict], list[str]]:
    """Santara et al.'s Table 2: greedy and sync after fine-tuning against PCA-30, a run per
    seed, then each scheme's mean and half the range over the seeds."""
    qrows, key = [], "finetuned"
    for seed in seeds:
        q = quality_run(which, cfg, runs, seed, reuse)
        for name, s in (("greedy", q["greedy"]), ("sync", q)):
            qrows.append({"seed": seed, "dataset": q["source"], "scheme": name,
                          "train_error": s["error"][key]["train"], "test_error": s["error"][key]["test"],
                          "pretrained_test_error": s["error"]["pretrained"]["test"],
                          "pca30_test_error": q["pca"]["test"], "vs_pca": s["error"][key]["test"] / q["pca"]["test"],
                          "pretrain_s": s["pretrain_time_s"], "finetune_s": s["finetune_time_s"],
                          "ranks": s["ranks"], "kind": "measured", "day": q["_day"],
                          "vs_greedy": q["test_error_vs_greedy"] if name == "sync" else 1.0,
                          **q["machine"]})  # the machine the run was on (a reused one's too)
    md = ["## Quality after fine-tuning (measured, one aepar.sync run with --compare-greedy per seed)", "",
          "| seed | scheme | train | test | pre-trained only (test) | PCA-30 (test) | test / PCA-30 | sync / greedy |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in qrows:
        md.append(f"| {r['seed']} | {r['scheme']} | {r['train_error']:.3f} | {r['test_error']:.3f} | "
                  f"{r['pretrained_test_error']:.3f} | {r['pca30_test_error']:.3f} | {r['vs_pca']:.3f} | "
                  f"{r['vs_greedy']:.3f} |")

    columns = ["train_error", "test_error", "pretrained_test_error", "pca30_test_error", "vs_pca", "vs_greedy"]
    verdicts = []
    for r in over_seeds(qrows, columns, by="scheme"):
        shown = {k: f"{r[k]:.3f} ± {r[k + '_spread']:.3f}" for k in columns}
        md.append(f"| mean | {r['scheme']} | " + " | ".join(shown[k] for k in columns) + " |")
        verdicts.append(f"{r['scheme']} {shown['vs_pca']} ({'met' if r['vs_pca'] <= 0.45 else 'not met'})")
    days = sorted({r["day"] for r in qrows if r["day"]})
    machines = sorted({f"{r['cpu_model']} ({r['isa']}, {r['cores']} cores, {r['blas']})" for r in qrows})
    md += ["", f"Santara et al.'s Table 2 as a target: the test error at most 0.45x PCA-30's for greedy and sync, "
           f"on the mean over seeds {', '.join(map(str, seeds))} (± half the range): {'; '.join(verdicts)}. "
           f"Sync within 5% of greedy on every seed: "
           f"{'yes' if all(r['vs_greedy'] <= 1.05 for r in qrows) else 'no'}. "
           f"Sync's extra epochs up to {','.join(map(str, q['extra']))} per layer. "
           f"Fine-tuning {recipe(q.get('finetune'))}. Runs of {', '.join(days)} on {'; '.join(machines)}, "
           f"`python -m bench.stacked --{which}"
           f"{' --skip ' + skip_text if skip_text else ''} --seeds {','.join(map(str, seeds))}`.",
           f"Data: {q['source']}", ""]
    return qrows, md


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stacked", description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="mnist5k (default)")
    g.add_argument("--full", action="store_true", help="Fashion-MNIST at the seed's epochs (about an hour)")
    p.add_argument("--skip", default="",
                   help="comma-separated parts to skip: rbm,stages,measured,quality; rbm-plain, rbm-careful, "
                        "rbm-numpy (peers of the rbm epoch)")
    p.add_argument("--rbm-only", action="store_true", help="only the CD-1 epoch comparison (rbm_epoch.csv)")
    p.add_argument("--rbm-threads", default=",".join(map(str, RBM_THREADS)),
                   help="thread counts of the CD-1 epoch comparison (default %(default)s)")
    p.add_argument("--rbm-rows", type=int, default=RBM_ROWS, help="Fashion-MNIST rows per epoch (default %(default)s)")
    p.add_argument("--rbm-repeats", type=int, default=3, help="timed epochs per implementation (best counts)")
    p.add_argument("--rbm-hidden", type=int, default=RBM_HIDDEN,
                   help="hidden units of the timed 784 x N layer (default %(default)s; the issue also asks for 2000)")
    p.add_argument("--rbm-batch", type=int, default=RBM_BATCH,
                   help="minibatch of the timed epoch (default %(default)s; the issue also asks for 5000)")
    p.add_argument("--rbm-layer", choices=sorted(LAYERS), default="rbm",
                   help="the timed layer: rbm (CD-1, the default) or ae (the autoencoder layer of --pretrainer ae)")
    p.add_argument("--rbm-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rbm-child-data", help=argparse.SUPPRESS)
    p.add_argument("--rbm-child-what", help=argparse.SUPPRESS)
    p.add_argument("--seeds", default="0",
                   help="the quality part's seeds, comma-separated: one aepar.sync --compare-greedy run each, "
                        "then the mean and half the range (default %(default)s)")
    p.add_argument("--reuse", action="store_true",
                   help="the quality part reads a seed's finished run in runs/bench_stacked instead of "
                        "running it again, where that run's options are what the preset and seed give today")
    p.add_argument("--out", default=str(RESULTS), help="directory of the results (default bench/results)")
    args = p.parse_args(argv)
    if args.rbm_hidden < 1 or args.rbm_batch < 1:
        p.error(f"--rbm-hidden and --rbm-batch must be positive, got {args.rbm_hidden} and {args.rbm_batch}")
    seeds = parse_seeds(args.seeds)
    if seeds is None:
        p.error(f"--seeds wants distinct non-negative integers such as 0,1,2, not {args.seeds!r}")
    if args.rbm_child:
        return _rbm_child(args)
    which = "full" if args.full else "quick"
    cfg = CONFIGS[which]
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = ROOT / "runs" / "bench_stacked"  # the jobs' run directories and logs (not committed)
    m = machine_columns()
    # each section says when, where and by what it was measured: a later run may replace one alone
    stamp = (f"{time.strftime('%Y-%m-%d')}, {m['cpu_model']} ({m['isa']}, {m['cores']} cores, {m['blas']}), "
             f"`python -m bench.stacked {' '.join(sys.argv[1:] if argv is None else map(str, argv))}`")
    runs.mkdir(parents=True, exist_ok=True)

    from aepar.data.sources import load_digits
    from aepar.parallel.synchronized import default_extras, split_validation

    digits = load_digits(cfg["dataset"], seed=0, dtype=np.float32)
    tr, va = split_validation(digits.train_y, cfg["val_fraction"], 0)
    x_train, x_val = digits.train_x[tr], digits.train_x[va]
    sizes = [784, 1000, 500, 250, 30]
    epochs, extras = [cfg["epochs"]] * 4, default_extras(4)
    md = [f"# Stacked autoencoder benchmark ({which}: {digits.source})", ""]

    if "rbm" not in skip or args.rbm_only:
        threads = [int(t) for t in args.rbm_threads.split(",") if t.strip()]
        rows = rbm_epoch(x_train, f"{cfg['dataset']} training split", threads, args.rbm_repeats, args.rbm_rows,
                         ",".join(sorted(skip)), args.rbm_hidden, args.rbm_batch, args.rbm_layer)
        # rows from other machines, code paths and shapes stay (bench.common's key, the layer, the batch)
        merge_rows([{k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
                   out / "rbm_epoch.csv", "rbm_epoch", legacy=True, key=KEY + ("layer", "batch"))
        data = rows[0].get("data", "") if rows else ""
        what = "CD-1 epoch, 784x{} Bernoulli RBM" if args.rbm_layer == "rbm" else "epoch, 784x{} autoencoder layer"
        md += [f"## One {what.format(args.rbm_hidden)}, batch {args.rbm_batch}, float32 "
               f"(measured; {data})", "", f"Measured {stamp}.", "",
               *rbm_table(rows), "",
               "Side by side in one process per thread count, warm-up then best of "
               f"{args.rbm_repeats} interleaved epochs; load average (1 min) before/after in rbm_epoch.csv.", ""]
        print("\n".join(md[2:]), flush=True)
        if args.rbm_only:
            print(f"bench.stacked: wrote {out / 'rbm_epoch.csv'}", flush=True)
            return 0

    st_path = out / f"stage_times_{which}.json"
    if "stages" not in skip or not st_path.exists():
        st = stage_times(x_train, x_val, sizes, epochs, extras)
        st_path.write_text(json.dumps(st, indent=2) + "\n")
    st = json.loads(st_path.read_text())

    from bench import makespan

    rows = makespan.simulate_grid(st)
    if cfg["epochs"] != 20:  # the seed's schedule from the same measured layer times
        rows += makespan.simulate_grid(dict(st, epochs=[20] * len(st["layers"])))
    measured = []
    if "measured" not in skip:
        hrows = []
        for np_ in cfg["ranks"]:
            for mode in ("data", "weights"):
                # greedy re-measured right before each run: the machine's load drifts
                g = makespan.greedy_s(stage_times(x_train, x_val, sizes, epochs, extras, repeats=1))
                s = run_sync(np_, runs / f"sync_np{np_}_{mode}",
                             ["--preset", cfg["preset"], "--no-compare-greedy", "--finetune-epochs", "0", "--no-plot",
                              "--handover-mode", mode], runs / f"sync_np{np_}_{mode}.log")
                measured.append({"kind": "measured", "scenario": "sync",
                                 "schedule": f"{cfg['epochs']} ep + {','.join(map(str, extras))}", "ranks": np_, "layout": s["layout"]["text"],
                                 "mode": mode, "handover": s["handover"], "end_with_first": s["end_with_first"],
                                 "greedy_s": g, "sync_s": s["pretrain_time_s"], "ratio": s["pretrain_time_s"] / g,
                                 "target_0_56": s["pretrain_time_s"] / g <= 0.56,
                                 "note": f"sync measured here ({np_} ranks on {os.cpu_count()} cores); greedy = "
                                         "sum of one-core layer times measured just before"})
                for h in s["pretrain"]["handover_stats"]:
                    hrows.append({"ranks": np_, "mode": mode, **h, "kind": "measured"})
        _write_csv(out / f"sync_measured_{which}.csv", measured)
        _write_csv(out / f"handover_{which}.csv", hrows)
        md += ["## Hand-over per version (measured, aepar.sync pre-training)", "", f"Measured {stamp}.", "",
               "| ranks | mode | layers | bytes | producer s | consumer recompute s | producer epoch s | (hand-over)/epoch |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for h in hrows:
            md.append(f"| {h['ranks']} | {h['mode']} | L{h['from_layer']}->L{h['to_layer']} | "
                      f"{h['bytes_per_handover'] / 1e6:.2f} MB | {h['producer_s_per_handover']:.4f} | "
                      f"{h['consumer_recompute_s_per_handover']:.4f} | {h['producer_epoch_s']:.3f} | "
                      f"{h['handover_vs_epoch']:.3f} |")
        md.append("")
    if "measured" not in skip or "stages" not in skip:  # else nothing new to add: the last table stays
        makespan.write_csv(measured + rows, out / f"makespan_{which}.csv")
        md += ["## Pre-training time: greedy (sum) vs synchronized", "",
               f"greedy = {makespan.greedy_s(st):.2f} s: sum of the layer times measured on one core "
               f"(stage_times_{which}.json). 'measured' rows ran here; 'simulated' rows replay the plan with one core per "
               f"rank from the measured layer times (bench/makespan.py; replicas add an Allreduce model). {stamp}.", "",
               makespan.format_rows(measured + rows), ""]

    if "quality" not in skip:
        qrows, lines = quality(which, cfg, runs, seeds, args.reuse, args.skip)
        _write_csv(out / f"quality_{which}.csv", qrows)
        md += lines
    path = out / f"stacked_{which}.md"
    # a part skipped this time keeps its section from the last run
    text = merge_sections(path.read_text() if path.exists() else "", "\n".join(md) + "\n")
    path.write_text(text)
    print("\n".join(md), flush=True)
    print(f"bench.stacked: wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
