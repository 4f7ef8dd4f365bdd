"""bench.scaling_model: the pure model functions (no MPI, no timing)."""
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.scaling_model.model import (OPS, Compute, Curve, Link, Network, Stack, collective_s, efficiency,
                                       fit_alpha_beta, fit_tree_overhead, free_network, layer_key, layerwise_s,
                                       sparse_eval_s, sparse_run_s, stops_scaling, tree_allreduce_s, tree_reduce_s)

PROPS = settings(max_examples=100, deadline=None, derandomize=True, database=None)
POW2 = [2 ** k for k in range(11)]


def net(alpha=5e-6, beta=5e9, inter=None, ranks_per_node=2, gamma=1e-10, tree_o=0.0):
    return Network("test", {op: Link(alpha, beta) for op in OPS}, inter, ranks_per_node, gamma, tree_o)


def sparse_compute(block_s=1e-4, serial_s=1e-3):
    return Compute(sparse={"block_s": block_s, "serial_s": serial_s, "evals_per_iter": 1.05, "cg_10k_s": 1e-2})


def linear_layer_compute(stack, per_row=1e-5):
    """Layers whose block gradient costs exactly per_row x rows; nothing else costs anything."""
    layers = {}
    for key in stack.keys():
        table = {1: per_row, 1024: per_row * 1024}
        layers[key] = {"leaf": table, "fused": table, "apply": 0.0, "transform_row": 0.0, "recon_row": 0.0,
                       "grad_bytes": 4e6, "param_bytes": 4e6, "flops": 1e6}
    return Compute(layers=layers)


# ---- the fit ------------------------------------------------------------------------------------
@PROPS
@given(alpha=st.floats(1e-7, 1e-3), beta=st.floats(1e8, 1e11))
def test_fit_recovers_exact_parameters(alpha, beta):
    n = np.array([2.0 ** k for k in range(3, 27)])
    link, resid = fit_alpha_beta(n, alpha + n / beta)
    assert link.alpha == pytest.approx(alpha, rel=1e-6)
    assert link.beta == pytest.approx(beta, rel=1e-6)
    assert resid < 1e-6


@PROPS
@given(alpha=st.floats(1e-6, 1e-4), beta=st.floats(1e9, 5e10), seed=st.integers(0, 2 ** 16))
def test_fit_tolerates_small_relative_noise(alpha, beta, seed):
    n = np.array([2.0 ** k for k in range(3, 27)])
    noise = np.random.default_rng(seed).uniform(0.97, 1.03, n.size)
    link, resid = fit_alpha_beta(n, (alpha + n / beta) * noise)
    assert link.alpha == pytest.approx(alpha, rel=0.1)
    assert link.beta == pytest.approx(beta, rel=0.1)
    assert resid < 0.1


def test_fit_keeps_parameters_non_negative():
    # times that fall with size would want a negative bandwidth term: clipped to infinite beta
    link, _ = fit_alpha_beta([8, 1024, 65536], [3e-6, 2e-6, 1e-6])
    assert link.alpha >= 0 and link.beta > 0
    with pytest.raises(ValueError):
        fit_alpha_beta([8], [1e-6])


# ---- collectives --------------------------------------------------------------------------------
def test_collectives_cost_nothing_on_one_rank_and_the_fit_on_two():
    n = net()
    for op in ("bcast", "reduce", "allreduce"):
        assert collective_s(n, op, 1e6, 1) == 0.0
        assert collective_s(n, op, 1e6, 2) == pytest.approx(5e-6 + 1e6 / 5e9)
    # the fixed tree over two ranks: one message and one add
    assert tree_reduce_s(n, 1e6, 2, 2) == pytest.approx(5e-6 + 1e6 / 5e9 + 1e6 * 1e-10)
    assert tree_reduce_s(n, 1e6, 1, 8) == 0.0
    with pytest.raises(ValueError):
        tree_reduce_s(n, 1e6, 4, 2)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(nbytes=st.floats(8, 6.4e7), count_extra=st.integers(0, 300))
def test_collectives_never_cheaper_with_more_ranks(nbytes, count_extra):
    n = net(inter=Link(30e-6, 1.1e9))
    for op in ("bcast", "allreduce"):
        times = [collective_s(n, op, nbytes, p) for p in POW2]
        assert all(b >= a - 1e-15 for a, b in zip(times, times[1:]))
    # the fixed tree: blocks aligned with the ranks give one message per level, the node's
    # pairs first (intra), then across nodes; unaligned ones need at least as many hops
    intra, inter, add = 5e-6 + nbytes / 5e9, 30e-6 + nbytes / 1.1e9, nbytes * 1e-10
    for k, p in enumerate(POW2):
        aligned = tree_reduce_s(n, nbytes, p, 1024)
        assert aligned == pytest.approx(min(k, 1) * intra + max(k - 1, 0) * inter + k * add)
        assert tree_reduce_s(n, nbytes, p, 1024 + count_extra) >= aligned * (1 - 1e-12)
    # up the tree and back costs the tree and more (by halving it may cost less: Rabenseifner)
    assert tree_allreduce_s(replace(n, halving=False), nbytes, 8, 64) >= tree_reduce_s(n, nbytes, 8, 64)


def test_the_fixed_trees_own_time_is_fitted_at_two_ranks_and_paid_once_per_level():
    send, gamma, o = Link(2e-6, 15e9), 1e-10, 3e-6
    sizes = [2 ** k for k in range(3, 27)]
    # planted: every small tree_reduce costs the message, the add and o; larger ones
    # something else again (a protocol switch), which the fit must not read as overhead
    rows = {n: send.t(n) + n * gamma + (o if n <= 2048 else 5 * o) for n in sizes}
    assert fit_tree_overhead(send, rows, gamma) == pytest.approx(o)
    assert fit_tree_overhead(send, {n: send.t(n) + n * gamma for n in sizes}, gamma) == pytest.approx(0.0, abs=1e-15)
    assert fit_tree_overhead(send, {8: send.t(8) / 2}, gamma) == 0.0  # faster than the fit: none, not negative
    assert fit_tree_overhead(send, {}, gamma) == 0.0
    # aligned blocks: one message per level, each with its own time
    plain, own = net(gamma=gamma), net(gamma=gamma, tree_o=o)
    for k, p in enumerate(POW2[:6]):
        assert tree_reduce_s(own, 512, p, 64) == pytest.approx(tree_reduce_s(plain, 512, p, 64) + k * o)
    assert tree_allreduce_s(own, 512, 8, 8) == pytest.approx(tree_allreduce_s(plain, 512, 8, 8) + 3 * o)


def test_inside_a_node_a_collective_is_the_faster_of_a_tree_and_the_bandwidth_optimal_form():
    """A Curve is its points (log-log between them, the smallest's time below, the
    largest's seconds per byte beyond). Inside one node a collective over P ranks is
    log2 P of them (a tree) or 2 log2 P latencies and 2 (P-1)/P of what the bytes took at
    np 2 (reduce-scatter or scatter, then allgather), whichever is faster; at two ranks the
    one call measured."""
    c = Curve(2e-6, 1e10, (8.0, 1024.0, 2.0 ** 20), (2e-6, 3e-6, 4e-4))
    assert c.t(1) == c.t(8) == 2e-6 and c.t(1024) == pytest.approx(3e-6)
    assert c.t(32768) == pytest.approx(math.exp(np.interp(math.log(32768), np.log([1024, 2 ** 20]),
                                                          np.log([3e-6, 4e-4]))))
    assert c.t(2 ** 21) == pytest.approx(8e-4)
    node = Network("node", {op: c for op in OPS}, None, 16, 1e-10)
    for op in ("bcast", "reduce", "allreduce"):
        # large: the bytes dominate, 15/8 of one call's instead of 4 calls
        assert collective_s(node, op, 2 ** 20, 16) == pytest.approx(2 * 4 * 2e-6 + 15 / 8 * (4e-4 - 2e-6))
        assert collective_s(node, op, 2 ** 20, 4) == pytest.approx(2 * 2 * 2e-6 + 3 / 2 * (4e-4 - 2e-6))
        # small: latency-bound, the tree's 4 calls (8 latencies would take longer)
        assert collective_s(node, op, 1024, 16) == pytest.approx(4 * 3e-6)
    # at two ranks the point itself, even where the line's latency is below the smallest point's
    low = replace(c, alpha=1e-7)
    pair = Network("pair", {op: low for op in OPS}, None, 16, 1e-10)
    for op in ("bcast", "reduce", "allreduce"):
        for n in (8, 1024, 2 ** 20):
            assert collective_s(pair, op, n, 2) == pytest.approx(low.t(n))


