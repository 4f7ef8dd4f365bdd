"""bench.makespan's greedy-on-the-same-ranks model against its one-core sum."""
import pytest

from bench.makespan import greedy_dp_s, greedy_s

STAGES = {"epochs": [3, 2], "layers": [
    {"epoch_s": 2.0, "transform_s": 0.5, "steps": 10, "param_bytes": 4e6},
    {"epoch_s": 1.0, "transform_s": 0.1, "steps": 10, "param_bytes": 1e6}]}


def test_one_rank_is_the_one_core_sum():
    assert greedy_dp_s(STAGES, 1) == pytest.approx(greedy_s(STAGES)) == 3 * 2.0 + 2 * 1.0 + 0.5


def test_more_ranks_divide_the_work_and_add_the_allreduces():
    free = greedy_dp_s(STAGES, 4, alpha=0.0, beta=float("inf"))
    assert free == pytest.approx(greedy_s(STAGES) / 4)
    # 3 + 2 epochs x 10 steps, each an Allreduce of that layer's parameters
    comm = 30 * (2 * 2 * 1e-3 + 1.5 * 4e6 / 1e9) + 20 * (2 * 2 * 1e-3 + 1.5 * 1e6 / 1e9)
    assert greedy_dp_s(STAGES, 4, alpha=1e-3, beta=1e9) == pytest.approx(free + comm)
