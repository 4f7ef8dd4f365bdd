"""Dependencies run one way (docs/architecture.md: kernels <- models <- parallel <- schemes).

Every .py under aepar/ and kernels/ (installed as aepar.kernels) is parsed with ``ast``;
every import counts, at module level or inside a function, absolute or relative:

- ``import aepar.x.y [as z]`` imports aepar.x.y; ``import aepar`` imports aepar/__init__;
- ``from aepar.x import y`` imports aepar.x and, if y is a module, aepar.x.y;
- ``from . import y`` / ``from ..m import y`` resolve against the importing module's package.

No implicit edges to parent packages are added (a package __init__ importing its own
submodules is not a cycle).
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# source directory -> the package name it is imported as (kernels/ through the link aepar/kernels)
TREES = {ROOT / "aepar": "aepar", ROOT / "kernels": "aepar.kernels"}
MODELS = "aepar.models"
KERNELS = "aepar.kernels"
# What kernels/ may import from aepar outside itself (today: nothing).
KERNELS_MAY_IMPORT: set[str] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is_package) for every .py under the trees."""
    out = {}
    for top, name in TREES.items():
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top).with_suffix("").parts
            if any(p.startswith(".") or p == "__pycache__" for p in rel):
                continue
            is_pkg = rel[-1] == "__init__"
            parts = rel[:-1] if is_pkg else rel
            out[".".join((name,) + parts)] = (path, is_pkg)
    return out


