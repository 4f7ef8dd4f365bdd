"""Stacked-autoencoder benchmark: ``python -m bench.stacked --quick|--full``.

Writes into bench/results/ (every figure says whether it was MEASURED here or SIMULATED):

- rbm_epoch.csv: one CD-1 epoch of the 784x1000 RBM (batch 100, float32, the seed's
  recipe), aepar's RBM and a PyTorch peer (bench/torch_rbm.py) side by side in one
  process with the same thread count, best of 3 after a warm-up; ratio = torch s / aepar s
  (> 1: aepar faster). Measured.
Files other than rbm_epoch.csv carry the configuration in their name (_quick, _full).

- stage_times.json: every layer's epoch and transform time on one core (the greedy
  schedule's pieces). Measured.
- makespan.csv: greedy (sum) vs synchronized makespan for 1-16 ranks, both hand-over
  modes (bench/makespan.py). Simulated from stage_times.json, because this 2-core
  machine cannot give every stage its own core; plus the measured rows below.
- sync_measured.csv and handover.csv: ``mpirun -np 2|4 python -m aepar.sync`` pre-training
  wall times here, and per hand-over bytes and seconds against epoch time, for both
  modes. Measured (4 ranks on 2 cores are oversubscribed: the waiting stages sleep).
- quality.csv: error per digit of PCA-30, greedy and sync after fine-tuning, from one
  ``aepar.sync`` run with --compare-greedy (quick: mnist5k; full: Fashion-MNIST, 20 + 10
  epochs). Measured.
- stacked_quick.md / stacked_full.md: all of the above as tables.

The jobs' own run directories and logs go to runs/bench_stacked/.

Single-process timings use one thread (AEPAR_THREADS overrides); the MPI jobs let aepar
give each rank cores / ranks threads. --quick takes a few minutes on 2 cores; --full (Fashion-MNIST, ``apt-get install
dataset-fashion-mnist``) takes about an hour.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# One thread per process unless AEPAR_THREADS says otherwise: on a small machine busy with
# other work, multithreaded kernels (Numba's and PyTorch's alike) time the contention.
os.environ.setdefault("AEPAR_THREADS", "1")

import aepar  # noqa: E402,F401  (threads before numpy)
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

CONFIGS = {
    "quick": {"dataset": "mnist5k", "preset": "quick", "epochs": 10, "val_fraction": 0.1, "limit": None,
              "ranks": (2, 4)},
    "full": {"dataset": "fashion", "preset": "full", "epochs": 20, "val_fraction": 1 / 6, "limit": None,
             "ranks": (2, 4)},
}


def machine_columns() -> dict:
    try:
        from aepar.machine import describe

        return describe()
    except Exception:  # another engineer's module; keep the benchmark running without it
        import platform

        return {"hostname": platform.node(), "cores": os.cpu_count(), "threads": aepar.THREADS,
                "python": platform.python_version(), "numpy": np.__version__}


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


# ---- one CD-1 epoch: aepar vs PyTorch ------------------------------------------------------
def rbm_epoch(x, repeats=3) -> list[dict]:
    from aepar import backend
    from aepar.pretrain import make_layers

    be = backend.select("cpu", "numba", "float32")
    layer = make_layers(be, [784, 1000], "rbm", seed=0)[0]
    xb = be.asarray(x)
    layer.train_epoch(xb[:500], 0)  # warm-up: JIT and BLAS buffers
    times = {}
    for r in range(repeats):
        t0 = time.perf_counter()
        layer.train_epoch(xb, 6 + r)  # epochs past the momentum switch, like most of a run
        times.setdefault("aepar (numba kernels)", []).append(time.perf_counter() - t0)
    from bench import torch_rbm

    if torch_rbm.available():
        peer = torch_rbm.TorchRBM(784, 1000, threads=aepar.THREADS, seed=0)
        peer.train_epoch(x[:500])
        for r in range(repeats):
            times.setdefault("pytorch (bench/torch_rbm.py)", []).append(peer.time_epoch(x))
    machine = machine_columns()
    best = {k: min(v) for k, v in times.items()}
    ours = best["aepar (numba kernels)"]
    rows = []
    for name, t in best.items():
        rows.append({"implementation": name, "samples": int(x.shape[0]), "layer": "784x1000", "batch": 100,
                     "dtype": "float32", "seconds": t, "ratio": t / ours, "repeats": repeats,
                     "kind": "measured", **machine})
    if not torch_rbm.available():
        rows.append({"implementation": "pytorch (not installed: .venv/bin/pip install torch==2.13.0)",
                     "samples": int(x.shape[0]), "kind": "missing", **machine})
    return rows


# ---- per-layer times on one core -------------------------------------------------------------
def stage_times(x_train, x_val, sizes, epochs, extras, batch=100, repeats=2) -> dict:
    """Epoch and transform time of every layer on one core (float32, the greedy schedule)."""
    from aepar import backend
    from aepar.pretrain import make_layers

    be = backend.select("cpu", "numba", "float32")
    layers = make_layers(be, sizes, "rbm", seed=0)
    xt, xv = be.asarray(x_train), be.asarray(x_val)
    out = []
    for i, layer in enumerate(layers):
        layer.train_epoch(xt[:batch * 2], 0)  # warm-up
        ts = []
        for r in range(repeats):
            t0 = time.perf_counter()
            layer.train_epoch(xt, r)
            ts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        nt, nv = layer.transform(xt), layer.transform(xv)
        tr = time.perf_counter() - t0
        out.append({"layer": i + 1, "n_in": layer.n_in, "n_out": layer.n_out,
                    "flops_per_sample": layer.flops_per_sample(), "epoch_s": float(np.median(ts)),
                    "transform_s": tr, "steps": -(-xt.shape[0] // batch),
                    "param_bytes": 4 * (layer.n_in * layer.n_out + layer.n_in + layer.n_out)})
        xt, xv = nt, nv
    return {"kind": "measured", "note": "single process, one thread, float32; epoch = median of "
                                        f"{repeats} timed epochs after a warm-up",
            "n_train": int(x_train.shape[0]), "n_val": int(x_val.shape[0]), "batch": batch,
            "epochs": list(epochs), "extras": list(extras), "layers": out, "machine": machine_columns()}


# ---- jobs ---------------------------------------------------------------------------------------
def _mpirun() -> list[str]:
    launcher = os.environ.get("MPIRUN")
    if launcher:
        return launcher.split()
    here = Path(sys.executable).parent / "mpirun"
    exe = str(here) if here.exists() else shutil.which("mpirun")
    if exe is None:
        raise SystemExit("bench.stacked: no mpirun found")
    return [exe, "--oversubscribe"]


def run_sync(np_, out: Path, args: list[str], log: Path) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("AEPAR_THREADS", None)  # aepar sets threads from the ranks per node
    cmd = _mpirun() + ["-np", str(np_), sys.executable, "-m", "aepar.sync", "--out", str(out), "--quiet"] + args
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench.stacked: {' '.join(cmd)} failed ({proc.returncode}); see {log}")
    summary = json.loads((out / "summary.json").read_text())
    summary["_wall_s"] = time.perf_counter() - t0
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stacked", description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="mnist5k (default)")
    g.add_argument("--full", action="store_true", help="Fashion-MNIST at the seed's epochs (about an hour)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: rbm,stages,measured,quality")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    which = "full" if args.full else "quick"
    cfg = CONFIGS[which]
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = ROOT / "runs" / "bench_stacked"  # the jobs' run directories and logs (not committed)
    runs.mkdir(parents=True, exist_ok=True)

    from aepar.data.sources import load_digits
    from aepar.sync import default_extras, split_validation

    digits = load_digits(cfg["dataset"], seed=0, dtype=np.float32)
    tr, va = split_validation(digits.train_y, cfg["val_fraction"], 0)
    x_train, x_val = digits.train_x[tr], digits.train_x[va]
    sizes = [784, 1000, 500, 250, 30]
    epochs, extras = [cfg["epochs"]] * 4, default_extras(4)
    md = [f"# Stacked autoencoder benchmark ({which}: {digits.source})", ""]

    if "rbm" not in skip:
        rows = rbm_epoch(x_train)
        _write_csv(out / "rbm_epoch.csv", rows)
        md += ["## One CD-1 epoch, 784x1000, batch 100, float32 (measured)", "",
               "| implementation | samples | seconds | seconds / aepar's (> 1: aepar faster) |",
               "| --- | --- | --- | --- |"]
        for r in rows:
            if "seconds" in r:
                md.append(f"| {r['implementation']} | {r['samples']} | {r['seconds']:.3f} | {r['ratio']:.2f} |")
        md.append("")
        print("\n".join(md[-len(rows) - 4:]), flush=True)

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
        md += ["## Hand-over per version (measured, aepar.sync pre-training)", "",
               "| ranks | mode | layers | bytes | producer s | consumer recompute s | producer epoch s | (hand-over)/epoch |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for h in hrows:
            md.append(f"| {h['ranks']} | {h['mode']} | L{h['from_layer']}->L{h['to_layer']} | "
                      f"{h['bytes_per_handover'] / 1e6:.2f} MB | {h['producer_s_per_handover']:.4f} | "
                      f"{h['consumer_recompute_s_per_handover']:.4f} | {h['producer_epoch_s']:.3f} | "
                      f"{h['handover_vs_epoch']:.3f} |")
        md.append("")
    makespan.write_csv(measured + rows, out / f"makespan_{which}.csv")
    md += ["## Pre-training time: greedy (sum) vs synchronized", "",
           f"greedy = {makespan.greedy_s(st):.2f} s: sum of the layer times measured on one core "
           f"(stage_times_{which}.json). 'measured' rows ran here; 'simulated' rows replay the plan with one core per "
           "rank from the measured layer times (bench/makespan.py; replicas add an Allreduce model).", "",
           makespan.format_rows(measured + rows), ""]

    if "quality" not in skip:
        q = run_sync(4 if which == "quick" else 2, runs / f"{which}_quality", ["--preset", cfg["preset"]],
                     runs / f"{which}_quality.log")
        gq, key = q["greedy"], "finetuned"
        qrows = [{"dataset": q["source"], "scheme": name, "train_error": s["error"][key]["train"],
                  "test_error": s["error"][key]["test"], "pretrained_test_error": s["error"]["pretrained"]["test"],
                  "pca30_test_error": q["pca"]["test"], "vs_pca": s["error"][key]["test"] / q["pca"]["test"],
                  "pretrain_s": s["pretrain_time_s"], "finetune_s": s["finetune_time_s"], "ranks": s["ranks"],
                  "kind": "measured"} for name, s in (("greedy", gq), ("sync", q))]
        qrows[1]["vs_greedy"] = q["test_error_vs_greedy"]
        _write_csv(out / f"quality_{which}.csv", qrows)
        md += ["## Quality after fine-tuning (measured, one aepar.sync run with --compare-greedy)", "",
               "| scheme | train | test | pre-trained only (test) | test / PCA-30 | sync / greedy |",
               "| --- | --- | --- | --- | --- | --- |"]
        for r in qrows:
            md.append(f"| {r['scheme']} | {r['train_error']:.3f} | {r['test_error']:.3f} | "
                      f"{r['pretrained_test_error']:.3f} | {r['vs_pca']:.3f} | {r.get('vs_greedy', 1.0):.3f} |")
        md += ["", f"PCA-30 test error {q['pca']['test']:.3f}; targets: greedy <= 0.59x PCA-30, sync within 5% of greedy.",
               f"Data: {q['source']}", ""]
    (out / f"stacked_{which}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    print(f"bench.stacked: wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
