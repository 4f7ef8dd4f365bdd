"""The aepar command: every program behind one name, the version, one line for a wrong name."""
from __future__ import annotations

import json
import subprocess
import sys

import aepar
from aepar import command, schemes


def aepar_cmd(*args, **kw):
    return subprocess.run([sys.executable, "-m", "aepar", *args], capture_output=True, text=True, timeout=300, **kw)


def test_version_and_help_name_every_program_and_scheme():
    r = aepar_cmd("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"aepar {aepar.__version__}"
    r = aepar_cmd("--help")
    assert r.returncode == 0
    for name in list(command.PROGRAMS) + schemes.names(None):
        assert f"\n  {name} " in r.stdout, name


def test_a_wrong_program_is_one_line_and_exit_2():
    r = aepar_cmd("hybrid")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "aepar pretrain --scheme" in r.stderr
    assert aepar_cmd().returncode == 2


def test_every_program_answers_help():
    for name in command.PROGRAMS:
        r = aepar_cmd(name, "--help")
        assert r.returncode == 0 and f"usage: aepar {name} " in r.stdout, (name, r.stdout[:200], r.stderr)


def test_a_program_runs_through_the_command(tmp_path):
    out = tmp_path / "run"
    r = aepar_cmd("greedy", "--layers", "784-16-8", "--epochs", "1", "--finetune-epochs", "0", "--limit", "200",
                  "--quiet", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["scheme"] == "greedy"
