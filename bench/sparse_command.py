"""The whole commands side by side: ``python -m aepar.sparse`` against the textbook's whole
program, each a fresh process timed from outside (interpreter start, imports, reading the
images, sampling patches, the L-BFGS-B iterations and writing the result all count).

    python -m bench.sparse_command [--samples 10000] [--iterations 400] [--threads 1]
                                   [--repeats 3] [--out bench/results/peers.csv]

Both read the same whitened images from one IMAGES.mat (UFLDL's input; written here from
aepar's default photographs, as ``natural_images()`` gives them):

- textbook: this module run as ``--textbook-child``: only NumPy and SciPy imported, the
  seed's patch sampling (a Python loop over patches, then UFLDL's normalisation), its
  initialisation, :class:`bench.textbook_sparse.TextbookSparseAutoencoder` for the cost and
  gradient, ``scipy.optimize.minimize(..., method="L-BFGS-B", jac=True)``, W1 saved with
  ``np.save`` (the seed also drew the features with matplotlib; not done here, which
  favours the textbook);
- aepar: ``python -m aepar.sparse --images IMAGES.mat --out DIR --quiet`` (its default
  outputs: weights.h5, features.png, summary files; its default precision, float32);
- the same with ``--dtype float64``, the textbook's precision;
- aepar's start-up: the default command with ``--iterations 1``.

Every command runs once untimed first (Numba's cache, the OS's file cache), then
``--repeats`` rounds in turns (textbook, aepar, start-up, ...); the best of each counts,
all are recorded. BLAS, Numba and aepar threads are set to ``--threads`` in every child;
``--threads 0`` sets none of them, so that each program runs as it does by default (the
textbook's NumPy: OpenBLAS on every core; aepar: one thread of its own per core, BLAS on
one), and times the textbook with one BLAS thread too: the speed-ups are then against the
faster of its two. Rows go to peers.csv as benchmark ``sparse_command``, their
``thread_setting`` N or ``defaults`` (earlier rows of the same machine, code path and
setting replaced).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import KEY, ONE_PROCESS, machine_columns, merge_rows, time_calls, with_machine
from bench.textbook_sparse import THREAD_VARS, _set_threads

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = "sparse_command"
ONE_BLAS_THREAD = "textbook command, one BLAS thread"  # beside the others with --threads 0
FLOAT64 = "aepar command, float64"
COLUMNS = ("implementation", "samples", "iterations", "evaluations", "seconds", "repeats", "all_seconds",
           "final_cost", "speedup_vs_textbook", "thread_setting", "description")


# ---------------------------------------------------------------------------- the textbook program
def textbook_program(images_mat, samples, iterations, patch, hidden, seed, out_dir) -> dict:
    """The seed's serial program: sample, normalise, initialise, minimise, save W1."""
    import numpy
    import scipy.io
    import scipy.optimize

    from bench.textbook_sparse import TextbookSparseAutoencoder

    images = scipy.io.loadmat(images_mat)["IMAGES"]
    rows, cols, count = images.shape
    rng = numpy.random.RandomState(seed)
    patches = numpy.zeros((patch * patch, samples))
    for i in range(samples):
        k = rng.randint(count)
        r, c = rng.randint(rows - patch + 1), rng.randint(cols - patch + 1)
        patches[:, i] = images[r:r + patch, c:c + patch, k].flatten()
    patches = patches - numpy.mean(patches, axis=0)
    pstd = 3 * numpy.std(patches)
    patches = numpy.maximum(numpy.minimum(patches, pstd), -pstd) / pstd
    patches = (patches + 1) * 0.4 + 0.1

    visible = patch * patch
    r = numpy.sqrt(6) / numpy.sqrt(visible + hidden + 1)
    W1 = rng.random_sample((hidden, visible)) * 2 * r - r
    W2 = rng.random_sample((visible, hidden)) * 2 * r - r
    theta = numpy.concatenate((W1.flatten(), W2.flatten(), numpy.zeros(hidden + visible)))
    encoder = TextbookSparseAutoencoder(visible, hidden)
    result = scipy.optimize.minimize(encoder.cost, theta, args=(patches,), method="L-BFGS-B", jac=True,
                                     options={"maxiter": iterations})
    numpy.save(Path(out_dir) / "W1.npy", result.x[:hidden * visible].reshape(hidden, visible))
    return {"final_cost": float(result.fun), "iterations": int(result.nit), "evaluations": int(result.nfev)}


