"""The front page and the documentation site: the site builds with no warning, README.md
stays a front page, what the pages name exists, and the scaling model's figures they quote
are the committed validation's.

The build needs MkDocs (`make docs` installs the `docs` extra into the venv). Without it the
build test is skipped, except under CI (CI set), where a missing MkDocs is a failure: CI
must build the site.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT = 12 * 1024  # bytes: a front page, the rest lives in docs/

# How the project was made is not documentation (case-insensitive, whole words).
# the words a text uses when it narrates how the project was made (spelled in pieces, so that this
# file does not itself say them)
BANNED = re.compile(r"\b(se" r"ssions?|le" r"ases?|le" r"ased|le" r"asing|work[ -]periods?|machine[ -]loans?)\b",
                    re.IGNORECASE)


def doc_files():
    return [README] + sorted(DOCS.rglob("*.md"))


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing_mkdocs() -> str | None:
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not installed (make docs, or pip install -e '.[docs]')"
    return None


def test_site_builds_strict(tmp_path):
    missing = _missing_mkdocs()
    if missing:
        if _in_ci():
            pytest.fail(f"CI is set and the site cannot be built: {missing}")
        pytest.skip(missing)
    site = tmp_path / "site"
    # not --quiet: it hides the warnings from the count that --strict fails on
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (site / "index.html").is_file()
    api = (site / "api.html").read_text(encoding="utf-8")
    assert 'id="aepar.engine"' in api and 'id="aepar.schemes"' in api, "the API page rendered no docstrings"


def test_readme_is_a_front_page():
    size = README.stat().st_size
    assert size < README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move the details into docs/"


def find_banned(files) -> list[str]:
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in BANNED.finditer(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    return hits


def test_no_narration_words():
    hits = find_banned(doc_files())
    assert not hits, "words about how the project was made, not about aepar:\n" + "\n".join(hits)


def test_banned_words_are_whole_words():
    text = "a release, please; " + "Se" + "ssions ran. One " + "LE" + "ASE, a work period."
    assert [m.group(0) for m in BANNED.finditer(text)] == ["Se" + "ssions", "LE" + "ASE", "work period"]


# --- what the pages name exists ------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(?:bench|jobs|tests|kernels|aepar|docs)/[\w./*<>-]*$")


def code_text(text: str) -> list[str]:
    """The fenced blocks and inline code spans of a Markdown page."""
    blocks = FENCE.findall(text)
    rest = FENCE.sub("", text)
    return blocks + SPAN.findall(rest)


def test_readme_links_resolve():
    bad = []
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (ROOT / target.split("#")[0]).exists():
            bad.append(target)
    assert not bad, f"README.md links to files that do not exist: {bad}"


def test_named_repository_paths_exist():
    bad = []
    for path in doc_files():
        for code in code_text(path.read_text(encoding="utf-8")):
            name = code.strip()
            if not REPO_PATH.match(name) or "<" in name:
                continue
            if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    # a page may describe a file the reader is to create (docs/architecture.md's toy scheme)
    bad = [b for b in bad if not b.endswith("aepar/schemes/roundrobin.py")]
    assert not bad, "pages name files that do not exist:\n" + "\n".join(bad)


def test_named_make_targets_and_modules_exist():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    bad = []
    sys.path.insert(0, str(ROOT))
    try:
        for path in doc_files():
            for code in code_text(path.read_text(encoding="utf-8")):
                for target in re.findall(r"(?<![\w-])make ([a-z][a-z-]*)", code):
                    if target not in targets:
                        bad.append(f"{path.relative_to(ROOT)}: make {target}")
                for module in re.findall(r"python -m ((?:aepar|bench)(?:\.[a-z_][a-z0-9_]*)*)", code):
                    if importlib.util.find_spec(module) is None:
                        bad.append(f"{path.relative_to(ROOT)}: python -m {module}")
    finally:
        sys.path.remove(str(ROOT))
    assert not bad, "pages name commands that do not exist:\n" + "\n".join(bad)


# ---- figures quoted from bench/results -------------------------------------------------------
RESULTS = ROOT / "bench" / "results"
# docs/performance.md's scaling-model table: each row's label -> which validation points it counts
MODEL_ROWS = {
    "every machine": lambda r: True,
    "Zen 4": lambda r: r["machine"] == "same as here",
    "the 16-vCPU Xeon": lambda r: r["source"].startswith("scaling_16core/"),
    "Zen 3": lambda r: "family 25 model 1 " in r["machine"],
    "the 2-vCPU Intel Xeon": lambda r: r["source"] in ("strong.csv", "weak.csv"),
}


def test_the_scaling_models_figures_in_the_docs_are_the_committed_validations():
    """docs/performance.md quotes the scaling model's validation (whole runs per machine:
    points, median error, worst) and its target row: the figures of
    bench/results/scaling_model_validation.csv and scaling_model.md, not a run's before."""
    import csv
    import statistics

    from bench.scaling_model.report import _pct as _percent  # as scaling_model.md writes a percentage

    rows = [r for r in csv.DictReader(open(RESULTS / "scaling_model_validation.csv"))
            if r["kind"] == "run" and not r["duplicate_of"] and r["abs_rel_error"]]
    text = (DOCS / "performance.md").read_text()
    model = (RESULTS / "scaling_model.md").read_text()
    every = re.search(r"\| whole runs, all machines \| (\d+) \| ([\d.]+%) \| ([\d.]+%) \|", model)
    assert every, "scaling_model.md has no row for every machine's whole runs"
    for label, counts in MODEL_ROWS.items():
        errors = [float(r["abs_rel_error"]) for r in rows if counts(r)]
        quoted = re.search(r"^\| " + re.escape(label) + r"\b[^|]*\| (\d+) \| \**([\d.]+%)\** \| ([\d.]+%) \|$", text,
                           re.MULTILINE)
        assert quoted, f"docs/performance.md's scaling-model table has no row for {label}"
        assert quoted.groups() == (str(len(errors)), _percent(statistics.median(errors)), _percent(max(errors))), \
            label
    errors = [float(r["abs_rel_error"]) for r in rows]
    assert every.groups() == (str(len(rows)), _percent(max(errors)), _percent(statistics.median(errors)))
    assert f"over every machine: {every.group(3)}" in text  # the targets' table
