"""One version everywhere, the command declared, the extras that the docs promise."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import aepar

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_one_number_in_the_package_the_changelog_and_the_citation():
    project = pyproject()["project"]
    assert "version" in project.get("dynamic", []) and \
        pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "aepar.__version__"}
    top = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    cited = re.search(r"^version: (\S+)", (ROOT / "CITATION.cff").read_text(), re.M).group(1)
    assert top == cited == aepar.__version__


def test_the_command_the_extras_and_the_license_are_declared():
    project = pyproject()["project"]
    assert project["scripts"]["aepar"] == "aepar.command:main"
    extras = project["optional-dependencies"]
    assert any(d.startswith("cupy-cuda13x") for d in extras["gpu"])
    assert any(d.startswith("cupy-cuda12x") for d in extras["gpu-cuda12"])
    assert {"plots", "data", "test", "docs"} <= set(extras)
    assert (ROOT / project["license-files"][0]).is_file()
    scipy = next(d for d in project["dependencies"] if d.startswith("scipy"))
    assert "<" in scipy, "scipy's private setulb is tested on a range: pin its top"
