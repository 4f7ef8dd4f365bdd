"""Per-rank program (mpirun -np N): data-parallel pre-training and fine-tuning are
bit-identical to one process, also across a pause in the middle of an epoch.

    mpi_greedy.py KERNELS DTYPE

Every rank builds the same synthetic data, keeps its blocks (8 fixed blocks), and trains
an RBM (Bernoulli and Gaussian hidden units), an autoencoder layer and the unrolled stack
for two epochs over the data-parallel group; it also trains the same models on all the
blocks alone (one process) and asserts that weights, errors and transforms are *equal*
(not close), and that the inputs were not changed. Then a run paused after its 3rd step
(a checkpoint request from rank 0), handed to a new model as a checkpoint would be
(parameters, momenta, the epoch's state with every block's random stream), and finished
there, equals the uninterrupted one. With allreduce=True (one Allreduce of each rank's own
sum per step) the weights are the same on every rank and close to the tree's. Prints one OK
line per rank; holds at 1-8 ranks.
"""
import sys

import aepar  # noqa: F401
import numpy as np

from aepar import backend
from aepar.comm import world
from aepar.guard import CHECKPOINT, Guard
from aepar.models.ae_layer import AELayer
from aepar.models.rbm import RBM
from aepar.models.stacked import StackedAutoencoder
from aepar.optim import SGD, Adam
from aepar.parallel.data_parallel import EpochState, reducer, train_epoch
from aepar.resume import Checkpointer
from aepar.rows import Shard

COUNT = 8


def check(name, ok, detail=""):
    if not ok:
        print(f"FAIL rank {world().rank}/{world().size}: {name} {detail}", flush=True)
        sys.exit(1)


def equal(a, b):
    return np.array_equal(np.asarray(a), np.asarray(b))


class PauseAt(Guard):
    """A guard whose rank 0 asks for a checkpoint at its ``step``-th step."""

    def __init__(self, comm, step):
        super().__init__(comm, "test", faults=[])
        self.at = step

    def local_request(self):
        return CHECKPOINT if self.comm.is_root and self.steps == self.at else 0.0


def paused_then_resumed(comm, make, shard, epoch, train):
    """Train ``epoch`` with a pause at step 3, move everything into a new model, finish."""
    first = make()
    for e in range(epoch):
        train(first, e, None, None)
    result = train(first, epoch, PauseAt(comm, 3), None)
    check("the pause came", not result.complete, result)
    state = Checkpointer.gather(result.state, comm)
    state = EpochState.from_dict(comm.bcast(state.to_dict() if comm.is_root else None))
    second = make()
    second.load_state(first.state())
    result = train(second, epoch, None, state)
    check("the resumed epoch completes", result.complete)
    return second, result


