"""Per-rank program for tests/mpi/test_mpi_sparse.py (not collected by pytest).

    mpi_sparse.py grad OUTDIR    the first half of check only, NumPy kernels only
    mpi_sparse.py check OUTDIR   cost/gradient at a fixed θ over the ranks (1003 samples in
                                 8 blocks, shared unevenly) = one process with the same
                                 kernels bit for bit, and the one-process NumPy reference to
                                 1e-12 (float32: 1e-5), for the numpy and numba kernels in
                                 float64 and the numba ones in float32; then a short CLI run
                                 into OUTDIR; every rank prints "ok rank R of N", rank 0
                                 prints "cost <final cost>"
    mpi_sparse.py balance OUTDIR a short CLI run whose last rank computes slowly (a sleep
                                 in its partials), balanced every 3 evaluations; rank 0
                                 prints the summary's blocks per rank and rebalances
    mpi_sparse.py fail-shared_sums OUTDIR | fail-partials OUTDIR | fail-assemble OUTDIR
                                 a short CLI run whose root raises at its 4th evaluation
                                 (inside its own first round, before the first sum; its
                                 second, between the sums; or in the assembly after
                                 them): every rank must end
"""
import sys

import aepar  # noqa: F401
import numpy as np

from aepar import backend
from aepar.comm import run_main
from aepar.models.sparse_ae import LEAF, SparseAutoencoder, init_theta
from aepar.parallel.blocks import TreeSum
from aepar.rows import Blocks

V, H, M = 64, 25, 1003
RHO, BETA, LAM = 0.01, 3.0, 1e-4


def check_gradient(comm, kset, dtype="float64"):
    rng = np.random.default_rng(7)
    x = rng.uniform(0.1, 0.9, size=(M, V))      # the same on every rank
    theta64 = init_theta(V, H, 11)
    theta64[2 * V * H:] = 0.2 * rng.standard_normal(H + V)
    be = backend.select("cpu", kset, dtype)
    theta = be.asarray(theta64)  # the kernels' θ, as the root broadcasts it (float32: rounded)
    blocks = Blocks.fixed(M, LEAF, comm.rank, comm.size)
    local = np.ascontiguousarray(x[blocks.rows])
    local_copy = local.copy()
    model = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(local, blocks)
    tree = TreeSum(comm, blocks.count)
    shared_rows, shared = model.new_leaves(model.n_shared), np.zeros(model.n_shared)
    model.shared_sums(theta, shared_rows)
    tree.allreduce(list(shared_rows), shared)
    leaves = model.new_leaves()
    known = model.partials(theta, leaves, shared)
    np.testing.assert_array_equal(local, local_copy)       # the shard is not touched
    total = tree.reduce_nodes(tree.node_values_from(known))
    if comm.is_root:
        cost, grad = model.assemble(total, theta64)
        alone = SparseAutoencoder(be, V, H, rho=RHO, beta=BETA, lam=LAM).attach(x)
        want_cost, want_grad = alone.cost_grad(theta64)
        assert cost == want_cost and np.array_equal(grad, want_grad), (kset, dtype, comm.size, cost - want_cost)
        ref = SparseAutoencoder(backend.select("cpu", "numpy", "float64"), V, H, rho=RHO, beta=BETA,
                                lam=LAM).attach(x)
        ref_cost, ref_grad = ref.cost_grad(theta64)
        rel = abs(cost - ref_cost) / abs(ref_cost)
        grel = np.max(np.abs(grad - ref_grad)) / np.max(np.abs(ref_grad))
        tol = 1e-12 if dtype == "float64" else 1e-5  # float32: 2e-8 and 3e-7 measured
        assert rel < tol and grel < tol, (kset, dtype, comm.size, rel, grel)


def short_run(comm, out, extra=()):
    from aepar.sparse import main

    return main(["--limit", str(M), "--iterations", "12", "--quiet", "--out", out, *extra], comm)


def inject_root_failure(where, after=3):
    """Make the root's model raise in ``where`` ("shared_sums", "partials" or "assemble") after
    ``after`` calls."""
    import aepar.models.sparse_ae as mod

    original = getattr(mod.SparseAutoencoder, where)
    calls = [0]

    def failing(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise RuntimeError(f"injected root failure in {where}")
        return original(self, *args, **kwargs)
    setattr(mod.SparseAutoencoder, where, failing)


def slow_partials(seconds):
    """Make this rank's model sleep ``seconds`` in every partials call: a slower core."""
    import time

    import aepar.models.sparse_ae as mod

    original = mod.SparseAutoencoder.partials

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return original(self, *args, **kwargs)
    mod.SparseAutoencoder.partials = slow


def main(argv, comm):
    mode, out = argv
    if mode not in ("check", "grad", "balance", "fail-shared_sums", "fail-partials", "fail-assemble"):
        raise SystemExit(f"unknown mode {mode}")
    # "grad" (8 oversubscribed ranks) stays with the NumPy kernels: no Numba start-up x 8
    for kset, dtype in {"check": (("numpy", "float64"), ("numba", "float64"), ("numba", "float32")),
                        "grad": (("numpy", "float64"),)}.get(mode, ()):
        check_gradient(comm, kset, dtype)
    if mode == "check":
        summary = short_run(comm, out)
        if comm.is_root:
            assert summary["processes"] == comm.size and summary["collectives_per_evaluation"] == 4.0
            print(f"cost {summary['final_cost']!r}", flush=True)
    if mode == "balance":
        if comm.rank == comm.size - 1:
            slow_partials(0.01)
        summary = short_run(comm, out, ["--balance-every", "3"])
        if comm.is_root:
            print(f"blocks {summary['blocks_per_rank']} rebalances {summary['rebalances']}", flush=True)
    if mode.startswith("fail-"):
        if comm.is_root:
            inject_root_failure(mode.split("-", 1)[1])
        short_run(comm, out)
    print(f"ok rank {comm.rank} of {comm.size}", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main, "mpi_sparse", sys.argv[1:]))
