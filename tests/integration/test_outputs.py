"""Every program's run directory describes itself: metrics.csv (one row per epoch, the time
stamp and the seconds since the run began), at least one figure, and progress lines with
the time and an estimate of the time left. Here greedy, finetune and classify; sparse, sync
and eager check theirs with :func:`assert_describes_itself` in their own tests."""
import csv
import re
import subprocess
import sys

import pytest

from aepar.metrics import FIELDS
from tests.conftest import ROOT, run_mpi

DIGITS = ["--dataset", "mnist5k", "--limit", "300"]
STACK = [*DIGITS, "--layers", "784-16-8", "--epochs", "2", "--finetune-epochs", "2", "--kernels", "numba"]
PROGRAMS = {
    "greedy": (1, ["-m", "aepar.greedy", *STACK]),
    "finetune": (1, ["-m", "aepar.finetune", *DIGITS, "--finetune-epochs", "2", "--weights", "{weights}"]),
    "classify": (1, ["-m", "aepar.classify", *DIGITS, "--classify-epochs", "2", "--weights", "{weights}"]),
}
GREEDY_RUNS = []  # the greedy case's run directory: its weights serve finetune and classify
STAMPED = re.compile(r"^\[\d\d:\d\d:\d\d\] .*, (\?|\d+s|\d+m\d\ds|\d+h\d\dm) left$")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A greedy run's weights for aepar.finetune and aepar.classify (the greedy case's, when it ran)."""
    if GREEDY_RUNS:
        return GREEDY_RUNS[0] / "weights.h5"
    out = tmp_path_factory.mktemp("weights") / "run"
    r = subprocess.run([sys.executable, "-m", "aepar.greedy", *STACK, "--finetune-epochs", "0", "--quiet",
                        "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "weights.h5"


def assert_describes_itself(out, stdout: str, *, figures: bool = True):
    """metrics.csv with its header and rows whose elapsed_s grows, a PNG, stamped progress lines."""
    with open(out / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == FIELDS
    assert len(rows) >= 2, rows
    elapsed = [float(r["elapsed_s"]) for r in rows]
    assert all(b >= a for a, b in zip(elapsed, elapsed[1:])) and elapsed[-1] > elapsed[0], elapsed
    assert all(r["time"] and r["epoch"] for r in rows)
    assert any(r["train_loss"] or r["train_error"] for r in rows)
    keys = [(r["phase"], r["stage"], r["epoch"]) for r in rows]
    assert len(keys) == len(set(keys)), keys  # one row per epoch
    if figures:
        assert list(out.glob("*.png")), sorted(p.name for p in out.iterdir())
    if stdout is not None:
        stamped = [l for l in stdout.splitlines() if STAMPED.match(l)]
        assert stamped and any(not l.endswith("? left") for l in stamped), stdout[-2000:]
    return rows


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_every_run_describes_itself(program, tmp_path_factory, request):
    ranks, args = PROGRAMS[program]
    if "{weights}" in args:
        args = [a.replace("{weights}", str(request.getfixturevalue("weights"))) for a in args]
    out = tmp_path_factory.mktemp(program) / "run"
    r = run_mpi(ranks, [*args, "--out", out], env={"AEPAR_PLOTS": "1"}, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if program == "greedy":
        GREEDY_RUNS.append(out)
    rows = assert_describes_itself(out, r.stdout)
    assert (out / "metrics.png").is_file()
    if program in ("greedy", "finetune"):
        assert (out / "reconstructions.png").is_file()
    phases = {r["phase"] for r in rows}
    assert phases == {"greedy": {"pretrain", "finetune"}, "finetune": {"finetune"}, "classify": {"classify"}}[program]