def test_slower_network_costs_more():
    fast, slow = net(inter=Link(1.5e-6, 23e9)), net(inter=Link(30e-6, 1.1e9))
    for p in (4, 64, 1024):
        assert collective_s(slow, "allreduce", 3e6, p) > collective_s(fast, "allreduce", 3e6, p)


# ---- schemes ------------------------------------------------------------------------------------
@PROPS
@given(block_s=st.floats(1e-6, 1e-2), serial_s=st.floats(0.0, 1e-2), alpha=st.floats(0.0, 1e-4),
       beta=st.floats(1e8, 1e11), samples=st.integers(128 * 1024, 400_000))
def test_root_optimiser_efficiency_never_rises_with_ranks(block_s, serial_s, alpha, beta, samples):
    comp, n = sparse_compute(block_s, serial_s), net(alpha, beta, inter=Link(alpha * 3, beta / 2))
    times = {p: sparse_eval_s(comp, n, p, samples)["seconds"] for p in POW2}
    eff = efficiency(times)
    assert eff[1] == pytest.approx(1.0)
    values = [eff[p] for p in POW2]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(values, values[1:]))


@PROPS
@given(per_row=st.floats(1e-7, 1e-3), batch_exp=st.integers(3, 10))
def test_data_parallel_efficiency_never_rises_with_ranks(per_row, batch_exp):
    stack = Stack("t", "ae", (64, 32, 8), n_train=4096, batch=2 ** batch_exp, epochs=1)
    comp = linear_layer_compute(stack, per_row)
    for key in comp.layers:  # a fixed cost per block, as measured: small blocks lose efficiency
        comp.layers[key]["leaf"] = {1: 1e-4 + per_row, 1024: 1e-4 + per_row * 1024}
    times = {p: (lambda r: r["seconds"] if r else None)(layerwise_s(comp, net(), stack, p, scheme="data"))
             for p in POW2}
    eff = [e for _, e in sorted(efficiency(times).items())]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(eff, eff[1:]))


def test_zero_communication_gives_ideal_speedup():
    comp = sparse_compute(block_s=1e-4, serial_s=0.0)
    free = free_network()
    samples = 128 * 1024  # blocks divide evenly over every power of two up to 1024
    t1 = sparse_eval_s(comp, free, 1, samples)["seconds"]
    for p in POW2:
        assert t1 / sparse_eval_s(comp, free, p, samples)["seconds"] == pytest.approx(p)
    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=1024, epochs=2)
    comp = linear_layer_compute(stack)
    t1 = layerwise_s(comp, free, stack, 1, scheme="data")["seconds"]
    for p in (2, 4, 8, 64, 1024):
        assert t1 / layerwise_s(comp, free, stack, p, scheme="data")["seconds"] == pytest.approx(p)


def test_the_test_reconstruction_is_not_in_the_timed_pre_training():
    """aepar.parallel.layerwise leaves the per-epoch test reconstruction error out of
    pretrain_time_s (it is eval_s), the figure every validated run reports: the model
    charges no reconstruction to greedy or data, however costly."""
    free = free_network()
    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, n_test=1000, batch=1024, epochs=3)
    comp = linear_layer_compute(stack)
    without = {p: layerwise_s(comp, free, stack, p, scheme="greedy")["seconds"] for p in (1, 2, 4, 8)}
    for key in comp.layers:
        comp.layers[key]["recon_row"] = 1e-2
    assert {p: layerwise_s(comp, free, stack, p, scheme="greedy")["seconds"] for p in without} == without


def test_a_ranks_blocks_cost_what_the_measured_multi_block_step_says():
    """k blocks on a rank are one factored sum in train_epoch, priced from the measured
    8-block step (k times one block's share at its rows); a record without it composes k
    one-block gradients and k - 1 adds, and one block is always one block's gradient."""
    from bench.scaling_model.model import step_s

    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=800, epochs=1, blocks=8)
    comp = linear_layer_compute(stack, per_row=1e-5)
    free = free_network()
    composed = step_s(comp, free, stack, 0, 2, blocks=8, allreduce=False)[0]
    assert composed == pytest.approx(4 * 100 * 1e-5)  # leaves only: adds, copy and step cost nothing here
    for key in comp.layers:
        comp.layers[key]["block"] = {10.0: 2e-4, 100.0: 5e-4}
    assert step_s(comp, free, stack, 0, 2, blocks=8, allreduce=False)[0] == pytest.approx(4 * 5e-4)
    assert step_s(comp, free, stack, 0, 4, blocks=8, allreduce=False)[0] == pytest.approx(2 * 5e-4)
    assert step_s(comp, free, stack, 0, 8, blocks=8, allreduce=False)[0] == pytest.approx(100 * 1e-5)
    half = Stack(**{**stack.__dict__, "batch": 440})  # 55 rows per block: between the measured rows
    assert step_s(comp, free, half, 0, 1, blocks=8, allreduce=False)[0] == pytest.approx(8 * 3.5e-4)


def test_one_process_on_one_thread_takes_its_blocks_whole_step_as_measured_so(tmp_path):
    """One process and one thread holding every block takes the gradients, the tree and
    the step in one kernel call, which a rank of several does not: where measure-compute
    timed that whole step (alone_blocked_step), it is the step of one process at one
    thread with those blocks, and of nothing else (two threads, two ranks, another
    block count take the rank's path)."""
    from bench.scaling_model.measure import load_compute
    from bench.scaling_model.model import step_s

    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=800, epochs=1, blocks=8)
    comp = linear_layer_compute(stack, per_row=1e-5)
    free = free_network()
    for key in comp.layers:
        comp.layers[key]["block"] = {10.0: 2e-4, 100.0: 5e-4}
    rank_path = step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False)[0]
    assert rank_path == pytest.approx(8 * 5e-4)
    key = stack.keys()[0]
    (tmp_path / "c.csv").write_text("what,key,rows,seconds,blocks\n" f"alone_blocked_step,{key},100,0.001,8\n"
                                    f"alone_blocked_step,{key},1000,0.002,8\n")
    comp.layers[key]["alone"] = load_compute(tmp_path / "c.csv").layers[key]["alone"]
    whole = 0.001 + 0.001 * 700 / 900  # batch 800, between the measured 100 and 1000
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False)[0] == pytest.approx(whole)
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False, f=2.0)[0] == pytest.approx(2 * whole)
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False, threads=2)[0] == pytest.approx(4 * 5e-4)
    assert step_s(comp, free, stack, 0, 2, blocks=8, allreduce=False)[0] == pytest.approx(4 * 5e-4)
    assert step_s(comp, free, stack, 0, 1, blocks=4, allreduce=False)[0] == pytest.approx(comp.blocks(key, 4, 200))


