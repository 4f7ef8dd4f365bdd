"""bench.common: the one launcher line, the one timing loop and its statistic, rows that
carry the machine."""
import sys
import types

import pytest

from aepar.machine import FIELDS
from bench import common


# ---- launching ------------------------------------------------------------------------------------
def test_one_rank_is_plain_python_and_more_go_through_the_launcher(monkeypatch):
    monkeypatch.setenv("MPIRUN", "/opt/mpi/bin/mpirun --oversubscribe --mca btl self,vader")
    assert common.python_command("aepar.sparse", ["--samples", 200]) == [sys.executable, "-m", "aepar.sparse",
                                                                         "--samples", "200"]
    assert common.python_command("aepar.sync", ["--quiet"], 4) == [
        "/opt/mpi/bin/mpirun", "--oversubscribe", "--mca", "btl", "self,vader", "-np", "4",
        sys.executable, "-m", "aepar.sync", "--quiet"]


def test_ranks_of_several_threads_run_unbound_unless_the_launcher_places_them(monkeypatch):
    monkeypatch.setenv("MPIRUN", "mpirun --oversubscribe")
    assert common.python_command("aepar.pretrain", [], 4, threads=4)[:5] == [
        "mpirun", "--oversubscribe", "--bind-to", "none", "-np"]
    assert "--bind-to" not in common.python_command("aepar.pretrain", [], 4)  # one thread: as mpirun places them
    assert "--bind-to" not in common.python_command("aepar.pretrain", [], 1, threads=4)  # no mpirun
    monkeypatch.setenv("MPIRUN", "mpirun --map-by slot:PE=4")
    assert common.python_command("aepar.pretrain", [], 4, threads=4)[:4] == ["mpirun", "--map-by", "slot:PE=4", "-np"]


def test_without_mpirun_set_the_launcher_next_to_this_python_oversubscribes(monkeypatch, tmp_path):
    monkeypatch.delenv("MPIRUN", raising=False)
    (tmp_path / "mpirun").write_text("")
    monkeypatch.setattr(common, "PY", str(tmp_path / "python"))
    assert common.mpirun() == [str(tmp_path / "mpirun"), "--oversubscribe"]
    (tmp_path / "mpirun").unlink()
    monkeypatch.setenv("PATH", str(tmp_path))  # none here, none on PATH
    with pytest.raises(SystemExit, match="no mpirun found"):
        common.mpirun()


def test_the_environment_lets_open_mpi_run_as_root_and_takes_changes(monkeypatch):
    monkeypatch.setenv("AEPAR_THREADS", "2")
    env = common.mpi_env(AEPAR_THREADS=None, AEPAR_FAULT="kill:1:3")
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert "AEPAR_THREADS" not in env and env["AEPAR_FAULT"] == "kill:1:3"
    assert common.mpi_env(AEPAR_THREADS=1)["AEPAR_THREADS"] == "1"


# ---- timing ---------------------------------------------------------------------------------------
class Clock:
    """perf_counter stand-in: each call of a timed function takes the next of ``durations``."""

    def __init__(self, durations):
        self.now, self.durations = 0.0, list(durations)

    def __call__(self):
        return self.now

    def tick(self):
        self.now += self.durations.pop(0)


def test_the_statistic_is_the_fastest_sample_not_the_median(monkeypatch):
    clock = Clock([9.0, 5.0, 1.0, 7.0])  # the warm-up call, then three timed ones
    monkeypatch.setattr(common.time, "perf_counter", clock)
    timing = common.time_call(clock.tick, 3)
    assert timing.samples == (5.0, 1.0, 7.0) and timing.calls == 1
    assert timing.seconds == 1.0 == common.fastest([5.0, 1.0, 7.0]) and timing.fastest_index == 1
    assert common.fastest_run([{"seconds": 3.0, "k": "a"}, {"seconds": 2.0, "k": "b"}])["k"] == "b"


def test_whole_runs_are_repeated_in_rounds():
    """in_rounds: every key once per round (a slow minute hits one round, not one key's every
    run), each key's results in round order."""
    calls = []
    runs = common.in_rounds(["a", "b"], 3, lambda key, k: calls.append((key, k)) or f"{key}{k}")
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert runs == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}


def test_calls_are_taken_in_turns_with_state_restored_and_the_device_drained_around_each():
    log = []
    fns = {name: (lambda name=name: log.append(name)) for name in "ab"}
    timings = common.time_calls(fns, 3, warmup=2, between=lambda: log.append("reset"),
                                sync=lambda: log.append("sync"))
    sample = [["reset", "sync", name, "sync"] for name in "ab"]  # one sample of a, then one of b
    assert log == ["a", "a", "sync", "b", "b", "sync"] + 3 * (sample[0] + sample[1])  # warm-ups drained first
    assert [len(t.samples) for t in timings.values()] == [3, 3]
    with pytest.raises(ValueError):
        common.time_call(lambda: None, 0)


