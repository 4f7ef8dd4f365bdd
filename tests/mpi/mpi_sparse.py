"""Per-rank program for tests/mpi/test_mpi_sparse.py (not collected by pytest).

    mpi_sparse.py grad OUTDIR    the first half of check only, NumPy kernels only
    mpi_sparse.py check OUTDIR   cost/gradient at a fixed θ over the ranks (1003 samples,
                                 uneven shards) = the one-process reference to 1e-12, for
                                 the numpy and numba kernels; then a short CLI run into
                                 OUTDIR; every rank prints "ok rank R of N", rank 0 prints
                                 "cost <final cost>"
    mpi_sparse.py fail-partials OUTDIR | fail-assemble OUTDIR
                                 a short CLI run whose root raises at its 4th evaluation
                                 (inside its own partials, between the broadcast and the
                                 reduce, or in the assembly after it): every rank must end
"""
import sys

import aepar  # noqa: F401
import numpy as np

from aepar import backend
from aepar.comm import run_main
from aepar.models.sparse_ae import SparseAutoencoder, init_theta
from aepar.parallel.data_parallel import shard
from aepar.parallel.root_optimizer import RootOptimizer

V, H, M = 64, 25, 1003
RHO, BETA, LAM = 0.01, 3.0, 1e-4


def one_evaluation(theta):
    """A 'minimiser' that evaluates once at θ and stops: the generic hook of RootOptimizer."""
    seen = {}

    def minimize(fun, theta0, maxiter, callback=None):
        seen["cost"], seen["grad"] = fun(theta0)

        class Result:
            x, fun, nit, message, success = theta0, seen["cost"], 0, "one evaluation", True
        return Result()
    return minimize, seen


def check_gradient(comm, kset):
    rng = np.random.default_rng(7)
    x = rng.uniform(0.1, 0.9, size=(M, V))      # the same on every rank
    theta = init_theta(V, H, 11)
    theta[2 * V * H:] = 0.2 * rng.standard_normal(H + V)
    be = backend.select("cpu", kset, "float64")
    local = np.ascontiguousarray(x[shard(M, comm.rank, comm.size)])
    local_copy = local.copy()
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(local, M)
    assert model.whole == (comm.size == 1)
    minimize, seen = one_evaluation(theta)
    opt = RootOptimizer(comm, model.partials, model.assemble, model.n_theta, model.new_partials(),
                        minimize=minimize)
    res = opt.run(theta if comm.is_root else None, 1)
    np.testing.assert_array_equal(local, local_copy)       # the shard is not touched
    assert res.evaluations == 1 and res.collectives == 2 and res.collectives_total == 3, res
    # every rank received exactly the root's θ
    np.testing.assert_array_equal(opt.buffer[1:], theta)
    if comm.is_root:
        serial = SparseAutoencoder(backend.select("cpu", "numpy", "float64"), V, H,
                                   rho=RHO, beta=BETA, lam=LAM).attach(x)
        want_cost, want_grad = serial.cost_grad(theta)
        rel = abs(seen["cost"] - want_cost) / abs(want_cost)
        grel = np.max(np.abs(seen["grad"] - want_grad)) / np.max(np.abs(want_grad))
        assert rel < 1e-12 and grel < 1e-12, (kset, comm.size, rel, grel)


def short_run(comm, out, extra=()):
    from aepar.sparse import main

    return main(["--samples", str(M), "--iterations", "12", "--quiet", "--out", out, *extra], comm)


def inject_root_failure(where, after=3):
    """Make the root's model raise in ``where`` ("partials" or "assemble") after ``after`` calls."""
    import aepar.models.sparse_ae as mod

    original = getattr(mod.SparseAutoencoder, where)
    calls = [0]

    def failing(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise RuntimeError(f"injected root failure in {where}")
        return original(self, *args, **kwargs)
    setattr(mod.SparseAutoencoder, where, failing)


def main(argv, comm):
    mode, out = argv
    if mode not in ("check", "grad", "fail-partials", "fail-assemble"):
        raise SystemExit(f"unknown mode {mode}")
    # "grad" (8 oversubscribed ranks) stays with the NumPy kernels: no Numba start-up x 8
    for kset in {"check": ("numpy", "numba"), "grad": ("numpy",)}.get(mode, ()):
        check_gradient(comm, kset)
    if mode == "check":
        summary = short_run(comm, out)
        if comm.is_root:
            assert summary["processes"] == comm.size and summary["collectives_per_evaluation"] == 2.0
            print(f"cost {summary['final_cost']!r}", flush=True)
    if mode.startswith("fail-"):
        if comm.is_root:
            inject_root_failure(mode.split("-")[1])
        short_run(comm, out)
    print(f"ok rank {comm.rank} of {comm.size}", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main, "mpi_sparse", sys.argv[1:]))
