"""CMU 15-618's measurements with the pre-training engine (``python -m aepar.pretrain``),
every row with the machine it ran on.

Stages (each runs the real command line; figures are read back from the runs' summary.json):

- ``accuracy``: test accuracy after pre-training + supervised fine-tuning for every scheme
  on the embedded MNIST digits (4,000 / 1,000), 15-618's skewed network
  784-2000-1000-500-100 of autoencoder layers; beside it the floors computed with aepar's
  own kernels: softmax regression on raw pixels and on PCA-30, and the same network from
  random weights (what pre-training is worth). Higher is better. ``--accuracy-dataset
  fashion --epochs 30 --seeds 0,1,2`` is 15-618's table at its own size and epochs
  (``make bench-pretrain-full``: about 10 hours on 2 cores, its runs in
  runs/bench-pretrain-full, so that it can be stopped and continued) with the spread over
  the seeds.
- ``largebatch``: the ``data`` scheme at batch 100 against batch 5000 with the plain average
  (15-618's collapse), with square-root and linear learning-rate scaling and warm-up, LARS
  and a cosine decay, at the same epochs, at twice as many, at the same pre-training
  epochs with four times the classification epochs, at 2/5 of the pre-training epochs with
  18/5 of the classification epochs, and batch 2000, on Fashion-MNIST
  (60k / 10k) when installed (``make fashion``): test accuracy, time, and accuracy against
  seconds.
- ``sweep``: epoch time per scheme and rank count over batch sizes (15-618's sweep, up to the
  rows at hand), and the speed-up of model and data over greedy, measured on the ranks this
  machine has beside the planner's prediction (aepar.parallel.planner) for 1-16 ranks.
- ``profile``: where each rank's time goes per operation (15-618's per-operation figure),
  every scheme at 2 and 4 ranks (hybrid at 5: more ranks than layers), read from
  each run's profile (aepar.report.profile), beside the planner's predicted pre-training
  time fed with this machine's one-rank layer times.

    python -m bench.pretrain [--stages accuracy,largebatch,sweep,profile] [--epochs N]
                             [--accuracy-dataset fashion] [--seeds 0,1,2] [--repeats 3] [--work DIR]

The sweep, largebatch and profile stages time each configuration ``--repeats`` times, the
stage's whole list once per round, and keep the fastest run, as bench/results times every
figure (a single run on a shared VM moves by up to 50% from one minute to the next); the
profile's predictions are the least of as many `--scheme auto` runs'.

Writes bench/results/pretrain_{accuracy,largebatch,sweep,speedup,profile}.{csv,md},
pretrain_accuracy.png (pretrain_accuracy_fashion.* with ``--accuracy-dataset fashion``),
pretrain_largebatch.png, pretrain_sweep.png and pretrain_profile_np{2,4,5}.png.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from bench.common import (ONE_PROCESS, Records, dates_text, fastest_run, in_rounds, machine_columns, mpi_env,
                          over_seeds, python_command, run_to_end)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
LARS_TRUST = 0.005  # the LARS configs' trust coefficient: of 0.005 and 0.02, the better at 10 + 10 epochs


RECORDS = Records("bench.pretrain")  # --records: runs kept in, and read back from, a folder


def machine_fields(summary: dict | None = None) -> dict:
    """The machine columns these tables have always had: five of them, the CPU as ``cpu``,
    and the aepar version that ran (empty for a record from before it was kept); the run's
    own (``summary``: one read back from a record may come from another machine), else
    this one's."""
    m = (summary or {}).get("machine") or machine_columns()
    return {"cpu": m["cpu_model"], "isa": m["isa"], "blas": m["blas"], "cores": m["cores"], "mpi": m["mpi"],
            "aepar": m.get("aepar", "")}


def launch(module, args, np_, work: Path, name: str) -> dict:
    """Run ``python -m module args --out work/name`` on ``np_`` ranks; its summary.json. A
    run an earlier call left unfinished (stopped by Ctrl-C or a job's time limit, which make
    it save a checkpoint; killed outright, its last timed one) continues from its checkpoint
    (``--resume-or-start``): its times add up its stretches, its weights are those of an
    uninterrupted run."""
    out, what = work / name, [module, *args]
    if (out / "summary.json").exists():  # done by an earlier call with the same --work
        print(f"bench.pretrain: {name}: reusing {out}", flush=True)
        summary = json.loads((out / "summary.json").read_text())
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime((out / "summary.json").stat().st_mtime))
        RECORDS.keep_if_new(name, what, np_, summary, {"command": "(unknown)", "wall_s": None, "date": when})
        return dict(summary, _date=when)
    record = RECORDS.read(name, what, np_)
    if record is not None:
        return dict(record["summary"], _date=record["launch"]["date"])
    if out.exists():
        print(f"bench.pretrain: {name}: continuing {out}", flush=True)
    cmd = python_command(module, [*args, "--out", out, "--resume-or-start"], np_)
    t0 = time.time()
    run_to_end("bench.pretrain", name, cmd, out, mpi_env(AEPAR_THREADS=None), REPO)
    summary = json.loads((out / "summary.json").read_text())
    summary["_wall_s"] = time.time() - t0
    print(f"bench.pretrain: {name}: done in {summary['_wall_s']:.0f}s", flush=True)
    launched = {"command": " ".join(map(str, cmd)), "wall_s": summary["_wall_s"],
                "date": time.strftime("%Y-%m-%d %H:%M")}
    RECORDS.keep(name, what, np_, summary, launched)
    return dict(summary, _date=launched["date"])