def test_a_second_thread_gains_what_was_measured_on_the_machine_and_small_steps_keep_one():
    """Two threads divide a step by the gain measured on the machine (one process's whole
    step, or a rank's path, sum and update included), not by two; without a measured gain
    the blocks split evenly as before. A layer whose rank's step is below aepar's
    SHARED_STEP_FLOPS trains on one thread, as aepar does; the transforms take the gain."""
    from aepar.parallel.data_parallel import SHARED_STEP_FLOPS
    from bench.scaling_model.model import step_s

    free = free_network()
    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=800, epochs=1, blocks=8)
    comp = linear_layer_compute(stack, per_row=1e-5)
    key = stack.keys()[0]
    for k in comp.layers:
        comp.layers[k]["block"] = {10.0: 2e-4, 100.0: 5e-4}
        comp.layers[k]["apply"] = 1e-4
    rank_path = step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False)[0]
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False, threads=2)[0] == \
        pytest.approx(4 * 5e-4 + 1e-4)  # even split of the blocks, the update whole
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False, threads=2, speedup=1.6)[0] == \
        pytest.approx(rank_path / 1.6)
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False, speedup=1.6)[0] == pytest.approx(rank_path)
    comp.layers[key]["alone"] = {8: {100.0: 3e-3, 1000.0: 4e-3}}
    assert step_s(comp, free, stack, 0, 1, blocks=8, allreduce=False, threads=2, speedup=1.6)[0] == \
        pytest.approx((3e-3 + 1e-3 * 700 / 900) / 1.6)  # one process's whole step measured, divided

    # layers 4096-256 (big steps, shared) and 256-4 (small steps: one thread whatever the threads)
    big = Stack("b", "ae", (4096, 256, 4), n_train=1600, batch=800, epochs=1, blocks=8)
    assert big.flops(0) * 800 >= SHARED_STEP_FLOPS > big.flops(1) * 800
    comp = linear_layer_compute(big, per_row=1e-5)
    for k in comp.layers:
        comp.layers[k]["transform_row"] = 1e-6
    one = layerwise_s(comp, free, big, 1, scheme="greedy")
    two = layerwise_s(comp, free, big, 1, scheme="greedy", threads=2, speedup=1.6)
    step = 8 * 100 * 1e-5  # a step of 8 one-block gradients of 100 rows
    steps = 2
    transform = 1e-6 * 1600
    assert one["seconds"] == pytest.approx(2 * steps * step + transform)
    assert two["seconds"] == pytest.approx(steps * step / 1.6 + steps * step + transform / 1.6)
    even = layerwise_s(comp, free, big, 1, scheme="greedy", threads=2)
    assert even["seconds"] == pytest.approx(steps * step / 2 + steps * step + transform / 2)


def test_thread_speedups_come_from_each_machines_last_block_tax_run(tmp_path):
    """A machine's gain from a second thread: bench.block_tax's 8-block epochs at one thread
    over two, the median over its layer-wise workloads (CD-1, autoencoder layer, greedy),
    per batch, each from its last day only, on the host's own code path, kept between 1 and 2;
    a point takes the measured batch nearest its own, and two threads only."""
    from bench.scaling_model.validate import Points, thread_speedups

    head = "workload,implementation,batch,threads,seconds,date,cpu_model,isa,cores\n"

    def row(w, t, s, day="2026-12-05", batch=100, impl="aepar, 8 blocks", isa="avx2"):
        return f'{w},"{impl}",{batch},{t},{s},{day} 10:00,EPYC,{isa},2\n'

    haswell = "avx2 [numba target: haswell]"
    rows = [row("rbm", 1, 1.0), row("rbm", 2, 0.6), row("ae", 1, 1.0), row("ae", 2, 0.5),
            row("greedy", 1, 1.0), row("greedy", 2, 0.8),
            row("finetune", 1, 1.0), row("finetune", 2, 0.9),  # not a layer-wise epoch
            row("rbm250x30", 1, 1.0), row("rbm250x30", 2, 1.0),  # a small RBM, which aepar keeps on one thread
            row("rbm", 1, 1.0, impl="aepar, 1 block"), row("rbm", 2, 0.99, impl="aepar, 1 block"),
            row("ae", 1, 1.0, isa=haswell), row("ae", 2, 0.99, isa=haswell),  # another code path
            row("rbm", 1, 1.0, day="2026-12-01"), row("rbm", 2, 0.9, day="2026-12-01"),  # an older day
            row("rbm", 1, 1.0, batch=1000), row("rbm", 2, 0.4, batch=1000),  # faster than two threads could be
            row("rbm", 1, 1.0, day="2026-12-01", batch=5000),  # no two-thread partner
            # a later run of one workload alone leaves the others' last day as it was
            row("ae250x30", 1, 1.0, day="2026-12-07"), row("ae250x30", 2, 1.0, day="2026-12-07")]
    (tmp_path / "block_tax.csv").write_text(head + "".join(rows))
    gains = thread_speedups(tmp_path)
    machine = ("EPYC", "avx2", "2")
    assert gains == {machine: {100: pytest.approx(1 / 0.6), 1000: 2.0}}
    pts = Points({"cpu_model": "other", "isa": "x", "cores": "2"}, {}, Compute(), speedups=gains)
    on_it = {"cpu_model": "EPYC", "isa": "avx2", "cores": "2"}
    assert pts.speedup(on_it, 100, 2) == pytest.approx(1 / 0.6)
    assert pts.speedup(on_it, 200, 2) == pytest.approx(1 / 0.6)
    assert pts.speedup(on_it, 500, 2) == 2.0
    assert pts.speedup(on_it, 100, 4) is None
    assert pts.speedup({"cpu_model": "other", "isa": "x", "cores": "2"}, 100, 2) is None
    assert thread_speedups(tmp_path / "missing") == {}


@pytest.mark.parametrize("kind", ["rbm", "ae"])
def test_measure_compute_times_a_ranks_blocked_step_with_its_update_and_one_process_alone(kind):
    """measure-compute's blocked steps run on today's train_epoch: one process alone on
    one thread takes a step's gradients, tree and update in one kernel call (no update
    phase of its own), so the rank's path (with its update) must be asked for."""
    import aepar  # noqa: F401
    from aepar import backend
    from aepar.models.ae_layer import AELayer
    from aepar.models.rbm import RBM
    from aepar.rows import Shard
    from bench.scaling_model.measure import _measure_blocked_steps

    be = backend.select("cpu", "auto", "float32")
    layer = {"rbm": RBM, "ae": AELayer}[kind](be, 24, 16, hidden="bernoulli", batch=32)
    x = np.random.default_rng(0).random((128, 24)).astype(np.float32)
    rows = []
    _measure_blocked_steps(lambda what, key, n, seconds, **kw: rows.append((what, n, seconds, kw)), 0.01, layer,
                           "k", Shard.of(be, x, 8))
    assert [(what, n, kw) for what, n, _, kw in rows] == [("blocked_step", 32, {"blocks": 8}),
                                                          ("update_in_loop", 32, {}),
                                                          ("alone_blocked_step", 32, {"blocks": 8})]
    assert all(seconds > 0 for _, _, seconds, _ in rows)


def test_serial_part_bounds_the_speedup():
    comp, free = sparse_compute(block_s=1e-4, serial_s=1e-3), free_network()
    samples = 128 * 1024
    t1 = sparse_eval_s(comp, free, 1, samples)["seconds"]
    bound = t1 / 1e-3  # Amdahl: never faster than the root's serial part
    assert all(t1 / sparse_eval_s(comp, free, p, samples)["seconds"] < bound for p in POW2)


def test_schemes_refuse_what_the_code_refuses():
    comp = sparse_compute()
    assert sparse_eval_s(comp, net(), 128, 10000) is None  # 79 blocks of 128
    assert sparse_eval_s(comp, net(), 64, 10000) is not None
    stack = Stack("t", "ae", (64, 32, 8), n_train=4096, batch=100, epochs=1)
    assert layerwise_s(linear_layer_compute(stack), net(), stack, 128, scheme="data") is None  # batch < ranks
    assert layerwise_s(linear_layer_compute(stack), net(), stack, 16, scheme="greedy") is None  # 8 blocks


def test_the_sparse_serial_part_comes_from_one_run_where_measured_so(tmp_path):
    """The root's serial part is what one run's evaluations took beyond their blocks
    (``sparse_serial``), not the difference of that run and a timing taken apart; a
    record without the row keeps the difference."""
    from bench.scaling_model.measure import load_compute

    rows = ("what,key,rows,seconds,evaluations,iterations,blocks\n"
            "sparse_local,64-25 float64,10000,0.005,,,79\n" "sparse_assemble,64-25 float64,10000,0.00001,,,\n"
            "sparse_eval,64-25 float64,10000,0.007,63,60,79\n")
    (tmp_path / "old.csv").write_text(rows)
    (tmp_path / "new.csv").write_text(rows + "sparse_serial,64-25 float64,10000,0.0003,63,,\n")
    assert load_compute(tmp_path / "old.csv").sparse["serial_s"] == pytest.approx(0.002)
    new = load_compute(tmp_path / "new.csv").sparse
    assert new["serial_s"] == pytest.approx(0.0003)
    assert new["block_s"] == pytest.approx(0.005 / 79)


