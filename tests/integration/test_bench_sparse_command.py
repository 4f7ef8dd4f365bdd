"""bench.sparse_command times the whole commands (the textbook's, aepar's in float32 and
float64, aepar's start-up) and writes their rows and table."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_commands_timed_from_the_same_images(tmp_path):
    out, md = tmp_path / "peers.csv", tmp_path / "command.md"
    cmd = [sys.executable, "-m", "bench.sparse_command", "--samples", "300", "--iterations", "5", "--repeats", "1",
           "--out", str(out), "--md", str(md)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["implementation"]: r for r in csv.DictReader(open(out))}
    assert sorted(rows) == ["aepar command", "aepar command, float64", "aepar start-up (1 iteration)",
                            "textbook command"]
    for r in rows.values():
        assert r["benchmark"] == "sparse_command" and r["samples"] == "300" and r["cpu_model"]
        assert float(r["seconds"]) > 0 and len(r["all_seconds"].split()) == 1
        assert r["thread_setting"] == "1" and r["threads"] == r["blas_threads"] == "1"
    assert rows["textbook command"]["iterations"] == rows["aepar command"]["iterations"] == "5"
    assert rows["aepar command, float64"]["iterations"] == "5"
    # float32 (the default) and float64 start alike and part by their rounding only
    cost32, cost64 = (float(rows[k]["final_cost"]) for k in ("aepar command", "aepar command, float64"))
    assert cost32 != cost64 and cost32 == pytest.approx(cost64, rel=1e-3)
    assert rows["aepar start-up (1 iteration)"]["iterations"] == "1"
    # the same problem on both sides: a cost of the same size after the same iterations
    assert 0.5 < float(rows["aepar command"]["final_cost"]) / float(rows["textbook command"]["final_cost"]) < 2
    assert float(rows["textbook command"]["speedup_vs_textbook"]) == 1.0
    assert "| aepar command | 5 |" in md.read_text()


def test_bad_options_exit_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "bench.sparse_command", "--repeats", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--repeats" in proc.stderr.strip().splitlines()[-1]


def test_each_programs_defaults_set_no_thread_variable(monkeypatch):
    """--threads 0 runs both commands as they run by default: the caller's thread variables
    are left out, not passed on; --threads N sets every one of them to N."""
    from bench.sparse_command import THREAD_VARS, _env, thread_setting
    for var in THREAD_VARS:
        monkeypatch.setenv(var, "3")
    assert not set(THREAD_VARS) & set(_env(0)) and thread_setting(0) == "defaults"
    assert {var: _env(2)[var] for var in THREAD_VARS} == dict.fromkeys(THREAD_VARS, "2") and thread_setting(2) == "2"


def test_defaults_time_the_textbook_both_ways_and_compare_with_the_faster(tmp_path):
    out = tmp_path / "peers.csv"
    cmd = [sys.executable, "-m", "bench.sparse_command", "--samples", "300", "--iterations", "3", "--repeats", "1",
           "--threads", "0", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["implementation"]: r for r in csv.DictReader(open(out))}
    both = [rows["textbook command"], rows["textbook command, one BLAS thread"]]
    assert {r["thread_setting"] for r in rows.values()} == {"defaults"} and len(rows) == 5
    aepar = rows["aepar command"]
    assert rows["textbook command, one BLAS thread"]["blas_threads"] == aepar["blas_threads"] == "1"
    faster = min(float(r["seconds"]) for r in both)
    assert float(aepar["speedup_vs_textbook"]) == round(faster / float(aepar["seconds"]), 2)
    assert sorted(float(r["speedup_vs_textbook"]) for r in both)[-1] == 1.0