# ---------------------------------------------------------------------------- timing the commands
def _env(threads: int) -> dict:
    # PYTHONDONTWRITEBYTECODE (set in some environments) would make every timed process
    # compile aepar's modules from source again, which a user's Python does not do: the
    # warm-up runs write their bytecode caches, as a first use would
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE") and (threads or k not in THREAD_VARS)}
    if threads:
        env.update({var: str(threads) for var in THREAD_VARS})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _run(cmd, env) -> str:
    """The command's output; a failure ends the benchmark with its last line."""
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"bench.sparse_command: {' '.join(map(str, cmd[1:4]))} ... exited {done.returncode}: "
                         f"{tail[0]}")
    return done.stdout


def run(samples=10000, iterations=400, patch=8, hidden=25, seed=0, threads=1, repeats=3, work=None):
    """Time the three commands; returns the rows for peers.csv."""
    import numpy as np
    import scipy.io

    from aepar.data.sources import natural_images

    images, source = natural_images()
    scipy.io.savemat(Path(work) / "IMAGES.mat", {"IMAGES": np.asarray(images, dtype=np.float64)})
    mat = str(Path(work) / "IMAGES.mat")
    env, py = _env(threads), sys.executable
    sizes = ["--patch", str(patch), "--hidden", str(hidden), "--seed", str(seed)]
    runs = itertools.count(1)  # each run writes into a directory of its own

    def aepar_cmd(its, *more):
        return [py, "-m", "aepar.sparse", "--limit", str(samples), *sizes, "--iterations", str(its), "--images", mat,
                *more, "--quiet", "--out", str(Path(work) / f"aepar-{next(runs)}")]

    def textbook_cmd():
        out = Path(work) / f"textbook-{next(runs)}"
        out.mkdir()
        return [py, "-m", "bench.sparse_command", "--textbook-child", mat, "--samples", str(samples), *sizes,
                "--iterations", str(iterations), "--child-out", str(out)]

    commands = {"textbook command": textbook_cmd, "aepar command": lambda: aepar_cmd(iterations),
                FLOAT64: lambda: aepar_cmd(iterations, "--dtype", "float64"),
                "aepar start-up (1 iteration)": lambda: aepar_cmd(1)}
    envs = dict.fromkeys(commands, env)
    if not threads:  # OpenBLAS's default threads can slow the textbook down: its one-thread time beside it
        commands[ONE_BLAS_THREAD] = textbook_cmd
        envs[ONE_BLAS_THREAD] = _env(1)
    last = {}  # key -> (command, its output) of its latest run

    def call(key):
        cmd = commands[key]()
        last[key] = (cmd, _run(cmd, envs[key]))
    # the untimed warm-up runs fill Numba's cache, the bytecode caches and the file cache
    timings = time_calls({key: (lambda key=key: call(key)) for key in commands}, repeats)
    results = {}
    for key, (cmd, stdout) in last.items():
        if key.startswith("textbook command"):
            results[key] = json.loads(stdout.strip().splitlines()[-1])
        else:
            summary = json.loads((Path(cmd[-1]) / "summary.json").read_text())
            results[key] = {k: summary[k] for k in ("final_cost", "iterations", "evaluations")}
    # the seconds as written, so that the speedup column is the ratio of the seconds column
    seconds = {key: round(timings[key].seconds, 4) for key in commands}
    t_text = min(seconds[key] for key in commands if key.startswith("textbook command"))  # the faster
    descriptions = {
        "textbook command": "python -m bench.sparse_command --textbook-child: numpy+scipy only, seed-style sampling, "
                            "scipy.optimize.minimize L-BFGS-B, np.save(W1)",
        "aepar command": "python -m aepar.sparse --images IMAGES.mat --quiet --out DIR (weights.h5, features.png, "
                         "summaries; float32, the default)",
        FLOAT64: "the aepar command with --dtype float64",
        "aepar start-up (1 iteration)": "python -m aepar.sparse --iterations 1, same inputs",
        ONE_BLAS_THREAD: "the textbook command with every thread variable set to 1"}
    rows = []
    for key in commands:
        best = seconds[key]
        rows.append({"implementation": key, "samples": samples, "iterations": results[key]["iterations"],
                     "evaluations": results[key]["evaluations"], "seconds": f"{best:.4f}", "repeats": repeats,
                     "all_seconds": " ".join(f"{t:.3f}" for t in timings[key].samples),
                     "final_cost": f"{results[key]['final_cost']:.10g}",
                     "speedup_vs_textbook": f"{t_text / best:.2f}" if key != "aepar start-up (1 iteration)" else "",
                     "thread_setting": thread_setting(threads),
                     "description": f"{descriptions[key]}; images: {source}"})
    return rows