def test_short_calls_are_repeated_until_a_sample_lasts_min_time(monkeypatch):
    clock = Clock([1e-3] * 1000)
    monkeypatch.setattr(common.time, "perf_counter", clock)
    timing = common.time_call(clock.tick, 2, min_time=0.05)
    assert timing.calls * 1e-3 >= 0.05 and timing.calls < 200
    assert timing.seconds == pytest.approx(1e-3) and len(timing.samples) == 2


def test_across_ranks_keeps_each_calls_slowest_rank():
    class TwoRanks:  # the other rank's samples, as MPI's elementwise max would combine them
        def Allreduce(self, buf, op):
            assert op == "max"
            buf[:] = [max(a, b) for a, b in zip(buf, [2.0, 1.0, 4.0])]
    slowest = common.across_ranks(TwoRanks(), common.Timing((1.0, 3.0, 0.5)))
    assert slowest.samples == (2.0, 3.0, 4.0) and slowest.seconds == 2.0


# ---- rows that carry the machine ------------------------------------------------------------------
def test_rows_carry_every_machine_column_and_keep_their_own_values(tmp_path, monkeypatch):
    cpu = types.SimpleNamespace(get_cpu_capability=lambda: "AVX2")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="9.9",
                                                                    backends=types.SimpleNamespace(cpu=cpu)))
    machine = common.machine_columns(mpi=common.ONE_PROCESS, threads=3)
    assert set(FIELDS) <= set(machine) and machine["mpi"] == common.ONE_PROCESS and machine["threads"] == 3
    assert machine["torch"] == "9.9 AVX2"  # the peer this process loaded
    rows = common.with_machine([{"kernel": "k", "seconds": 1.5, "threads": 1}], machine)
    assert list(rows[0])[:3] == ["kernel", "seconds", "threads"] and rows[0]["threads"] == 1
    assert all(rows[0][k] == machine[k] for k in FIELDS if k != "threads")
    common.write_rows(tmp_path / "rows.csv", rows)
    back = common.read_rows(tmp_path / "rows.csv")[0]
    assert back["cpu_model"] == machine["cpu_model"] and back["seconds"] == "1.5" and back["threads"] == "1"
    assert common.read_rows(tmp_path / "missing.csv") == []


def test_merging_replaces_only_this_benchmarks_rows_of_this_machine(tmp_path):
    here = {"hostname": "h", "cpu_model": "c", "isa": "i", "blas_coretype": ""}
    path = tmp_path / "peers.csv"
    common.merge_rows([{"x": 1, **here}, {"x": 2, **here, "cpu_model": "other"}], path, "a")
    common.merge_rows([{"y": 3, **here}], path, "b")
    common.merge_rows([{"x": 4, **here}], path, "a")
    rows = common.read_rows(path)
    assert sorted((r["benchmark"], r["x"], r["y"]) for r in rows) == [("a", "2", ""), ("a", "4", ""), ("b", "", "3")]


def test_a_finished_run_is_recorded_and_read_back_only_with_the_same_options(tmp_path, capsys):
    """A study of many hours in pieces: a run recorded in one job (or on another machine) is
    read back in the next, never one made with other options or ranks."""
    records = common.Records("bench.x", tmp_path / "records")
    summary = {"accuracy": 0.9, "machine": {"cpu_model": "Some CPU"}}
    launch = {"command": "python -m aepar.eager --seed 0", "wall_s": 12.0, "date": "2026-01-02 03:04"}
    assert records.read("large-seed0", ["--seed", 0], 2) is None  # nothing recorded yet
    records.keep("large-seed0", ["--seed", 0], 2, summary, launch)
    back = records.read("large-seed0", ["--seed", "0"], 2)
    assert back["summary"] == summary and back["launch"] == launch and "commit" in back
    assert "read back from" in capsys.readouterr().out
    assert records.read("large-seed0", ["--seed", 1], 2) is None  # other options: run again
    assert records.read("large-seed0", ["--seed", 0], 4) is None  # other ranks: run again
    assert "other options or ranks" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "records").iterdir()] == ["large-seed0.json"]  # no temporary left
    none = common.Records("bench.x")
    none.keep("large-seed0", [], 2, summary, launch)
    assert none.read("large-seed0", [], 2) is None
    (tmp_path / "records" / "large-seed0.json").write_text("{half a file")
    with pytest.raises(SystemExit, match="large-seed0.json: not a run record"):
        records.read("large-seed0", ["--seed", 0], 2)
