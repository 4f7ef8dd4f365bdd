"""Kernel bench: every kernel of every set checked against the NumPy oracle, then timed.

    python -m bench.kernels [--threads 1] [--repeats 10] [--rounds 2] [--quick] [--only dense,rbm]
                            [--sets numba,cupy,numpy] [--out DIR] [--list]

In the spirit of llm.c's ``dev/cuda`` programs: for each kernel family (dense,
activation, loss, sparsity, rbm, conv with transposed conv and max-pooling, update,
blocksum, sparse_ae) and each kernel set (numba ``aepar.kernels.nb``; cupy ``aepar.kernels.cp``
when CuPy and a GPU are there; numpy ``aepar.kernels.ref``, the oracle, timed as a row
of its own), the kernel is FIRST run at the bench shape and compared with the
reference (every output, and every array it updates in place), THEN timed at that
shape: a warm-up call, a number of calls per sample calibrated so that a sample lasts
``--min-time`` seconds (the device synchronised at its end on the GPU), best of
``--repeats`` samples, and the whole pass over the kernels done ``--rounds`` times (the
fastest counts: a shared VM's speed changed by up to 2x for seconds at a time, and a
single pass could time one kernel in a slow spell and its neighbour in a fast one); arrays
a kernel updates in place are restored (untimed) before each sample, and a row whose timed
calls still reached inf/NaN says so in ``timing_note``. Repeated calls keep their operands
in cache when they fit, so a small kernel may beat the memory roof: its fraction of the
bandwidth peak can pass 1.

The shapes are the models': the stacked autoencoder 784-1000-500-250-30 at batch 100
(float32, the default of the backprop and RBM schemes), the classifier head on the CAE
codes (1568 -> 10), RBM CD-1 per layer, the CAE of :mod:`aepar.models.cae` on 1x28x28
(conv 3x3 16 and 32 filters, 2x2 pooling, 2x2/2 transposed convs, batch 100, float32),
Adam and SGD on 784x1000, and the sparse autoencoder (64-25, 10,000 patches, float64)
both ways the model calls it: one shard with the KL term folded in, and per leaf of 128
samples as :class:`aepar.models.sparse_ae.SparseAutoencoder` does.

Correctness: ``|got - ref| <= atol + rtol |ref|`` elementwise, ``rtol = 8 eps sqrt(work)``
(``eps`` of the kernel's dtype, ``work`` the longest sum the output involves, as
tests/gradcheck.py derives them) and ``atol = rtol max|ref|``; outputs must also keep
their dtype and shape. ``err_to_tol`` is the worst ratio of error to allowance (<= 1
passes). A failure is recorded in the row's ``check`` column and makes the exit code 1;
the kernel is still timed unless it raised. Bernoulli CD noise is moved 1e-3 away from
the probabilities it is compared with, so rounding cannot flip a sampled state.

Peaks, measured in the same process with the same threads (before and after the kernels,
the better counts): SGEMM and DGEMM of n x n matrices (``np.matmul``, n = 2000, best of
5; 2 n^3 FLOPs) and memory bandwidth as a copy of a 256 MB array (``np.copyto``,
STREAM's count: 2 x 256 MB moved). On the GPU: ``cupy.matmul`` at n = 4096 and a 256 MB
device copy. float32 rows are held against SGEMM, float64 rows against DGEMM.

FLOPs (per call). One FLOP per add, multiply, divide, comparison/max, sqrt, exp or log
that the formula needs (a transcendental counts as one; abs, selects and the stable
sigmoid's branch count nothing): sigmoid 3 (exp, add, divide), its backward 3,
relu 1, relu backward 1. B batch, I/O layer widths, V/H visible/hidden units, N
elements. A convolution counts only the taps that land on the image (not on the zero
padding): T = sum over output pixels of the kernel taps inside the input (conv 3x3 pad 1
on 28x28: 0.95 of 9 per pixel); for a transposed conv, T of the conv it is the adjoint of.

=========================== ================================================================
kernel                      FLOPs
=========================== ================================================================
dense_forward               2BIO + BO (bias) + f_act BO
dense_backward              g_act BO (dz) + 2BIO + IO (dW +=) + BO (db) [+ 2BIO for dx]
sigmoid/relu fwd, bwd       3N / 1N, 3N / 1N
mse_forward, backward       3N (sub, square, sum), 2N (sub, scale)
sigmoid_xent_forward        7N (max, z t, exp, log1p, 2 add/sub, sum) + 3N (y = sigmoid)
sigmoid_xent_backward       2N
softmax_xent_forward        5BC (max, sub, exp, sum, divide) + 3B (log, sub, sum)
softmax_xent_backward       BC + B
kl_sparsity fwd, bwd        9H (2 div, 2 log, 1 sub, 2 mul, 2 add), 5H (2 div, sub, add, mul)
weight_decay fwd, bwd       2N (square, sum), 2N (mul, add)
tied_ae_update              10BIO (five products) + (2 + 2f_act) BO (code units: bias, act,
                            act', column sum) + 13BI (output: bias, sigmoid, error, dy, its
                            sigmoid', column sum) + 7IO (W's two parts, weight cost, velocity,
                            step) + 4(I + O) (the biases' steps)
rbm_hidden, rbm_visible     2BVH + 4BH (bias, sigmoid), 2BVH + 4BV
rbm_free_energy             2BVH + BH + 4BH (softplus 3, sum) + 2BV (v.bv) + B
rbm_cd_backward (CD-1)      10BVH (five products) + (2f_h + 3) BH + 9BV + 3VH + 2V + 2H,
                            f_h = 4 bernoulli (bias, sigmoid) or 1 gaussian (bias)
rbm_cd_update (CD-1)        as cd_backward, with 8VH + 8(V + H) for gradient, weight cost,
                            velocity and step instead of 3VH + 2V + 2H
rbm_cd_factors_blocks       the chain's three products 6BVH + (2f_h + 4) BH + 6BV (the W
                            gradient is block_outer_sum's)
conv2d_forward              2 Cout Cin N T + N Cout Ho Wo
conv2d_backward             4 Cout Cin N T (dW and dx) + Cout Cin kh kw + N Cout Ho Wo
conv2d_transpose fwd, bwd   the same with the roles of input and output exchanged
maxpool2x2 fwd, bwd         3 per output (comparisons), 0 (data movement only)
adam_update                 13N (m: 3, v: 4, step: sqrt, 2 mul, add, div, sub)
sgd_momentum_update         4N
sparse_ae_partials          10mvh (five products) + 10mh + 11mv with the KL term folded (one
                            shard, or per leaf with ρ̂ from sparse_ae_activations: "rounds");
                            12mvh + 10mh + 11mv per leaf in one round (x^T s: a sixth product)
=========================== ================================================================

Bytes are the least each call must move: every input read once, every output written
once, every array updated in place read and written (itemsize of its dtype; int8 pooling
indices, int64 labels). GFLOP/s = FLOPs / seconds, GB/s = bytes / seconds, arithmetic
intensity = FLOPs / bytes.

Outputs (``--out DIR``, default bench/results; runs/bench-kernels-quick with --quick):
``kernels.csv``, one row per (kernel, set) plus the peaks as rows of family ``peak``.
Every row carries the machine (:func:`aepar.machine.describe`), ``numba_cpu_name``
(NUMBA_CPU_NAME, "host" if unset), ``numba_cpu_features`` (NUMBA_CPU_FEATURES),
``numba_isa`` (the vector ISA Numba's code may use: NUMBA_CPU_NAME=haswell alone still
lets it emit AVX-512 on an AVX-512 host; add NUMBA_CPU_FEATURES=-avx512f for AVX2 code),
``openblas_coretype`` (OPENBLAS_CORETYPE if set) and ``openblas_arch`` (the kernels the
loaded OpenBLAS reports). Rows of earlier runs are kept; a row is replaced only by one
with the same (kernel, set, shape, dtype, threads, numba_cpu_name, numba_cpu_features,
openblas_coretype, cpu_model). ``kernels.md``: the table for this CPU and thread count,
one column per code path found in the CSV. ``kernels_roofline.png``: the CSV's rows of this
run's code path (so a run of a few families keeps the others' points) on log-log axes
against the roofs measured in this run (kernels with no FLOPs are not drawn).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench.common import ONE_PROCESS, machine_columns, mpi_env, python_command, time_call
from bench.kernel_cases import FAMILIES, Case, case_rng, catalog

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
QUICK_OUT = ROOT / "runs" / "bench-kernels-quick"
SETS = ("numba", "cupy", "numpy")
KEY = ("kernel", "set", "shape", "dtype", "threads", "numba_cpu_name", "numba_cpu_features",
       "openblas_coretype", "cpu_model")
ROW_FIELDS = ("family", "kernel", "set", "shape", "dtype", "check", "err_to_tol", "seconds", "repeats",
              "calls_per_sample", "flops", "bytes", "gflops", "gbs", "intensity", "peak_kind", "peak_gflops",
              "frac_compute_peak", "peak_gbs", "frac_bw_peak", "device", "numba_cpu_name",
              "numba_cpu_features", "numba_isa", "openblas_coretype", "openblas_arch", "quick", "timestamp",
              "loadavg_start", "timing_note")


def _set_threads(n: int) -> bool:
    """Fix aepar/BLAS/Numba threads before NumPy loads; False if it is too late."""
    if "numpy" in sys.modules:
        return False
    for var in ("AEPAR_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = str(n)
    return True


# ---------------------------------------------------------------------------- kernel sets
@dataclass
class KernelSet:
    name: str
    K: object
    to_dev: Callable
    to_host: Callable
    sync: Callable
    device: str
    peaks: dict = field(default_factory=dict)


def load_sets(names, log) -> list:
    import numpy as np
    from aepar import kernels
    from aepar.kernels import memory
    out = []
    for name in names:
        if name == "cupy":
            try:
                import cupy
                if cupy.cuda.runtime.getDeviceCount() < 1:
                    raise RuntimeError("no CUDA device")
                K = kernels.load("cupy")
                props = cupy.cuda.runtime.getDeviceProperties(0)
                gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            except Exception as e:  # no CuPy, no driver, no GPU: the CPU sets still run
                log(f"cupy: skipped ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
                continue

            def sync(cupy=cupy):
                cupy.cuda.get_current_stream().synchronize()
            out.append(KernelSet("cupy", K, cupy.asarray, cupy.asnumpy, sync, gpu))
        else:
            # host inputs laid out as the CPU backend lays out a run's arrays (on cache lines)
            out.append(KernelSet(name, kernels.load(name), memory.aligned, np.asarray, lambda: None, "cpu"))
    return out


def _copy_inputs(host: dict, to_dev) -> dict:
    import numpy as np
    return {k: to_dev(v.copy()) if isinstance(v, np.ndarray) else v for k, v in host.items()}


# ---------------------------------------------------------------------------- check
def _tolerance(dtype, work):
    import numpy as np
    return 8 * float(np.finfo(dtype).eps) * math.sqrt(max(int(work), 1))


def compare(got_list, ref_list, names, dtype, work, to_host) -> tuple[str, float]:
    """("ok" or what failed, worst error / allowance) of a set's outputs against the oracle's."""
    import numpy as np
    rtol = _tolerance(dtype, work)
    worst, problems = 0.0, []
    if len(got_list) != len(ref_list):
        return f"FAIL: {len(got_list)} outputs, the reference has {len(ref_list)}", math.inf
    for name, got, want in zip(names, got_list, ref_list):
        if isinstance(want, np.ndarray):
            if got is None or not hasattr(got, "shape"):
                problems.append(f"{name}: {type(got).__name__}, not an array")
                continue
            g = to_host(got)
            if g.shape != want.shape or g.dtype != want.dtype:
                problems.append(f"{name}: {g.dtype}{g.shape}, reference {want.dtype}{want.shape}")
                worst = math.inf
                continue
        else:
            g = np.asarray(float(to_host(got)) if hasattr(got, "shape") else got, dtype=np.float64)
        w = np.asarray(want, dtype=np.float64)
        g = np.asarray(g, dtype=np.float64)
        if w.size == 0:
            continue
        finite = np.isfinite(w)
        if not np.array_equal(finite, np.isfinite(g)) or not np.array_equal(w[~finite], g[~finite]):
            problems.append(f"{name}: non-finite values differ")
            worst = math.inf
            continue
        scale = float(np.max(np.abs(w[finite]))) if finite.any() else 0.0
        allow = rtol * max(scale, 1e-30) + rtol * np.abs(w[finite])
        ratio = float(np.max(np.abs(g[finite] - w[finite]) / allow)) if finite.any() else 0.0
        worst = max(worst, ratio)
        if ratio > 1:
            problems.append(f"{name}: error {ratio:.3g}x the tolerance (rtol {rtol:.2g})")
    return ("ok" if not problems else "FAIL: " + "; ".join(problems)), worst


def check(case: Case, ks: KernelSet, ref_out, host) -> tuple[str, float]:
    a = _copy_inputs(host, ks.to_dev)
    if case.prep:
        case.prep(ks.K, a)
    try:
        got = case.run(ks.K, a)
        ks.sync()
    except Exception as e:
        return f"ERROR: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", math.inf
    if case.canon:
        got, ref_out = case.canon([ks.to_host(o) if hasattr(o, "shape") else o for o in got]), case.canon(ref_out)
    return compare(got, ref_out, case.outs, case.dtype, case.work, ks.to_host)


def _all_finite(outs, to_host) -> bool:
    import numpy as np
    return all(bool(np.all(np.isfinite(np.asarray(to_host(o) if hasattr(o, "shape") else o, dtype=np.float64))))
               for o in outs if o is not None)


# ---------------------------------------------------------------------------- peaks
def measure_peaks(ks: KernelSet, quick: bool) -> dict:
    """GEMM GFLOP/s (float32, float64) and copy GB/s of this set's device, best of a few."""
    import numpy as np
    if ks.name == "cupy":
        import cupy as xp
        n, mb = (512, 16) if quick else (4096, 256)
    else:
        xp = np
        n, mb = (256, 8) if quick else (2000, 256)
    reps = 3 if quick else 5
    peaks = {}
    rng = np.random.default_rng(0)
    for kind, dt in (("sgemm", np.float32), ("dgemm", np.float64)):
        a = xp.asarray(rng.standard_normal((n, n)).astype(dt))
        b = xp.asarray(rng.standard_normal((n, n)).astype(dt))
        c = xp.empty((n, n), dtype=dt)
        t = time_call(lambda: xp.matmul(a, b, out=c), reps, sync=ks.sync).seconds
        peaks[kind] = (2.0 * n ** 3 / t / 1e9, t, f"{n}x{n}x{n}", 2.0 * n ** 3, 3 * n * n * np.dtype(dt).itemsize)
    count = mb * 2 ** 20 // 8
    src = xp.ones(count)
    dst = xp.empty(count)
    t = time_call(lambda: xp.copyto(dst, src), reps, sync=ks.sync).seconds
    peaks["copy"] = (2.0 * count * 8 / t / 1e9, t, f"{mb}MB", 0.0, 2.0 * count * 8)
    return peaks


