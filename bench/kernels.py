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
a kernel updates in place are restored (untimed) before each sample, and a row whose timed calls still reached inf/NaN says so in ``timing_note``. Repeated calls keep their operands in cache when they fit, so a
small kernel may beat the memory roof: its fraction of the bandwidth peak can pass 1.

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
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
QUICK_OUT = ROOT / "runs" / "bench-kernels-quick"
FAMILIES = ("dense", "activation", "loss", "sparsity", "rbm", "conv", "update", "blocksum", "sparse_ae")
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


# ---------------------------------------------------------------------------- the cases
@dataclass
class Case:
    """One kernel at one shape: how to make its inputs and call it.

    ``make(rng)`` returns a dict of host inputs (arrays and scalars); ``run(K, a)`` calls
    the kernel of set ``K`` on the (device) inputs ``a`` and returns the outputs to check,
    arrays updated in place included, named by ``outs``; ``prep(K, a)`` adds set-specific
    state (a workspace) once before the calls. The inputs named in ``mutates`` are updated
    in place and restored before every timed sample, so that thousands of calls do not
    walk the parameters out of the regime the model runs in (overflow, subnormals).
    """

    family: str
    kernel: str
    shape: str
    dtype: str
    flops: float
    bytes: float
    work: int
    outs: tuple
    make: Callable
    run: Callable
    prep: Callable | None = None
    mutates: tuple = ()
    canon: Callable | None = None  # host outputs -> what is compared, where sets may factor a result otherwise

    @property
    def name(self):
        return f"{self.kernel} {self.shape} {self.dtype}"


FLOP_ACT = {"sigmoid": 3, "relu": 1, "identity": 0}


def _rng(name):
    import numpy as np
    return np.random.default_rng(zlib.crc32(name.encode()))