def _resolve(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` inside ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, path: Path, is_pkg: bool, known) -> set[str]:
    """Every name ``module`` imports (all of them, not only aepar's), function level included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_pkg, node.level, node.module)
            out.add(base)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    out.add(f"{base}.{alias.name}")
    return out


def _graph():
    mods = _modules()
    raw = {m: imports_of(m, p, pkg, mods) for m, (p, pkg) in mods.items()}
    edges = {m: sorted(t for t in targets if t in mods and t != m) for m, targets in raw.items()}
    return mods, raw, edges


def find_cycle(edges: dict) -> list[str] | None:
    """One cycle [a, b, ..., a] of the directed graph, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in edges}
    stack: list[str] = []

    def visit(m):
        colour[m] = GREY
        stack.append(m)
        for t in edges.get(m, ()):
            if colour.get(t, BLACK) == GREY:
                return stack[stack.index(t):] + [t]
            if colour.get(t) == WHITE:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        colour[m] = BLACK
        return None

    for m in sorted(edges):
        if colour[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.fixture(scope="module")
def graph():
    return _graph()


def test_every_source_file_is_seen(graph):
    mods, _, edges = graph
    assert "aepar" in mods and "aepar.comm" in mods and "aepar.kernels.nb.rbm" in mods
    assert "aepar.models.rbm" in edges["aepar.models.ae_layer"]  # the parse sees real edges


def test_no_import_cycle(graph):
    _, _, edges = graph
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_models_never_import_parallel_or_comm(graph):
    _, raw, _ = graph
    bad = {m: sorted(t for t in targets if _under(t, "aepar.parallel") or _under(t, "aepar.comm")
                     or _under(t, "mpi4py"))
           for m, targets in raw.items() if _under(m, MODELS)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"models import the parallel layer (hand them a reducer instead): {bad}"


def test_kernels_import_nothing_of_aepar_outside_kernels(graph):
    _, raw, _ = graph
    bad = {m: sorted(t for t in targets if _under(t, "aepar") and not _under(t, KERNELS)
                     and t not in KERNELS_MAY_IMPORT)
           for m, targets in raw.items() if _under(m, KERNELS)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"kernels/ imports aepar: {bad}"


def test_only_comm_imports_mpi4py(graph):
    _, raw, _ = graph
    users = sorted(m for m, targets in raw.items() if any(_under(t, "mpi4py") for t in targets))
    assert users == ["aepar.comm"], f"mpi4py imported by {users}"


def test_cycle_finder_finds_a_cycle_and_names_it():
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a"]}) is None


def test_relative_and_aliased_imports_resolve(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import aepar.x.y as z\nfrom . import sib\nfrom ..up import thing\n"
                   "def f():\n    from aepar.parallel import blocks\n    import aepar\n")
    known = {"aepar.pkg.sib", "aepar.parallel.blocks"}
    got = imports_of("aepar.pkg.sub.m", src, False, known)
    assert {"aepar.x.y", "aepar.pkg.sub", "aepar.pkg.up", "aepar.parallel", "aepar.parallel.blocks",
            "aepar"} <= got
    assert "aepar.pkg.sib" not in got  # `from . import sib` inside aepar.pkg.sub is aepar.pkg.sub.sib
    got = imports_of("aepar.pkg.m", src, False, known)
    assert "aepar.pkg.sib" in got


def test_kernels_are_reached_through_the_backend_only(graph):
    _, raw, _ = graph
    users = sorted(m for m, targets in raw.items()
                   if not _under(m, KERNELS) and any(_under(t, KERNELS) for t in targets))
    assert users == ["aepar.backend"], f"aepar.kernels imported outside aepar.backend by {users}"


def test_kernels_are_one_directory_reached_by_one_link():
    link = ROOT / "aepar" / "kernels"
    # setup.py maps nothing and aepar/__init__ registers nothing: the link is the one way in
    assert link.is_symlink() and os.readlink(link) == "../kernels" and link.resolve() == (ROOT / "kernels")


SCHEMES_PKG, TASKS_PKG = "aepar.schemes", "aepar.tasks"
# the programs and the engine sit above the schemes: a scheme or task importing one stands on it
PROGRAMS = ("aepar.engine", "aepar.pretrain", "aepar.greedy", "aepar.sync", "aepar.sparse", "aepar.eager",
            "aepar.finetune", "aepar.classify")


def _scheme_files(mods):
    return sorted(m for m in mods if _under(m, SCHEMES_PKG) and m != SCHEMES_PKG)


def test_schemes_never_import_each_other_or_a_program(graph):
    mods, raw, _ = graph
    bad = {m: sorted(t for t in raw[m] if (_under(t, SCHEMES_PKG) and t != SCHEMES_PKG)
                     or any(_under(t, p) for p in PROGRAMS))
           for m in _scheme_files(mods)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"a scheme stands on another (what two share belongs in aepar.parallel): {bad}"


def test_tasks_never_import_schemes_or_programs(graph):
    mods, raw, _ = graph
    bad = {m: sorted(t for t in targets if _under(t, SCHEMES_PKG) or any(_under(t, p) for p in PROGRAMS))
           for m, targets in raw.items() if _under(m, TASKS_PKG)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"a task imports a scheme or a program (tasks take the layers any scheme trained): {bad}"


def test_the_layers_below_never_import_a_scheme_file(graph):
    """models, parallel, tasks and the rest may read the registry (aepar.schemes), never a scheme."""
    mods, raw, _ = graph
    files = set(_scheme_files(mods))
    bad = {m: sorted(files & targets) for m, targets in raw.items()
           if m not in files and not any(_under(m, p) for p in PROGRAMS)}
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"imported a scheme file directly (go through aepar.schemes.get(name).load()): {bad}"


def test_every_registered_scheme_is_a_file_with_the_engines_interface(graph):
    from aepar import schemes

    mods, _, _ = graph
    for s in schemes.SCHEMES.values():
        assert s.module in mods, f"scheme {s.name}: no file {s.module}"
        if s.engine != schemes.STACKED:
            continue
        path, _ = mods[s.module]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in ast.walk(n)
                    if isinstance(t, ast.Name)}
        missing = {"check", "setup", "pretrain"} - defined
        assert not missing, f"scheme {s.name} ({path.name}) lacks {sorted(missing)}"


def test_setup_installs_every_package_of_the_tree(graph):
    """A package missing from setup.py works from a checkout and is absent from an install."""
    mods, _, _ = graph
    call = next(n for n in ast.walk(ast.parse((ROOT / "setup.py").read_text())) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "setup")
    listed = set(ast.literal_eval(next(k.value for k in call.keywords if k.arg == "packages")))
    packages = {m for m, (_, is_pkg) in mods.items() if is_pkg}
    assert packages <= listed, f"setup.py's packages lack {sorted(packages - listed)}"
