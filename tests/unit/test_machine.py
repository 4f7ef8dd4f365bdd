"""aepar.machine: the hardware/BLAS/MPI columns of every benchmark row."""
import os
import subprocess
import sys

import numpy as np
import pytest

from aepar import _threads, machine

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_describe_has_every_field_with_sane_values():
    d = machine.describe(mpi="test-mpi")
    assert tuple(d) == machine.FIELDS
    assert d["cores"] == _threads.usable_cores() >= 1
    assert d["mpi"] == "test-mpi"
    assert d["numpy"] == np.__version__
    assert d["python"].count(".") == 2
    assert d["cpu_model"] and d["hostname"]
    assert isinstance(d["threads"], int) and d["threads"] >= 1


def test_cpu_model_comes_from_proc_cpuinfo():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo on this system")
    with open("/proc/cpuinfo") as f:
        text = f.read()
    assert machine.cpu_model() in text


def test_blas_names_numpys_build():
    blas, _ = machine.blas_info()
    cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    assert blas.startswith(cfg["name"])
    assert cfg.get("version", "") in blas


def test_threads_follow_the_environment(monkeypatch):
    monkeypatch.setenv("AEPAR_THREADS", "3")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    d = machine.describe(mpi="x")
    assert d["threads"] == 3 and d["blas_threads"] == 2
    assert machine.describe(mpi="x", threads=5)["threads"] == 5
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "AEPAR_THREADS"):
        monkeypatch.delenv(var, raising=False)
    assert machine.threads_per_rank() == _threads.threads_per_rank() and machine.blas_threads() == 1


def test_isa_lists_the_vector_instruction_sets():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo on this system")
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith(("flags", "Features"))), [])
    assert machine.isa().split() == [x for x in machine.ISA_FLAGS if x in flags]


def test_forced_openblas_coretype_is_reported():
    # OpenBLAS reads OPENBLAS_CORETYPE when it loads: a fresh process
    code = "import aepar.machine as m; print(m.describe(mpi='x')['blas_coretype'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, OPENBLAS_CORETYPE="Haswell"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Haswell"


def test_cheap_no_numba_or_mpi_import_when_mpi_given():
    code = ("import sys, aepar.machine as m; m.describe(mpi='x'); "
            "print('numba' in sys.modules, 'mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_default_mpi_is_the_comm_library():
    from aepar.comm import library
    assert machine.describe()["mpi"] == library()


def test_avx2_path_holds_every_library_to_avx2():
    # the benchmarks' ratios on the AVX2 path compare code an AVX2-only CPU would run on
    # both sides: Numba's, OpenBLAS's and the PyTorch peers' (ATen, MKL, oneDNN)
    names = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY",
             "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
    code = f"import os, aepar; print(*[os.environ.get(k, '-') for k in {names!r}])"
    env = {k: v for k, v in os.environ.items() if k not in names}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(env, AEPAR_ISA="avx2"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["haswell", "-avx512f", "Haswell", "avx2", "AVX2", "AVX2"]


def test_torch_peer_names_version_and_isa_only_when_loaded(monkeypatch):
    import types
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert machine.torch_peer() == ""
    fake = types.SimpleNamespace(__version__="9.9.9+cpu",
                                 backends=types.SimpleNamespace(cpu=types.SimpleNamespace(
                                     get_cpu_capability=lambda: "AVX2")))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert machine.torch_peer() == "9.9.9+cpu AVX2"