def write(rows, stem, title, columns, notes=(), csv_rows=None):
    """``stem``.md: a table of ``rows``; ``stem``.csv: ``csv_rows`` (default the same rows)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    csv_rows = rows if csv_rows is None else csv_rows
    with open(RESULTS / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(csv_rows[0]))
        w.writeheader()
        w.writerows(csv_rows)
    where, when = provenance(csv_rows)
    lines = [f"# {title}", "", f"{where}; measured {when} by `python -m bench.pretrain`.", "",
             "| " + " | ".join(c for c, _ in columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r) for _, fmt in columns) + " |")
    lines += [""] + list(notes)
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def provenance(rows) -> tuple[str, str]:
    """The machine(s) and the day(s) of the runs behind ``rows`` (rows read back from records
    keep their own), as the tables and figures name them."""
    machines = sorted({r["cpu"] for r in rows if r.get("cpu")})
    when = dates_text([r.get("date") for r in rows if r.get("date")] or [time.strftime("%Y-%m-%d")])
    if len(machines) > 1:
        return "Machines (each row's is in the CSV): " + "; ".join(machines), when
    m = rows[0] if rows and rows[0].get("cpu") else machine_fields()
    # the MPI any of the runs used (a table's first run may be a single process)
    mpi = next((r["mpi"] for r in rows if r.get("mpi") and r["mpi"] != ONE_PROCESS), m["mpi"])
    return f"Machine: {m['cpu']} ({m['isa']}), {m['cores']} cores, BLAS {m['blas']}, {mpi}", when


def short_cpu(cpu: str) -> str:
    """A figure title's CPU: its name and family, without the caches ("AMD EPYC (family 25
    model 1 stepping 1)")."""
    return cpu.split(",")[0] + (")" if "(" in cpu and "," in cpu else "")


def pct(x):
    return f"{100 * x:.2f}%" if x is not None else "–"


