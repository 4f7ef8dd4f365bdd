"""bench.stacked --rbm-only: rows land in rbm_epoch.csv beside other machines' rows."""
import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(out, *shape):
    cmd = [sys.executable, "-m", "bench.stacked", "--rbm-only", "--rbm-threads", "1", "--rbm-repeats", "1",
           "--rbm-rows", "1000", "--skip", "rbm-numpy,rbm-careful,rbm-plain", "--out", str(out), *shape]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_rbm_rows_replace_this_machines_and_keep_others(tmp_path):
    csv_path = tmp_path / "rbm_epoch.csv"
    csv_path.write_text("implementation,seconds,hostname,cpu_model,blas_coretype\n"
                        "aepar (numba kernels),3.7,vm,Some Other CPU,SkylakeX\n")
    _run(tmp_path)
    _run(tmp_path, "--rbm-hidden", "64", "--rbm-batch", "250")  # another shape: its own rows
    _run(tmp_path, "--rbm-layer", "ae", "--rbm-hidden", "64", "--rbm-batch", "250")  # another layer: its own
    _run(tmp_path)
    rows = list(csv.DictReader(open(csv_path)))
    assert rows[0]["cpu_model"] == "Some Other CPU" and rows[0]["seconds"] == "3.7"
    ours = [r for r in rows[1:] if r["kind"] == "measured"]
    assert sorted((r["layer"], r["batch"]) for r in ours) == [("784x1000 bernoulli", "100")] * 2 + \
        [("784x64 autoencoder", "250")] * 2 + [("784x64 bernoulli", "250")] * 2
    names = sorted(r["implementation"] for r in ours)
    assert len(set(names)) == 2 and all(n.startswith("aepar (numba kernels, ") for n in names)  # 8 blocks, 1 block
    assert all(float(r["seconds"]) > 0 and r["benchmark"] == "rbm_epoch" and r["isa"] for r in ours)
    assert not [r for r in rows if r.get("kind") == "missing"]  # PyTorch's peers skipped: nothing said missing


def test_rbm_shape_must_be_positive(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.stacked", "--rbm-only", "--rbm-batch", "0",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert "--rbm-hidden and --rbm-batch must be positive, got 1000 and 0" in proc.stderr
    assert not (tmp_path / "rbm_epoch.csv").exists()
