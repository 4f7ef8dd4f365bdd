"""bench.balance's table: per machine and setting, the fastest round of equal shares and of
shares by speed, their ratio, and the balanced run's rebalances and final shares."""
from bench.balance import table


def _row(every, total, core="1", options="", rebalances=0, blocks="157 156", cpu="CPU A", rnd=1):
    return {"ranks": "2", "limit": "40000", "busy_core": core, "mpirun_options": options, "every": str(every),
            "round": str(rnd), "total_s": str(total), "rebalances": str(rebalances), "blocks_per_rank": blocks,
            "cpu_model": cpu, "isa": "avx512f", "cores": "2", "mpi": "Open MPI", "date": "2026-11-30",
            "command": "python -m bench.balance --busy-core 1"}


def test_the_fastest_round_of_each_and_the_speed_up_of_shares_by_speed():
    rows = [_row(0, 7.0), _row(50, 6.0, rebalances=1, blocks="200 113"),
            _row(0, 6.8, rnd=2), _row(50, 5.5, rebalances=1, blocks="208 105", rnd=2),
            _row(0, 10.0, options="--oversubscribe"), _row(50, 10.5, options="--oversubscribe", rebalances=3),
            _row(0, 3.0, core="", cpu="CPU B")]  # a setting without its balanced run: no line
    text = table(rows)
    assert text.count("## CPU A") == 1 and text.count("## CPU B") == 1
    assert "| 2 | 40000 | 1 | (none) | 6.80 | 5.50 | 1.24x | 1 | 208 105 |" in text
    assert "| 2 | 40000 | 1 | --oversubscribe | 10.00 | 10.50 | 0.95x | 3 | 157 156 |" in text
    assert "| 2 | 40000 | none |" not in text
    assert "`python -m bench.balance --busy-core 1`" in text and "2026-11-30" in text