def main():
    comm = world()
    be = backend.select("cpu", sys.argv[1], sys.argv[2])
    rng = np.random.default_rng(42)
    n, d = 230, 24  # 230 rows in 8 blocks, batch 40: uneven blocks, a short last batch
    protos = (rng.random((3, d)) < 0.4) * 1.0
    x = np.clip(protos[rng.integers(0, 3, n)] + (rng.random((n, d)) < 0.05), 0, 1)
    mine = Shard.of(be, x, COUNT, comm.rank, comm.size)
    every = Shard.of(be, x, COUNT)
    before = be.to_host(mine.x).copy()

    def layer_train(model, epoch, guard, resume, shard=mine):
        return train_epoch(model, shard, epoch, comm, guard=guard, resume=resume)

    cases = [("rbm-bernoulli", lambda: RBM(be, d, 10, batch=40, seed=7, layer_index=1)),
             ("rbm-gaussian", lambda: RBM(be, d, 4, hidden="gaussian", lr=0.01, batch=40, seed=7, layer_index=3)),
             ("ae-layer", lambda: AELayer(be, d, 6, batch=40, seed=7))]
    for name, make in cases:
        par, one = make(), make()
        for epoch in range(2):
            e_par = train_epoch(par, mine, epoch, comm).means
            e_one = train_epoch(one, every, epoch).means
            check(f"{name} epoch {epoch} error", e_par == e_one, (e_par, e_one))
        for k in par.params:
            check(f"{name} {k} equals one process", equal(par.params[k], one.params[k]))
        check(f"{name} test error", par.recon_error(mine, reducer(comm)) == one.recon_error(every))
        check(f"{name} transform", equal(par.transform(mine).x, one.transform(every).x[mine.blocks.rows]))
        resumed, _ = paused_then_resumed(comm, make, mine, 1, layer_train)
        for k in par.params:
            check(f"{name} {k} after a pause and resume", equal(resumed.params[k], one.params[k]))

    for loss, opt in (("mse", "sgd"), ("xent", "adam")):
        def make(loss=loss):
            return StackedAutoencoder(be, [d, 8, 3], loss=loss, seed=5)

        def optimizer(m, opt=opt):
            return SGD(be, m.params, lr=0.1, momentum=0.9) if opt == "sgd" else Adam(be, m.params, lr=0.01)

        par, one = make(), make()
        o_par, o_one = optimizer(par), optimizer(one)
        for epoch in range(2):
            m_par = train_epoch(par, mine, epoch, comm, batch=40, optimizer=o_par).means
            m_one = train_epoch(one, every, epoch, batch=40, optimizer=o_one).means
            check(f"stacked {loss} loss", m_par == m_one, (m_par, m_one))
        for k in par.params:
            check(f"stacked {loss} {k} equals one process", equal(par.params[k], one.params[k]))
        check(f"stacked {loss} error per digit", par.error_per_digit(mine, reducer(comm)) == one.error_per_digit(every))

        optimizers = {}

        def stack_train(model, epoch, guard, resume):
            o = optimizers.setdefault(id(model), optimizer(model))
            return train_epoch(model, mine, epoch, comm, batch=40, optimizer=o, guard=guard, resume=resume)
        first = make()
        stack_train(first, 0, None, None)
        result = stack_train(first, 1, PauseAt(comm, 3), None)
        check("stacked: the pause came", not result.complete)
        state = Checkpointer.gather(result.state, comm)
        state = EpochState.from_dict(comm.bcast(state.to_dict() if comm.is_root else None))
        second = make()
        for k, v in first.params.items():
            second.params[k][...] = v
        optimizers[id(second)] = optimizer(second)
        optimizers[id(second)].load_state(optimizers[id(first)].state())
        stack_train(second, 1, None, state)
        for k in par.params:
            check(f"stacked {loss} {k} after a pause and resume", equal(second.params[k], one.params[k]))

    # allreduce=True: each rank's own sum, one Allreduce per step; the same on every rank,
    # close to the fixed tree (not the same bits: that is the tree's job)
    for name, make in cases[:1]:
        fast, one = make(), make()
        steps = -(-n // fast.batch)
        for epoch in range(2):
            issued = comm.collectives
            e_fast = train_epoch(fast, mine, epoch, comm, allreduce=True).means
            check(f"{name} allreduce: one collective per step", comm.collectives - issued == steps,
                  (comm.collectives - issued, steps))
            e_one = train_epoch(one, every, epoch).means
            check(f"{name} allreduce epoch {epoch} error close", np.allclose(e_fast, e_one, rtol=1e-5), (e_fast, e_one))
        for k in fast.params:
            host = be.to_host(fast.params[k])
            check(f"{name} allreduce {k} the same on every rank", all(equal(host, h) for h in comm.allgather(host)))
            check(f"{name} allreduce {k} close to the tree",
                  np.allclose(host, be.to_host(one.params[k]), rtol=1e-4, atol=1e-5))

    check("input unchanged", equal(be.to_host(mine.x), before))
    print(f"OK rank {comm.rank}/{comm.size}", flush=True)


if __name__ == "__main__":
    main()
