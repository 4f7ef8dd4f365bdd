"""The pipeline's pure parts: rank allotment, layer grouping, the plan and its replay."""
import itertools

import pytest

from aepar.comm import wait_until
from aepar.parallel.pipeline import (Layout, allot_ranks, group_stages, make_layout, plan_schedule,
                                     replay_plan, stage_costs)

SIZES = [784, 1000, 500, 250, 30]
FLOPS = [10.0 * a * b for a, b in zip(SIZES, SIZES[1:])]
HAND = [2.0 * a * b for a, b in zip(SIZES, SIZES[1:])]


# ---- allotment ---------------------------------------------------------------------------
def _bottleneck(costs, counts):
    return max(c / n for c, n in zip(costs, counts))


@pytest.mark.parametrize("n_ranks", [4, 5, 6, 7, 8, 11, 16])
def test_allot_minimises_the_bottleneck(n_ranks):
    counts = allot_ranks(FLOPS, n_ranks)
    assert sum(counts) == n_ranks and min(counts) >= 1
    best = min(_bottleneck(FLOPS, c) for c in itertools.product(range(1, n_ranks + 1), repeat=4)
               if sum(c) == n_ranks)
    assert _bottleneck(FLOPS, counts) == pytest.approx(best)


def test_allot_gives_the_heavy_layer_the_most():
    counts = allot_ranks(FLOPS, 8)
    assert counts[0] == max(counts) and counts[0] >= 3
    assert counts == [4, 2, 1, 1]
    # with the seed's extras (25, 40, 59 epochs for layers 2-4) layer 2 weighs more
    plan = plan_schedule(FLOPS, HAND, [20] * 4, [0, 5, 20, 40])
    assert allot_ranks([FLOPS[l] * plan.epochs(l) for l in range(4)], 8) == [3, 3, 1, 1]


def test_allot_respects_caps_and_rejects_too_many():
    assert allot_ranks([10, 1], 4) == [3, 1]
    assert allot_ranks([10, 1], 4, max_per_stage=2) == [2, 2]
    with pytest.raises(ValueError):
        allot_ranks([10, 1], 5, max_per_stage=2)  # 4 places for 5 ranks
    with pytest.raises(ValueError):
        allot_ranks([1, 2, 3], 2)


# ---- grouping ------------------------------------------------------------------------------
def _groups_brute(costs, g):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), g - 1):
        bounds = (0,) + cuts + (n,)
        value = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("costs", [FLOPS, [1, 1, 1, 1, 1], [5, 1, 1, 1, 9, 2], [3, 8, 2, 7]])
def test_grouping_is_consecutive_and_optimal(costs):
    for g in range(1, len(costs) + 1):
        groups = group_stages(costs, g)
        assert len(groups) == g
        assert [s for grp in groups for s in grp] == list(range(len(costs)))
        assert all(grp for grp in groups)
        assert max(sum(costs[s] for s in grp) for grp in groups) == pytest.approx(_groups_brute(costs, g))


def test_grouping_the_paper_stack_on_two_ranks():
    # layer 1 (784x1000) alone; the three others together are lighter
    assert group_stages(FLOPS, 2) == [(0,), (1, 2, 3)]
    assert group_stages(FLOPS, 3) == [(0,), (1,), (2, 3)]


def test_layout_for_every_rank_count():
    for p in range(1, 10):
        lay = make_layout(FLOPS, p)
        assert lay.n_ranks == p and lay.n_stages == 4
        ranks = [r for rs in lay.ranks for r in rs]
        assert ranks == list(range(p))  # contiguous, every rank once
        for r in range(p):
            assert lay.group_of_stage(lay.groups[lay.group_of_rank(r)][0]) == lay.group_of_rank(r)
    assert make_layout(FLOPS, 1).groups == ((0, 1, 2, 3),)
    assert make_layout(FLOPS, 8).describe() == \
        "layer 1: ranks 0-3 | layer 2: ranks 4-5 | layer 3: rank 6 | layer 4: rank 7"
    assert isinstance(make_layout(FLOPS, 4), Layout)


