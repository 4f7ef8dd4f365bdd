"""A run's figures are drawn into RunDir.output's temporary name (".name.PID.tmp") once the
run directory is published (a checkpoint was saved): every figure must say its format
rather than let matplotlib guess it from that name (a long sync run ended in an
MPI_ABORT at its last step, spacetime.png, when one did not)."""
import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_every_savefig_in_aepar_names_its_format():
    missing = []
    for path in sorted((Path(ROOT) / "aepar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "savefig" \
                    and not any(k.arg == "format" for k in node.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, f"savefig without format= (fails on a .tmp name): {missing}"


def test_the_space_time_diagram_draws_into_a_temporary_name(tmp_path):
    pytest.importorskip("matplotlib")
    from aepar.report.spacetime import plot_spacetime

    epochs = [{"stage": s, "start": float(e + s), "end": float(e + s + 1), "extra": e > 1, "train_error": 1.0 / (e + 1),
               "val_error": None, "version": e} for s in range(2) for e in range(3)]
    handovers = [{"stage": 0, "t": float(e + 1), "version": e + 1} for e in range(3)]
    path = tmp_path / ".spacetime.png.123.tmp"
    plot_spacetime(epochs, handovers, path, n_stages=2)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
