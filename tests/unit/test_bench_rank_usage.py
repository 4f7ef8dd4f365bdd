"""bench.rank_usage: one JSON file of rusage per process, merged with perf's counts."""
import json
import subprocess
import sys
from pathlib import Path

from bench.rank_usage import perf_counts, rank_of, usage_rows

ROOT = Path(__file__).resolve().parents[2]
PERF = """# started on Wed Dec  2 14:28:18 2026

1233.22,msec,task-clock,1233215421,100.00,0.993,CPUs utilized
43,,context-switches,1233215421,100.00,34.868,/sec
<not supported>,,cycles,0,100.00,,
"""


def test_perf_counts_reads_the_values_and_leaves_what_perf_could_not_count_empty():
    assert perf_counts(PERF) == {"task-clock": 1233.22, "context-switches": 43.0, "cycles": None}


def test_the_rank_is_the_launchers_and_none_outside_one():
    assert rank_of({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert rank_of({"PMI_RANK": "5"}) == 5
    assert rank_of({"OMPI_COMM_WORLD_RANK": "", "SLURM_PROCID": "2"}) == 2
    assert rank_of({}) is None


def test_each_process_writes_its_usage_and_the_rows_take_perfs_file_beside_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.rank_usage", "--out", tmp_path, "--tag", "alone", "-m",
                           "platform"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    row = json.loads((tmp_path / "alone-rank0.json").read_text())
    assert row["module"] == "platform" and row["rank"] is None
    assert row["wall_s"] > 0 and row["user_s"] >= 0 and row["allowed_cpus"] >= 1
    (tmp_path / "alone-perf-rank0.csv").write_text(PERF)
    (tmp_path / "mpi-rank1.json").write_text(json.dumps({"rank": 1, "wall_s": 2.0}))
    rows = usage_rows(tmp_path)
    assert [r["process"] for r in rows] == ["alone-rank0", "mpi-rank1"]
    assert rows[0]["task-clock"] == 1233.22 and rows[0]["cycles"] is None
    assert "task-clock" not in rows[1]  # no perf file of its own


def test_a_failing_module_still_writes_its_usage_and_keeps_its_exit_code(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.rank_usage", "--out", tmp_path, "-m", "json.tool",
                           str(tmp_path / "missing.json")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode != 0
    assert json.loads((tmp_path / "usage-rank0.json").read_text())["module"] == "json.tool"