# ---- the plan --------------------------------------------------------------------------------
def test_plan_follows_the_paper_rules():
    plan = plan_schedule(FLOPS, HAND, [20] * 4, [0, 5, 20, 40])
    s0 = plan.stages[0]
    assert [e.version for e in s0] == [0] * 20 and not any(e.extra for e in s0)
    for l in range(1, 4):
        eps = plan.stages[l]
        base = [e for e in eps if not e.extra]
        assert len(base) == 20
        assert eps[0].version == 1                                   # waits for l-1's first epoch
        assert eps[0].start >= plan.stages[l - 1][0].end
        assert all(a.version <= b.version for a, b in zip(eps, eps[1:]))  # never goes back
        extra = [e for e in eps if e.extra]
        assert len(extra) <= [0, 5, 20, 40][l]
        assert all(a.version < b.version for a, b in zip(extra, extra[1:]))  # one per new input
        produced = len(plan.stages[l - 1])
        for e in eps:
            # the newest version available at the epoch's start
            ready = [v for v in range(1, produced + 1)
                     if plan.stages[l - 1][v - 1].end + HAND[l - 1] <= e.start]
            assert e.version == max(ready)
        assert all(b.start >= a.end for a, b in zip(eps, eps[1:]))   # one epoch at a time
    # the seed's figures: L2 gets its 5 extras, L4 trained its 20 epochs on L3's first output
    assert sum(e.extra for e in plan.stages[1]) == 5
    assert all(e.version == 1 for e in plan.stages[3][:20])
    assert plan.uses[0] == [0]
    assert plan.needed(0) == set(plan.uses[1]) and plan.needed(3) == set()


def test_plan_is_deterministic_and_independent_of_ranks():
    a = plan_schedule(FLOPS, HAND, [7, 6, 5, 4], [0, 3, 9, 12])
    b = plan_schedule(list(FLOPS), list(HAND), [7, 6, 5, 4], [0, 3, 9, 12])
    assert a.to_dict() == b.to_dict()
    assert [(e.stage, e.epoch, e.version) for e in a.order] == [(e.stage, e.epoch, e.version) for e in b.order]


def test_plan_order_puts_producers_first():
    plan = plan_schedule(FLOPS, HAND, [4] * 4, [0, 2, 4, 8])
    seen = {0: {0}}
    for e in plan.order:
        assert e.version in seen.get(e.stage, set()), "an epoch is ordered before its input exists"
        seen.setdefault(e.stage + 1, set()).add(e.epoch + 1)


def test_end_with_first_stops_extras():
    costs = [1.0, 1.0, 0.1]
    full = plan_schedule(costs, [0, 0, 0], [3, 3, 3], [0, 10, 10])
    cut = plan_schedule(costs, [0, 0, 0], [3, 3, 3], [0, 10, 10], end_with_first=True)
    t_end = cut.stages[0][-1].end
    assert all(e.start < t_end for s in cut.stages[1:] for e in s if e.extra)
    assert sum(map(len, cut.stages)) < sum(map(len, full.stages))
    assert all(sum(not e.extra for e in s) == 3 for s in cut.stages)  # base epochs always run


def test_plan_rejects_bad_schedules():
    with pytest.raises(ValueError):
        plan_schedule([1, 1], [0, 0], [1], [0, 0])
    with pytest.raises(ValueError):
        plan_schedule([1, 0], [0, 0], [1, 1], [0, 0])
    with pytest.raises(ValueError):
        plan_schedule([1, 1], [0, 0], [0, 1], [0, 0])


def test_replay_matches_plan_and_measures_grouping():
    plan = plan_schedule(FLOPS, [0, 0, 0, 0], [5] * 4, [0, 2, 4, 8])
    same = replay_plan(plan, FLOPS, [0, 0, 0, 0])
    assert same["makespan"] == pytest.approx(plan.makespan)
    # one group holding everything runs the plan's epochs back to back
    one = replay_plan(plan, FLOPS, [0, 0, 0, 0], Layout(((0, 1, 2, 3),), ((0,),)))
    work = sum(FLOPS[l] * plan.epochs(l) for l in range(4))
    assert one["makespan"] == pytest.approx(work)
    # faster stages never make the replay slower
    faster = replay_plan(plan, [c / 3 for c in FLOPS], [0, 0, 0, 0])
    assert faster["makespan"] == pytest.approx(plan.makespan / 3)


