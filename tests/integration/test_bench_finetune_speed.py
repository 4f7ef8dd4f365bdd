"""bench.finetune_speed runs end to end and writes its rows and table."""
import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rows_and_table_for_both_block_counts(tmp_path):
    out, md = tmp_path / "peers.csv", tmp_path / "finetune.md"
    cmd = [sys.executable, "-m", "bench.finetune_speed", "--threads", "1", "--rows", "200", "--repeats", "1",
           "--no-torch", "--out", str(out), "--md", str(md)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(open(out)))
    assert sorted(r["implementation"] for r in rows) == ["aepar1", "aepar8"]
    for r in rows:
        assert r["benchmark"] == "finetune_epoch" and r["samples"] == "200" and r["cpu_model"]
        assert float(r["seconds"]) > 0 and 0 < float(r["fraction_of_peak"]) < 1.5
    assert "| 1 | aepar (numba kernels, 1 block" in md.read_text()