def test_measure_compute_times_the_sparse_serial_part_in_the_run_it_times_the_evaluation_in():
    """The serial row is that run's evaluations less their blocks' own time and sums."""
    import aepar  # noqa: F401
    from bench.scaling_model.measure import _measure_sparse_evaluation

    rows = {}
    _measure_sparse_evaluation(lambda what, key, n, seconds, **kw: rows.setdefault(what, seconds), 0.01, True,
                               np.random.default_rng(0))
    # the root's L-BFGS-B step and assembly, a small part beside the 79 blocks' two rounds
    assert 0 < rows["sparse_serial"] < 0.5 * rows["sparse_local"]


def test_run_multiplies_the_evaluation():
    comp = sparse_compute()
    e = sparse_eval_s(comp, net(), 4, 40000)
    r = sparse_run_s(comp, net(), 4, 40000, 400)
    assert r["seconds"] == pytest.approx(e["seconds"] * 400 * 1.05)
    assert r["per_iteration"] == pytest.approx(e["seconds"] * 1.05)
    assert sparse_run_s(comp, net(), 4, 40000, 400, evaluations=10)["seconds"] == pytest.approx(10 * e["seconds"])


def test_compute_scale_and_oversubscription_multiply_compute_only():
    comp = sparse_compute(serial_s=0.0)
    a = sparse_eval_s(comp, net(), 2, 40000)
    b = sparse_eval_s(comp, net(), 2, 40000, scale=2.0)
    c = sparse_eval_s(comp, net(), 4, 40000, cores=2)
    assert b["compute_s"] == pytest.approx(2 * a["compute_s"]) and b["comm_s"] == a["comm_s"]
    assert c["compute_s"] == pytest.approx(2 * sparse_eval_s(comp, net(), 4, 40000)["compute_s"])


def test_stops_scaling():
    times = {1: 100.0, 2: 50.0, 4: 30.0, 8: 20.0, 16: 25.0, 32: None}
    below, best, still = stops_scaling(times)
    assert (below, best, still) == (16, 8, False)  # efficiency 100 / (16 x 25) = 0.25
    assert stops_scaling({1: 8.0, 2: 4.0, 4: 2.0}) == (None, 4, True)
    assert layer_key("rbm", 784, 1000, "bernoulli") == "rbm:784-1000:bernoulli:float32"
    assert math.isclose(efficiency({1: 10.0, 2: 10.0})[2], 0.5)


def test_machine_scales_come_from_that_exact_machine_and_the_hosts_own_code_path(tmp_path):
    """A factor belongs to one machine (CPU name, ISA, cores): a Xeon of another core count or
    model never lends it, nor does a row of another code path (AEPAR_ISA's, "[numba target
    ...]" in isa) or another implementation; the last matching row counts, over here's row
    of the same file where there is one. A point on a machine with no factor for its kernel
    is left out and counted, not predicted unscaled."""
    from bench.scaling_model.validate import Points, kernel_scales

    head = "implementation,samples,evaluations,seconds_in_cost_gradient,cpu_model,isa,cores,threads\n"
    rows = ["aepar,10000,100,3.0,Intel Xeon,avx512f avx2,2,1\n",
            "aepar,10000,100,2.0,Intel Xeon,avx512f avx2,2,1\n",
            "aepar,10000,100,9.0,Intel Xeon,avx512f avx2 [numba target: haswell -avx512f],2,1\n",
            "aepar,10000,100,7.0,Intel Xeon,avx512f avx2,16,1\n",
            "aepar,10000,100,5.0,Intel Xeon (family 6 model 207),avx512f avx2,2,1\n",
            "textbook,10000,100,4.0,Intel Xeon,avx512f avx2,2,1\n"]
    (tmp_path / "peers.csv").write_text(head + "".join(rows))
    comp = sparse_compute()
    comp.rbm_epoch_50k = 5.0
    (tmp_path / "rbm_epoch.csv").write_text(
        "implementation,samples,seconds,threads,layer,batch,cpu_model,isa,cores\n"
        '"aepar (numba kernels, 1 block: one process only)",25000,2.0,1,784x1000 bernoulli,100,AMD EPYC,avx2,2\n'
        '"aepar (numba kernels, 8 blocks)",25000,9.0,1,784x1000 bernoulli,100,AMD EPYC,avx2,2\n')
    scales = kernel_scales(comp, ("AMD EPYC", "avx512f", "2"), tmp_path)
    xeon = ("Intel Xeon", "avx512f avx2", "2")
    assert scales[xeon] == {"sparse": pytest.approx(2.0 / 100 / 1e-2)}
    assert scales[("Intel Xeon", "avx512f avx2", "16")]["sparse"] == pytest.approx(7.0)
    assert scales[("Intel Xeon (family 6 model 207)", "avx512f avx2", "2")]["sparse"] == pytest.approx(5.0)
    assert scales[("AMD EPYC", "avx2", "2")] == {"layers": pytest.approx(2.0 * 2 / 5.0)}
    assert len(scales) == 4
    assert kernel_scales(comp, ("AMD EPYC", "avx512f", "2"), tmp_path / "missing") == {}
    # like is divided by like: here's own row of the same benchmark, where it has one
    assert kernel_scales(comp, xeon, tmp_path)[("Intel Xeon", "avx512f avx2", "16")] == {"sparse": pytest.approx(3.5)}

    comp.contention = {"layers": {1: 2.0, 2: 2.5}}
    pts = Points({"cpu_model": "AMD EPYC", "isa": "avx512f", "cores": "2"}, scales, comp)
    assert pts.scale("a.csv", {"cpu_model": "AMD EPYC", "isa": "avx512f", "cores": 2}, "layers") == 1.0
    # here, ranks sharing the cores slow each other as measured; never past one per core
    for ranks in (2, 8):
        assert pts.scale("a.csv", {"cpu_model": "AMD EPYC", "isa": "avx512f", "cores": 2}, "layers", ranks) == \
            pytest.approx(1.25)
    assert pts.scale("a.csv", {"cpu_model": "AMD EPYC", "isa": "avx512f", "cores": 2}, "sparse", 2) == 1.0
    assert pts.scale("a.csv", {"cpu_model": "Intel Xeon", "isa": "avx512f avx2", "cores": 2}, "sparse") == \
        pytest.approx(2.0)
    assert pts.scale("a.csv", {"cpu_model": "Intel Xeon", "isa": "avx512f avx2", "cores": 2}, "layers") is None
    assert pts.scale("b.csv", {"cpu": "AMD EPYC", "isa": "avx2", "cores": "2"}, "layers") == pytest.approx(0.8)
    assert pts.skipped == {("a.csv", "Intel Xeon (AVX-512, 2 cores)"): 1}


