"""aepar's sparse autoencoder side by side with the textbook NumPy one, in one process.

The textbook implementation is the seed's serial code style (Agrawal's Python port of
UFLDL, which Lewis & Canann parallelised): column-major samples (v, m), W1 (h, v), the
cost and gradient written out formula by formula with new temporaries on every call, and
scipy's L-BFGS-B. aepar's is :class:`aepar.models.sparse_ae.SparseAutoencoder` on the
Numba kernel set (fused, blocked, no allocations per evaluation), driven by the same
L-BFGS-B (:class:`aepar.optim.LBFGSB`), and the same model driven by aepar's L-BFGS
without bounds (:class:`aepar.optim.LBFGS`, ``--optimizer lbfgs``: its own iterates), and
the same model in float32 (``aepar float32``: the sparse command's default precision) with
L-BFGS-B. All run here in turns on the same patches (aepar's sampler on the natural
images) and the same initial θ, 400 iterations, one process, float64 but for that row; the
time outside the cost/gradient (``seconds`` - ``seconds_in_cost_gradient``) is the
optimiser's own.

    python -m bench.textbook_sparse [--samples 10000] [--iterations 400] [--threads 1]
                                    [--out bench/results/peers.csv]

FLOPs: each evaluation's five matrix products (x W1, a2 W2, δ3 W2ᵀ, a2ᵀ δ3, xᵀ δ2) cost
2·m·v·h each, i.e. 10·m·v·h = 16,000·m for v = 64, h = 25 (element-wise work not
counted). Achieved GFLOP/s = 16,000·m·evaluations / seconds / 1e9 over the whole run
(L-BFGS-B's own work included; the time inside the cost/gradient is reported beside it),
against the DGEMM rate of a 1000×1000 matrix product timed in the same run with the same
thread count (the float32 row: against SGEMM's).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.common import ONE_PROCESS, machine_columns, merge_rows, time_call, time_calls, with_machine

RESULTS = Path(__file__).resolve().parent / "results"


# aepar's, BLAS's and Numba's thread counts (bench.sparse_command sets them in its children too)
THREAD_VARS = ("AEPAR_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def _set_threads(n: int):
    """Fix BLAS/Numba threads before NumPy loads (aepar._threads reads AEPAR_THREADS)."""
    if "numpy" in sys.modules:
        return  # too late to change; describe() records what is in effect
    for var in THREAD_VARS:
        os.environ[var] = str(n)


# ---------------------------------------------------------------------------- textbook
class TextbookSparseAutoencoder:
    """UFLDL's sparse autoencoder as the seed's serial Python code writes it.

    Samples are columns (v, m); θ = [W1 (h×v), W2 (v×h), b1, b2] flattened row-major.
    Every call allocates its activations, deltas and gradients afresh.
    """

    def __init__(self, visible, hidden, rho=0.01, lamda=1e-4, beta=3.0):
        self.visible_size, self.hidden_size = visible, hidden
        self.rho, self.lamda, self.beta = rho, lamda, beta
        self.limit0 = 0
        self.limit1 = hidden * visible
        self.limit2 = 2 * hidden * visible
        self.limit3 = 2 * hidden * visible + hidden
        self.limit4 = 2 * hidden * visible + hidden + visible

    @staticmethod
    def sigmoid(x):
        import numpy
        return 1 / (1 + numpy.exp(-x))

    def cost(self, theta, input):
        import numpy
        W1 = theta[self.limit0:self.limit1].reshape(self.hidden_size, self.visible_size)
        W2 = theta[self.limit1:self.limit2].reshape(self.visible_size, self.hidden_size)
        b1 = theta[self.limit2:self.limit3].reshape(self.hidden_size, 1)
        b2 = theta[self.limit3:self.limit4].reshape(self.visible_size, 1)
        m = input.shape[1]

        hidden_layer = self.sigmoid(numpy.dot(W1, input) + b1)
        output_layer = self.sigmoid(numpy.dot(W2, hidden_layer) + b2)
        rho_cap = numpy.sum(hidden_layer, axis=1) / m

        diff = output_layer - input
        sum_of_squares_error = 0.5 * numpy.sum(numpy.multiply(diff, diff)) / m
        weight_decay = 0.5 * self.lamda * (numpy.sum(numpy.multiply(W1, W1))
                                           + numpy.sum(numpy.multiply(W2, W2)))
        kl_divergence = self.beta * numpy.sum(self.rho * numpy.log(self.rho / rho_cap)
                                              + (1 - self.rho) * numpy.log((1 - self.rho) / (1 - rho_cap)))
        cost = sum_of_squares_error + weight_decay + kl_divergence

        kl_div_grad = self.beta * (-(self.rho / rho_cap) + ((1 - self.rho) / (1 - rho_cap)))
        del_out = numpy.multiply(diff, numpy.multiply(output_layer, 1 - output_layer))
        del_hid = numpy.multiply(numpy.dot(numpy.transpose(W2), del_out) + kl_div_grad.reshape(-1, 1),
                                 numpy.multiply(hidden_layer, 1 - hidden_layer))

        W1_grad = numpy.dot(del_hid, numpy.transpose(input))
        W2_grad = numpy.dot(del_out, numpy.transpose(hidden_layer))
        b1_grad = numpy.sum(del_hid, axis=1)
        b2_grad = numpy.sum(del_out, axis=1)
        W1_grad = W1_grad / m + self.lamda * W1
        W2_grad = W2_grad / m + self.lamda * W2
        b1_grad = b1_grad / m
        b2_grad = b2_grad / m
        theta_grad = numpy.concatenate((W1_grad.flatten(), W2_grad.flatten(),
                                        b1_grad.flatten(), b2_grad.flatten()))
        return [cost, theta_grad]


def to_textbook_theta(theta, visible, hidden):
    """aepar's θ (W1 v×h, W2 h×v, b1, b2) -> the textbook's (W1 h×v, W2 v×h, b1, b2)."""
    import numpy as np
    v, h = visible, hidden
    W1 = theta[:v * h].reshape(v, h)
    W2 = theta[v * h:2 * v * h].reshape(h, v)
    return np.concatenate([W1.T.ravel(), W2.T.ravel(), theta[2 * v * h:]])


# ---------------------------------------------------------------------------- measure
def flops_per_evaluation(m: int, visible: int, hidden: int) -> int:
    """The five matrix products of one cost/gradient evaluation: 10·m·v·h."""
    return 10 * m * visible * hidden


def gemm_gflops(dtype="float64", n: int = 1000, repeats: int = 5) -> float:
    """The rate of an n×n matrix product (2n³ FLOPs) in ``dtype`` in GFLOP/s, its fastest
    of ``repeats`` after a warm-up (thread pool, pages)."""
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    c = np.empty((n, n), dtype)
    return 2.0 * n ** 3 / time_call(lambda: np.matmul(a, b, out=c), repeats).seconds / 1e9


def run(samples=10000, iterations=400, patch=8, hidden=25, seed=0, kernels="numba", data_dir=None,
        repeats=3):
    """Time both implementations, ``repeats`` whole runs each taken in turns (textbook,
    aepar, textbook, ...) so that load from other users hits both alike; each row is its
    fastest run. Returns (rows, info); rows are dicts for peers.csv."""
    import numpy as np

    from aepar.backend import select
    from aepar.optim import LBFGS, LBFGSB
    from aepar.data.patches import sample_patches
    from aepar.data.sources import natural_images
    from aepar.models.sparse_ae import SparseAutoencoder, init_theta

    images, source = natural_images(data_dir)
    x = sample_patches(images, samples, patch, seed)           # (m, v) float64
    v = patch * patch
    theta0 = init_theta(v, hidden, seed)

    # aepar: the model the scheme uses, in one process (every block: the fixed-tree sum)
    be = select("cpu", kernels, "float64")
    model = SparseAutoencoder(be, v, hidden).attach(x)
    model32 = SparseAutoencoder(select("cpu", kernels, "float32"), v, hidden).attach(x)
    # textbook: its own layout (samples as columns), the same θ0 permuted to it
    tb = TextbookSparseAutoencoder(v, hidden)
    xt = np.ascontiguousarray(x.T)
    theta0_tb = to_textbook_theta(theta0, v, hidden)

    # Same function: the cost at θ0 must agree before any timing means anything.
    c_aepar, g_aepar = model.cost_grad(theta0)                  # also compiles/loads Numba
    c_tb, g_tb = tb.cost(theta0_tb, xt)
    if not np.isclose(c_aepar, c_tb, rtol=1e-10, atol=0):
        raise RuntimeError(f"implementations disagree at theta0: {c_aepar!r} vs {c_tb!r}")
    if not np.allclose(to_textbook_theta(g_aepar, v, hidden), g_tb, rtol=1e-7, atol=1e-12):
        raise RuntimeError("implementations' gradients disagree at theta0")
    c32 = model32.cost_grad(theta0)[0]
    if not np.isclose(c32, c_tb, rtol=1e-5, atol=0):  # float32's sums
        raise RuntimeError(f"aepar float32 disagrees at theta0: {c32!r} vs {c_tb!r}")

    # each implementation: its objective, its start and its optimiser
    objectives = {"textbook": (lambda theta: tb.cost(theta, xt), theta0_tb, LBFGSB),
                  "aepar": (model.cost_grad, theta0, LBFGSB),
                  "aepar lbfgs": (model.cost_grad, theta0, LBFGS),
                  "aepar float32": (model32.cost_grad, theta0, LBFGSB)}

    runs = {key: [] for key in objectives}  # what each run produced, in order

    def one_run(key):
        fun, start, optimizer = objectives[key]
        count, inside = 0, 0.0  # evaluations, seconds inside the objective (rest: the optimiser)

        def counted(theta):
            nonlocal count, inside
            count += 1
            t0 = time.perf_counter()
            out = fun(theta)
            inside += time.perf_counter() - t0
            return out
        res = optimizer(counted, start, iterations).run()
        runs[key].append({"res": res, "evals": count, "inside": inside})

    peak, peak32 = gemm_gflops(), gemm_gflops("float32")
    # textbook first, then aepar: neither gets a warmer cache from the other's data
    timings = time_calls({key: (lambda key=key: one_run(key)) for key in runs}, repeats, warmup=0)
    # the better of before and after: a busy box varies
    peak, peak32 = max(peak, gemm_gflops()), max(peak32, gemm_gflops("float32"))
    # the seconds as written, so that the speedup column is the ratio of the seconds column
    results = {key: dict(runs[key][t.fastest_index], seconds=round(t.seconds, 4)) for key, t in timings.items()}

    flop = flops_per_evaluation(samples, v, hidden)
    rows = []
    t_text = results["textbook"]["seconds"]
    names = {"textbook": "textbook NumPy (seed style: UFLDL formulas, new temporaries, scipy L-BFGS-B)",
             "aepar": f"aepar SparseAutoencoder ({be.kernel_set} kernels, scipy L-BFGS-B)",
             "aepar lbfgs": f"aepar SparseAutoencoder ({be.kernel_set} kernels, aepar's L-BFGS, --optimizer lbfgs)",
             "aepar float32": f"aepar SparseAutoencoder in float32 ({be.kernel_set} kernels, scipy L-BFGS-B; "
                              f"fraction_of_peak against SGEMM)"}
    for key in objectives:
        res, seconds, evals = results[key]["res"], results[key]["seconds"], results[key]["evals"]
        # the optimiser's own time per evaluation, every run's (the fastest run is picked by
        # its total, which the evaluations' noise decides): the median over the runs
        own = [(t - r["inside"]) / max(r["evals"], 1) for t, r in zip(timings[key].samples, runs[key])]
        gflops = flop * evals / seconds / 1e9  # over the whole run, optimiser included
        rows.append({
            "implementation": key, "description": names[key], "samples": samples,
            "iterations": int(res.nit), "evaluations": evals, "seconds": f"{seconds:.4f}",
            "seconds_per_evaluation": f"{seconds / max(evals, 1):.6f}",
            "seconds_in_cost_gradient": f"{results[key]['inside']:.4f}",
            "optimizer_ms_per_evaluation": f"{1e3 * float(np.median(own)):.4f}",
            "repeats": repeats, "all_seconds": " ".join(f"{t:.3f}" for t in timings[key].samples),
            "final_cost": f"{float(res.fun):.10g}",
            "gflop_per_evaluation": f"{flop / 1e9:.4f}", "gflops": f"{gflops:.2f}",
            "dgemm_peak_gflops": f"{peak:.2f}", "sgemm_peak_gflops": f"{peak32:.2f}",
            "fraction_of_peak": f"{gflops / (peak32 if key == 'aepar float32' else peak):.3f}",
            "speedup_vs_textbook": f"{t_text / seconds:.2f}",
        })
    blocked, whole = leaf_tax(be.K, x, theta0, v, hidden, repeats)
    for key, timing, what in (("aepar cost/gradient, blocks of 128", blocked, "its fixed tree"),
                              ("aepar cost/gradient, one block", whole, "no guarantee across rank counts")):
        rows.append({
            "implementation": key, "samples": samples, "seconds": f"{timing.seconds * timing.calls:.4f}",
            "repeats": repeats, "all_seconds": " ".join(f"{t * timing.calls:.3f}" for t in timing.samples),
            "seconds_per_evaluation": f"{timing.seconds:.6f}", "gflop_per_evaluation": f"{flop / 1e9:.4f}",
            "gflops": f"{flop / timing.seconds / 1e9:.2f}", "dgemm_peak_gflops": f"{peak:.2f}",
            "fraction_of_peak": f"{flop / timing.seconds / 1e9 / peak:.3f}",
            "description": f"the kernels' two rounds at theta0, {timing.calls} evaluations a sample, in turns with "
                           f"the other: the model's blocks of 128 patches ({what})"
                           if "128" in key else f"the kernels' two rounds at theta0, {timing.calls} evaluations a "
                           f"sample, in turns with the other: every patch one block ({what})"})
    info = {"source": source, "peak": peak, "peak32": peak32, "flop_per_evaluation": flop,
            "leaf_tax": blocked.seconds / whole.seconds}
    return rows, info


def leaf_tax(K, x, theta, visible, hidden, repeats):
    """(blocks, one block): :class:`bench.common.Timing` of one evaluation's kernels (ρ̂,
    then the partials) at ``theta``, over the model's blocks of LEAF patches added in their
    fixed tree as one process adds them, and over every patch as one block, in turns: what
    the same bits on any number of processes cost a single one."""
    import numpy as np

    from aepar.models.sparse_ae import LEAF
    from aepar.rows import cover_merges

    m, v, h = x.shape[0], visible, hidden
    W1, W2 = theta[:v * h].reshape(v, h), theta[v * h:2 * v * h].reshape(h, v)
    b1, b2 = theta[2 * v * h:2 * v * h + h], theta[2 * v * h + h:]
    size, kl = K.sparse_ae_partials_size(v, h), (0.01, 3.0)
    count = -(-m // LEAF)
    nodes, merges = cover_merges(0, count, count)

    def evaluation(leaf, merges, leaves, sums):
        ws = K.sparse_ae_workspace(m, v, h, np.float64, leaf=leaf)
        act, out = np.empty((leaves, h)), np.empty((sums, size))

        def call():
            K.sparse_ae_activations(x, W1, b1, act, ws, leaf)
            K.sparse_ae_partials(x, W1, b1, W2, b2, out, ws, kl, leaf, act.sum(axis=0) / m, merges)
        return call
    timings = time_calls({"blocks": evaluation(LEAF, merges, count, len(nodes)),
                          "one": evaluation(None, None, 1, 1)}, repeats, min_time=0.2)
    return timings["blocks"], timings["one"]


BENCHMARK = "sparse_ae"  # its rows in peers.csv
PEER_COLUMNS = ("implementation", "samples", "iterations", "evaluations", "seconds", "repeats", "all_seconds",
                "seconds_per_evaluation", "seconds_in_cost_gradient", "optimizer_ms_per_evaluation", "final_cost",
                "gflop_per_evaluation", "gflops",
                "dgemm_peak_gflops", "sgemm_peak_gflops", "fraction_of_peak", "speedup_vs_textbook", "description")


def write(rows, path, machine):
    """The rows (with the machine) into peers.csv, beside the other benchmarks' rows."""
    merge_rows(with_machine([{k: r[k] for k in PEER_COLUMNS if k in r} for r in rows], machine), path, BENCHMARK,
               legacy=True)


