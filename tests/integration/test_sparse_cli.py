"""`python -m aepar.sparse` end to end on the embedded natural images, and its refusals."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, is_note, run_mpi
from tests.integration.run_json import assert_run_json
from tests.integration.test_outputs import assert_describes_itself

PROG = "aepar.sparse"


def run_cli(*args, timeout=180):
    env = dict(os.environ, AEPAR_THREADS="1")
    return subprocess.run([sys.executable, "-m", PROG, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def error_lines(stderr):
    """stderr's lines, less a note on the machine (a CPU without FMA), which is not about the input."""
    return [line for line in stderr.splitlines() if line.strip() and not is_note(line)]


def test_small_run_writes_every_output(tmp_path):
    out = tmp_path / "sparse"
    p = run_cli("--limit", 2000, "--iterations", 30, "--seed", 3, "--plot", "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    assert_run_json(out, 1, samples=2000, iterations=30, seed=3)
    assert {r["phase"] for r in assert_describes_itself(out, p.stdout)} == {"lbfgs"}
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"{PROG}: 2000 patches 8x8") and "64-25-64" in lines[0]
    progress = [l.split("] ", 1)[-1] for l in lines if "] iteration" in l]
    assert [int(l.split()[1]) for l in progress] == [25, 30]
    assert "4.00 communications/evaluation" in lines[-1] and "wrote" in lines[-1]
    assert sorted(f.name for f in out.iterdir()) == ["features.png", "metrics.csv", "metrics.png", "run.json", "summary.csv",
                                                     "summary.json", "weights.h5"]
    assert not list(tmp_path.glob(".sparse.*"))  # the staging directory was renamed away

    summary = json.loads((out / "summary.json").read_text())
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert len(rows) == 1
    for key in ("final_cost", "iterations", "evaluations", "processes", "samples", "hidden", "patch",
                "dtype", "kernels", "total_s", "compute_s", "comm_s",
                "collectives_per_evaluation", "seed", "source"):
        assert key in rows[0] and str(summary[key]) == rows[0][key], key
    assert summary["iterations"] == 30 and summary["evaluations"] >= 30 and summary["processes"] == 1
    assert summary["collectives_per_evaluation"] == 4.0 and summary["kernels"] == "numba"
    assert summary["machine"]["mpi"] == "not used (one process)"  # MPI was not started for this line
    assert 0 < summary["compute_s"] <= summary["total_s"]
    assert summary["compute_per_rank_s"] == [summary["compute_s"]] and "each rank's" not in lines[-1]
    assert float(progress[-1].split()[3]) == pytest.approx(summary["final_cost"], rel=1e-6)
    assert (out / "features.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the saved weights give the reported cost on the same patches (drawn again from the seed)
    from aepar import backend, checkpoint
    from aepar.data.patches import sample_patches
    from aepar.data.sources import natural_images
    from aepar.models.sparse_ae import SparseAutoencoder, init_theta

    ck = checkpoint.load(out / "weights.h5", scheme="sparse",
                         shapes={"W1": (64, 25), "W2": (25, 64), "b1": (25,), "b2": (64,)})
    theta = np.concatenate([ck.params[k].ravel() for k in ("W1", "W2", "b1", "b2")])
    patches = sample_patches(natural_images()[0], 2000, 8, seed=3)
    assert summary["dtype"] == "float32"  # the default
    own = SparseAutoencoder(backend.select("cpu", "numba", "float32"), 64, 25).attach(patches)
    assert own.cost_grad(theta)[0] == summary["final_cost"]  # the run's own kernels: the same bits
    model = SparseAutoencoder(backend.select("cpu", "numpy", "float64"), 64, 25).attach(patches)
    assert model.cost_grad(theta)[0] == pytest.approx(summary["final_cost"], rel=1e-6)  # float32's sums
    assert summary["final_cost"] < 0.5 * model.cost_grad(init_theta(64, 25, 3))[0]


def test_help_explains_the_options():
    p = run_cli("--help")
    assert p.returncode == 0
    for option in ("--limit", "--iterations", "--patch", "--hidden", "--rho", "--weight-cost", "--beta",
                   "--images", "--device", "--kernels", "--dtype", "--seed", "--data-dir", "--out", "--quiet",
                   "--overwrite", "--resume", "--checkpoint-every", "--checkpoint-minutes", "--timeout"):
        assert option in p.stdout


def _malformed_mat(directory):
    directory.mkdir()
    path = directory / "IMAGES.mat"
    path.write_bytes(b"MATLAB 5.0 MAT-file, but then nothing useful" + bytes(range(200)))
    return path


BAD = {  # case: (arguments, what the one error line must name)
    "unknown-option": (["--bogus", "1"], "--bogus"),
    "zero-hidden": (["--hidden", "0"], "--hidden"),
    "negative-limit": (["--limit", "-5"], "--limit"),
    "bad-rho": (["--rho", "1.5"], "--rho"),
    "nan-weight-cost": (["--weight-cost", "nan"], "--weight-cost"),
    "negative-seed": (["--seed", "-1"], "--seed"),
    "malformed-images": (["--images", "{bad}"], "IMAGES.mat"),
    "malformed-data-dir": (["--data-dir", "{bad_dir}"], "IMAGES.mat"),
    "missing-images": (["--images", "{missing}"], "IMAGES.mat"),
}


def test_quiet_run_prints_nothing(tmp_path):
    """--quiet silences every line on stdout, the last one too, as in the other programs
    (the API passes it by default: a notebook gets the results, not the log)."""
    out = tmp_path / "run"
    p = run_cli("--limit", 300, "--iterations", 3, "--no-plot", "--quiet", "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout == ""
    assert json.loads((out / "summary.json").read_text())["iterations"] == 3


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line_and_no_run_dir(case, tmp_path):
    bad = _malformed_mat(tmp_path / "data")
    paths = {"bad": bad, "bad_dir": bad.parent, "missing": tmp_path / "nowhere" / "IMAGES.mat"}
    args, names = BAD[case]
    args = [a.format(**paths) for a in args]
    out = tmp_path / "run"
    defaults = ["--iterations", "2"] + ([] if "--limit" in args else ["--limit", "100"])
    p = run_cli(*args, *defaults, "--out", out)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = error_lines(p.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), p.stderr
    assert names in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".run.*"))
    assert p.stdout == ""


@pytest.mark.mpi
def test_fewer_samples_than_processes_exits_2_on_every_rank(tmp_path):
    out = tmp_path / "run"
    p = run_mpi(2, ["-m", PROG, "--limit", 1, "--out", out], timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    # (mpirun adds its own note about the non-zero exit; the program says one line)
    ours = [l for l in error_lines(p.stderr) if PROG in l or "Traceback" in l or "rank" in l]
    assert ours == [f"{PROG}: error: --limit 1 make 1 block(s) of 128 patches, fewer than the 2 processes "
                    "(every process needs a block): use at most 1 or at least 256 samples"], p.stderr
    assert p.stdout == ""
    assert not out.exists() and not list(tmp_path.glob(".run.*"))
