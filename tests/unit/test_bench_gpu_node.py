"""bench.gpu_node's bookkeeping, without a GPU: steps that need one are skipped and counted
as not run, a step with too little time left is skipped, and ranks whose weights differ
from one rank's fail the shared step."""
import csv
from pathlib import Path

import pytest

from bench import gpu_node


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpu_node, "gpu_name", lambda: None)
    monkeypatch.setattr(gpu_node, "warm_up", lambda: None)  # no compilation in the background


def test_without_a_gpu_the_gpu_steps_are_skipped_and_the_pass_fails(tmp_path, no_gpu):
    assert gpu_node.main(["--out", str(tmp_path), "--steps", "tests,bits,epochs", "--commit", "abc123"]) == 1
    for step in ("tests", "bits", "epochs"):
        text = (tmp_path / f"{step}.log").read_text()
        assert "# commit abc123" in text and "skipped: no GPU" in text


def test_a_step_with_too_little_time_left_is_skipped(tmp_path, no_gpu, monkeypatch):
    def never(*args):
        raise AssertionError("the step ran")
    monkeypatch.setattr(gpu_node, "step_sixteen", never)
    assert gpu_node.main(["--out", str(tmp_path), "--steps", "sixteen", "--budget", "10"]) == 1
    assert "skipped: 10 s left" in (tmp_path / "sixteen.log").read_text()


@pytest.mark.parametrize("found, passed", [([], True), (["weights.h5: W1 differs"], False)])
def test_the_shared_step_fails_when_a_rank_count_gives_other_bits(tmp_path, no_gpu, monkeypatch, found, passed):
    monkeypatch.setattr(gpu_node.Log, "run", lambda self, cmd, env=None, timeout=600.0: (0, "", 0.5))
    monkeypatch.setattr(gpu_node, "differences", lambda a, b: found)
    assert gpu_node.main(["--out", str(tmp_path), "--steps", "shared", "--device", "cpu"]) == (0 if passed else 1)
    rows = list(csv.DictReader((tmp_path / "shared_gpu.csv").open()))
    assert {r["same_bits_as_first"] for r in rows if r["ranks"] != "1"} == {str(passed)}
    assert ("differs from 1 rank" in (tmp_path / "shared.log").read_text()) is not passed


def test_each_measured_process_runs_through_rank_usage_under_the_launcher_python_command_gives(tmp_path,
                                                                                               monkeypatch):
    """with_usage keeps the launcher and its placement (threads: unbound ranks) and puts
    bench.rank_usage, under perf stat where perf counts, between it and the module."""
    monkeypatch.setenv("MPIRUN", "mpirun --oversubscribe")
    monkeypatch.setattr(gpu_node, "perf_works", lambda: False)
    cmd = gpu_node.with_usage(tmp_path, "run", "aepar.sparse", ["--limit", 10], ranks=4, threads=4)
    assert cmd[:5] == ["mpirun", "--oversubscribe", "--bind-to", "none", "-np"] and cmd[5] == "4"
    assert cmd[6:] == [gpu_node.PY, "-m", "bench.rank_usage", "--out", tmp_path, "--tag", "run", "-m",
                       "aepar.sparse", "--limit", "10"]
    alone = gpu_node.with_usage(tmp_path, "run", "aepar.sparse", ["--limit", 10])
    assert alone[0] == gpu_node.PY and alone[-2:] == ["--limit", "10"]
    monkeypatch.setattr(gpu_node, "perf_works", lambda: True)
    perf = gpu_node.with_usage(tmp_path, "run", "aepar.sparse", ["--limit", 10], ranks=2)
    assert perf[perf.index("sh"):perf.index("sh") + 2] == ["sh", "-c"] and "perf stat" in perf[perf.index("sh") + 2]
    assert perf[perf.index("sh") + 3] == tmp_path / "run-perf" and perf[-4:] == ["-m", "aepar.sparse", "--limit", "10"]


@pytest.mark.parametrize("big, collectives", [(4, [2, 4]), (16, [2, 4, 8, 16])])
def test_the_sixteen_step_keeps_a_row_per_run_with_the_ranks_compute_spread(tmp_path, monkeypatch, big, collectives):
    """Every run's row is written as it ends (a pass cut short keeps them), the sparse runs'
    with the least and median compute per rank beside the slowest's, and the schemes last."""
    written = []
    real_write = gpu_node.write_rows

    def write(path, rows):
        written.append(len(rows))
        return real_write(path, rows)
    monkeypatch.setattr(gpu_node, "write_rows", write)
    commands = []

    def run(self, cmd, env=None, timeout=600.0, cwd=None):
        commands.append([str(c) for c in cmd])
        return 0, "", 0.5
    monkeypatch.setattr(gpu_node.Log, "run", run)
    monkeypatch.setattr(gpu_node, "summary_of", lambda out: {"total_s": 1.0, "compute_s": 0.9, "comm_s": 0.1,
                                                             "root_step_s": 0.04,
                                                             "compute_per_rank_s": [0.9, 0.5, 0.7, 0.6]})
    monkeypatch.setattr(gpu_node, "independent_copies", lambda *args: True)
    monkeypatch.setattr(gpu_node, "machine", lambda: "m")
    opts = type("Opts", (), {"out": tmp_path, "sixteen": big, "data_dir": None, "commit": "abc"})()
    assert gpu_node.step_sixteen(gpu_node.Log(tmp_path / "sixteen.log", "sixteen", "abc"), opts, tmp_path)
    rows = list(csv.DictReader((tmp_path / "sixteen.csv").open()))
    assert written[:3] == [1, 2, 3] and len(rows) == written[-1]
    sparse = [r for r in rows if r["what"].startswith("sparse")]
    assert sparse and all((r["compute_min_s"], r["compute_median_s"], r["compute_s"], r["root_step_s"])
                          == ("0.5", "0.7", "0.9", "0.04") for r in sparse)
    assert rows[-1]["what"].startswith("pretrain") and not any(r["what"].startswith("sparse")
                                                               for r in rows[len(sparse):])
    # the sparse runs in float64, the precision of the committed grid and of the scaling model
    runs = [c for c in commands if "aepar.sparse" in c]
    assert runs and all("--dtype" in c and c[c.index("--dtype") + 1] == "float64" for c in runs)
    # the collectives at 2 ranks and at every power of two up to the ranks asked for
    outs = [Path(c[c.index("--out") + 1]).name for c in commands if "measure-mpi" in c]
    assert outs == [f"mpi_{r}ranks.csv" for r in collectives]
