"""The sparse autoencoder's root-optimiser scheme under mpirun -np 1, 2, 3, 4 and 8: the
same bits at every size."""
import json

import h5py
import numpy as np
import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def final_costs():
    return {}


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_same_cost_and_gradient_at_every_size(ranks, tmp_path, final_costs):
    out = tmp_path / "run"
    p = run_mpi(ranks, ["tests/mpi/mpi_sparse.py", "check", out], timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert sorted(l for l in lines if l.startswith("ok")) == sorted(f"ok rank {r} of {ranks}" for r in range(ranks))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == ranks and summary["samples"] == 1003
    assert summary["collectives_per_evaluation"] == 4.0
    # every rank's own compute time, the slowest of them reported as the run's
    per_rank = summary["compute_per_rank_s"]
    assert len(per_rank) == ranks and min(per_rank) > 0 and max(per_rank) == summary["compute_s"]
    # features.png: the suite runs with AEPAR_PLOTS=0; test_sparse_cli draws it
    assert {"weights.h5", "summary.json", "summary.csv"} <= {f.name for f in out.iterdir()}
    cost = float(next(l for l in lines if l.startswith("cost ")).split()[1])
    # 12 L-BFGS-B iterations from the same patches and θ0 give the same cost at any size, bit for bit
    for other in final_costs.values():
        assert cost == other, (cost, final_costs)
    final_costs[ranks] = cost


def h5_arrays(path):
    """Every dataset of an HDF5 file, by its full name."""
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


def test_same_weights_bit_for_bit_on_1_to_4_ranks(tmp_path):
    """``python -m aepar.sparse`` itself: every array of weights.h5 the same bits on 1, 2, 3
    and 4 ranks (1003 samples: 8 blocks of 128, the last short, shared unevenly by 3)."""
    runs = {}
    for ranks in (1, 2, 3, 4):
        out = tmp_path / f"np{ranks}"
        p = run_mpi(ranks, ["-m", "aepar.sparse", "--limit", 1003, "--iterations", 12, "--quiet", "--out", out],
                    timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[ranks] = h5_arrays(out / "weights.h5")
    one = runs[1]
    assert one and all(a.size for a in one.values())
    for ranks, arrays in runs.items():
        assert set(arrays) == set(one), (ranks, sorted(arrays), sorted(one))
        # the same dtype too: array_equal alone takes a float32 copy of equal values as equal
        differ = [name for name in one
                  if arrays[name].dtype != one[name].dtype or not np.array_equal(arrays[name], one[name])]
        assert not differ, (ranks, differ)


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_slow_rank_gives_blocks_away_and_the_bits_stay(ranks, tmp_path):
    """The last rank sleeps in every evaluation: at the balances (every 3 evaluations) it
    takes fewer blocks than an even share and the others more, and the weights are the
    same bits as one process's."""
    alone = tmp_path / "np1"
    p = run_mpi(1, ["-m", "aepar.sparse", "--limit", 1003, "--iterations", 12, "--quiet", "--out", alone],
                timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = tmp_path / f"np{ranks}"
    p = run_mpi(ranks, ["tests/mpi/mpi_sparse.py", "balance", out], timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(l for l in p.stdout.splitlines() if l.startswith("blocks "))
    summary = json.loads((out / "summary.json").read_text())
    shares, rebalances = summary["blocks_per_rank"], summary["rebalances"]
    assert rebalances >= 1 and sum(shares) == 8 and min(shares) >= 1, line
    assert shares[-1] < 8 // ranks and max(shares[:-1]) > 8 // ranks, line
    one, many = h5_arrays(alone / "weights.h5"), h5_arrays(out / "weights.h5")
    assert set(one) == set(many) and all(np.array_equal(one[k], many[k]) and one[k].dtype == many[k].dtype
                                         for k in one)


def test_gradient_at_8_oversubscribed_ranks(tmp_path):
    """Eight ranks on two cores, one block of 128 samples each: the same cost and gradient."""
    p = run_mpi(8, ["tests/mpi/mpi_sparse.py", "grad", tmp_path / "run"], timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.splitlines()) == sorted(f"ok rank {r} of 8" for r in range(8))


@pytest.mark.parametrize("ranks, where", [(2, "partials"), (4, "assemble"), (4, "shared_sums")])
def test_root_failure_ends_every_rank(ranks, where, tmp_path):
    out = tmp_path / "run"
    p = run_mpi(ranks, ["tests/mpi/mpi_sparse.py", f"fail-{where}", out], timeout=120)
    assert p.returncode != 0
    # the root's error, from the root or from a worker's RootFailure (whichever prints first)
    assert f"RuntimeError: injected root failure in {where}" in p.stderr, p.stderr[-3000:]
    assert "ok rank" not in p.stdout
    assert not out.exists() and not any(tmp_path.glob(".run.*"))  # nothing half-written