def _best_peaks(a: dict, b: dict) -> dict:
    return {k: max(a[k], b[k], key=lambda p: p[0]) for k in a}


# ---------------------------------------------------------------------------- machine
def _openblas_arch() -> str:
    try:
        from threadpoolctl import threadpool_info
        for info in threadpool_info():
            if info.get("internal_api") == "openblas":
                return info.get("architecture") or ""
    except Exception:
        pass
    return ""


def machine_and_code_path(threads: int) -> dict:
    """The machine columns and the code path: what Numba compiles for (``numba_isa``: the
    kernels' own :func:`aepar.kernels.nb.simd.target_isa`), OpenBLAS's core type."""
    from aepar.kernels.nb.simd import target_isa

    cols = machine_columns(mpi=ONE_PROCESS, threads=threads)
    cols.update(numba_cpu_name=os.environ.get("NUMBA_CPU_NAME") or "host",
                numba_cpu_features=os.environ.get("NUMBA_CPU_FEATURES", ""), numba_isa=target_isa(),
                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", ""), openblas_arch=_openblas_arch(),
                loadavg_start=f"{os.getloadavg()[0]:.2f}")  # > 0 before the run: others shared the cores
    return cols


# ---------------------------------------------------------------------------- rows, files
def _fmt(x, digits=4):
    if isinstance(x, float):
        return "" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.{digits}g}")
    return x