# ---- accuracy ------------------------------------------------------------------------------------
def accuracy(work, epochs, dataset="mnist5k", seeds=(0,)):
    """15-618's accuracy table: every scheme, then the floors, for each seed; the table gives
    the mean and half the min-max range over the seeds."""
    net = ["--preset", "15618-skewed", "--dataset", dataset, "--epochs", epochs, "--classify-epochs", epochs]
    runs = [("greedy", 1), ("data", 2), ("model", 2), ("sync", 2), ("hybrid", 5)]
    rows, curves = [], {}  # curves: {model: [(pre-training s, the classifier's epochs), one per seed]}
    tag = "" if dataset == "mnist5k" else f"-{dataset}-{epochs}"
    for seed in seeds:
        at = ["--seed", seed]
        suffix = f"{tag}-seed{seed}" if (tag or seed) else "-all"  # "-all": the runs of the one-seed table
        for scheme, np_ in runs:
            # sync holds out validation rows by default: all the training rows here, as the other schemes use
            extra = ["--no-plot", "--extra", "0,1,2,2", "--val-fraction", 0] if scheme in ("sync", "hybrid") else []
            s = launch("aepar.pretrain", ["--scheme", scheme, *net, *at, *extra], np_, work, f"acc-{scheme}{suffix}")
            c = s["classify"]
            rows.append(dict(machine_fields(s), date=s.get("_date"), model=f"{scheme} pre-training + fine-tuning",
                             ranks=np_, seed=seed,
                             epochs=f"{epochs} + {epochs}", test_accuracy=c["after"]["test"],
                             train_accuracy=c["after"]["train"], pretrained_only_test=c["before"]["test"],
                             pretrain_s=s["pretrain_time_s"], finetune_s=c["time_s"], data=s["source"]))
            curves.setdefault(rows[-1]["model"], []).append((s["pretrain_time_s"], c.get("epochs") or []))
        s = launch("aepar.classify", ["--floors", "--layers", "784-2000-1000-500-100", "--dataset", dataset,
                                      "--classify-epochs", epochs, *at], 1, work,
                   f"acc-floors{suffix if suffix != '-all' else ''}")
        c = s["classify"]
        rows.append(dict(machine_fields(s), date=s.get("_date"), model="same network from random weights (Adam)",
                         ranks=1, seed=seed,
                         epochs=f"0 + {epochs}", test_accuracy=c["after"]["test"], train_accuracy=c["after"]["train"],
                         pretrained_only_test=None, pretrain_s=0.0, finetune_s=c["time_s"], data=s["source"]))
        curves.setdefault(rows[-1]["model"], []).append((0.0, c.get("epochs") or []))
        for key, label in (("raw", "softmax regression on raw pixels (floor)"),
                           ("pca", "softmax regression on PCA-30 (floor)")):
            f = s["floors"][key]
            rows.append(dict(machine_fields(s), date=s.get("_date"), model=label, ranks=1, seed=seed,
                             epochs=f"0 + {epochs}",
                             test_accuracy=f["after"]["test"], train_accuracy=f["after"]["train"],
                             pretrained_only_test=None, pretrain_s=0.0, finetune_s=f["time_s"], data=s["source"]))
    table = over_seeds(rows, ["test_accuracy", "train_accuracy", "pretrained_only_test", "pretrain_s", "finetune_s"])
    greedy = table[0]["test_accuracy"]

    def spread(key, seconds=False):
        """The mean (a percentage, or seconds) and, over several seeds, ± half the range."""
        def show(r):
            if r[key] is None:
                return "–"
            text, half = (f"{r[key]:.1f}", f"{r[key + '_spread']:.1f}") if seconds else \
                (pct(r[key]), f"{100 * r[key + '_spread']:.2f}")
            return text + (f" ± {half}" if len(seeds) > 1 else "")
        return show
    source = rows[0]["data"]
    stem = "pretrain_accuracy" if dataset == "mnist5k" else f"pretrain_accuracy_{dataset}"
    write(table, stem,
          f"Test accuracy after pre-training and supervised fine-tuning ({source.split(',')[0]}; higher is better)",
          [("model", lambda r: r["model"]), ("ranks", lambda r: str(r["ranks"])), ("epochs", lambda r: r["epochs"]),
           ("test accuracy", spread("test_accuracy")),
           ("vs greedy (points)", lambda r: f"{100 * (r['test_accuracy'] - greedy):+.2f}"),
           ("train accuracy", spread("train_accuracy")),
           ("pre-trained only", spread("pretrained_only_test")),
           ("pre-train s", spread("pretrain_s", seconds=True)), ("fine-tune s", spread("finetune_s", seconds=True))],
          [f"Network 784-2000-1000-500-100 (CMU 15-618's config 2) of autoencoder layers, batch 100, "
           f"{epochs} epochs of pre-training per layer and {epochs} of fine-tuning with Adam (15-618: 30 + 30 on "
           "55,000 MNIST digits, 96.62%). sync and hybrid add the extra epochs 0,1,2,2. "
           f"Seeds {', '.join(map(str, seeds))}" + (": mean ± half the min-max range over them. " if len(seeds) > 1
                                                    else ". ")
           + f"Data: {source}. Times on this machine's shared cores (hybrid's 5 ranks may be oversubscribed): "
           "accuracy is the point of this table, not time. Every seed's row is in the CSV. "
           f"Accuracy per model and against epochs and seconds: {stem}.png."], csv_rows=rows)
    accuracy_png(rows, curves, RESULTS / f"{stem}.png",
                 f"{source.split(',')[0].split(':')[0]}, {epochs} + {epochs} epochs, seeds "
                 f"{', '.join(map(str, seeds))}\n{' / '.join(sorted({r['cpu'] for r in rows}))}, "
                 f"{provenance(rows)[1]}, "
                 f"`python -m bench.pretrain --stages accuracy"
                 f"{'' if dataset == 'mnist5k' else f' --accuracy-dataset {dataset}'} --epochs {epochs} "
                 f"--seeds {','.join(map(str, seeds))}`")


