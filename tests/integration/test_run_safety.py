"""Runs that share a working directory or meet a full disk lose nothing.

- Runs started together without ``--out`` (eight plain processes, four 2-rank jobs under
  mpirun) each end in a numbered directory of their own, with their own complete results.
- A run whose disk fills ends with one line naming the file and what was kept, exit 74,
  every rank ending: on a real 300 KB tmpfs where the tests run as root, and with an
  injected write failure (AEPAR_FAULT's ``enospc``) everywhere.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from aepar import checkpoint
from tests.conftest import ROOT, mpirun_cmd

RUNS = {1: 8, 2: 4}  # runs started together, by ranks per run (four 2-rank jobs: 8 processes on the cores)
SPARSE = ["--limit", "512", "--iterations", "20"]  # not --quiet: the last line names the run
GREEDY = ["--dataset", "mnist5k", "--layers", "784-64-16", "--epochs", "2", "--finetune-epochs", "1",
          "--limit", "800", "--quiet"]


def _env(**extra):
    return dict(os.environ, AEPAR_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                PYTHONPATH=str(ROOT), **extra)


def _command(ranks, module, args):
    prefix = [] if ranks == 1 else mpirun_cmd() + ["-np", str(ranks)]
    return prefix + [sys.executable, "-m", module, *map(str, args)]


def aepar_lines(stderr, prog):
    """aepar's own lines, not the fault injector's."""
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}:") and "AEPAR_FAULT" not in line]


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.mpi)])
def test_runs_started_together_in_one_directory_each_keep_their_results(tmp_path, ranks):
    if ranks > 1 and mpirun_cmd() is None:
        pytest.skip("no mpirun found")
    seeds = list(range(1, RUNS[ranks] + 1))
    jobs = [subprocess.Popen(_command(ranks, "aepar.sparse", SPARSE + ["--seed", seed]), cwd=tmp_path,
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seed in seeds]
    said = []
    for job in jobs:
        out, err = job.communicate(timeout=600)
        assert job.returncode == 0, err[-2000:]
        said.append(out.strip().rsplit("wrote ", 1)[-1])
    base = tmp_path / "runs" / "sparse"
    dirs = sorted(p.name for p in base.iterdir())
    assert dirs == [f"{i:03d}" for i in range(1, RUNS[ranks] + 1)], dirs  # no staging left, none replaced
    assert sorted(said) == [f"runs/sparse/{d}" for d in dirs]  # each run names its own directory
    found = []
    for d in dirs:
        marker = json.loads((base / d / "run.json").read_text())
        assert marker["state"] == "complete"
        assert sorted(p.name for p in (base / d).iterdir()) == sorted(marker["files"] + ["run.json"])
        seed = int(marker["argv"][marker["argv"].index("--seed") + 1])
        found.append(seed)
        summary = json.loads((base / d / "summary.json").read_text())
        assert summary["seed"] == seed and summary["processes"] == ranks
        assert checkpoint.load(base / d / "weights.h5").params  # readable, whole
    assert sorted(found) == seeds


def _tmpfs(path, size="300k"):
    """Mount a small tmpfs at ``path`` (root only), or skip saying why."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a small tmpfs; the injected case covers the rest")
    path.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")


def test_a_full_disk_ends_the_run_in_one_line_and_leaves_nothing(tmp_path):
    disk = tmp_path / "disk"
    _tmpfs(disk)
    try:
        p = subprocess.run(_command(1, "aepar.greedy", GREEDY + ["--out", disk / "run"]), cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=300)
        lines = aepar_lines(p.stderr, "aepar.greedy")
        assert p.returncode == 74, p.stderr[-2000:]
        assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-2000:]
        assert lines[0].startswith(f"aepar.greedy: error: cannot write {disk / 'run'}/")
        assert "No space left on device; the run had no checkpoint yet, so nothing is kept" in lines[0]
        assert os.listdir(disk) == []  # staging directory and half-written files removed
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.mpi
def test_a_failed_checkpoint_write_keeps_the_last_one_and_ends_every_rank(tmp_path):
    if mpirun_cmd() is None:
        pytest.skip("no mpirun found")
    out = tmp_path / "run"
    # files 1-5: metrics.csv after each epoch and the checkpoints after layer 1's epochs; file 6, the
    # checkpoint after layer 2's first epoch, fails
    p = subprocess.run(_command(2, "aepar.greedy", GREEDY + ["--checkpoint-every", "1", "--timeout", "60",
                                                            "--out", out]),
                       cwd=tmp_path, env=_env(AEPAR_FAULT="0:6:enospc"), capture_output=True, text=True,
                       timeout=300)
    lines = aepar_lines(p.stderr, "aepar.greedy")
    assert p.returncode == 74, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-3000:]
    assert lines[0] == (f"aepar.greedy: error: cannot write {out}/checkpoint.h5: No space left on device; the last "
                        f"checkpoint (layer 1, 2 epochs done) in {out} is intact: make room, then --resume {out} "
                        "(rank 0)")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.h5", "metrics.csv", "run.json"]  # nothing half-written
    assert json.loads((out / "run.json").read_text())["state"] == "failed"
    resumed = subprocess.run(_command(1, "aepar.greedy", ["--resume", out, "--quiet"]), cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole = subprocess.run(_command(1, "aepar.greedy", GREEDY + ["--out", tmp_path / "whole"]), cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    a, b = checkpoint.load(out / "weights.h5").params, checkpoint.load(tmp_path / "whole" / "weights.h5").params
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