def make_row(case_or_peak, ks: KernelSet, machine: dict, seconds, calls, repeats, check_s, err, quick) -> dict:
    c = case_or_peak
    flops, nbytes = float(c.flops), float(c.bytes)
    peak_kind = "sgemm" if c.dtype == "float32" else "dgemm"
    peak = ks.peaks.get(peak_kind, (math.nan,))[0]
    bw = ks.peaks.get("copy", (math.nan,))[0]
    ok_time = seconds is not None and seconds > 0
    gflops = flops / seconds / 1e9 if ok_time else math.nan
    gbs = nbytes / seconds / 1e9 if ok_time else math.nan
    row = {"family": c.family, "kernel": c.kernel, "set": ks.name, "shape": c.shape, "dtype": c.dtype,
           "check": check_s, "err_to_tol": _fmt(float(err), 3), "seconds": _fmt(seconds if ok_time else math.nan, 6),
           "repeats": repeats, "calls_per_sample": calls, "flops": int(flops), "bytes": int(nbytes),
           "gflops": _fmt(gflops), "gbs": _fmt(gbs), "intensity": _fmt(flops / nbytes if nbytes else math.nan),
           "peak_kind": (("gpu_" if ks.name == "cupy" else "") + peak_kind), "peak_gflops": _fmt(peak),
           "frac_compute_peak": _fmt(gflops / peak if flops else math.nan, 3),
           "peak_gbs": _fmt(bw), "frac_bw_peak": _fmt(gbs / bw, 3), "device": ks.device, "quick": int(quick),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}
    row.update({k: v for k, v in machine.items()})
    return row


