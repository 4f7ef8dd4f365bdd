"""aepar.comm under mpirun -np 1, 2 and 4."""
import pytest

from aepar import _threads
from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_collectives_hold_at_every_size(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_comm.py"], timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.split("\n")[:-1]) == sorted(f"ok rank {r} of {ranks}" for r in range(ranks))


@pytest.mark.parametrize("ranks", [2, 4])
def test_collective_user_error_one_line_exit_2(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_fail.py", "user-all"], timeout=60)
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.startswith("mpi_fail: error:")]
    assert errors == ["mpi_fail: error: --samples 1 is fewer than the 2 ranks"], p.stderr
    assert "finished" not in p.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_one_rank_user_error_ends_every_rank(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_fail.py", "user-one"], timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert f"mpi_fail: error: rank-local bad file (rank {ranks - 1})" in p.stderr
    assert "finished" not in p.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_internal_error_aborts_not_hangs(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_fail.py", "crash"], timeout=60)
    assert p.returncode != 0
    assert f"rank {ranks - 1}/{ranks}: internal error" in p.stderr and "RuntimeError: boom" in p.stderr
    assert "finished" not in p.stdout


@pytest.mark.skipif(_threads.usable_cores() < 2, reason="binding two ranks to a core each needs two cores")
def test_ranks_bound_to_a_core_each_have_both_cores():
    """``mpirun -np 2`` binds each rank to a core by default: each sees one CPU, but the two
    ranks have two cores between them, so both take part in data-parallel fine-tuning (with
    the cores of rank 0 alone, only rank 0 did) and the planner counts two cores."""
    p = run_mpi(2, ["tests/mpi/mpi_binding.py"], timeout=60, env={"AEPAR_THREADS": ""},
                launcher_args=["--bind-to", "core"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.splitlines()) == [f"rank {r} cpus 1 threads 1 cores 2 members [0, 1]" for r in (0, 1)]


def test_ranks_are_grouped_into_nodes_by_mpi_not_by_host_name():
    """Two unbound ranks of one machine whose host names differ are still one node (MPI's
    shared-memory grouping): they split its cores (one thread each on two) and have its
    cores once, not two "hosts" of all the cores each (four cores, two threads a rank).
    Host names do not tell machines apart (clones of one image may all be "localhost")."""
    p = run_mpi(2, ["tests/mpi/mpi_binding.py"], timeout=60,
                env={"AEPAR_THREADS": "", "AEPAR_TEST_HOST_PER_RANK": "1"}, launcher_args=["--bind-to", "none"])
    assert p.returncode == 0, p.stderr[-3000:]
    cores = _threads.usable_cores()
    threads = max(1, cores // 2)
    members = list(range(min(2, max(1, cores // threads))))
    assert sorted(p.stdout.splitlines()) == [f"rank {r} cpus {cores} threads {threads} cores {cores} members {members}"
                                             for r in (0, 1)]


@pytest.mark.skipif(_threads.usable_cores() < 2, reason="binding two ranks to a core each needs two cores")
def test_the_planner_counts_the_cores_of_ranks_bound_to_one_each(tmp_path):
    """``--scheme auto`` under ``mpirun -np 2 --bind-to core``: the table's two ranks have
    two cores, not the one that rank 0 sees, and nothing is called oversubscribed."""
    p = run_mpi(2, ["-m", "aepar.pretrain", "--scheme", "auto", "--layers", "784-16-8", "--pretrainer", "ae",
                    "--dataset", "mnist5k", "--limit", "200", "--epochs", "1", "--finetune-epochs", "0", "--no-plot",
                    "--out", tmp_path / "run"], timeout=120, env={"AEPAR_THREADS": ""},
                launcher_args=["--bind-to", "core"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "on 2 rank(s) on 2 core(s)" in p.stdout and "oversubscribed" not in p.stdout, p.stdout
    # greedy's and data's layer epochs were measured on the two ranks, not divided
    # only the prediction table's rows: the run's own tables name the scheme auto chose too
    table = p.stdout.split("Predicted pre-training", 1)[1].split("auto runs", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith(("| greedy", "| data", "| **greedy", "| **data"))]
    assert len(rows) == 2 and all("epochs measured on these ranks" in r for r in rows), p.stdout