def test_the_layers_factor_is_the_median_of_every_like_for_like_epoch(tmp_path):
    """Where both machines ran bench.block_tax, a machine's layers factor is the median of
    rbm_epoch.csv's CD-1 ratio and block_tax.csv's: each layer-wise epoch at one thread (CD-1,
    the autoencoder layer, greedy; one block and 8; per batch) over here's same epoch, each
    machine's last day, on the host's own code path; fine-tuning, the CAE, two threads, an
    AEPAR_ISA row and an epoch here never ran do not count. Without rbm_epoch's row the
    block_tax ratios alone."""
    from bench.scaling_model.validate import kernel_scales

    comp = sparse_compute()
    comp.rbm_epoch_50k = 5.0
    (tmp_path / "rbm_epoch.csv").write_text(
        "implementation,samples,seconds,threads,layer,batch,cpu_model,isa,cores\n"
        '"aepar (numba kernels, 1 block: one process only)",50000,5.0,1,784x1000 bernoulli,100,Zen4,avx512f,2\n'
        '"aepar (numba kernels, 1 block: one process only)",50000,6.0,1,784x1000 bernoulli,100,Zen3,avx2,2\n')
    head = "workload,implementation,batch,threads,seconds,date,cpu_model,isa,cores\n"

    def row(cpu, w, s, impl="aepar, 8 blocks", t=1, day="2026-12-05", batch=100, isa=None):
        isa = isa or {"Zen4": "avx512f", "Zen3": "avx2", "Xeon": "avx512f"}[cpu]
        return f'{w},"{impl}",{batch},{t},{s},{day} 09:00,{cpu},{isa},2\n'

    rows = [row("Zen4", "rbm", 1.0), row("Zen3", "rbm", 1.3),
            row("Zen4", "ae", 1.0, impl="aepar, 1 block"), row("Zen3", "ae", 1.4, impl="aepar, 1 block"),
            row("Zen4", "greedy", 2.0, batch=1000), row("Zen3", "greedy", 2.6, batch=1000),
            row("Zen4", "rbm250x30", 0.1), row("Zen3", "rbm250x30", 0.15),
            row("Zen3", "rbm", 9.0, day="2026-12-01"),  # an older day of Zen 3's
            row("Zen4", "finetune", 1.0), row("Zen3", "finetune", 9.0),  # not a layer-wise epoch
            row("Zen4", "ae", 1.0, t=2), row("Zen3", "ae", 9.0, t=2),  # two threads
            row("Zen3", "rbm", 9.0, isa="avx2 [numba target: haswell]"),  # another code path
            row("Zen3", "cae", 9.0), row("Zen3", "ae", 9.0, batch=5000),  # here never ran these
            row("Xeon", "rbm", 0.5), row("Xeon", "ae", 0.7, impl="aepar, 1 block")]
    (tmp_path / "block_tax.csv").write_text(head + "".join(rows))
    scales = kernel_scales(comp, ("Zen4", "avx512f", "2"), tmp_path)
    assert scales[("Zen3", "avx2", "2")]["layers"] == pytest.approx(float(np.median([1.2, 1.3, 1.4, 1.3, 1.5])))
    assert scales[("Xeon", "avx512f", "2")] == {"layers": pytest.approx(0.6)}
    assert set(scales) == {("Zen3", "avx2", "2"), ("Xeon", "avx512f", "2")}  # no AEPAR_ISA row's machine
    # here without block_tax rows: rbm_epoch's ratio alone, as before
    (tmp_path / "block_tax.csv").write_text(head + "".join(r for r in rows if ",Zen4," not in r))
    assert kernel_scales(comp, ("Zen4", "avx512f", "2"), tmp_path)[("Zen3", "avx2", "2")] == \
        {"layers": pytest.approx(1.2)}


def test_a_steps_sum_is_priced_as_measured_in_a_loop_of_steps():
    """Where measure-mpi timed a training step's sums (np 2), a rank's step pays its sum times
    how much longer it took in the loop than alone (log-log between the measured sizes, the
    nearest beyond), plus the measured wait for the slower rank, a fraction of the step's
    compute, growing with the ranks as the expected largest of that many normal draws; on
    one rank, or where nothing was measured, nothing changes."""
    from bench.scaling_model.model import expected_max, step_s

    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max(4) == pytest.approx(1.0294, abs=1e-4)
    assert [expected_max(p) for p in (2, 4, 8, 16)] == sorted(expected_max(p) for p in (2, 4, 8, 16))

    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=800, epochs=1, blocks=8)
    comp = linear_layer_compute(stack, per_row=1e-5)
    gb = comp.layers[stack.keys()[0]]["grad_bytes"]  # 4 MB
    plain = net(alpha=1e-5, beta=1e9)
    loop = replace(plain, step_sums={"allreduce": {2 ** 20: 2.0, 2 ** 24: 4.0}, "tree_allreduce": {2 ** 22: 1.5}},
                   straggle=0.1)
    assert loop.in_step("allreduce", 2 ** 22) == pytest.approx(3.0)  # halfway in log bytes
    assert loop.in_step("allreduce", 10) == 2.0 and loop.in_step("allreduce", 2 ** 30) == 4.0
    assert loop.in_step("bcast", 2 ** 22) == 1.0 and plain.in_step("allreduce", 2 ** 22) == 1.0
    for p in (2, 4):
        work, comm = step_s(comp, plain, stack, 0, p, blocks=8, allreduce=True)
        work_l, comm_l = step_s(comp, loop, stack, 0, p, blocks=8, allreduce=True)
        assert work_l == work
        ratio = loop.in_step("allreduce", gb)
        assert comm_l == pytest.approx(comm * ratio + 0.1 * expected_max(p) / expected_max(2) * work)
    work, comm = step_s(comp, plain, stack, 0, 2, blocks=8, allreduce=False)
    assert step_s(comp, loop, stack, 0, 2, blocks=8, allreduce=False)[1] == pytest.approx(comm * 1.5 + 0.1 * work)
    assert step_s(comp, loop, stack, 0, 1, blocks=8, allreduce=False) == step_s(comp, plain, stack, 0, 1, blocks=8,
                                                                                allreduce=False)


def test_a_greedy_steps_sum_at_two_ranks_is_the_call_measure_mpi_timed():
    """At np 2 on one node a greedy step's fixed-tree sum costs the whole call as measured
    (the Bcast of a sum just written costs more than a Bcast timed alone), less the root's
    copy that the step's own work already counts; beyond two ranks, or across nodes, it is
    composed from the parts."""
    from bench.scaling_model.model import step_s, step_tree_allreduce_s

    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=800, epochs=1, blocks=8)
    comp = linear_layer_compute(stack)
    comp.mem = {"copy": {2 ** 10: 1e-6, 2 ** 30: 1e-3}}
    gb = comp.layers[stack.keys()[0]]["grad_bytes"]
    parts = replace(net(alpha=1e-5, beta=1e9), halving=False)  # up the tree and back, as before 0.8.51
    slow = Link(1e-5, 1e8)  # the whole call: a tenth of the parts' bandwidth
    whole = replace(parts, intra=parts.intra | {"tree_allreduce": slow})
    copy = comp.mem_s("copy", gb)
    assert step_tree_allreduce_s(whole, gb, 2, 8, copy) == pytest.approx(slow.t(gb) - copy)
    assert step_s(comp, whole, stack, 0, 2, blocks=8, allreduce=False)[1] == pytest.approx(slow.t(gb) - copy)
    for p, n in ((4, whole), (2, replace(whole, inter=Link(3e-5, 1e9), ranks_per_node=1))):
        assert step_tree_allreduce_s(n, gb, p, 8, copy) == tree_allreduce_s(n, gb, p, 8)
    assert step_tree_allreduce_s(whole, 8, 2, 8, 1.0) == 0.0  # never negative


