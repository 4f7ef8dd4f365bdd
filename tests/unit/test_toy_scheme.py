"""Adding a scheme takes one file and one registration: the toy scheme of
docs/architecture.md ("Adding a scheme"), taken from the page as it is, runs under the
engine on 1 and 2 ranks with the same weights, and writes what every scheme writes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import is_note, run_mpi

ROOT = Path(__file__).resolve().parents[2]
RUN = ("import sys; from aepar import schemes; "
       "schemes.register('roundrobin', 'every epoch trains each layer once', module='roundrobin'); "
       "from aepar import pretrain; from aepar.comm import run_main; sys.exit(run_main(pretrain.main, 'aepar.pretrain'))")
ARGS = ["--scheme", "roundrobin", "--layers", "784-32-8", "--epochs", "2", "--finetune-epochs", "1", "--limit", "400",
        "--reduce-blocks", "4", "--dtype", "float64", "--quiet"]


def toy_source() -> str:
    page = (ROOT / "docs" / "architecture.md").read_text()
    found = re.search(r"<!-- toy-scheme[^>]*-->\s*```python\n(.*?)```\s*<!-- /toy-scheme -->", page, re.S)
    assert found, "docs/architecture.md lost its toy scheme"
    return found.group(1)


def _run(tmp_path, ranks, out, *extra):
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    args = ["-c", RUN, *ARGS, *extra, "--out", str(out)]
    if ranks > 1:
        return run_mpi(ranks, args, timeout=600, env=env)
    return subprocess.run([sys.executable, *args], env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=600)


def _weights(path) -> dict:
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
    return out


@pytest.mark.mpi
def test_the_toy_scheme_of_the_docs_runs_under_the_engine_with_the_same_bits_on_any_ranks(tmp_path):
    (tmp_path / "roundrobin.py").write_text(toy_source())
    one, two = tmp_path / "np1", tmp_path / "np2"
    r1 = _run(tmp_path, 1, one)
    assert r1.returncode == 0, r1.stderr
    r2 = _run(tmp_path, 2, two)
    assert r2.returncode == 0, r2.stderr
    for out in (one, two):
        assert {"summary.json", "tables.md", "weights.h5", "trace.json", "run.json"} <= set(os.listdir(out))
    s = json.loads((one / "summary.json").read_text())
    assert s["scheme"] == "roundrobin" and s["task"] == "reconstruct" and s["machine"]["cpu_model"]
    assert len(s["pretrain"]["errors"]) == 2 * 2  # epochs x layers: the toy's own record
    assert s["error"]["finetuned"]["test"] > 0
    a, b = _weights(one / "weights.h5"), _weights(two / "weights.h5")
    assert "params/layer2/W" in a and any(k.startswith("params/finetuned/") for k in a)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), "1 and 2 ranks differ"


@pytest.mark.mpi
def test_what_the_toy_cannot_run_is_refused_by_its_check_in_one_line(tmp_path):
    (tmp_path / "roundrobin.py").write_text(toy_source())
    r = _run(tmp_path, 2, tmp_path / "bad", "--reduce-blocks", "1")
    # mpirun adds lines of its own; a note on the machine (a CPU without FMA) is not about the input
    lines = [line for line in r.stderr.splitlines() if line.startswith("aepar") and not is_note(line)]
    assert r.returncode == 2 and len(lines) == 1 and "--reduce-blocks 1 cannot be shared by 2 ranks" in lines[0], \
        r.stderr
    assert not (tmp_path / "bad").exists()