def _dense_cases(shapes, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    cases = []
    for B, I, O, act, need_dx in shapes:
        shape = f"{B}x{I}x{O} {act}"

        def make_fwd(rng, B=B, I=I, O=O):
            return {"x": rng.random((B, I), dtype=dt), "W": (rng.standard_normal((I, O)) / math.sqrt(I)).astype(dt),
                    "b": (0.1 * rng.standard_normal(O)).astype(dt)}
        cases.append(Case("dense", "dense_forward", shape, dt, 2 * B * I * O + (1 + FLOP_ACT[act]) * B * O,
                          s * (B * I + I * O + O + B * O), I, ("a",), make_fwd,
                          lambda K, a, act=act: [K.dense_forward(a["x"], a["W"], a["b"], act)]))
        bshape = shape + ("" if need_dx else " no-dx")

        def make_bwd(rng, make_fwd=make_fwd, act=act, O=O, B=B):
            a = make_fwd(rng)
            a["a"] = ref.dense_forward(a["x"], a["W"], a["b"], act)
            a["da"] = (0.01 * rng.standard_normal((B, O))).astype(dt)
            a["dW"], a["db"] = np.zeros_like(a["W"]), np.zeros_like(a["b"])
            return a

        def run_bwd(K, a, act=act, need_dx=need_dx):
            dx = K.dense_backward(a["da"], a["x"], a["W"], a["a"], act, a["dW"], a["db"], need_dx)
            return ([dx] if need_dx else []) + [a["dW"], a["db"]]
        g_act = FLOP_ACT[act]
        flops = g_act * B * O + 2 * B * I * O + I * O + B * O + (2 * B * I * O if need_dx else 0)
        nbytes = s * (2 * B * O + B * I + 2 * I * O + 2 * O + ((I * O + B * I) if need_dx else 0))
        cases.append(Case("dense", "dense_backward", bshape, dt, flops, nbytes, max(B, I, O),
                          (("dx",) if need_dx else ()) + ("dW", "db"), make_bwd, run_bwd, mutates=("dW", "db")))
    return cases


def _dense_blocks_cases(shapes, dt):
    """dense_forward_blocks / dense_backward_blocks: a batch as the trainer's blocks of
    rows, stacked (the Numba set's one call against the reference's call per block)."""
    import numpy as np
    from aepar.kernels import ref
    from aepar.rows import block_bounds
    s = np.dtype(dt).itemsize
    cases = []
    for B, I, O, act, count in shapes:
        shape, starts = f"{B}x{I}x{O} {act} {count} blocks", block_bounds(B, count)

        def make(rng, B=B, I=I, O=O, act=act, count=count):
            a = {"x": rng.random((B, I), dtype=dt), "W": (rng.standard_normal((I, O)) / math.sqrt(I)).astype(dt),
                 "b": (0.1 * rng.standard_normal(O)).astype(dt)}
            a["a"] = ref.dense_forward(a["x"], a["W"], a["b"], act)
            a["da"] = (0.01 * rng.standard_normal((B, O))).astype(dt)
            a["db"] = np.zeros((count, O), dt)  # block k's bias gradient: row k
            return a
        cases.append(Case("dense", "dense_forward_blocks", shape, dt, 2 * B * I * O + (1 + FLOP_ACT[act]) * B * O,
                          s * (B * I + I * O + O + B * O), I, ("a",), make,
                          lambda K, a, act=act, starts=starts: [K.dense_forward_blocks(a["x"], a["W"], a["b"], act,
                                                                                       starts)]))

        def run_bwd(K, a, act=act, starts=starts):
            dx, dz = K.dense_backward_blocks(a["da"], a["x"], a["W"], a["a"], act, list(a["db"]), starts)
            return [dx, dz, a["db"]]
        cases.append(Case("dense", "dense_backward_blocks", shape, dt,
                          FLOP_ACT[act] * B * O + B * O + 2 * B * I * O, s * (3 * B * O + I * O + B * I + count * O),
                          max(B, I, O), ("dx", "dz", "db"), make, run_bwd, mutates=("db",)))
    return cases


def _tied_ae_cases(shapes, dt):
    """tied_ae_update: a whole step of the tied autoencoder layer, with momentum and weight cost."""
    import numpy as np
    s = np.dtype(dt).itemsize
    cases = []
    for B, I, O, act in shapes:
        def make(rng, B=B, I=I, O=O):
            a = {"x": rng.random((B, I), dtype=dt), "W": (0.1 * rng.standard_normal((I, O))).astype(dt),
                 "bv": (0.1 * rng.standard_normal(I)).astype(dt), "bh": (0.1 * rng.standard_normal(O)).astype(dt)}
            for p in ("W", "bv", "bh"):
                a["v" + p] = (0.001 * rng.standard_normal(a[p].shape)).astype(dt)
            return a

        def run(K, a, act=act):
            err = K.tied_ae_update(a["x"], a["W"], a["bv"], a["bh"], act, a["vW"], a["vbv"], a["vbh"], 0.1, 0.5, 2e-4)
            return [err, a["W"], a["bv"], a["bh"], a["vW"], a["vbv"], a["vbh"]]
        flops = (10 * B * I * O + (2 + 2 * FLOP_ACT[act]) * B * O + 13 * B * I + 7 * I * O + 4 * (I + O))
        cases.append(Case("dense", "tied_ae_update", f"{B}x{I}x{O} {act}", dt, flops,
                          s * (B * I + 4 * I * O + 4 * (I + O)), 2 * B, ("sq_err", "W", "bv", "bh", "vW", "vbv", "vbh"),
                          make, run, mutates=("W", "bv", "bh", "vW", "vbv", "vbh")))
    return cases


def _activation_cases(sig_shape, relu_shape, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    cases = []
    for act, shape in (("sigmoid", sig_shape), ("relu", relu_shape)):
        n = int(np.prod(shape))
        label = "x".join(map(str, shape))

        def make(rng, shape=shape, act=act):
            z = (2 * rng.standard_normal(shape)).astype(dt)
            a = getattr(ref, f"{act}_forward")(z)
            return {"z": z, "a": a, "da": rng.standard_normal(shape).astype(dt)}
        f = FLOP_ACT[act]
        cases.append(Case("activation", f"{act}_forward", label, dt, f * n, 2 * n * s, 1, ("a",), make,
                          lambda K, a, act=act: [getattr(K, f"{act}_forward")(a["z"])]))
        cases.append(Case("activation", f"{act}_backward", label, dt, f * n, 3 * n * s, 1, ("dz",), make,
                          lambda K, a, act=act: [getattr(K, f"{act}_backward")(a["da"], a["a"])]))
    return cases


def _loss_cases(img_shape, cls_shape, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    n = int(np.prod(img_shape))
    label = "x".join(map(str, img_shape))

    def make_img(rng):
        z = (2 * rng.standard_normal(img_shape)).astype(dt)
        return {"y": rng.random(img_shape, dtype=dt), "t": rng.random(img_shape, dtype=dt), "z": z,
                "sy": ref.sigmoid_forward(z)}
    B, C = cls_shape
    cl = f"{B}x{C}"

    def make_cls(rng):
        z = (2 * rng.standard_normal(cls_shape)).astype(dt)
        labels = rng.integers(0, C, B)
        return {"z": z, "labels": labels, "probs": ref.softmax_xent_forward(z, labels)[1]}
    li = 8  # int64 labels
    return [
        Case("loss", "mse_forward", label, dt, 3 * n, 2 * n * s, n, ("loss",), make_img,
             lambda K, a: [K.mse_forward(a["y"], a["t"])]),
        Case("loss", "mse_backward", label, dt, 2 * n, 3 * n * s, 1, ("dy",), make_img,
             lambda K, a: [K.mse_backward(a["y"], a["t"])]),
        Case("loss", "sigmoid_xent_forward", label, dt, 10 * n, 3 * n * s, n, ("loss", "y"), make_img,
             lambda K, a: list(K.sigmoid_xent_forward(a["z"], a["t"]))),
        Case("loss", "sigmoid_xent_backward", label, dt, 2 * n, 3 * n * s, 1, ("dz",), make_img,
             lambda K, a: [K.sigmoid_xent_backward(a["sy"], a["t"])]),
        Case("loss", "softmax_xent_forward", cl, dt, 5 * B * C + 3 * B, 2 * B * C * s + B * li, B * C,
             ("loss", "probs"), make_cls, lambda K, a: list(K.softmax_xent_forward(a["z"], a["labels"]))),
        Case("loss", "softmax_xent_backward", cl, dt, B * C + B, 2 * B * C * s + B * li, 1, ("dz",), make_cls,
             lambda K, a: [K.softmax_xent_backward(a["probs"], a["labels"])]),
    ]


def _sparsity_cases(h, w_shape, wdt):
    import numpy as np
    dt = "float64"

    def make_kl(rng):
        return {"r": rng.uniform(0.01, 0.2, h).astype(dt)}
    n = int(np.prod(w_shape))
    ws = np.dtype(wdt).itemsize

    def make_w(rng):
        W = (0.1 * rng.standard_normal(w_shape)).astype(wdt)
        return {"W": W, "dW": (0.01 * rng.standard_normal(w_shape)).astype(wdt)}
    wl = "x".join(map(str, w_shape))
    return [
        Case("sparsity", "kl_sparsity_forward", f"{h}", dt, 9 * h, 8 * h, h, ("kl",), make_kl,
             lambda K, a: [K.kl_sparsity_forward(a["r"], 0.01, 3.0)]),
        Case("sparsity", "kl_sparsity_backward", f"{h}", dt, 5 * h, 16 * h, 1, ("dr",), make_kl,
             lambda K, a: [K.kl_sparsity_backward(a["r"], 0.01, 3.0)]),
        Case("sparsity", "weight_decay_forward", wl, wdt, 2 * n, n * ws, n, ("decay",), make_w,
             lambda K, a: [K.weight_decay_forward(a["W"], 2e-4)]),
        Case("sparsity", "weight_decay_backward", wl, wdt, 2 * n, 3 * n * ws, 1, ("dW",), make_w, _run_decay_bwd,
             mutates=("dW",)),
    ]


def _run_decay_bwd(K, a):
    K.weight_decay_backward(a["W"], 2e-4, a["dW"])
    return [a["dW"]]


def _safe_noise(v0, W, bh, noise, hidden, margin=1e-3):
    """Uniforms within ``margin`` of h0 moved ``margin`` away (CD-1 compares only h0 with
    noise[0]): rounding in another set must not flip a sampled state."""
    import numpy as np
    from aepar.kernels import ref
    if hidden != "bernoulli":
        return noise
    h0 = ref.rbm_hidden(v0, W, bh, hidden)
    u = noise[0]
    close = np.abs(h0 - u) < margin
    u[close] = np.where(h0[close] > 0.5, h0[close] - margin, h0[close] + margin)
    return noise


def _rbm_make(B, V, H, hidden, dt):
    import numpy as np

    def make(rng):
        v0 = rng.random((B, V), dtype=dt)
        W = (0.1 * rng.standard_normal((V, H))).astype(dt)
        bv, bh = (0.1 * rng.standard_normal(V)).astype(dt), (0.1 * rng.standard_normal(H)).astype(dt)
        noise = (rng.random((1, B, H), dtype=np.float32) if hidden == "bernoulli"
                 else rng.standard_normal((1, B, H), dtype=np.float32))
        a = {"v0": v0, "W": W, "bv": bv, "bh": bh, "noise": _safe_noise(v0, W, bh, noise, hidden),
             "h": rng.random((B, H), dtype=dt)}
        for p in ("W", "bv", "bh"):
            a["d" + p] = np.zeros_like(a[p])
            a["v" + p] = (0.001 * rng.standard_normal(a[p].shape)).astype(dt)
        return a
    return make


def _rbm_cases(first, layers, dt):
    import numpy as np
    from aepar.rows import block_bounds
    s = np.dtype(dt).itemsize
    B, V, H, hidden = first
    make = _rbm_make(B, V, H, hidden, dt)
    lab = f"{B}x{V}x{H} {hidden}"
    fh = 4 if hidden == "bernoulli" else 1
    cases = [
        Case("rbm", "rbm_hidden", lab, dt, 2 * B * V * H + fh * B * H, s * (B * V + V * H + H + B * H), V, ("h",),
             make, lambda K, a: [K.rbm_hidden(a["v0"], a["W"], a["bh"], hidden)]),
        Case("rbm", "rbm_visible", lab, dt, 2 * B * V * H + 4 * B * V, s * (B * H + V * H + V + B * V), H, ("v",),
             make, lambda K, a: [K.rbm_visible(a["h"], a["W"], a["bv"])]),
        Case("rbm", "rbm_free_energy", lab, dt, 2 * B * V * H + (1 + fh) * B * H + 2 * B * V + B,
             s * (B * V + V * H + V + H + B), max(V, H), ("F",), make,
             lambda K, a: [K.rbm_free_energy(a["v0"], a["W"], a["bv"], a["bh"], hidden)]),
    ]

    def run_cd(K, a, hidden=hidden):
        h0, vk, err = K.rbm_cd_backward(a["v0"], a["W"], a["bv"], a["bh"], a["noise"], hidden,
                                        a["dW"], a["dbv"], a["dbh"])
        return [h0, vk, err, a["dW"], a["dbv"], a["dbh"]]
    cases.append(Case("rbm", "rbm_cd_backward", lab, dt,
                      10 * B * V * H + (2 * fh + 3) * B * H + 9 * B * V + 3 * V * H + 2 * V + 2 * H,
                      s * (B * V + 3 * V * H + 3 * V + 3 * H + B * H + B * V) + 4 * B * H, max(B, V, H),
                      ("h0", "vk", "sq_err", "dW", "dbv", "dbh"), make, run_cd, mutates=("dW", "dbv", "dbh")))
    # the trainer's 8 blocks of a batch, their chains stacked (the Numba set's one call of
    # each row kernel against the reference's calls block by block); compared as each
    # block's W gradient alpha A_b.T @ D_b, since the sets order and sign the factors
    # differently (the reference [v0; vk], [-h0; hk]; the CuPy set [vk; v0], [hk; -h0])
    def make_blocks(rng, V=V, H=H):
        a = make(rng)
        a["dbvs"], a["dbhs"] = np.zeros((8, V), dt), np.zeros((8, H), dt)
        return a

    def run_blocks(K, a, hidden=hidden, B=B):
        A, D, alpha, errs = K.rbm_cd_factors_blocks(a["v0"], a["W"], a["bv"], a["bh"], a["noise"], hidden,
                                                    list(a["dbvs"]), list(a["dbhs"]), block_bounds(B, 8), 1.0 / B)
        return [A, alpha * D, np.array([float(e) for e in errs]), a["dbvs"], a["dbhs"]]

    def block_gradients(outs, B=B):
        A, aD, *rest = outs
        s = 2 * np.asarray(block_bounds(B, 8))
        grads = np.stack([A[lo:hi].astype(np.float64).T @ aD[lo:hi].astype(np.float64) for lo, hi in zip(s[:-1], s[1:])])
        return [grads, *rest]
    cases.append(Case("rbm", "rbm_cd_factors_blocks", f"{lab} 8 blocks", dt,
                      6 * B * V * H + (2 * fh + 4) * B * H + 6 * B * V,
                      s * (B * V + V * H + V + H + 4 * B * V + 4 * B * H) + 4 * B * H, max(B, V, H),
                      ("W gradient of each block", "sq_errs", "dbvs", "dbhs"), make_blocks, run_blocks,
                      mutates=("dbvs", "dbhs"), canon=block_gradients))
    for B, V, H, hidden in layers:
        fh = 4 if hidden == "bernoulli" else 1

        def run_up(K, a, hidden=hidden):
            lr = 0.1 if hidden == "bernoulli" else 0.001  # the recipe's: linear code units learn slower
            err = K.rbm_cd_update(a["v0"], a["W"], a["bv"], a["bh"], a["noise"], hidden, a["vW"], a["vbv"],
                                  a["vbh"], lr, 0.5, 2e-4)
            return [err, a["W"], a["bv"], a["bh"], a["vW"], a["vbv"], a["vbh"]]
        cases.append(Case("rbm", "rbm_cd_update", f"{B}x{V}x{H} {hidden}", dt,
                          10 * B * V * H + (2 * fh + 3) * B * H + 9 * B * V + 8 * V * H + 8 * (V + H),
                          s * (B * V + 4 * V * H + 4 * (V + H)) + 4 * B * H, max(B, V, H),
                          ("sq_err", "W", "bv", "bh", "vW", "vbv", "vbh"), _rbm_make(B, V, H, hidden, dt),
                          run_up, mutates=("W", "bv", "bh", "vW", "vbv", "vbh")))
    return cases


def _taps(n_out, n_in, k, stride, pad):
    """Kernel taps of a 1-D conv that land inside the input, summed over the outputs."""
    return sum(1 for o in range(n_out) for i in range(k) if 0 <= o * stride - pad + i < n_in)


def _conv_arrays(rng, dt, xs, wsh, ys, bias_len):
    """Inputs of a conv or transposed-conv case: x, PyTorch-style uniform W and b (bound
    1/sqrt(fan-in) from W's last three sides), an upstream gradient dy, zeroed dW and db."""
    import numpy as np
    bound = 1 / math.sqrt(wsh[1] * wsh[2] * wsh[3])
    return {"x": rng.random(xs, dtype=dt), "W": rng.uniform(-bound, bound, wsh).astype(dt),
            "b": rng.uniform(-bound, bound, bias_len).astype(dt), "dy": rng.standard_normal(ys).astype(dt),
            "dW": np.zeros(wsh, dt), "db": np.zeros(bias_len, dt)}


def _conv_cases(convs, tconvs, pools, dt):
    import numpy as np
    from aepar.kernels import ref
    s = np.dtype(dt).itemsize
    cases = []
    for (N, C, H, Wd), (Co, _, k, _), stride, pad in convs:
        Ho, Wo = (H + 2 * pad - k) // stride + 1, (Wd + 2 * pad - k) // stride + 1
        T = _taps(Ho, H, k, stride, pad) * _taps(Wo, Wd, k, stride, pad)
        lab = f"{N}x{C}x{H}x{Wd} * {Co}x{C}x{k}x{k} s{stride} p{pad}"
        nx, ny, nw = N * C * H * Wd, N * Co * Ho * Wo, Co * C * k * k

        def make(rng, xs=(N, C, H, Wd), wsh=(Co, C, k, k), ys=(N, Co, Ho, Wo)):
            return _conv_arrays(rng, dt, xs, wsh, ys, bias_len=wsh[0])

        def run_bwd(K, a, stride=stride, pad=pad):
            dx = K.conv2d_backward(a["dy"], a["x"], a["W"], stride, pad, a["dW"], a["db"])
            return [dx, a["dW"], a["db"]]
        cases.append(Case("conv", "conv2d_forward", lab, dt, 2 * Co * C * N * T + ny, s * (nx + nw + Co + ny),
                          C * k * k, ("y",), make,
                          lambda K, a, stride=stride, pad=pad: [K.conv2d_forward(a["x"], a["W"], a["b"], stride, pad)]))
        cases.append(Case("conv", "conv2d_backward", lab, dt, 4 * Co * C * N * T + nw + ny,
                          s * (ny + nx + nw + 2 * nw + 2 * Co + nx), max(N * Ho * Wo, Co * k * k), ("dx", "dW", "db"),
                          make, run_bwd, mutates=("dW", "db")))
    for (N, Ci, H, Wd), (_, Co, k, _), stride, pad in tconvs:
        Ho, Wo = (H - 1) * stride - 2 * pad + k, (Wd - 1) * stride - 2 * pad + k
        # the adjoint of the conv (N, Co, Ho, Wo) -> (N, Ci, H, W): its taps inside (Ho, Wo)
        T = _taps(H, Ho, k, stride, pad) * _taps(Wd, Wo, k, stride, pad)
        lab = f"{N}x{Ci}x{H}x{Wd} * {Ci}x{Co}x{k}x{k} s{stride} p{pad}"
        nx, ny, nw = N * Ci * H * Wd, N * Co * Ho * Wo, Ci * Co * k * k

        def make(rng, xs=(N, Ci, H, Wd), wsh=(Ci, Co, k, k), ys=(N, Co, Ho, Wo)):
            return _conv_arrays(rng, dt, xs, wsh, ys, bias_len=wsh[1])

        def run_bwd(K, a, stride=stride, pad=pad):
            dx = K.conv2d_transpose_backward(a["dy"], a["x"], a["W"], stride, pad, a["dW"], a["db"])
            return [dx, a["dW"], a["db"]]
        cases.append(Case("conv", "conv2d_transpose_forward", lab, dt, 2 * Co * Ci * N * T + ny,
                          s * (nx + nw + Co + ny), max(Co * k * k, 1), ("y",), make,
                          lambda K, a, stride=stride, pad=pad: [K.conv2d_transpose_forward(a["x"], a["W"], a["b"],
                                                                                             stride, pad)]))
        cases.append(Case("conv", "conv2d_transpose_backward", lab, dt, 4 * Co * Ci * N * T + nw + ny,
                          s * (ny + nx + nw + 2 * nw + 2 * Co + nx), max(N * H * Wd, Co * k * k),
                          ("dx", "dW", "db"), make, run_bwd, mutates=("dW", "db")))
    for shape in pools:
        N, C, H, Wd = shape
        nx, ny = N * C * H * Wd, N * C * (H // 2) * (Wd // 2)
        lab = "x".join(map(str, shape))

        def make(rng, shape=shape):
            x = rng.standard_normal(shape).astype(dt)
            y, idx = ref.maxpool2x2_forward(x)
            return {"x": x, "idx": idx, "dy": rng.standard_normal(y.shape).astype(dt)}
        cases.append(Case("conv", "maxpool2x2_forward", lab, dt, 3 * ny, s * (nx + ny) + ny, 1, ("y", "argmax"),
                          make, lambda K, a: list(K.maxpool2x2_forward(a["x"]))))
        cases.append(Case("conv", "maxpool2x2_backward", lab, dt, 0, s * (ny + nx) + ny, 1, ("dx",), make,
                          lambda K, a, shape=shape: [K.maxpool2x2_backward(a["dy"], a["idx"], shape)]))
    return cases


def _update_cases(shape, dt):
    import numpy as np
    s = np.dtype(dt).itemsize
    n = int(np.prod(shape))
    lab = "x".join(map(str, shape))

    def make(rng):
        return {"p": (0.1 * rng.standard_normal(shape)).astype(dt), "g": (0.01 * rng.standard_normal(shape)).astype(dt),
                "m": (0.001 * rng.standard_normal(shape)).astype(dt),
                "v": (1e-5 * np.abs(rng.standard_normal(shape))).astype(dt)}

    def run_adam(K, a):
        K.adam_update(a["p"], a["g"], a["m"], a["v"], 3, 1e-3)
        return [a["p"], a["m"], a["v"]]

    def run_sgd(K, a):
        K.sgd_momentum_update(a["p"], a["g"], a["m"], 0.1, 0.9)
        return [a["p"], a["m"]]
    return [Case("update", "adam_update", lab, dt, 13 * n, 7 * n * s, 1, ("p", "m", "v"), make, run_adam,
                 mutates=("p", "m", "v")),
            Case("update", "sgd_momentum_update", lab, dt, 4 * n, 5 * n * s, 1, ("p", "v"), make, run_sgd,
                 mutates=("p", "m"))]


def _adam_many_case(shapes, dt, label):
    """``adam_update_many`` over a model's parameters (one launch on a GPU): inputs p0.., g0..,
    m0.., v0.. per parameter."""
    import numpy as np
    s = np.dtype(dt).itemsize
    n = int(sum(np.prod(sh) for sh in shapes))
    names = [f"{k}{i}" for k in "pmv" for i in range(len(shapes))]

    def make(rng):
        out = {}
        for i, sh in enumerate(shapes):
            out[f"p{i}"] = (0.1 * rng.standard_normal(sh)).astype(dt)
            out[f"g{i}"] = (0.01 * rng.standard_normal(sh)).astype(dt)
            out[f"m{i}"] = (0.001 * rng.standard_normal(sh)).astype(dt)
            out[f"v{i}"] = (1e-5 * np.abs(rng.standard_normal(sh))).astype(dt)
        return out

    def run(K, a):
        k = range(len(shapes))
        K.adam_update_many([a[f"p{i}"] for i in k], [a[f"g{i}"] for i in k], [a[f"m{i}"] for i in k],
                           [a[f"v{i}"] for i in k], 3, 1e-3)
        return [a[name] for name in names]
    return [Case("update", "adam_update_many", label, dt, 13 * n, 7 * n * s, 1, tuple(names), make, run,
                 mutates=tuple(names))]


def _blocksum_cases(shapes, dt):
    """block_outer_sum: (rows, m, n, blocks) = a batch's weight gradient from its blocks in
    the fixed tree (the trainer's call per tree node)."""
    import numpy as np
    from aepar.rows import block_bounds, tree_merges, tree_top
    s = np.dtype(dt).itemsize
    cases = []
    for rows, m, n, count in shapes:
        starts = block_bounds(rows, count)
        merges = tree_merges(tree_top(count), 0, count)

        def make(rng, rows=rows, m=m, n=n):
            return {"A": rng.random((rows, m)).astype(dt), "D": (0.01 * rng.standard_normal((rows, n))).astype(dt),
                    "out": np.zeros((m, n), dt)}

        def run(K, a, starts=starts, merges=merges, count=count):
            return [K.block_outer_sum(a["A"], a["D"], starts, merges, [-0.01] * count, a["out"])]
        cases.append(Case("blocksum", "block_outer_sum", f"{rows}x{m}x{n} {count} blocks", dt, 2 * rows * m * n,
                          s * (rows * (m + n) + m * n), rows, ("out",), make, run))
    return cases


def _sparse_ae_cases(m, v, h, leaf):
    import numpy as np
    from aepar.kernels import ref
    from aepar.rows import cover_merges
    dt = "float64"
    size = ref.sparse_ae_partials_size(v, h)
    layout = ref.sparse_ae_layout(v, h)
    nparams = 2 * v * h + h + v
    cases = []
    # kl: one shard folds the KL term; leaf: per-leaf sums with Q = x^T s (one round);
    # rounds: per-leaf Σ a2, then the leaves' sums with ρ̂ given, added in the fixed tree as
    # they come (aepar.sparse's two rounds in one process)
    _, merges = cover_merges(0, -(-m // leaf), -(-m // leaf))
    for kind in ("kl", f"leaf{leaf}", f"rounds{leaf}"):
        rows = 1 if kind == "kl" else -(-m // leaf)

        def make(rng, rows=rows, kind=kind):
            r = math.sqrt(6 / (v + h + 1))
            return {"x": rng.uniform(0.1, 0.9, (m, v)), "W1": rng.uniform(-r, r, (v, h)), "b1": np.zeros(h),
                    "W2": rng.uniform(-r, r, (h, v)), "b2": np.zeros(v),
                    "out": np.zeros(size if rows == 1 else (1 if kind.startswith("rounds") else rows, size)),
                    "act": np.zeros((rows, h))}

        def prep(K, a, kind=kind):
            a["ws"] = K.sparse_ae_workspace(m, v, h, np.float64, leaf=None if kind == "kl" else leaf)

        def run(K, a, kind=kind):
            kl, lf, rho_hat = ((0.01, 3.0), None, None) if kind == "kl" else (None, leaf, None)
            if kind.startswith("rounds"):
                act = K.sparse_ae_activations(a["x"], a["W1"], a["b1"], a["act"], a.get("ws"), leaf)
                total = act.sum(axis=0)
                total = total.get() if hasattr(total, "get") else total  # CuPy's: ρ̂ goes in on the host
                kl, rho_hat = (0.01, 3.0), np.asarray(total, dtype=np.float64) / m
            out = K.sparse_ae_partials(a["x"], a["W1"], a["b1"], a["W2"], a["b2"], a["out"], a.get("ws"), kl, lf,
                                       rho_hat, merges if kind.startswith("rounds") else None)
            return [out[..., o:o + int(np.prod(shp))] for o, shp in layout.values()]
        products = 12 if kind.startswith("leaf") else 10
        cases.append(Case("sparse_ae", "sparse_ae_partials", f"{m}x{v}x{h} {kind}", dt,
                          products * m * v * h + 10 * m * h + 11 * m * v, 8 * (m * v + nparams + rows * size),
                          m * v, tuple(layout), make, run, prep))
    return cases


def catalog(quick: bool) -> list:
    """Every case, at the models' shapes (or tiny ones with ``quick``)."""
    f32 = "float32"
    if quick:
        dense = [(8, 24, 16, "sigmoid", False), (8, 16, 12, "sigmoid", True), (8, 12, 4, "identity", True)]
        cases = _dense_cases(dense, f32)
        cases += _dense_blocks_cases([(9, 16, 12, "sigmoid", 3)], f32)
        cases += _tied_ae_cases([(8, 12, 6, "sigmoid")], f32)
        cases += _activation_cases((4, 10), (2, 3, 4, 4), f32)
        cases += _loss_cases((4, 12), (4, 3), f32)
        cases += _sparsity_cases(5, (6, 4), f32)
        cases += _rbm_cases((6, 12, 8, "bernoulli"), [(6, 12, 8, "bernoulli"), (6, 8, 3, "gaussian")], f32)
        cases += _conv_cases([((2, 1, 8, 8), (3, 1, 3, 3), 1, 1), ((2, 3, 4, 4), (4, 3, 3, 3), 1, 1)],
                             [((2, 4, 2, 2), (4, 3, 2, 2), 2, 0), ((2, 3, 4, 4), (3, 1, 2, 2), 2, 0)],
                             [(2, 3, 8, 8), (2, 4, 4, 4)], f32)
        cases += _update_cases((6, 5), f32)
        cases += _adam_many_case([(6, 5), (5,), (5, 6), (6,)], f32, "6-5-6 (4 arrays)")
        cases += _blocksum_cases([(20, 12, 40, 3)], f32)
        cases += _sparse_ae_cases(96, 8, 5, 32)
        return cases
    # 784-1000-500-250-30 (linear code layer) at batch 100, then the classifier head on the CAE
    # codes; a network's first layer needs no input gradient (need_dx False)
    dense = [(100, 784, 1000, "sigmoid", False), (100, 1000, 500, "sigmoid", True),
             (100, 500, 250, "sigmoid", True), (100, 250, 30, "identity", True),
             (100, 1568, 10, "identity", False)]
    cases = _dense_cases(dense, f32)
    # fine-tuning's blocks: the first layer forward, a middle layer backward (both ways each)
    cases += _dense_blocks_cases([(100, 784, 1000, "sigmoid", 8), (100, 1000, 500, "sigmoid", 8)], f32)
    # the autoencoder layer's (--pretrainer ae) one-block step: its first and code layers
    cases += _tied_ae_cases([(100, 784, 1000, "sigmoid"), (100, 250, 30, "identity")], f32)
    cases += _activation_cases((100, 1000), (100, 16, 28, 28), f32)
    cases += _loss_cases((100, 784), (100, 10), f32)
    cases += _sparsity_cases(25, (784, 1000), f32)
    cases += _rbm_cases((100, 784, 1000, "bernoulli"),
                        [(100, 784, 1000, "bernoulli"), (100, 1000, 500, "bernoulli"),
                         (100, 500, 250, "bernoulli"), (100, 250, 30, "gaussian")], f32)
    # aepar.models.cae: conv 3x3 pad 1 (1->16, 16->32), pool, transposed 2x2/2 (32->16, 16->1)
    cases += _conv_cases([((100, 1, 28, 28), (16, 1, 3, 3), 1, 1), ((100, 16, 14, 14), (32, 16, 3, 3), 1, 1)],
                         [((100, 32, 7, 7), (32, 16, 2, 2), 2, 0), ((100, 16, 14, 14), (16, 1, 2, 2), 2, 0)],
                         [(100, 16, 28, 28), (100, 32, 14, 14)], f32)
    cases += _update_cases((784, 1000), f32)
    # the unrolled 784-1000-500-250-30 stack's 16 parameters (fine-tuning's Adam step)
    sizes = [784, 1000, 500, 250, 30, 250, 500, 1000, 784]
    cases += _adam_many_case([sh for i in range(8) for sh in ((sizes[i], sizes[i + 1]), (sizes[i + 1],))], f32,
                             "784-1000-500-250-30 unrolled (16 arrays)")
    # the CD-1 statistics ([v0; vk] of 8 blocks) and fine-tuning's first and code layers
    cases += _blocksum_cases([(200, 784, 1000, 8), (100, 784, 1000, 8), (100, 250, 30, 8)], f32)
    cases += _sparse_ae_cases(10000, 64, 25, 128)
    return cases


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


# ---------------------------------------------------------------------------- timing
def time_call(fn, sync, repeats: int, min_time: float, reset=None) -> tuple[float, int]:
    """(best seconds per call, calls per sample): warm-up, calls per sample calibrated to
    last ``min_time``, best of ``repeats`` samples, synchronised at the end of each;
    ``reset()`` (untimed) before each sample."""
    reset = reset or (lambda: None)
    fn()
    sync()
    inner = 1
    while True:
        reset()
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        t = time.perf_counter() - t0
        if t >= min_time or inner >= 1 << 20:
            break
        inner = min(1 << 20, max(2 * inner, int(inner * 1.2 * min_time / max(t, 1e-9))))
    best = t / inner
    for _ in range(max(repeats - 1, 0)):
        reset()
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best, inner


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
        t, _ = time_call(lambda: xp.matmul(a, b, out=c), ks.sync, reps, 0.0)
        peaks[kind] = (2.0 * n ** 3 / t / 1e9, t, f"{n}x{n}x{n}", 2.0 * n ** 3, 3 * n * n * np.dtype(dt).itemsize)
    count = mb * 2 ** 20 // 8
    src = xp.ones(count)
    dst = xp.empty(count)
    t, _ = time_call(lambda: xp.copyto(dst, src), ks.sync, reps, 0.0)
    peaks["copy"] = (2.0 * count * 8 / t / 1e9, t, f"{mb}MB", 0.0, 2.0 * count * 8)
    return peaks


def _best_peaks(a: dict, b: dict) -> dict:
    return {k: max(a[k], b[k], key=lambda p: p[0]) for k in a}


# ---------------------------------------------------------------------------- machine
def numba_isa() -> str:
    """The vector ISA aepar's Numba kernels are compiled for in this process (their own
    :func:`aepar.kernels.nb.simd.target_isa`), "" without Numba."""
    try:
        from aepar.kernels.nb.simd import target_isa
    except ImportError:
        return ""
    return target_isa()


def _openblas_arch() -> str:
    try:
        from threadpoolctl import threadpool_info
        for info in threadpool_info():
            if info.get("internal_api") == "openblas":
                return info.get("architecture") or ""
    except Exception:
        pass
    return ""


def machine_columns(threads: int) -> dict:
    from aepar.machine import describe
    cols = dict(describe(mpi="not used (one process)", threads=threads))
    cols.update(numba_cpu_name=os.environ.get("NUMBA_CPU_NAME") or "host",
                numba_cpu_features=os.environ.get("NUMBA_CPU_FEATURES", ""), numba_isa=numba_isa(),
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
                   help="run every numba kernel once at small shapes so that Numba caches its machine code, and exit "
                        "(make venv does this; nothing is checked, timed or written)")
    return p


def _split(value, allowed, what, parser):
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        parser.error(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def warm(log) -> int:
    """``--warm``: run every kernel of the numba set once at the small shapes, so that Numba
    compiles and caches them now (``make venv`` does this once), not in every rank of a
    first run at the same moment. No checks, no timings, no files."""
    from aepar import kernels
    K = kernels.load("numba")
    started = time.perf_counter()
    cases = catalog(quick=True)
    for case in cases:
        a = case.make(_rng(case.name))
        if case.prep:
            case.prep(K, a)
        case.run(K, a)
    log(f"bench.kernels --warm: {len(cases)} kernel cases compiled and cached in {time.perf_counter() - started:.0f} s")
    return 0


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
    machine = machine_columns(threads)
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
        host = case.make(_rng(case.name))
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
                seconds, calls = time_call(call, ks.sync, repeats, min_time, reset)
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
            seconds, calls = time_call(call, ks.sync, repeats, min_time, reset)
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
