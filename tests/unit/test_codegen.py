"""kernels.nb.codegen: generated kernel source compiled once and its code object kept."""
import numpy as np
import pytest
from numba.core import config

import aepar  # noqa: F401  (fixes thread counts before numpy loads)
from aepar.kernels.nb import codegen

SOURCE = "def twice(a):\n    return a * 2.0\n"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    return tmp_path


def _compile_refused(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("compiled again although a copy was kept")
    monkeypatch.setattr(codegen, "compile", refuse, raising=False)  # found before the builtin


def test_a_source_is_compiled_once_then_loaded(cache_dir, monkeypatch):
    first = codegen._code(SOURCE, "/x/gen.py")
    assert len(list((cache_dir / "generated").glob("*.marshal"))) == 1
    _compile_refused(monkeypatch)
    again = codegen._code(SOURCE, "/x/gen.py")
    assert again == first and again.co_filename == "/x/gen.py"


def test_another_source_or_file_is_compiled_afresh(cache_dir):
    codegen._code(SOURCE, "/x/gen.py")
    other = codegen._code(SOURCE.replace("2.0", "3.0"), "/x/gen.py")
    elsewhere = codegen._code(SOURCE, "/y/gen.py")
    assert elsewhere.co_filename == "/y/gen.py"
    assert len(list((cache_dir / "generated").glob("*.marshal"))) == 3
    scope = {}
    exec(other, {}, scope)
    assert scope["twice"](1.0) == 3.0


def test_a_damaged_copy_is_compiled_again(cache_dir):
    codegen._code(SOURCE, "/x/gen.py")
    (kept,) = (cache_dir / "generated").glob("*.marshal")
    kept.write_bytes(b"\x00not marshal")
    scope = {}
    exec(codegen._code(SOURCE, "/x/gen.py"), {}, scope)
    assert scope["twice"](2.0) == 4.0


def test_no_writable_cache_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setattr(config, "CACHE_DIR", str(blocker))  # "generated" cannot be made below a file
    scope = {}
    exec(codegen._code(SOURCE, "/x/gen.py"), {}, scope)
    assert scope["twice"](1.5) == 3.0


def test_define_binds_a_jitted_function(cache_dir):
    home = cache_dir / "gen.py"  # Numba caches a kernel beside the file it says it is from
    home.write_text(SOURCE)
    namespace = {}
    fn = codegen.define("twice", SOURCE, namespace, str(home))
    assert namespace["twice"] is fn and fn(np.float64(2.5)) == 5.0