def test_a_sum_on_every_rank_is_priced_as_the_code_of_its_record_took_it():
    """Since 0.8.51 TreeSum.allreduce halves where a power-of-two number of ranks hold one
    node of the tree each and the vector is 64 KB or more: log2 P swaps of halving pieces
    (two one-way sends at once and an add each), then the pieces back. A record of older
    code, or naming no aepar version, went up the tree and back by Bcast and is priced so;
    validation takes the version from each point's row."""
    from bench.scaling_model.model import halving_allreduce_s, step_tree_allreduce_s, sums_by_halving
    from bench.scaling_model.validate import Points

    assert all(sums_by_halving(v) for v in ("0.8.51", "0.8.60", "0.9.0", "1.0.0"))
    assert not any(sums_by_halving(v) for v in ("0.8.50", "0.7.99", "", None))
    link, o, gamma, big = Link(1e-5, 1e9), 3e-6, 1e-10, 4e6
    new = net(alpha=1e-5, beta=1e9, gamma=gamma, tree_o=o)
    new = replace(new, intra={op: link for op, link in new.intra.items() if op != "tree_halving"})  # not timed
    old = replace(new, halving=False)
    assert halving_allreduce_s(new, big, 2) == pytest.approx(2 * (o + 2 * link.t(big / 2)) + big / 2 * gamma)
    assert halving_allreduce_s(new, big, 4) == pytest.approx(halving_allreduce_s(new, big, 2) + 2 * (
        o + 2 * link.t(big / 4)) + big / 4 * gamma)
    for p in (2, 4, 8, 16):
        count = max(8, p)
        assert tree_allreduce_s(new, big, p, count) == halving_allreduce_s(new, big, p)
        assert tree_allreduce_s(old, big, p, count) == tree_reduce_s(old, big, p, count) + \
            collective_s(old, "bcast", big, p)
    assert halving_allreduce_s(new, big, 16) < tree_allreduce_s(old, big, 16, 16)  # about 4 n against 4 levels of n
    # where TreeSum does not halve: under 64 KB, ranks not a power of two
    for nbytes, p in ((60e3, 4), (big, 6), (big, 3)):
        assert tree_allreduce_s(new, nbytes, p, 8) == tree_allreduce_s(old, nbytes, p, 8)
    # the np 2 call measure-mpi timed is the tree and the Bcast: a halving record's is composed
    slow = Link(1e-5, 1e8)
    whole = replace(new, intra=new.intra | {"tree_allreduce": slow})
    assert step_tree_allreduce_s(whole, big, 2, 8, 0.0) == halving_allreduce_s(whole, big, 2)
    assert step_tree_allreduce_s(replace(whole, halving=False), big, 2, 8, 0.0) == pytest.approx(slow.t(big))
    # a record with the halving timed at np 2 (measure-mpi's tree_halving) serves it there
    timed = replace(whole, intra=whole.intra | {"tree_halving": Link(2e-5, 2e8)})
    assert step_tree_allreduce_s(timed, big, 2, 8, 1.0) == pytest.approx(Link(2e-5, 2e8).t(big))
    assert step_tree_allreduce_s(replace(timed, halving=False), big, 2, 8, 0.0) == pytest.approx(slow.t(big))
    # validation: each point's row says which code it ran
    pts = Points({"cpu_model": "Zen4", "isa": "avx512f", "cores": "2"}, {}, Compute())
    assert pts.network("a.csv", old, 2, {"cpu_model": "Zen4", "isa": "avx512f", "aepar": "0.8.51"}).halving
    assert not pts.network("a.csv", new, 2, {"cpu_model": "Zen4", "isa": "avx512f", "aepar": "0.8.50"}).halving
    assert not pts.network("a.csv", new, 2, {"cpu_model": "Zen4", "isa": "avx512f"}).halving


def test_measure_mpi_times_each_way_of_the_sum_on_every_rank_whatever_the_code_would_take():
    """measure-mpi's tree_allreduce is up the tree and back by Bcast at every size, and
    tree_halving by halving at every size (only where the ranks can halve), so that each
    op's points stand for one way whichever aepar measured them; the code's own bound is
    left as it was."""
    from types import SimpleNamespace

    from aepar.parallel import blocks
    from bench.scaling_model.measure import _mpi_ops

    taken = []

    class Tree:
        butterfly = None

        def allreduce(self, vectors, out):
            taken.append((self.butterfly, blocks.HALVING_BYTES))

        def reduce(self, vectors):
            pass

    bound = blocks.HALVING_BYTES
    buf = np.zeros(4)
    ops = _mpi_ops(SimpleNamespace(size=2, rank=0), Tree(), buf, buf)
    assert set(ops) == set(OPS)
    ops["tree_allreduce"]()
    ops["tree_halving"]()
    assert taken == [(False, 0), (True, 0)] and blocks.HALVING_BYTES == bound
    assert "tree_halving" not in _mpi_ops(SimpleNamespace(size=3, rank=0), Tree(), buf, buf)


def test_load_steps_divides_each_sum_in_a_step_by_the_same_op_alone():
    from bench.scaling_model.measure import load_steps

    rows = [{"op": "allreduce", "bytes": "1024", "seconds": "1", "min_seconds": "1e-5"},
            {"op": "allreduce", "bytes": "1048576", "seconds": "1", "min_seconds": "1e-3"},
            {"op": "allreduce_step", "bytes": "1024", "seconds": "3e-5"},
            {"op": "allreduce_step", "bytes": "32768", "seconds": "1e-4"},  # alone: 1e-4 (log-log between)
            {"op": "tree_allreduce_step", "bytes": "1024", "seconds": "3e-5"},  # its op alone was not timed
            {"op": "straggle", "bytes": "0", "seconds": "2e-4", "compute_seconds": "5e-3"}]
    ratios, straggle = load_steps(rows)
    assert ratios == {"allreduce": {1024: pytest.approx(3.0), 32768: pytest.approx(1.0)}}
    assert straggle == pytest.approx(0.04)
    assert load_steps(rows[:2]) == ({}, 0.0)


def test_step_sums_are_timed_as_a_loop_issues_them(monkeypatch):
    """measure-mpi's step rows: every size, both sums, and the straggle row (on one process:
    its sums and waits are all but free, its compute is not)."""
    from aepar.comm import Comm
    from aepar.parallel.blocks import TreeSum
    from bench.scaling_model import measure

    monkeypatch.setattr(measure, "STEP_WORK_S", 0.0002)
    comm = Comm.serial()
    rows = measure._step_sums(comm, TreeSum(comm, 1), quick=True)
    steps = [r for r in rows if r["op"].endswith("_step")]
    assert {(r["op"], r["bytes"]) for r in steps} == {(f"{op}_step", n) for op in ("allreduce", "tree_allreduce")
                                                       for n in (2 ** 15, 2 ** 20, 2 ** 23)}
    assert all(0 < r["seconds"] <= r["max_seconds"] for r in steps)
    straggle = [r for r in rows if r["op"] == "straggle"]
    assert len(straggle) == 1 and straggle[0]["compute_seconds"] > 0 <= straggle[0]["seconds"]
    # where the ranks can halve, the halving's sum in a step too
    monkeypatch.setattr("aepar.parallel.blocks.halving_pairs", lambda count, ranks: True)
    rows = measure._step_sums(comm, TreeSum(comm, 1), quick=True)
    assert {r["bytes"] for r in rows if r["op"] == "tree_halving_step"} == {2 ** 15, 2 ** 20, 2 ** 23}


def test_a_halving_sum_in_a_step_takes_the_halvings_measured_ratio_else_the_trees():
    """A greedy step's sum costs the measured ratio of its own way in a loop of steps over
    alone: the halving's where measure-mpi timed it, else the tree's (what the records of
    older code have)."""
    from bench.scaling_model.model import step_s

    stack = Stack("t", "ae", (64, 32, 8), n_train=8192, batch=800, epochs=1, blocks=8)
    comp = linear_layer_compute(stack)
    plain = net(alpha=1e-5, beta=1e9)
    tree_only = replace(plain, step_sums={"tree_allreduce": {1: 2.0, 2 ** 30: 2.0}})
    both = replace(plain, step_sums={"tree_allreduce": {1: 2.0, 2 ** 30: 2.0}, "tree_halving": {1: 3.0, 2 ** 30: 3.0}})
    base = step_s(comp, plain, stack, 0, 4, blocks=8, allreduce=False)[1]
    assert step_s(comp, tree_only, stack, 0, 4, blocks=8, allreduce=False)[1] == pytest.approx(2 * base)
    assert step_s(comp, both, stack, 0, 4, blocks=8, allreduce=False)[1] == pytest.approx(3 * base)
    old = replace(both, halving=False)  # a record of older code: the tree's way and its ratio
    assert step_s(comp, old, stack, 0, 4, blocks=8, allreduce=False)[1] == pytest.approx(
        2 * step_s(comp, replace(plain, halving=False), stack, 0, 4, blocks=8, allreduce=False)[1])