def peak_rows(ks: KernelSet, machine: dict, quick: bool, repeats: int) -> list:
    rows = []
    for kind, (rate, t, shape, flops, nbytes) in ks.peaks.items():
        dtype = {"sgemm": "float32", "dgemm": "float64", "copy": "float64"}[kind]
        fake = Case("peak", kind, shape, dtype, flops, nbytes, 1, (), None, None)
        row = make_row(fake, ks, machine, t, 1, repeats, "", 0.0, quick)
        row["set"] = "cupy" if ks.name == "cupy" else "numpy"  # measured with the array library
        if kind == "copy":
            row.update(intensity="", frac_compute_peak="", peak_kind="")
        rows.append(row)
    return rows


def _key(row):
    return tuple(str(row.get(k, "")) for k in KEY)


def merge_csv(path: Path, rows: list) -> list:
    """Write ``rows`` into the CSV, keeping earlier rows unless one of ``rows`` has their
    key (KEY); returns all rows now in the file."""
    old, fields = [], []
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields = list(reader.fieldnames or [])
            old = list(reader)
    new_keys = {_key(r) for r in rows}
    kept = [r for r in old if _key(r) not in new_keys]
    for name in list(ROW_FIELDS) + [k for r in rows for k in r]:
        if name not in fields:
            fields.append(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows(kept + rows)
    os.replace(tmp, path)
    return kept + rows


def _env_label(r) -> str:
    """The code path a row ran on: Numba's target, OpenBLAS's kernels, the device."""
    label = r.get("numba_cpu_name") or "host"
    if r.get("numba_cpu_features"):
        label += f" [{r['numba_cpu_features']}]"
    if r.get("openblas_coretype"):
        label += f" blas={r['openblas_coretype']}"
    if r.get("device", "cpu") != "cpu":
        label += f" ({r['device']})"
    return label


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _pct(f):
    return "" if math.isnan(f) else (f"{f:.1%}" if f < 0.1 else f"{f:.0%}")


def write_markdown(path: Path, rows: list, machine: dict, argv_line: str):
    """The table of this CPU and thread count: one column per (kernel set, code path) in the CSV."""
    mine = [r for r in rows if r.get("cpu_model") == machine["cpu_model"]
            and str(r.get("threads")) == str(machine["threads"])]
    envs = list(dict.fromkeys(_env_label(r) for r in mine))
    lines = ["# Kernel bench: `python -m bench.kernels`", "",
             f"Machine: {machine['cpu_model']} ({machine['isa'].split(' [')[0]}), {machine['cores']} cores, "
             f"{machine['blas']}; {machine['threads']} thread(s). Last run: `{argv_line}` "
             f"({time.strftime('%Y-%m-%d %H:%M')}). Columns, formulas and method: `bench/kernels.py`.", "",
             "Code paths: NUMBA_CPU_NAME [NUMBA_CPU_FEATURES] and OPENBLAS_CORETYPE when set; `numba_isa` "
             "is the vector ISA Numba's code may use, `OpenBLAS` the kernels OpenBLAS reports.", "",
             "| code path | numba_isa | OpenBLAS | SGEMM GFLOP/s | DGEMM GFLOP/s | copy GB/s |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for env in envs:
        at = [r for r in mine if _env_label(r) == env]
        pk = {r["kernel"]: r for r in at if r["family"] == "peak"}
        cell = lambda k, col: f"{_num(pk[k][col]):.1f}" if k in pk else ""  # noqa: E731
        lines.append(f"| {env} | {at[0].get('numba_isa', '')} | {at[0].get('openblas_arch', '')} | "
                     f"{cell('sgemm', 'gflops')} | {cell('dgemm', 'gflops')} | {cell('copy', 'gbs')} |")
    lines += ["", "Cells: GFLOP/s (fraction of that path's SGEMM peak for float32, DGEMM for float64); "
              "kernels with no FLOPs: GB/s (fraction of the copy bandwidth). FAIL: the check against the "
              "NumPy reference failed.", ""]
    table = {}
    for r in mine:
        if r["family"] != "peak":
            table.setdefault((r["family"], r["kernel"], r["shape"], r["dtype"]), {})[
                f"{r['set']} {_env_label(r)}"] = r
    cols = list(dict.fromkeys(f"{r['set']} {_env_label(r)}" for r in mine if r["family"] != "peak"))
    cols.sort(key=lambda c: (SETS.index(c.split(" ")[0]) if c.split(" ")[0] in SETS else 9))
    lines += ["| kernel | shape | dtype | " + " | ".join(cols) + " |",
              "| --- | --- | --- | " + " | ".join("---:" for _ in cols) + " |"]
    for k, by in table.items():
        cells = []
        for c in cols:
            r = by.get(c)
            if r is None:
                cells.append("")
                continue
            g = _num(r["gflops"])
            if _num(r["flops"]) > 0 and not math.isnan(g):
                cell = f"{g:.1f} ({_pct(_num(r['frac_compute_peak']))})"
            elif not math.isnan(_num(r["gbs"])):
                cell = f"{_num(r['gbs']):.1f} GB/s ({_pct(_num(r['frac_bw_peak']))} bw)"
            else:
                cell = "-"
            cell += " (non-finite)" if r.get("timing_note") else ""
            cells.append(cell if r["check"] == "ok" else "FAIL " + cell)
        lines.append(f"| {k[1]} | {k[2]} | {k[3].replace('float', 'f')} | " + " | ".join(cells) + " |")
    others = sorted({(r.get("cpu_model"), str(r.get("threads"))) for r in rows}
                    - {(machine["cpu_model"], str(machine["threads"]))})
    if others:
        lines += ["", "Also in kernels.csv: " + "; ".join(f"{c} at {t} thread(s)" for c, t in others) + "."]
    path.write_text("\n".join(lines) + "\n")


def _short(row):
    """A point's label: the kernel abbreviated, the shape's sizes (and the sparse AE's kind)."""
    k = row["kernel"].replace("_forward", " fwd").replace("_backward", " bwd").replace("conv2d_transpose", "tconv")
    k = k.replace("conv2d", "conv").replace("sparse_ae_partials", "sparse_ae")
    words = row["shape"].split(" ")
    return f"{k} {words[0]}" + (f" {words[-1]}" if row["family"] == "sparse_ae" else "")


PATH_KEY = ("device", "threads", "numba_cpu_name", "numba_cpu_features", "openblas_coretype", "cpu_model", "quick")


def _on_this_path(merged: list, rows: list) -> list:
    """The kernel rows of the CSV measured on the code paths of this run's ``rows``: a run
    of a few families still draws the others' latest points."""
    paths = {tuple(str(r.get(k, "")) for k in PATH_KEY) for r in rows}
    sets = {r["set"] for r in rows}
    return [r for r in merged if r["family"] != "peak" and r["set"] in sets
            and tuple(str(r.get(k, "")) for k in PATH_KEY) in paths]


def write_roofline(path: Path, rows: list, sets: list):
    """The kernels of this run's code path on log-log axes (intensity, GFLOP/s) under the
    roofs measured in this run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = []
    for ks in sets:
        if ks.device not in [d for d, _ in devices]:
            devices.append((ks.device, ks))
    fig, axes = plt.subplots(1, len(devices), figsize=(13 * len(devices), 9), squeeze=False)
    colors = {"numba": "tab:blue", "numpy": "tab:gray", "cupy": "tab:green"}
    for ax, (device, ks) in zip(axes[0], devices):
        pts = [r for r in rows if r["device"] == device and r["family"] != "peak"
               and _num(r["flops"]) > 0 and _num(r["gflops"]) > 0]
        skipped = sum(1 for r in rows if r["device"] == device and r["family"] != "peak" and not _num(r["flops"]) > 0)
        bw = ks.peaks["copy"][0]
        xi = [_num(r["intensity"]) for r in pts] or [1.0]
        lo = math.floor(math.log10(min(min(xi), 0.5))) - 0.3
        hi = math.ceil(math.log10(max(max(xi), 2 * ks.peaks["sgemm"][0] / bw))) + 0.6  # room for labels
        xs = [10 ** (lo + (hi - lo) * i / 200) for i in range(201)]
        for kind, style in (("sgemm", "-"), ("dgemm", "--")):
            peak = ks.peaks[kind][0]
            ax.plot(xs, [min(peak, bw * x) for x in xs], style, color="black", lw=1.2,
                    label=f"{kind.upper()} {peak:.0f} GFLOP/s" + (f"; copy {bw:.1f} GB/s" if kind == "sgemm" else ""))
        ax.set_xlim(xs[0], xs[-1])
        for r in pts:
            x, y = _num(r["intensity"]), _num(r["gflops"])
            mk = "o" if r["dtype"] == "float32" else "s"
            bad = r["check"] != "ok"
            ax.scatter([x], [y], marker=mk, s=22, color="red" if bad else colors.get(r["set"], "k"),
                       edgecolors="black" if bad else "none", zorder=3)
            ax.annotate(_short(r), (x, y), fontsize=5, xytext=(3, 2), textcoords="offset points",
                        color=colors.get(r["set"], "k"))
        for name, c in colors.items():
            if any(r["set"] == name for r in pts):
                ax.scatter([], [], color=c, label=name)
        ax.scatter([], [], marker="o", color="white", edgecolors="black", label="float32")
        ax.scatter([], [], marker="s", color="white", edgecolors="black", label="float64")
        if any(r["check"] != "ok" for r in pts):
            ax.scatter([], [], color="red", edgecolors="black", label="failed its check")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte, least bytes moved)")
        ax.set_ylabel("GFLOP/s")
        title = f"{device if device != 'cpu' else _cpu_title(rows)}"
        if skipped:
            title += f"\n({skipped} rows without FLOPs not drawn)"
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def _cpu_title(rows):
    r = next((r for r in rows), {})
    target = " ".join(filter(None, (r.get("numba_cpu_name", ""), r.get("numba_cpu_features", ""))))
    return (f"{r.get('cpu_model', '')}, {r.get('threads', '')} thread(s); Numba {target} -> {r.get('numba_isa', '')}; "
            f"OpenBLAS {r.get('openblas_arch', '')}")


# ---------------------------------------------------------------------------- main
def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.kernels",
        description="Check every kernel set (numba, cupy when a GPU is there, numpy) against the NumPy "
                    "reference at the models' shapes, then time it (warm-up, best of --repeats, GPU "
                    "synchronised); report GFLOP/s, GB/s and arithmetic intensity against SGEMM/DGEMM "
                    "and copy bandwidth measured in the same run. Writes kernels.csv (merged with earlier "
                    "runs: rows of other machines and code paths are kept), kernels.md and "
                    "kernels_roofline.png. Exit code 1 if any kernel failed its check.",
        epilog="The AVX2 code path on an AVX-512 machine: NUMBA_CPU_NAME=haswell "
               "NUMBA_CPU_FEATURES=-avx512f OPENBLAS_CORETYPE=Haswell python -m bench.kernels "
               "(NUMBA_CPU_NAME alone keeps the host's AVX-512 features; see the numba_isa column).")
    p.add_argument("--threads", type=int, default=1,
                   help="threads for aepar, BLAS and Numba (AEPAR_THREADS, OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS); "
                        "the peaks are measured with the same (default 1)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed samples per kernel, the best counts (default 10; 2 with --quick)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds a timed sample lasts at least: short kernels are called many times per "
                        "sample (default 0.05; 0.002 with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="passes over all the kernels, each timing every kernel again, the best counts "
                        "(default 2; 1 with --quick): a shared VM's speed changes for seconds at a time, and "
                        "one pass can time a kernel in a slow spell")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, small peaks, few repeats (for tests); writes to "
                        f"{QUICK_OUT.relative_to(ROOT)} unless --out is given")
    p.add_argument("--only", default="", help=f"families to run, comma-separated: {','.join(FAMILIES)}")
    p.add_argument("--sets", default=",".join(SETS),
                   help="kernel sets to check and time, comma-separated (default numba,cupy,numpy; cupy is "
                        "skipped without CuPy and a GPU)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"directory for kernels.csv/.md/_roofline.png (default {RESULTS.relative_to(ROOT)})")
    p.add_argument("--list", action="store_true", help="print the cases (kernel, shape, dtype, FLOPs, bytes) and exit")
    p.add_argument("--warm", action="store_true",
                   help="run every numba kernel once at small shapes, then each command once on a few hundred rows "
                        "at 1 thread and at this machine's threads (pre-training also at 2, 3 and 8), so that Numba "
                        "caches its machine code, and exit (make venv does this; nothing is checked, timed or kept)")
    return p


def _split(value, allowed, what, parser):
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        parser.error(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def warm(log) -> int:
    """``--warm``: run every kernel of the numba set once at the small shapes, the host's
    L-BFGS (``--optimizer lbfgs``) for a few iterations, and the commands once each, tiny
    (:func:`warm_commands`), so that Numba compiles and caches them now (``make venv``
    does this once), not in every rank of a first run at the same moment. No checks, no
    timings, no files kept."""
    from aepar import kernels
    from aepar.optim import LBFGS
    K = kernels.load("numba")
    started = time.perf_counter()
    cases = catalog(quick=True)
    for case in cases:
        a = case.make(case_rng(case.name))
        if case.prep:
            case.prep(K, a)
        case.run(K, a)
    LBFGS.warm_up()  # the host's L-BFGS kernels (--optimizer lbfgs), not a set's
    log(f"bench.kernels --warm: {len(cases)} kernel cases compiled and cached in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    runs = warm_commands()
    log(f"bench.kernels --warm: {runs} tiny command runs compiled what they add in "
        f"{time.perf_counter() - started:.0f} s")
    return 0


# The commands' own paths, tiny: each compiles specializations the catalog's cases do not
# give (the sparse autoencoder's float32 tiles, a layer's blocks as tuples as long as a
# thread's group of blocks, the fine-tuning's Adam, ...). Numba's cache holds them by type,
# not by size, so a few hundred rows give what a full run needs.
WARM_COMMANDS = (
    ("aepar.sparse", ["--iterations", "3", "--limit", "1280"]),
    ("aepar.pretrain", ["--scheme", "greedy", "--pretrainer", "rbm", "--dataset", "mnist5k", "--limit", "400",
                        "--epochs", "1", "--finetune-epochs", "1"]),
    ("aepar.pretrain", ["--scheme", "greedy", "--pretrainer", "ae", "--dataset", "mnist5k", "--limit", "400",
                        "--epochs", "1", "--finetune-epochs", "1"]),
    ("aepar.eager", ["--preset", "small", "--limit", "300", "--epochs", "1", "--mono-epochs", "1",
                     "--classify-epochs", "1"]),
)


# A thread's (or a rank's) group of a batch's 8 blocks is a tuple whose length Numba compiles
# for: 8 at one thread, 4 at two, 3 and 2 at three (and on 3 ranks), 1 at eight or more;
# no layout of 8 blocks gives 5-7
GROUP_THREADS = (1, 2, 3, 8)
# command runs at once, at most (one a core below that): each holds about 1 GB while it compiles
WARM_PROCESSES = 4


def warm_commands() -> int:
    """Each of :data:`WARM_COMMANDS` once at one thread (a rank per core under mpirun) and
    once at this machine's default (one process on every core), and the pre-training ones
    also at :data:`GROUP_THREADS`, so that a first run on other ranks or threads finds its
    block groups compiled. As many runs at once as there are cores (at most
    :data:`WARM_PROCESSES`), the one-thread runs, which compile the most, first: the
    kernels' cache saves hold a lock (kernels/nb/caching.py), so runs compiling one kernel
    for different types keep each type's entry. Runs in a temporary directory it removes;
    returns the number of runs. A failed run ends the warm-up (the runs not yet started
    are dropped) with its command and the end of its error output."""
    import subprocess
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from aepar._threads import usable_cores

    cores = usable_cores()
    runs = sorted(((n, i) for i, (module, _) in enumerate(WARM_COMMANDS)
                   for n in {1, cores, *(GROUP_THREADS if module == "aepar.pretrain" else ())}),
                  key=lambda run: (run[0] != 1, run[1], run[0]))

    def one(tmp, n, i):
        module, args = WARM_COMMANDS[i]
        cmd = python_command(module, [*args, "--quiet", "--no-plot", "--out", Path(tmp) / f"{i}-{n}"])
        proc = subprocess.run(cmd, env=mpi_env(AEPAR_THREADS=n), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"bench.kernels --warm: {' '.join(cmd[1:])} failed (exit {proc.returncode}):\n"
                             f"{proc.stderr[-2000:]}")

    with tempfile.TemporaryDirectory(prefix="aepar-warm-") as tmp:
        pool = ThreadPoolExecutor(max_workers=max(1, min(cores, WARM_PROCESSES)))
        try:
            for started in [pool.submit(one, tmp, n, i) for n, i in runs]:
                started.result()
        finally:
            pool.shutdown(cancel_futures=True)
    return len(runs)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    families = _split(args.only, FAMILIES, "family", parser) or list(FAMILIES)
    set_names = _split(args.sets, SETS, "kernel set", parser)
    if not set_names:
        parser.error("--sets names no kernel set")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rounds = args.rounds or (1 if args.quick else 2)
    repeats = args.repeats or (2 if args.quick else 10)
    min_time = args.min_time if args.min_time is not None else (0.002 if args.quick else 0.05)
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    set_now = _set_threads(args.threads)

    import aepar  # noqa: F401  (threads fixed before numpy)
    import numpy as np

    def log(msg):
        print(msg, flush=True)

    if args.warm:
        return warm(log)
    cases = [c for c in catalog(args.quick) if c.family in families]
    if args.list:
        for c in cases:
            log(f"{c.family:<10} {c.kernel:<26} {c.shape:<36} {c.dtype:<8} {c.flops:>14,d} FLOP {c.bytes:>12,d} B")
        return 0
    started = time.perf_counter()
    threads = args.threads if set_now else int(os.environ.get("AEPAR_THREADS", aepar.THREADS))
    if not set_now:
        log(f"note: numpy was already imported; threads stay at AEPAR_THREADS={threads}, "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '')}")
    from aepar import kernels
    ref = kernels.load("numpy")
    sets = load_sets(set_names, log)
    machine = machine_and_code_path(threads)
    if (os.environ.get("NUMBA_CPU_NAME") and "NUMBA_CPU_FEATURES" not in os.environ
            and machine["numba_isa"] == "avx512" and os.environ["NUMBA_CPU_NAME"].lower() not in ("host",)):
        log(f"note: NUMBA_CPU_NAME={os.environ['NUMBA_CPU_NAME']} without NUMBA_CPU_FEATURES: Numba keeps this "
            "host's features and may still emit AVX-512 (numba_isa=avx512); add NUMBA_CPU_FEATURES=-avx512f "
            "for AVX2 code")
    log(f"bench.kernels: {machine['cpu_model']} ({machine['isa']}), load {machine['loadavg_start']}, "
        f"threads {threads}, numba "
        f"{machine['numba_cpu_name']} -> {machine['numba_isa']}, OpenBLAS {machine['openblas_arch']}; "
        f"{len(cases)} cases x {', '.join(ks.name for ks in sets)}; repeats {repeats}, min {min_time} s/sample, "
        f"{rounds} round(s)")
    peaks = {}  # per device: the CPU sets share one measurement
    for ks in sets:
        if ks.device not in peaks:
            peaks[ks.device] = measure_peaks(ks, args.quick)
            log(f"peaks {ks.device}: SGEMM {peaks[ks.device]['sgemm'][0]:.1f} GFLOP/s, "
                f"DGEMM {peaks[ks.device]['dgemm'][0]:.1f} GFLOP/s, copy {peaks[ks.device]['copy'][0]:.1f} GB/s")
        ks.peaks = peaks[ks.device]

    rows, failures = [], 0
    timed = []  # (row index, the call, its reset, what make_row needs) for the later rounds
    for case in cases:
        host = case.make(case_rng(case.name))
        ref_in = _copy_inputs(host, lambda a: a)
        ref_out = [np.array(o, copy=True) if isinstance(o, np.ndarray) else o for o in case.run(ref, ref_in)]
        for ks in sets:
            status, err = ("ok (oracle)", 0.0) if ks.name == "numpy" else check(case, ks, ref_out, host)
            seconds = calls = None
            note = ""
            if not status.startswith("ERROR"):
                a = _copy_inputs(host, ks.to_dev)
                if case.prep:
                    case.prep(ks.K, a)
                start = {k: ks.to_dev(host[k].copy()) for k in case.mutates}

                def reset(a=a, start=start):
                    for k, v in start.items():
                        a[k][...] = v

                def call(case=case, ks=ks, a=a):
                    case.run(ks.K, a)
                timing = time_call(call, repeats, sync=ks.sync, min_time=min_time, between=reset)
                seconds, calls = timing.seconds, timing.calls
                note = "" if _all_finite(case.run(ks.K, a), ks.to_host) else "timed calls reached non-finite values"
            status = "ok" if status == "ok (oracle)" else status
            failures += status != "ok"
            row = dict(make_row(case, ks, machine, seconds, calls, repeats, status, err, args.quick), timing_note=note)
            if seconds is not None:
                timed.append((len(rows), call, reset, (case, ks, status, err, note)))
            rows.append(row)
            frac = row["frac_compute_peak"] if case.flops else row["frac_bw_peak"]
            what = "of " + row["peak_kind"].upper() if case.flops else "of copy bw"
            t_us = f"{seconds * 1e6:10.1f} us" if seconds else f"{'-':>13}"
            log(f"{case.kernel:<26} {case.shape:<36} {case.dtype[5:]:<3} {ks.name:<6} {status[:60]:<4} {t_us} "
                f"{_fmt(_num(row['gflops'])) or '-':>8} GFLOP/s {_fmt(_num(row['gbs'])) or '-':>8} GB/s  "
                f"{_fmt(_num(frac)) or '-'} {what}" + (f"  [{note}]" if note else ""))
    for r in range(1, rounds):  # every kernel timed again, a pass later: the faster pass counts
        log(f"round {r + 1} of {rounds}")
        for i, call, reset, (case, ks, status, err, note) in timed:
            timing = time_call(call, repeats, sync=ks.sync, min_time=min_time, between=reset)
            seconds, calls = timing.seconds, timing.calls
            if seconds < _num(rows[i]["seconds"]):
                rows[i] = dict(make_row(case, ks, machine, seconds, calls, repeats, status, err, args.quick),
                               timing_note=note)
    for device, ks in {ks.device: ks for ks in sets}.items():  # again after the kernels: the better counts
        peaks[device] = _best_peaks(peaks[device], measure_peaks(ks, args.quick))
    for ks in sets:
        ks.peaks = peaks[ks.device]
    # the fractions against the final peaks
    by_set = {ks.name: ks for ks in sets}
    for r in rows:
        ks = by_set[r["set"]]
        peak, bw = ks.peaks["sgemm" if r["dtype"] == "float32" else "dgemm"][0], ks.peaks["copy"][0]
        r.update(peak_gflops=_fmt(peak), peak_gbs=_fmt(bw),
                 frac_compute_peak=_fmt(_num(r["gflops"]) / peak if _num(r["flops"]) else math.nan, 3),
                 frac_bw_peak=_fmt(_num(r["gbs"]) / bw, 3))
    for ks in {ks.device: ks for ks in sets}.values():
        rows += peak_rows(ks, machine, args.quick, 5 if not args.quick else 3)

    out.mkdir(parents=True, exist_ok=True)
    merged = merge_csv(out / "kernels.csv", rows)
    argv_line = " ".join(f"{k}={os.environ[k]}" for k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE")
                         if k in os.environ)
    argv_line = (argv_line + " python -m bench.kernels " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    write_markdown(out / "kernels.md", merged, machine, argv_line)
    write_roofline(out / "kernels_roofline.png", _on_this_path(merged, rows), sets)
    elapsed = time.perf_counter() - started
    log("peaks (best of before/after): " + "; ".join(
        f"{d}: SGEMM {p['sgemm'][0]:.1f}, DGEMM {p['dgemm'][0]:.1f} GFLOP/s, copy {p['copy'][0]:.1f} GB/s"
        for d, p in peaks.items()))
    log(f"wrote {out / 'kernels.csv'}, kernels.md, kernels_roofline.png in {elapsed:.0f} s; "
        f"{failures} check failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