def thread_setting(threads: int) -> str:
    """The rows' ``thread_setting``: N (every thread variable set to N) or defaults (none set)."""
    return str(threads) if threads else "defaults"


def markdown(rows, threads) -> str:
    setting = f"{threads} thread(s)" if threads else "each program's default threads"
    lines = [f"## Whole commands, {rows[0]['samples']} patches, {setting}", "",
             "Each a fresh process timed from outside; best of the runs taken in turns (all in peers.csv)"
             + ("; speed-ups against the faster textbook run." if not threads else "."), "",
             "| command | iterations | evaluations | seconds (best) | all runs | speedup | final cost |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        speed = f"{r['speedup_vs_textbook']}x" if r["speedup_vs_textbook"] else ""
        lines.append(f"| {r['implementation']} | {r['iterations']} | {r['evaluations']} | {r['seconds']} | "
                     f"{r['all_seconds']} | {speed} | {r['final_cost']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sparse_command", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=10000, help="patches (default 10000)")
    p.add_argument("--iterations", type=int, default=400, help="L-BFGS iterations (default 400)")
    p.add_argument("--patch", type=int, default=8, help="patch side in pixels (default 8)")
    p.add_argument("--hidden", type=int, default=25, help="hidden units (default 25)")
    p.add_argument("--seed", type=int, default=0, help="seed of the patches and the start (default 0)")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS, Numba and aepar threads in every command; 0: none set, each program's own default "
                        "(default 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each command, in turns (default 3)")
    p.add_argument("--out", default=str(RESULTS / "peers.csv"), help="the CSV the rows are merged into")
    p.add_argument("--md", default="", help="also write the markdown table here")
    p.add_argument("--textbook-child", metavar="IMAGES_MAT", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.textbook_child:
        print(json.dumps(textbook_program(args.textbook_child, args.samples, args.iterations, args.patch,
                                          args.hidden, args.seed, args.child_out)))
        return 0
    if args.repeats < 1 or args.samples < 1 or args.iterations < 1:
        p.error("--samples, --iterations and --repeats must be at least 1")
    if args.threads < 0:
        p.error("--threads must be 0 (each program's default) or more")
    if args.threads:
        _set_threads(args.threads)  # this process's own NumPy (the IMAGES.mat it writes) as the children

    import aepar  # noqa: F401  (threads before numpy)

    with tempfile.TemporaryDirectory(prefix="aepar-sparse-command-") as work:
        rows = run(args.samples, args.iterations, args.patch, args.hidden, args.seed, args.threads, args.repeats,
                   work)
    machine = machine_columns(mpi=ONE_PROCESS)
    rows = [{k: r[k] for k in COLUMNS} for r in rows]
    if not args.threads:  # what each program ran: the textbook's OpenBLAS and aepar's own threads on every core
        cores = str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
        for r in rows:
            textbook = r["implementation"] == "textbook command"
            r.update(threads="1" if textbook else cores, blas_threads=cores if textbook else "1")
            if r["implementation"] == ONE_BLAS_THREAD:
                r.update(threads="1", blas_threads="1")
    merge_rows(with_machine(rows, machine), args.out, BENCHMARK,
               key=KEY + ("thread_setting",))
    md = markdown(rows, args.threads)
    if args.md:
        Path(args.md).write_text(md)
    print(md)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