def test_a_machines_own_step_sums_serve_its_points_whatever_cores_its_ranks_saw(tmp_path):
    """own_steps reads every results folder's mpi_2ranks.csv with step rows, keyed by the CPU
    and ISA (a rank under mpirun sees one core); a point on that machine takes them and
    that machine's own np 2 points, a point here or elsewhere keeps this machine's network."""
    from bench.scaling_model.validate import Points, own_steps

    (tmp_path / "zen3").mkdir()
    (tmp_path / "zen3" / "mpi_2ranks.csv").write_text(
        "op,bytes,seconds,min_seconds,compute_seconds,cpu_model,isa,cores\n"
        "allreduce,1024,1,1e-5,,Zen3,avx2,1\n" "allreduce,1048576,1,1e-3,,Zen3,avx2,1\n"
        "allreduce_step,1024,2e-5,2e-5,,Zen3,avx2,1\n" "straggle,0,1e-4,,2e-3,Zen3,avx2,1\n")
    (tmp_path / "zen4").mkdir()  # this machine's own: its network has them already, as measured with its record
    (tmp_path / "zen4" / "mpi_2ranks.csv").write_text(
        "op,bytes,seconds,min_seconds,compute_seconds,cpu_model,isa,cores\n"
        "allreduce,1024,1,1e-5,,Zen4,avx512f,1\n" "allreduce_step,1024,9e-5,9e-5,,Zen4,avx512f,1\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mpi_2ranks.csv").write_text("op,bytes,seconds,min_seconds,cpu_model,isa,cores\n"
                                                       "allreduce,1024,1,1e-5,Xeon,avx512f,1\n")
    steps = own_steps(tmp_path)
    ratios, straggle, links, src = steps[("Zen3", "avx2")]
    assert (ratios, straggle, src) == ({"allreduce": {1024: pytest.approx(2.0)}}, pytest.approx(0.05),
                                       "zen3/mpi_2ranks.csv")
    assert links["allreduce"].t(1024) == pytest.approx(1e-5) and links["allreduce"].t(1048576) == pytest.approx(1e-3)
    assert set(steps) == {("Zen3", "avx2"), ("Zen4", "avx512f")}
    pts = Points({"cpu_model": "Zen4", "isa": "avx512f", "cores": "2"}, {}, Compute(), steps=steps)
    base = replace(net(), halving=False)  # these rows name no aepar version: older code's sums
    there = pts.network("a.csv", base, 2, {"cpu": "Zen3", "isa": "avx2", "cores": "2"})
    assert there.step_sums == {"allreduce": {1024: pytest.approx(2.0)}} and there.straggle == pytest.approx(0.05)
    assert there.intra["allreduce"] is links["allreduce"] and there.intra["send"] is base.intra["send"]
    assert pts.network("a.csv", base, 2, {"cpu_model": "Zen4", "isa": "avx512f", "cores": "2"}) == base
    assert pts.network("a.csv", base, 2, {"cpu_model": "Xeon", "isa": "avx512f", "cores": "2"}) == base
    assert pts.network("a.csv", base, 2) == base


def test_the_optimiser_step_is_the_one_the_loop_pays(tmp_path):
    """Where measure-compute timed the update inside train_epoch (after the gradients, at
    each batch), that median is the model's step; the isolated one is kept beside it."""
    from bench.scaling_model.measure import load_compute

    key = "ae:784-2000:bernoulli:float32"
    (tmp_path / "c.csv").write_text("what,key,rows,seconds\n" f"apply,{key},,0.001\n"
                                    f"update_in_loop,{key},100,0.003\n" f"update_in_loop,{key},1000,0.005\n"
                                    "apply,rbm:784-1000:bernoulli:float32,,0.002\n")
    comp = load_compute(tmp_path / "c.csv")
    assert comp.layers[key]["apply"] == pytest.approx(0.004)
    assert comp.layers[key]["apply_isolated"] == pytest.approx(0.001)
    assert comp.layers["rbm:784-1000:bernoulli:float32"]["apply"] == pytest.approx(0.002)
    assert "apply_isolated" not in comp.layers["rbm:784-1000:bernoulli:float32"]


def test_contention_interpolates_between_the_measured_copies():
    comp = Compute(contention={"layers": {1: 1.0, 4: 1.3}})
    assert comp.shared("layers", 1) == 1.0
    assert comp.shared("layers", 2) == pytest.approx(1.1)
    assert comp.shared("layers", 4) == pytest.approx(1.3)
    assert comp.shared("layers", 16) == pytest.approx(1.3)  # beyond the cores: oversubscription's, not this
    assert comp.shared("sparse", 4) == 1.0  # not measured: no factor
    # two copies measured faster than one alone (a 2-vCPU VM's drift between the rounds): none
    assert Compute(contention={"layers": {1: 1.0, 2: 0.95}}).shared("layers", 2) == 1.0


def test_reuse_describes_the_machine_that_measured(tmp_path):
    from bench.scaling_model.measure import measured_on

    (tmp_path / "compute.csv").write_text("what,cpu_model,isa,cores,threads\nmem,AMD EPYC,avx512f,2,1\n")
    m = measured_on(tmp_path / "compute.csv")
    assert (m["cpu_model"], m["isa"], m["cores"], m["threads"]) == ("AMD EPYC", "avx512f", "2", "1")
    assert "hostname" in m  # columns the CSV lacks come from this machine


def test_model_parallel_and_the_pipelines_are_the_planners_schedules():
    """One set of scheme costs: with free links the model-parallel figure is the planner's
    own on the measured one-block epochs, and every pipeline replays the planner's layout."""
    from aepar.parallel import planner
    from bench.scaling_model.model import layer_costs, model_parallel_s, pipeline_s

    stack = Stack("t", "rbm", (64, 48, 32, 16, 8), n_train=4096, batch=256, epochs=3, extras=(0, 1, 2, 2), blocks=8)
    comp = linear_layer_compute(stack)
    for key in comp.layers:
        comp.layers[key]["transform_row"] = 1e-6
    epoch = [stack.steps * comp.fused(k, stack.batch) for k in stack.keys()]
    transform = [1e-6 * stack.n_train] * stack.n_layers
    for p in (2, 3, 4):
        ours = model_parallel_s(comp, free_network(), stack, p)["seconds"]
        theirs = planner.model_parallel_s(layer_costs(stack, epoch, transform), p, alpha=0.0, beta=math.inf)
        assert ours == pytest.approx(theirs["seconds"])
    small_batch = Stack(**{**stack.__dict__, "batch": 16})  # replicas capped at 16 per stage
    for p in POW2[:7]:
        sync, hybrid = (pipeline_s(comp, net(), small_batch, p, replicas=r) for r in (False, True))
        assert (sync is None) == (p > stack.n_layers) and (hybrid is None) == (p <= stack.n_layers)
        assert (sync or hybrid)["seconds"] > 0


def test_another_machines_points_take_the_contention_measured_in_their_folder(tmp_path):
    """The 16-vCPU machine's points (its folder of bench/results) are slowed by the ranks
    sharing its cores as measure-contention found there; other folders' points of that
    machine, and one rank, are not."""
    from bench.scaling_model.measure import read_contention
    from bench.scaling_model.validate import Points

    (tmp_path / "contention.csv").write_text("what,key,rows,seconds\n" "contention,sparse,1,2.0\n"
                                             "contention,sparse,16,3.0\n")
    table = read_contention(tmp_path / "contention.csv")
    assert table == {"sparse": {1: 2.0, 16: 3.0}}
    assert read_contention(tmp_path / "missing.csv") == {}
    xeon = {"cpu_model": "Intel Xeon", "isa": "avx512f", "cores": "16"}
    scales = {("Intel Xeon", "avx512f", "16"): {"sparse": 2.0, "layers": 4.0}}
    pts = Points({"cpu_model": "AMD EPYC", "isa": "avx2", "cores": "2"}, scales, Compute(), folders={"big": table})
    assert pts.scale("big/strong.csv", xeon, "sparse", 1) == pytest.approx(2.0)
    assert pts.scale("big/strong.csv", xeon, "sparse", 16) == pytest.approx(3.0)
    assert pts.scale("big/strong.csv", xeon, "sparse", 32) == pytest.approx(3.0)  # past the copies measured: the last
    assert pts.scale("big/strong.csv", xeon, "layers", 16) == pytest.approx(4.0)  # not measured there
    assert pts.scale("strong.csv", xeon, "sparse", 16) == pytest.approx(2.0)  # another folder