@pytest.mark.parametrize("extras", [[0, 0, 0, 0], [0, 2, 4, 8]])
@pytest.mark.parametrize("hand", [[0, 0, 0, 0], HAND])
def test_replay_on_shared_cores_keeps_them_busy_and_sleeps_the_waiting(extras, hand):
    """Ranks sharing cores: on one core the run lasts all the ranks' work (the core never
    idles while an epoch can run: stage 1 always can); on as many cores as ranks it is the
    dedicated replay; in between it sits between that and the dedicated replay slowed by
    ranks / cores (every running rank gets at least cores / ranks of a core)."""
    plan = plan_schedule(FLOPS, HAND, [3] * 4, extras)
    layouts = [None, Layout(((0,), (1,), (2, 3)), ((0, 1, 2), (3,), (4,)))]  # one rank a stage; replicas
    for layout in layouts:
        base = replay_plan(plan, FLOPS, hand, layout)
        ranks = layout.n_ranks if layout else 4
        sizes = [len(layout.ranks[layout.group_of_stage(l)]) for l in range(4)] if layout else [1] * 4
        one = replay_plan(plan, FLOPS, hand, layout, cores=1)
        assert one["makespan"] == pytest.approx(sum(w * r for w, r in zip(one["work"], sizes)))
        assert one["work"] == pytest.approx(base["work"]) and base["busy"] == base["work"]
        assert replay_plan(plan, FLOPS, hand, layout, cores=ranks)["makespan"] == base["makespan"]
        for cores in range(2, ranks):
            shared = replay_plan(plan, FLOPS, hand, layout, cores=cores)["makespan"]
            assert base["makespan"] < shared <= base["makespan"] * ranks / cores * (1 + 1e-12)


def test_synchronized_bound_for_the_paper_stack():
    # one rank per layer cannot beat total / heaviest; the plan without hand-over cost
    # and ending with layer 1 sits at that bound (layer 1 ~55% of the work)
    plan = plan_schedule(FLOPS, [0, 0, 0, 0], [20] * 4, [0, 5, 20, 40], end_with_first=True)
    greedy = 20 * sum(FLOPS)
    assert plan.makespan / greedy == pytest.approx(FLOPS[0] / sum(FLOPS), rel=0.05)
    assert 0.54 < FLOPS[0] / sum(FLOPS) < 0.57


def test_stage_costs_from_layers():
    class L:
        def __init__(self, a, b):
            self.n_in, self.n_out = a, b

        def flops_per_sample(self):
            return 10.0 * self.n_in * self.n_out

    ec, hc = stage_costs([L(4, 3), L(3, 2)], 10, 5)
    assert ec == [10 * 12 * 10 + 4 * 12 * 5, 10 * 6 * 10 + 4 * 6 * 5]
    assert hc == [2 * 12 * 15, 2 * 6 * 15]


def test_wait_until_backs_off():
    calls = {"n": 0}

    def ready():
        calls["n"] += 1
        return calls["n"] > 5

    waited = wait_until(ready)
    assert calls["n"] == 6 and waited > 0


def test_mode_choice_follows_the_replayed_costs():
    from aepar.parallel.pipeline import choose_mode, mode_costs

    plan = plan_schedule(FLOPS, HAND, [20] * 4, [0, 5, 20, 40], end_with_first=True)
    totals = [FLOPS[l] * plan.epochs(l) for l in range(4)]
    one_each = make_layout(totals, 4)
    # one rank per layer: weights keeps the transform off layer 1, the bottleneck
    mode, times = choose_mode(plan, one_each, FLOPS, HAND)
    assert mode == "weights" and times["weights"] < times["data"]
    # replicas: the small single-rank stages would recompute the big layers below them
    mode, times = choose_mode(plan, make_layout(totals, 8), FLOPS, HAND)
    assert mode == "data" and times["data"] < times["weights"]
    # oversubscribed cores: the least total work
    assert choose_mode(plan, one_each, FLOPS, HAND, oversubscribed=True)[0] == "data"
    # data mode charges the producer, weights mode the consumer for the changed chain only
    e, h, r = mode_costs(plan, one_each, FLOPS, HAND, "data")
    assert h[:3] == HAND[:3] and r(1, 1, 2) == 0.0
    e, h, r = mode_costs(plan, one_each, FLOPS, HAND, "weights")
    assert h == [0.0] * 4
    assert r(1, 1, 2) == HAND[0]                 # layer 1's newer output: recompute layer 1
    v2, v3 = plan.stages[1][1].version, plan.stages[1][2].version
    assert r(2, 2, 3) == (HAND[1] if v2 == v3 else HAND[0] + HAND[1])