def accuracy_png(rows, curves, path, title):
    """The accuracy table as a reader would rather look at it: each model's test accuracy
    (every seed a dot, the bar their mean), and the test accuracy after each classification
    epoch against the epoch and against the seconds so far (pre-training included), the
    mean over the seeds."""
    try:
        from aepar.report.figures import figure
    except ImportError:
        return
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig = figure(16.0, 5.0)
    bars, by_epoch, by_time = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.3, 1, 1]})
    for i, model in enumerate(models):
        accs = [100 * r["test_accuracy"] for r in rows if r["model"] == model]
        bars.barh(i, sum(accs) / len(accs), color=f"C{i % 10}", alpha=0.45)
        bars.plot(accs, [i] * len(accs), "k.", ms=5)
    bars.set_yticks(range(len(models)), [m.replace(" (floor)", "\n(floor)") for m in models], fontsize=7)
    bars.invert_yaxis()
    accs = [100 * r["test_accuracy"] for r in rows]
    bars.set_xlim(max(0.0, min(accs) - 3), min(100.0, max(accs) + 2))
    bars.set_xlabel("test accuracy (%): bar the mean, dots the seeds")
    for i, model in enumerate(models):
        runs = [(pre, epochs) for pre, epochs in curves.get(model, []) if epochs]
        if not runs:  # a floor: its final accuracy as a line
            finals = [100 * r["test_accuracy"] for r in rows if r["model"] == model]
            by_epoch.axhline(sum(finals) / len(finals), color=f"C{i % 10}", ls=":", lw=1.2, label=model)
            continue
        n = min(len(epochs) for _, epochs in runs)  # the seeds' common epochs
        acc = [100 * sum(epochs[e]["test_accuracy"] for _, epochs in runs) / len(runs) for e in range(n)]
        secs = [sum(pre + sum(x["epoch_s"] for x in epochs[:e + 1]) for pre, epochs in runs) / len(runs)
                for e in range(n)]
        by_epoch.plot(range(1, n + 1), acc, color=f"C{i % 10}", lw=1.3, label=model)
        by_time.plot(secs, acc, color=f"C{i % 10}", lw=1.3, marker="." if n < 40 else None)
    by_epoch.set_xlabel("classification epoch")
    by_time.set_xlabel("seconds (pre-training, then the classifier's epochs)")
    for ax in (by_epoch, by_time):
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    bars.grid(alpha=0.3, axis="x")
    by_epoch.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Test accuracy after pre-training and fine-tuning: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)


