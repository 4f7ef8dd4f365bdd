"""Per-rank program (mpirun -np N): data-parallel pre-training and fine-tuning equal one process.

Every rank builds the same synthetic data, keeps its contiguous shard, and trains an RBM
(Bernoulli and Gaussian hidden units), an autoencoder layer and the unrolled stack for
two epochs over the data-parallel group; it also trains the same models on all the data
alone (a serial communicator) and asserts the weights agree up to float rounding, that
all ranks hold the same weights, and that the inputs were not changed. Prints one OK line
per rank. Holds at any number of ranks.
"""
import sys

import aepar  # noqa: F401
import numpy as np

from aepar import backend
from aepar.comm import Comm, world
from aepar.models.ae_layer import AELayer
from aepar.models.rbm import RBM
from aepar.models.stacked import StackedAutoencoder
from aepar.optim import SGD
from aepar.parallel.data_parallel import shard


def check(name, ok, detail=""):
    if not ok:
        print(f"FAIL rank {world().rank}/{world().size}: {name} {detail}", flush=True)
        sys.exit(1)


def close(a, b, tol=1e-10):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) <= tol * max(1.0, float(np.max(np.abs(b))))


def same_on_all_ranks(comm, a, tol=1e-12):
    mine = np.ascontiguousarray(a, dtype=np.float64)
    top, bottom = mine.copy(), mine.copy()
    comm.allreduce(top, "max")
    comm.allreduce(bottom, "min")
    return float(np.max(top - bottom)) <= tol * max(1.0, float(np.max(np.abs(mine))))


def main():
    comm = world()
    be = backend.select("cpu", sys.argv[1] if len(sys.argv) > 1 else "numpy", "float64")
    rng = np.random.default_rng(42)
    n, d = 230, 24  # 230 rows, batch 40: a short last batch, uneven shards
    protos = (rng.random((3, d)) < 0.4) * 1.0
    x = np.clip(protos[rng.integers(0, 3, n)] + (rng.random((n, d)) < 0.05), 0, 1)
    mine = np.ascontiguousarray(x[shard(n, comm.rank, comm.size)])
    mine_before = mine.copy()
    serial = Comm.serial()

    cases = [("rbm-bernoulli", lambda: RBM(be, d, 10, batch=40, seed=7, layer_index=1)),
             ("rbm-gaussian", lambda: RBM(be, d, 4, hidden="gaussian", lr=0.01, batch=40, seed=7, layer_index=3)),
             ("ae-layer", lambda: AELayer(be, d, 6, batch=40, seed=7))]
    for name, make in cases:
        par, one = make(), make()
        for epoch in range(2):
            err_par = par.train_epoch(mine, epoch, comm)
            err_one = one.train_epoch(x, epoch, serial)
            check(f"{name} epoch {epoch} error", abs(err_par - err_one) <= 1e-10 * err_one, (err_par, err_one))
        for k in par.params:
            check(f"{name} {k} equals one process", close(par.params[k], one.params[k]))
            check(f"{name} {k} same on all ranks", same_on_all_ranks(comm, par.params[k]))
        check(f"{name} test error", abs(par.recon_error(mine, comm) - one.recon_error(x)) <= 1e-10 * one.recon_error(x))
        check(f"{name} transform", close(par.transform(mine), one.transform(x)[shard(n, comm.rank, comm.size)]))

    for loss in ("mse", "xent"):
        par, one = (StackedAutoencoder(be, [d, 8, 3], loss=loss, seed=5) for _ in range(2))
        opt_par, opt_one = SGD(be, par.params, lr=0.1, momentum=0.9), SGD(be, one.params, lr=0.1, momentum=0.9)
        for epoch in range(2):
            l_par, e_par = par.train_epoch(mine, epoch, opt_par, comm, batch=40, seed=3)
            l_one, e_one = one.train_epoch(x, epoch, opt_one, serial, batch=40, seed=3)
            check(f"stacked {loss} loss", abs(l_par - l_one) <= 1e-10 * l_one and abs(e_par - e_one) <= 1e-10 * e_one,
                  (l_par, l_one, e_par, e_one))
        for k in par.params:
            check(f"stacked {loss} {k} equals one process", close(par.params[k], one.params[k]))
        check(f"stacked {loss} error per digit",
              abs(par.error_per_digit(mine, comm) - one.error_per_digit(x)) <= 1e-10 * one.error_per_digit(x))

    check("input unchanged", np.array_equal(mine, mine_before))
    print(f"OK rank {comm.rank}/{comm.size}", flush=True)


if __name__ == "__main__":
    main()