def test_memory_slowdown_is_the_mean_over_a_trees_levels_of_the_rate_alone_over_the_rate_shared():
    """Level k of a tree over P ranks copies in 2^k processes at once: each level's bytes
    move at the slowest process's rate with that many at once (linear between the counts
    measured, the last beyond), and a tree's slowdown is the mean over its levels."""
    from bench.scaling_model.model import memory_slowdown

    bw = {1: 20.0, 4: 20.0, 8: 10.0, 16: 5.0}
    assert memory_slowdown(bw, 1) == 1.0
    assert memory_slowdown(bw, 2) == pytest.approx(1.0)  # 2 processes: between 1 and 4, both 20
    assert memory_slowdown(bw, 8) == pytest.approx((1.0 + 1.0 + 2.0) / 3)
    assert memory_slowdown(bw, 16) == pytest.approx((1.0 + 1.0 + 2.0 + 4.0) / 4)
    assert memory_slowdown(bw, 32) == pytest.approx((1.0 + 1.0 + 2.0 + 4.0 + 4.0) / 5)  # the last count beyond
    assert memory_slowdown({}, 16) == 1.0  # not measured: no factor
    assert memory_slowdown({1: 20.0, 8: 10.0}, 4) == pytest.approx((20 / (20 - 10 / 7) + 20 / (20 - 30 / 7)) / 2)


def test_relinked_moves_only_the_bytes_at_the_other_machines_send_and_memory():
    """On another machine each point keeps its smallest message's time (the latency) and
    the rest is scaled by that machine's send over this one's at the same size, and by the
    memory slowdown; the fitted lines stay."""
    from bench.scaling_model.model import relinked

    sizes = (8.0, 1024.0, 2.0 ** 20)
    here = Curve(1e-6, 1e10, sizes, (2e-6, 4e-6, 2e-4))
    there = Curve(1e-6, 1e10, sizes, (2e-6, 6e-6, 8e-4))  # send there: 1.5x at 1 KB, 4x at 1 MB
    node = Network("node", {op: here for op in OPS}, None, 16, 1e-10)
    moved = relinked(node, there, slowdown=2.0)
    for op in OPS:
        c = moved.intra[op]
        assert (c.alpha, c.beta, c.sizes) == (here.alpha, here.beta, sizes)
        assert c.times[0] == pytest.approx(2e-6)
        assert c.times[1] == pytest.approx(2e-6 + 2e-6 * 2.0 * 1.5)
        assert c.times[2] == pytest.approx(2e-6 + (2e-4 - 2e-6) * 2.0 * 4.0)
    assert relinked(node, here).intra["bcast"].times == here.times  # the same link, no slowdown: unchanged
    assert node.intra["bcast"] is here  # the network it was given is left as it was


def test_only_the_machine_whose_links_were_measured_takes_them(tmp_path):
    """Points of the folder with its own send and triad are priced on them, at their rank
    count; every other folder keeps this machine's links; missing files give no entry."""
    import json

    from bench.scaling_model.validate import Points, own_links

    here = Curve(1e-6, 1e10, (8.0, 2.0 ** 20), (2e-6, 2e-4))
    node = Network("node", {op: here for op in OPS}, None, 16, 1e-10)
    (tmp_path / "big").mkdir()
    cols = "op,bytes,seconds,min_seconds,max_seconds,reps,trials,ranks\n"
    (tmp_path / "big" / "mpi.csv").write_text(cols + "send,8,2e-6,2e-6,2e-6,10,1,16\n"
                                              "send,1048576,4e-4,4e-4,4e-4,10,1,16\n")
    (tmp_path / "probe.log").write_text("\n".join(json.dumps({"processes": k, "triad_min": r})
                                                  for k, r in ((1, 20.0), (16, 10.0))))
    import bench.scaling_model.validate as validate
    links = {"big": ("big/mpi.csv", "probe.log", "big/pair.csv")}
    old = validate.OWN_LINKS
    validate.OWN_LINKS = links
    try:
        found = own_links(tmp_path)
        assert set(found) == {"big"} and found["big"][1] == {1: 20.0, 16: 10.0}
        validate.OWN_LINKS = {**links, "gone": ("gone/mpi.csv", "probe.log", "gone/pair.csv")}
        assert set(own_links(tmp_path)) == {"big"}
    finally:
        validate.OWN_LINKS = old
    pts = Points({"cpu_model": "AMD EPYC", "isa": "avx2", "cores": "2"}, {}, Compute(), links=found)
    assert pts.network("strong.csv", node, 16) is node
    assert pts.network("other/strong.csv", node, 16) is node
    big = pts.network("big/strong.csv", node, 2).intra["reduce"].times[-1]
    # one level of 2 processes copying: the link (2x at 1 MB) and the triad between 1 and 16 at once
    assert big == pytest.approx(2e-6 + (2e-4 - 2e-6) * 2.0 * 20.0 / (20.0 - 10.0 / 15))
    slowed = pts.network("big/strong.csv", node, 4).intra["reduce"].times[-1]
    assert slowed > big
    # that machine's own np 2 points, where measured, replace this machine's: its link is in
    # them, and only the memory's slowdown is added
    (tmp_path / "big" / "pair.csv").write_text(cols + "send,8,3e-6,3e-6,3e-6,10,1,2\n"
                                               "send,1048576,5e-4,5e-4,5e-4,10,1,2\n"
                                               "reduce,8,4e-6,4e-6,4e-6,10,1,2\n"
                                               "reduce,1048576,6e-4,6e-4,6e-4,10,1,2\n")
    validate.OWN_LINKS = {"big": ("big/mpi.csv", "probe.log", "big/pair.csv")}
    try:
        found = own_links(tmp_path)
    finally:
        validate.OWN_LINKS = old
    assert set(found["big"][2]) == {"send", "reduce"} and found["big"][3] == "probe.log"
    # measure-contention's memory triad in that folder, where it ran, in place of the probe's log
    (tmp_path / "big" / "contention.csv").write_text("what,key,rows,seconds\n" "contention,memory,1,2.0\n"
                                                     "contention,memory,16,4.0\n" "contention,sparse,16,9.0\n")
    validate.OWN_LINKS = {"big": ("big/mpi.csv", "probe.log", "big/pair.csv")}
    try:
        triad = own_links(tmp_path)["big"]
    finally:
        validate.OWN_LINKS = old
    assert triad[1] == {1: 1.0, 16: 0.5} and triad[3] == "big/contention.csv"
    pts = Points({"cpu_model": "AMD EPYC", "isa": "avx2", "cores": "2"}, {}, Compute(), links=found)
    there = pts.network("big/strong.csv", node, 2).intra
    assert there["reduce"].times[-1] == pytest.approx(4e-6 + (6e-4 - 4e-6) * 20.0 / (20.0 - 10.0 / 15))
    # not measured there: this machine's points, with the memory's slowdown alone
    assert there["bcast"].times[-1] == pytest.approx(2e-6 + (2e-4 - 2e-6) * 20.0 / (20.0 - 10.0 / 15))


def test_measure_sparse_and_stacked_run_their_points_in_rounds_and_keep_the_fastest(tmp_path, monkeypatch):
    """measure-sparse and measure-stacked: every point once per round, a row from its
    fastest run."""
    from bench.common import read_rows
    from bench.scaling_model import measure as M

    calls, seconds = [], iter([3.0, 5.0, 2.0, 6.0] + [1.0] * 100)

    def fake(cmd, out_dir, what):
        calls.append(str(out_dir).rsplit("/", 1)[1])
        t = next(seconds)
        return {"total_s": t, "compute_s": t, "comm_s": 0.0, "iterations": 4, "evaluations": 5, "pretrain_time_s": t}
    monkeypatch.setattr(M, "_run_summary", fake)
    monkeypatch.setattr(M, "REPO", tmp_path)
    M.measure_sparse(tmp_path / "s.csv", samples=(100,), procs=(1, 2), iterations=4, repeats=2)
    assert calls == ["sparse-1-100-0", "sparse-2-100-0", "sparse-1-100-1", "sparse-2-100-1"]
    assert [float(r["seconds"]) for r in read_rows(tmp_path / "s.csv")] == [2.0, 5.0]
    calls.clear()
    M.measure_stacked(tmp_path / "t.csv", repeats=2)
    n = len(M.STACKED_RUNS)
    assert [c.rsplit("-", 1)[1] for c in calls] == ["0"] * n + ["1"] * n and calls[0][:-1] == calls[n][:-1]