def markdown(rows, info) -> str:
    """A small markdown table of the comparison (bench.run appends it to scaling.md)."""
    lines = [f"## Side by side at {rows[0]['samples']} patches, 1 process, float64 (and aepar in float32)", "",
             f"Best of {rows[0]['repeats']} runs each, taken in turns (all runs in peers.csv).", "",
             f"FLOPs per evaluation = 10·m·v·h = {info['flop_per_evaluation'] / 1e9:.3f} GFLOP "
             f"(five matrix products); DGEMM 1000×1000 in the same run: {info['peak']:.1f} GFLOP/s "
             f"(SGEMM {info['peak32']:.1f}: the float32 row's). "
             f"The same bits on any number of processes (blocks of 128 patches in a fixed tree) cost one "
             f"process {info['leaf_tax']:.3f}x one block per evaluation (the cost/gradient rows).",
             "",
             "| implementation | iterations | evaluations | seconds | in cost/gradient | optimiser ms/evaluation "
             "(median) | GFLOP/s | of DGEMM (float32: SGEMM) | speedup | final cost |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "iterations" not in r:  # the cost/gradient alone
            lines.append(f"| {r['implementation']} | | | {float(r['seconds_per_evaluation']):.6f} per evaluation | "
                         f"| | {r['gflops']} | {float(r['fraction_of_peak']):.0%} | | |")
            continue
        lines.append(f"| {r['implementation']} | {r['iterations']} | {r['evaluations']} | {r['seconds']} | "
                     f"{r['seconds_in_cost_gradient']} | {r['optimizer_ms_per_evaluation']} | "
                     f"{r['gflops']} | {float(r['fraction_of_peak']):.0%} | {r['speedup_vs_textbook']}x | "
                     f"{r['final_cost']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.textbook_sparse", description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=10000, help="patches (default 10000)")
    p.add_argument("--iterations", type=int, default=400, help="L-BFGS iterations (default 400)")
    p.add_argument("--hidden", type=int, default=25, help="hidden units (default 25)")
    p.add_argument("--patch", type=int, default=8, help="patch side in pixels (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the patches and the start (default 0)")
    p.add_argument("--kernels", choices=["numba", "numpy"], default="numba", help="aepar's kernel set (default numba)")
    p.add_argument("--threads", type=int, default=1, help="BLAS/Numba threads for both (default 1)")
    p.add_argument("--repeats", type=int, default=3,
                   help="whole runs of each, taken in turns; rows give the best (default 3)")
    p.add_argument("--data-dir", default=None,
                   help="directory of IMAGES.mat or CIFAR-10 batches (default $AEPAR_DATA, else the "
                        "scikit-image photographs)")
    p.add_argument("--out", default=str(RESULTS / "peers.csv"),
                   help="the CSV the rows go to (default bench/results/peers.csv)")
    p.add_argument("--md", default="", help="also write the markdown table here")
    args = p.parse_args(argv)
    _set_threads(args.threads)

    rows, info = run(args.samples, args.iterations, args.patch, args.hidden, args.seed,
                     args.kernels, args.data_dir, args.repeats)
    machine = machine_columns(mpi=ONE_PROCESS)
    write(rows, args.out, machine)
    md = markdown(rows, info)
    if args.md:
        Path(args.md).write_text(md)
    print(f"data: {info['source']}")
    print(md)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
