"""Per-rank program for tests/mpi/test_mpi_sync.py (run under mpirun -np N).

Synchronized pre-training of a small stack (784-64-32-16-8 by default) on a few hundred
real mnist5k digits, executed from a plan on however many ranks there are, against an
independent sequential execution of the same plan on rank 0: the weights must be equal,
bit for bit, whatever the layout (replicas inside stages included: their steps add the
fixed blocks' gradients in one fixed tree).

    python tests/mpi/mpi_sync.py [--mode data|weights] [--handover plan|newest] [--spin]
                                 [--pause STEP]

--pause STEP: rank 0 asks for a checkpoint at its STEP-th step; every stage pauses where
it is (different epochs, mid-epoch), the pipeline's state goes through rank 0 to every
rank as a checkpoint would, and a new pipeline built from it finishes: still the same bits.

--spin checks instead that a rank waiting for its input sleeps: its CPU time while
waiting stays a small fraction of the wall time it waited.
Prints "OK ..." on rank 0 when every check passed; any failure raises (non-zero exit).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aepar  # noqa: E402,F401  (thread settings before numpy)
import numpy as np  # noqa: E402

from aepar import backend  # noqa: E402
from aepar.comm import world  # noqa: E402
from aepar.data.sources import load_digits  # noqa: E402
from aepar.guard import CHECKPOINT, Guard  # noqa: E402
from aepar.parallel.data_parallel import train_epoch  # noqa: E402
from aepar.parallel.executor import Pipeline  # noqa: E402
from aepar.parallel.pipeline import make_layout, plan_schedule, stage_costs  # noqa: E402
from aepar.stack import make_layers  # noqa: E402
from aepar.rows import Shard  # noqa: E402

BLOCKS = 8


class PauseAt(Guard):
    """Rank 0 asks for a checkpoint from its ``step``-th step until one is saved."""

    def __init__(self, comm, step):
        super().__init__(comm, "test", faults=[])
        self.at, self.done = step, False

    def local_request(self):
        return CHECKPOINT if self.comm.is_root and self.steps >= self.at and not self.done else 0.0

    def saved(self):
        super().saved()
        self.done = True


def sequential_reference(be, sizes, plan, x_train, x_val, seed):
    """The plan executed the obvious way in one process: a dict of input versions."""
    layers = make_layers(be, sizes, "rbm", seed)
    inputs = {0: {0: (Shard.of(be, x_train, BLOCKS), Shard.of(be, x_val, BLOCKS))}}
    for e in plan.order:
        train, val = inputs[e.stage][e.version]
        layer = layers[e.stage]
        train_epoch(layer, train, e.epoch)  # one process: all blocks
        if (e.epoch + 1) in plan.needed(e.stage):
            inputs.setdefault(e.stage + 1, {})[e.epoch + 1] = (layer.transform(train), layer.transform(val))
    return layers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="data")
    p.add_argument("--handover", default="plan")
    p.add_argument("--layers", default="784-64-32-16-8")
    p.add_argument("--rows", type=int, default=300)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--extra", default="0,1,2,3")
    p.add_argument("--spin", action="store_true")
    p.add_argument("--pause", type=int, default=0)
    args = p.parse_args()

    comm = world()
    be = backend.select("cpu", "numpy", "float64")
    digits = load_digits("mnist5k", seed=0)
    n_val = args.rows // 5
    x_train, x_val = digits.train_x[:args.rows], digits.train_x[args.rows:args.rows + n_val]
    sizes = [int(s) for s in args.layers.split("-")]
    n = len(sizes) - 1
    epochs = [args.epochs] * n
    extras = [int(x) for x in args.extra.split(",")]
    layers = make_layers(be, sizes, "rbm", seed=3)
    ec, hc = stage_costs(layers, len(x_train), len(x_val))
    plan = plan_schedule(ec, hc, epochs, extras)
    totals = [ec[l] * plan.epochs(l) for l in range(n)]
    layout = make_layout(totals, comm.size, max_per_stage=BLOCKS)
    guard = PauseAt(comm, args.pause) if args.pause else None

    def pipeline(state=None):
        return Pipeline(be, comm, layers, layout, x_train, x_val, epochs=epochs, extras=extras, blocks=BLOCKS,
                        mode=args.mode, handover=args.handover, plan=plan, guard=guard, resume=state)
    pipe = pipeline()
    result = pipe.run()
    paused = result.paused
    if args.pause:
        assert paused, "the checkpoint request did not pause the pipeline"
        state = comm.bcast(pipe.state())
        guard.saved()
        before = result.epochs
        result = pipeline(state).run()
        assert not result.paused
        if comm.is_root:
            result.epochs = sorted(before + result.epochs, key=lambda r: (r["stage"], r["epoch"]))

    # every rank holds every layer's final weights, the same everywhere
    for layer in layers:
        mine = np.concatenate([np.ravel(layer.params[k]) for k in sorted(layer.params)])
        root = comm.Bcast(mine.copy())
        assert np.array_equal(root, mine), f"rank {comm.rank}: weights differ from rank 0's"

    if args.spin:
        ratios = [(w["wait_cpu_s"] / w["wait_s"], w["wait_s"]) for w in result.waits or [] if w["wait_s"] > 0.2]
        if comm.is_root:
            assert ratios, f"no rank waited long enough to measure: {result.waits}"
            worst = max(r for r, _ in ratios)
            assert worst < 0.25, f"a waiting rank used {worst:.0%} of a core: {result.waits}"
            print(f"OK spin np={comm.size} waits {[(round(w, 2), round(r, 3)) for r, w in ratios]}", flush=True)
        return

    if comm.is_root:
        # the plan's epochs ran, each on its planned version
        got = [(r["stage"], r["epoch"], r["version"]) for r in result.epochs]
        want = [(e.stage, e.epoch, e.version) for s in plan.stages for e in s]
        if args.handover == "plan":
            assert got == want, f"epochs run {got} != planned {want}"
        else:
            # real-time newest-wins: every stage its base epochs, then at most its extras,
            # each extra on a newer input; versions never go back
            assert len({(s, e) for s, e, _ in got}) == len(got)
            for l in range(n):
                mine = [r for r in result.epochs if r["stage"] == l]
                assert sum(not r["extra"] for r in mine) == epochs[l], (l, mine)
                assert sum(r["extra"] for r in mine) <= extras[l]
                vs = [r["version"] for r in mine]
                assert vs == sorted(vs) and (l > 0 or set(vs) == {0}) and (l == 0 or vs[0] >= 1)
                xs = [r["version"] for r in mine if r["extra"]]
                assert len(set(xs)) == len(xs)
        assert len(got) >= sum(epochs)
        if args.handover == "plan":
            ref = sequential_reference(be, sizes, plan, x_train, x_val, seed=3)
            for i, (a, b) in enumerate(zip(layers, ref)):
                for k in ("W", "bv", "bh"):
                    x, y = np.asarray(a.params[k]), np.asarray(b.params[k])
                    assert np.array_equal(x, y), f"layer {i + 1} {k}: max diff {np.abs(x - y).max()}"
            # and training moved them away from the initial weights
            init = make_layers(be, sizes, "rbm", seed=3)
            assert all(not np.allclose(a.params["W"], b.params["W"]) for a, b in zip(layers, init))
        print(f"OK np={comm.size} mode={args.mode} handover={args.handover} layout={layout.describe()} "
              f"epochs={len(got)} time={result.time_s:.2f}s" + (" paused+resumed" if args.pause else ""), flush=True)


if __name__ == "__main__":
    main()