# ---- large batches -------------------------------------------------------------------------------
def largebatch(work, epochs, dataset, repeats: int = 3):
    base = ["--scheme", "data", "--task", "classify", "--dataset", dataset]
    long = 2 * epochs  # the larger batches' epochs are cheaper: the target allows more of them
    big = ["--batch", 5000, "--classify-batch", 5000]
    sqrt = [*big, "--lr-scaling", "sqrt", "--warmup-epochs", 2]
    lars = [*sqrt, "--lars", LARS_TRUST]
    # (label, pre-training epochs, classification epochs, options)
    configs = [("batch 100", epochs, epochs, ["--batch", 100, "--classify-batch", 100]),
               ("batch 5000, plain average (15-618)", epochs, epochs, big),
               ("batch 5000, sqrt lr scaling + 2 warm-up epochs", epochs, epochs, sqrt),
               ("batch 5000, sqrt lr scaling + 2 warm-up epochs", long, long, sqrt),
               ("batch 5000, linear lr scaling + 3 warm-up epochs", long, long,
                [*big, "--lr-scaling", "linear", "--warmup-epochs", 3]),
               (f"batch 5000, sqrt lr scaling + 2 warm-up epochs + LARS {LARS_TRUST}", long, long, lars),
               ("batch 5000, sqrt lr scaling + 2 warm-up epochs", epochs, 4 * epochs, sqrt),
               (f"batch 5000, sqrt lr scaling + 2 warm-up epochs + LARS {LARS_TRUST}", epochs, 4 * epochs, lars),
               (f"batch 5000, sqrt lr scaling + 2 warm-up epochs + LARS {LARS_TRUST} + cosine decay", epochs,
                4 * epochs, [*lars, "--lr-decay", "cosine"]),
               # fewer layer epochs, more of the classifier's: at batch 5000 an epoch of the
               # classifier gains more accuracy than one of each layer
               (f"batch 5000, sqrt lr scaling + 2 warm-up epochs + LARS {LARS_TRUST} + cosine decay",
                max(1, 2 * epochs // 5), 18 * epochs // 5, [*lars, "--lr-decay", "cosine"]),
               ("batch 2000, sqrt lr scaling + 2 warm-up epochs", long, long,
                ["--batch", 2000, "--classify-batch", 2000, "--lr-scaling", "sqrt", "--warmup-epochs", 2])]
    grid = {i: (base + ["--epochs", n, "--classify-epochs", m] + args, 2, f"lb-{i}-{n}-{m}")
            for i, (label, n, m, args) in enumerate(configs)}

    def total_s(run):  # pre-training + classification: what the target compares
        return run["pretrain_time_s"] + run["classify"]["time_s"]
    runs = launch_in_rounds(grid, repeats, work, seconds=total_s)
    rows, curves = [], []
    for i, (label, n, m, args) in enumerate(configs):
        s, times = runs[i]
        c = s["classify"]
        total = total_s(s)
        label = f"{label}, {n} + {m} epochs"
        rows.append(dict(machine_fields(s), config=label, dataset=s["source"].split(":")[0], ranks=2,
                         epochs=f"{n} + {m}", test_accuracy=c["after"]["test"], classify_lr=c["lr"],
                         pretrain_s=s["pretrain_time_s"], finetune_s=c["time_s"], total_s=total, **times))
        # time to accuracy: the test accuracy after each classification epoch, against the seconds so far
        t, points = s["pretrain_time_s"], []
        for e in c["epochs"]:
            t += e["epoch_s"]
            points.append((t, e["test_accuracy"]))
        curves.append((label, points))
    small, small_s = rows[0]["test_accuracy"], rows[0]["total_s"]
    write(rows, "pretrain_largebatch", "Large batches in the data scheme (test accuracy; higher is better)",
          [("config", lambda r: r["config"]), ("data", lambda r: r["dataset"]), ("epochs", lambda r: r["epochs"]),
           ("test accuracy", lambda r: pct(r["test_accuracy"])),
           ("vs batch 100 (points)", lambda r: f"{100 * (r['test_accuracy'] - small):+.2f}"),
           ("classifier lr", lambda r: f"{r['classify_lr']:.4g}"),
           ("pre-train s", lambda r: f"{r['pretrain_s']:.1f}"), ("fine-tune s", lambda r: f"{r['finetune_s']:.1f}"),
           ("time / batch 100's", lambda r: f"{r['total_s'] / small_s:.2f}")],
          ["784-1000-500-250-30 RBMs, `--scheme data` on 2 ranks, then the classifier (the encoder and a softmax, "
           "Adam) at the same batch; the larger batches' learning rates (the layers' and the classifier's) scaled "
           "from batch 100's as the config says, over the warm-up epochs; LARS: the layers' weight matrices at "
           "layer-wise adaptive rates (`--lars`); cosine: every rate decays after the warm-up (`--lr-decay "
           "cosine`). The epochs are pre-training + classification. The target: batch 5000 within 0.5 points of batch 100 in no more time "
           "(pre-training + fine-tuning). 15-618 measured 74.72% at batch 5000 against 96.62% at 100 (30 + 30 "
           "epochs, MNIST). Seed 0 for every run (aepar's default). Times: each configuration's fastest of its runs "
           "(pre-training + classification; all_seconds in the CSV), the whole list run once per round; on 2 "
           "ranks the data scheme's sums give the same bits in every run, so its accuracy is one figure. "
           "Accuracy against seconds: pretrain_largebatch.png."])
    try:
        from aepar.report.figures import figure
    except ImportError:
        return
    fig = figure(12.0, 4.8)  # the legend right of the curves
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, points) in enumerate(curves):  # past the 10 colours, dashed: none shares a look
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], marker=".", ls="-" if i < 10 else "--",
                label=label)
    ax.axhline(100 * small - 0.5, color="0.5", ls=":", lw=1, label="batch 100's accuracy - 0.5 points")
    ax.axvline(small_s, color="0.5", ls="--", lw=1, label="batch 100's time")
    ax.set_xlabel("seconds (pre-training, then each classification epoch)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Time to accuracy, data scheme on 2 ranks, each the fastest of its runs\n"
                 f"{short_cpu(rows[0]['cpu'])}, {time.strftime('%Y-%m-%d')}, "
                 "python -m bench.pretrain --stages largebatch", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(RESULTS / "pretrain_largebatch.png", format="png", dpi=100)


def launch_rounds(grid: dict, repeats: int, work: Path) -> dict:
    """``python -m aepar.pretrain`` for each of ``grid`` (key -> (arguments, ranks, run
    name)) ``repeats`` times (:func:`~bench.common.in_rounds`), each run under its own name:
    key -> the runs' summaries in round order."""
    def one(key, k):
        args, np_, name = grid[key]
        return launch("aepar.pretrain", args, np_, work, name + (f"-r{k}" if k else ""))
    return in_rounds(grid, repeats, one)


def launch_in_rounds(grid: dict, repeats: int, work: Path, seconds=lambda run: run["pretrain_time_s"]) -> dict:
    """:func:`launch_rounds`: key -> (the summary of its fastest run, as bench/results times
    every figure; the columns ``repeats`` and ``all_seconds``, each run's seconds)."""
    return {key: (fastest_run(runs, seconds=seconds),
                  {"repeats": len(runs), "all_seconds": " ".join(f"{seconds(run):.3f}" for run in runs)})
            for key, runs in launch_rounds(grid, repeats, work).items()}


def sweep(work, repeats: int = 3):
    """The batch sweep, each configuration the fastest of ``repeats`` runs (:func:`launch_in_rounds`)."""
    from aepar.parallel.planner import LayerCosts, greedy_s, predict

    net = ["--layers", "784-2000-1000", "--pretrainer", "ae", "--dataset", "mnist5k", "--limit", 2000,
           "--epochs", 2, "--finetune-epochs", 0]
    # greedy on one process with one block is its fastest path (no tree to add): the baseline
    runs = (("greedy", 1, ["--reduce-blocks", 1]), ("greedy", 1, []), ("greedy", 2, []), ("data", 2, []),
            ("model", 2, []))
    grid = {(batch, scheme, np_, bool(extra)): (["--scheme", scheme, *net, "--batch", batch, *extra], np_,
                                                 f"sw-{scheme}-{np_}-{batch}" + ("-1block" if extra else ""))
            for batch in (100, 500, 1000, 2000) for scheme, np_, extra in runs}
    rows = []
    for (batch, scheme, np_, _), (s, times) in launch_in_rounds(grid, repeats, work).items():
        # the blocks the run cut its batches into, as its summary records them
        rows.append(dict(machine_fields(s), scheme=scheme, ranks=np_, blocks=s["blocks"], batch=batch,
                         pretrain_s=s["pretrain_time_s"], epoch_s=s["pretrain_time_s"] / 2, **times))
    write(rows, "pretrain_sweep", "Pre-training time per epoch (both layers) over batch sizes (lower is better)",
          [("scheme", lambda r: r["scheme"]), ("ranks", lambda r: str(r["ranks"])),
           ("blocks", lambda r: str(r["blocks"])), ("batch", lambda r: str(r["batch"])),
           ("s per epoch", lambda r: f"{r['epoch_s']:.3f}")],
          ["784-2000-1000 autoencoder layers (15-618's first two layers), 2,000 embedded digits, 2 epochs; "
           "ranks share this machine's cores; each row the fastest of its runs (all_seconds in the CSV), "
           "the whole grid run once per round. "
           "greedy's default 8 blocks (bit-identical on up to 8 ranks) give each block 12-13 rows at batch "
           "100; data cuts one block per rank."])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 4))
        for scheme, np_, blocks in dict.fromkeys((r["scheme"], r["ranks"], r["blocks"]) for r in rows):
            pts = [(r["batch"], r["epoch_s"]) for r in rows
                   if r["scheme"] == scheme and r["ranks"] == np_ and r["blocks"] == blocks]
            ax.plot(*zip(*pts), marker="o", label=f"{scheme}, {np_} rank(s), {blocks} block(s)")
        ax.set_xscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("seconds per epoch (lower is better)")
        ax.set_title(f"15-618's batch sweep, each point the fastest of its runs\n{short_cpu(rows[0]['cpu'])}, "
                     f"{time.strftime('%Y-%m-%d')}, python -m bench.pretrain --stages sweep", fontsize=8)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves
        fig.tight_layout()
        fig.savefig(RESULTS / "pretrain_sweep.png", dpi=120)
    except ImportError:
        pass
    # speed-ups over greedy on one rank: measured on 2 ranks, predicted for 1-16 by the planner
    by, best = {}, {}
    for r in rows:
        key = (r["scheme"], r["ranks"], r["batch"])
        if r["scheme"] == "greedy" and r["ranks"] == 1:  # one core (one block) and the best of 1 / 8 blocks
            best[r["batch"]] = min(best.get(r["batch"], float("inf")), r["epoch_s"])
            if r["blocks"] != 1:
                continue
        by[key] = r["epoch_s"]
    out = []
    for batch in (100, 2000):
        s = launch("aepar.pretrain", ["--scheme", "greedy", *net, "--batch", batch, "--reduce-blocks", 1], 1, work,
                   f"sp-costs-{batch}-1block")
        layers = s["pretrain"]["layers"]
        costs = LayerCosts(epoch_s=tuple(l["epoch_times_s"][-1] for l in layers),
                           transform_s=tuple(l.get("transform_s", 0.0) for l in layers),
                           param_bytes=tuple(4 * (a * b + a + b) for a, b in ((784, 2000), (2000, 1000))),
                           steps_per_epoch=(-(-s["n_train"] // batch),) * 2, epochs=(2, 2), extras=(0, 0),
                           n_train=s["n_train"], batch=batch, blocks=None)
        base = by[("greedy", 1, batch)]
        for p in (1, 2, 4, 8, 16):
            pred = predict(costs, p)
            for scheme in ("data", "model"):
                measured = by.get((scheme, p, batch))
                sec = pred[scheme]["seconds"]
                out.append(dict(machine_fields(), scheme=scheme, batch=batch, ranks=p,
                                measured_speedup=base / measured if measured else None,
                                measured_vs_best=best[batch] / measured if measured else None,
                                predicted_speedup=greedy_s(costs) / sec if sec else None))
    write(out, "pretrain_speedup", "Speed-up of pre-training over greedy on one core (one process, one "
          "block; higher is better)",
          [("scheme", lambda r: r["scheme"]), ("batch", lambda r: str(r["batch"])), ("ranks", lambda r: str(r["ranks"])),
           ("measured", lambda r: f"{r['measured_speedup']:.2f}x" if r["measured_speedup"] else "–"),
           ("measured vs greedy's best one-process run", lambda r: f"{r['measured_vs_best']:.2f}x"
            if r["measured_vs_best"] else "–"),
           ("predicted (planner, one core per rank)", lambda r: f"{r['predicted_speedup']:.2f}x"
            if r["predicted_speedup"] else "–")],
          ["Measured where this machine has the ranks (2 cores). The next column divides by greedy's best "
           "one-process run, which may use both cores (8 blocks on 2 threads). The rest is the planner's model "
           "fed with this machine's one-core layer times (aepar.parallel.planner). 15-618 on 4 GPUs: model 1.3x at batch 100 "
           "(30 epochs), 2.1x at batch 5000 (60 epochs); data near-linear at batch 5000."])


# ---- per-operation profile ---------------------------------------------------------------------
PROFILE_LAYERS = (784, 500, 250, 100, 30)
PROFILE_SCHEMES = ("greedy", "data", "model", "sync", "hybrid")
# (scheme, ranks): model and sync take at most a rank per layer, hybrid more ranks than layers
PROFILE_RUNS = tuple((scheme, p) for p in (2, 4) for scheme in PROFILE_SCHEMES[:4]) + (("hybrid", 5),)


def profile(work, runs=PROFILE_RUNS, epochs=3, repeats: int = 3):
    """Each scheme's run on its ranks and `--scheme auto`'s prediction there, each point the
    fastest of ``repeats`` runs in rounds and each prediction the least of ``repeats`` auto
    runs' (the planner's own timings, like every figure here, at the machine's quiet moments)."""
    import numpy as np

    from aepar.parallel.planner import SPLIT
    from aepar.report.profile import PHASES, draw_profile

    sizes = "-".join(map(str, PROFILE_LAYERS))
    net = ["--layers", sizes, "--pretrainer", "ae", "--dataset", "mnist5k", "--limit", 2000, "--epochs", epochs,
           "--finetune-epochs", 0, "--no-plot"]
    # the planner's predictions as `--scheme auto` makes them on each rank count (what its
    # run's summary.json records), beside what each scheme then measured
    autos = {p: (["--scheme", "auto", *net], p, f"prof-auto-{p}") for p in sorted({p for _, p in runs})}
    plans = {p: [r["auto"]["predicted"] for r in made] for p, made in launch_rounds(autos, repeats, work).items()}
    measured = launch_in_rounds({(scheme, p): (["--scheme", scheme, *net], p, f"prof-{scheme}-{p}")
                                 for scheme, p in runs}, repeats, work)
    rows, panels = [], {}
    for scheme, p in runs:
        made = [plan[scheme] for plan in plans[p] if plan.get(scheme, {}).get("time_s") is not None]
        plan = min(made, key=lambda e: e["time_s"]) if made else {}
        predicted, split = plan.get("time_s"), plan.get("split")
        r, _ = measured[(scheme, p)]
        panels[(scheme, p)] = (r["profile"], split, r["pretrain_time_s"], predicted)
        for rank in r["profile"]:
            rows.append(dict(machine_fields(r), scheme=scheme, ranks=p, rank=rank["rank"],
                             **{f"{k}_s": round(rank[f"{k}_s"], 4) for k, _ in PHASES},
                             measured_pretrain_s=round(r["pretrain_time_s"], 3),
                             predicted_pretrain_s=None if predicted is None else round(predicted, 3),
                             **{f"predicted_{k}_s": None if split is None else round(split[k], 4) for k in SPLIT}))

    def mean(scheme, p, key):
        mine = [r for r in rows if r["scheme"] == scheme and r["ranks"] == p]
        return sum(r[key] for r in mine) / len(mine)
    summary = [dict(scheme=scheme, ranks=p, **{k: mean(scheme, p, f"{k}_s") for k, _ in PHASES},
                    measured=panels[(scheme, p)][2], predicted=panels[(scheme, p)][3],
                    split=panels[(scheme, p)][1]) for scheme, p in panels]

    def planned(r):
        return "–" if r["split"] is None else " / ".join(f"{r['split'][k]:.2f}" for k in SPLIT)
    write(summary, "pretrain_profile", "Where the time goes per operation: seconds per rank (mean over "
          "the ranks), per scheme and rank count (lower is better)",
          [("scheme", lambda r: r["scheme"]), ("ranks", lambda r: str(r["ranks"]))]
          + [(label, lambda r, k=k: f"{r[k]:.2f}") for k, label in PHASES if any(x[k] > 0 for x in summary)]
          + [("pre-training s, measured", lambda r: f"{r['measured']:.2f}"),
             ("predicted (planner)", lambda r: "–" if r["predicted"] is None else f"{r['predicted']:.2f}"),
             ("predicted training / reduction / hand-over / wait", planned)],
          [f"Autoencoder layers {sizes}, 2,000 embedded digits, batch 100, {epochs} epochs per layer, no "
           "fine-tuning; the ranks share this machine's cores (4 ranks on 2 cores are oversubscribed). Each "
           "rank's seconds come from its run's trace (profile.csv): forward + backward of every own block, "
           "the weight gradients and the blocks' tree on the rank (aepar computes the factored weight "
           "gradients inside that sum), the sum over ranks (waiting for slower ranks included), the update "
           "(or the fused step: all of it in one kernel call, where one block, or every block on one "
           "thread, is a rank's), hand-overs (sending and recomputing inputs), waiting, validation, and "
           "the rest of the epochs. The planner predicts a rank's time as `--scheme auto` does on those "
           "ranks (from one-rank layer times, one core per rank unless the ranks outnumber the cores; "
           "greedy's and data's layer epochs measured on the ranks, sums included), recorded in that auto "
           "run's summary.json, split into training (the epochs' whole work), the sum over ranks, hand-overs (for "
           "greedy and data the transforms that make the next layer's input; for model the weight "
           "exchanges too) and waiting, the mean over the ranks: the hatched bar in "
           "pretrain_profile_np*.png. "
           "Every rank's row is in pretrain_profile.csv. hybrid runs on 5 ranks: it needs more ranks than "
           "layers, and model and sync at most one rank per layer."], csv_rows=rows)
    try:
        from aepar.report.figures import figure
    except ImportError:
        return
    for p in sorted({p for _, p in panels}):
        shown = [scheme for scheme in PROFILE_SCHEMES if (scheme, p) in panels]
        width = 3.2 * len(shown) + 3.2  # the legend takes the last 3.2 inches
        fig = figure(width, 4.4)
        axes = np.atleast_1d(fig.subplots(1, len(shown), sharey=True))
        legend = {}
        for ax, scheme in zip(axes, shown):
            prof, split, _, _ = panels[(scheme, p)]
            draw_profile(ax, prof, predicted=split, legend=False)
            ax.set_title(scheme)
            legend.update(zip(*reversed(ax.get_legend_handles_labels())))  # every panel's phases, once
        order = [label for _, label in PHASES]
        labels = sorted(legend, key=lambda label: order.index(label) if label in order else len(order))
        fig.legend([legend[label] for label in labels], labels, fontsize="small", loc="center right")
        fig.suptitle(f"Seconds per operation, {p} ranks ({sizes}, {epochs} epochs per layer)\n"
                     f"{short_cpu(rows[0]['cpu'])}, {time.strftime('%Y-%m-%d')}, "
                     "python -m bench.pretrain --stages profile", fontsize=9)
        fig.tight_layout(rect=(0, 0, 1 - 3.2 / width, 1))
        fig.savefig(RESULTS / f"pretrain_profile_np{p}.png", format="png", dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pretrain", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="accuracy,largebatch,sweep,profile",
                    help="which measurements, comma-separated (default accuracy,largebatch,sweep,profile: "
                         "the stages above)")
    ap.add_argument("--epochs", type=int, default=10, help="pre-training and fine-tuning epochs (default 10)")
    ap.add_argument("--accuracy-dataset", default="mnist5k",
                    help="the accuracy stage's data (default mnist5k, the embedded digits; fashion: 15-618's "
                         "table at full size, written to pretrain_accuracy_fashion.*)")
    ap.add_argument("--seeds", default="0", help="the accuracy stage's seeds, comma-separated (default 0)")
    ap.add_argument("--largebatch-epochs", type=int, default=5,
                    help="the largebatch stage's pre-training and classification epochs; its longer "
                         "configurations take twice as many (default 5)")
    ap.add_argument("--largebatch-dataset", default="fashion",
                    help="the largebatch stage's data (default fashion: Fashion-MNIST, `make fashion`)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each configuration of the sweep, largebatch and profile stages, all of a "
                         "stage's once per round; a row keeps the fastest (default 3)")
    ap.add_argument("--records", default=None, metavar="DIR",
                    help="keep every finished run's summary in DIR (one JSON per run, to commit) and read a run "
                         "recorded there back instead of repeating it: a study of many hours done in pieces, on "
                         "several machines or days, each row with its own run's machine and date (default: none)")
    ap.add_argument("--work", default=None,
                    help="run directory of the runs (default a new runs/bench-pretrain-DATE); runs already "
                         "done in it are read back, not repeated, and one left unfinished continues from its "
                         "checkpoint")
    args = ap.parse_args(argv)
    global RECORDS
    RECORDS = Records("bench.pretrain", args.records)
    work = Path(args.work) if args.work else REPO / "runs" / f"bench-pretrain-{time.strftime('%Y%m%d-%H%M%S')}"
    stages = args.stages.split(",")
    if "accuracy" in stages:
        accuracy(work, args.epochs, args.accuracy_dataset, [int(x) for x in args.seeds.split(",")])
    if "sweep" in stages:
        sweep(work, args.repeats)
    if "largebatch" in stages:
        largebatch(work, args.largebatch_epochs, args.largebatch_dataset, args.repeats)
    if "profile" in stages:
        profile(work, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
