"""`python -m aepar.sync` end to end on small real data, and its answers to bad input."""
import json
import struct

import pytest

from aepar.trace import validate_chrome
from tests.conftest import is_note, run_mpi
from tests.integration.run_json import assert_run_json
from tests.integration.test_outputs import assert_describes_itself

pytestmark = pytest.mark.mpi
SMALL = ["-m", "aepar.sync", "--dataset", "mnist5k", "--layers", "784-32-16-8", "--epochs", "2",
         "--extra", "0,1,2", "--limit", "400", "--finetune-epochs", "1", "--quiet"]


def test_quick_run_writes_every_output(tmp_path):
    out = tmp_path / "run"
    r = run_mpi(3, SMALL + ["--compare-greedy", "--plot", "--out", out], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("weights.h5", "summary.json", "tables.md", "trace.json", "spacetime.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    s = json.loads((out / "summary.json").read_text())
    assert s["scheme"] == "sync" and s["ranks"] == 3 and s["handover"] == "plan"
    assert_run_json(out, 3, compare_greedy=True)
    rows = assert_describes_itself(out, None)  # --quiet: no progress lines
    assert {r["phase"] for r in rows} == {"pretrain", "finetune"} and (out / "reconstructions.png").is_file()
    assert {r["stage"] for r in rows} >= {"1", "greedy/1"}  # the greedy comparison's rows too
    # the epochs run are the plan's, in every stage
    planned = [(l, e["epoch"], e["version"]) for l, st in enumerate(s["plan"]["stages"]) for e in st]
    ran = [(e["stage"], e["epoch"], e["version"]) for e in s["pretrain"]["epochs"]]
    assert ran == planned
    assert s["greedy"]["scheme"] == "greedy" and s["error"]["finetuned"]["test"] > 0
    tables = (out / "tables.md").read_text()
    assert "greedy pre-training" in tables and "sync pre-training" in tables and "Table 3" in tables
    doc = json.loads((out / "trace.json").read_text())
    assert validate_chrome(doc) == []
    names = {e["name"] for e in doc["traceEvents"]}
    assert {"epoch", "handover"} <= names
    assert {e["pid"] for e in doc["traceEvents"] if e["name"] == "epoch"} == {0, 1, 2}
    # where each rank's time went: the epochs' phases from the trace, a bar per rank
    profile = s["profile"]
    assert [r["rank"] for r in profile] == [0, 1, 2] and all(r["epochs"] >= 2 for r in profile)
    # each layer's rank holds every block on one thread: its steps are fused steps (one kernel call)
    assert all(r["fused_step_s"] > 0 and r["wait_s"] >= 0 for r in profile)
    assert sum(r["handover_s"] for r in profile) > 0
    assert sum(r["epochs"] for r in profile) == len(ran)  # sync's epochs, not the greedy comparison's
    assert (out / "profile.csv").read_text().count("\n") == 1 + 3 and (out / "profile.png").stat().st_size > 0
    png = (out / "spacetime.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] > 300
    import h5py

    with h5py.File(out / "weights.h5") as f:
        assert f["params/layer1/W"].shape == (784, 32) and f["params/layer3/W"].shape == (16, 8)
        assert "params/finetuned/W1" in f and "params/greedy/layer1/W" in f


def test_one_process_and_three_ranks_agree(tmp_path):
    """The plan makes the weights independent of the number of ranks."""
    import h5py
    import numpy as np

    runs = {}
    for np_ in (1, 3):
        out = tmp_path / f"np{np_}"
        r = run_mpi(np_, SMALL + ["--finetune-epochs", "0", "--no-plot", "--out", out], timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        with h5py.File(out / "weights.h5") as f:
            runs[np_] = {k: np.array(f[f"params/layer{i}/{k}"]) for i in (1, 2, 3) for k in ("W", "bh")}
    for k in runs[1]:
        assert np.array_equal(runs[1][k], runs[3][k]), k


@pytest.mark.parametrize("args,np_,message", [
    (["--layers", "100-32-8"], 2, "starts at 100 but the data has 784 inputs"),
    (["--layers", ""], 2, "--layers is empty"),
    (["--extra", "0,1"], 2, "has 2 count(s) but there are 3 layers"),
    (["--extra", "1,1,1"], 2, "layer 1's input never changes"),
    (["--limit", "5", "--reduce-blocks", "8"], 2, "rows cannot fill 8 blocks"),
    (["--lr", "-0.1"], 2, "argument --lr: invalid learning rate"),
    (["--momentum", "1.0"], 2, "argument --momentum: invalid momentum"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, np_, message):
    out = tmp_path / "run"
    base = [a for a in SMALL if a not in ("--quiet",)]
    # later options win in argparse: the bad value replaces the good one
    r = run_mpi(np_, base + args + ["--out", out], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    # mpirun adds its own banner about the exit code; the ranks' output is one line in all
    # (besides a note on the machine, such as a CPU without FMA, which is not about the input)
    lines = [line for line in (r.stdout + r.stderr).splitlines()
             if ("aepar" in line or "Traceback" in line) and not is_note(line)]
    assert len(lines) == 1 and lines[0].startswith("aepar.sync: error: ") and message in lines[0], r.stderr
    assert r.stdout.strip() == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_help_says_newest_is_not_reproducible():
    r = run_mpi(1, ["-m", "aepar.sync", "--help"], timeout=60)
    assert r.returncode == 0
    assert "NOT reproducible" in " ".join(r.stdout.split()) and "--handover-mode" in r.stdout
