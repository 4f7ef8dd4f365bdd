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
    name = machine.cpu_name(text)
    assert name and name in text and machine.cpu_model().startswith(name)
    assert machine.cpu_id(text) in machine.cpu_model()


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: {model}
model name\t: Intel(R) Xeon(R) Processor
stepping\t: {stepping}

processor\t: 1
cpu family\t: 6
model\t\t: 1
stepping\t: 9
"""


def test_two_xeons_with_one_name_are_told_apart():
    spr, emr = CPUINFO.format(model=143, stepping=8), CPUINFO.format(model=207, stepping=2)
    assert machine.cpu_name(spr) == machine.cpu_name(emr) == "Intel(R) Xeon(R) Processor"
    assert machine.cpu_id(spr) == "family 6 model 143 stepping 8"  # the first processor's block
    assert machine.cpu_id(emr) == "family 6 model 207 stepping 2"
    assert machine.cpu_id("processor : 0\nModel : Raspberry Pi 4\n") == ""  # no x86 numbers


def test_cache_sizes_come_from_sysfs(tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                                 (2, "Unified", "2048K"), (3, "Unified", "307200K")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert machine._cache_size(2, str(tmp_path)) == "L2 2 MiB"
    assert machine._cache_size(3, str(tmp_path)) == "L3 300 MiB"
    assert machine._cache_size(1, str(tmp_path)) == "L1 48 KiB"
    assert machine._cache_size(4, str(tmp_path)) == ""
    assert machine._cache_size(2, str(tmp_path / "missing")) == ""


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
    # the CPU's own sets, before any "[numba target: ...]" (AEPAR_ISA, NUMBA_CPU_NAME)
    assert machine.isa().split(" [")[0].split() == [x for x in machine.ISA_FLAGS if x in flags]


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


def test_one_process_is_said_alike_in_runs_and_benchmarks():
    from bench.common import ONE_PROCESS
    assert machine.ONE_PROCESS == ONE_PROCESS


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
