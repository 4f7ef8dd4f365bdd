"""Backend selection, thread policy and the CLI parser."""
import os
import subprocess
import sys

import numpy as np
import pytest

from aepar import _threads
from aepar.backend import select
from aepar.cli import ArgumentParser, add_common
from aepar.errors import UserError, one_line
from tests.conftest import HAVE_GPU


def test_cpu_backend_uses_numba_kernels_by_default():
    be = select("cpu")
    assert be.kernel_set == "numba" and be.xp is np and be.K.__name__ == "aepar.kernels.nb"
    assert select("cpu", "numpy").K.__name__ == "aepar.kernels.ref"


def test_kernel_set_must_fit_the_device():
    with pytest.raises(UserError, match="does not run on device"):
        select("cpu", "cupy")


@pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU")
def test_gpu_without_gpu_is_a_one_line_user_error():
    with pytest.raises(UserError) as err:
        select("gpu")
    assert "\n" not in str(err.value) and "--device gpu" in str(err.value)


def test_a_foreign_error_is_quoted_in_one_line():
    assert one_line(OSError("disk gone\nerrno 5 detail")) == "OSError: disk gone"
    assert one_line(KeyError()) == "KeyError"
    assert one_line(ValueError("")) == "ValueError"


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")
def test_gpu_work_is_queued_by_one_thread(monkeypatch):
    import aepar
    from aepar.rows import threads
    monkeypatch.setattr(aepar, "THREADS", 4)
    select("gpu")
    assert threads() == 1


def test_every_kernel_set_exports_the_same_names():
    import importlib

    names = {}
    for mod in ("ref", "nb"):
        m = importlib.import_module(f"aepar.kernels.{mod}")
        names[mod] = {n for n in dir(m) if n.endswith(("_forward", "_backward", "_update"))}
    assert names["ref"] == names["nb"] and names["ref"]
    # cupy's set is checked by source, since cupy cannot import without a GPU stack
    import pathlib
    import re

    cp_dir = pathlib.Path(importlib.import_module("aepar.kernels").__file__).parent / "cp"
    cp_names = set()
    for f in cp_dir.glob("*.py"):
        cp_names |= set(re.findall(r"^def (\w+_(?:forward|backward|update))\(", f.read_text(), re.M))
    assert cp_names == names["ref"], sorted(cp_names ^ names["ref"])


def test_threads_split_cores_between_local_ranks(monkeypatch):
    monkeypatch.delenv("AEPAR_THREADS", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    monkeypatch.setattr(_threads, "usable_cores", lambda: 16)
    assert _threads.threads_per_rank() == 4
    monkeypatch.setattr(_threads, "usable_cores", lambda: 2)
    assert _threads.threads_per_rank() == 1  # never zero
    monkeypatch.setenv("AEPAR_THREADS", "3")
    assert _threads.threads_per_rank() == 3


# (node, CPUs) per rank, as aepar._threads.node_layout gathers them
UNBOUND_4_ON_16 = [("n1", tuple(range(16)))] * 4
CORE_EACH_2_ON_2 = [("n1", (0,)), ("n1", (1,))]
PE4_4_ON_16 = [("n1", tuple(range(4 * r, 4 * r + 4))) for r in range(4)]  # mpirun --map-by slot:PE=4
SOCKETS_2_2 = [("n1", tuple(range(8)))] * 2 + [("n1", tuple(range(8, 16)))] * 2  # --bind-to socket, spread
ONE_SOCKET_4 = [("n1", tuple(range(8)))] * 4  # all four ranks bound to the first socket
TWO_HOSTS = [("a", (0,)), ("a", (1,)), ("b", (0, 1, 2, 3))]


@pytest.mark.parametrize("layout, threads, cores", [
    (UNBOUND_4_ON_16, [4] * 4, 16), (CORE_EACH_2_ON_2, [1, 1], 2), (PE4_4_ON_16, [4] * 4, 16),
    (SOCKETS_2_2, [4] * 4, 16), (ONE_SOCKET_4, [2] * 4, 8), (TWO_HOSTS, [1, 1, 4], 6)])
def test_threads_and_cores_follow_every_ranks_binding(layout, threads, cores):
    """A rank's threads are its CPUs shared among the ranks on its node bound over them; the
    ranks' cores are all their CPUs together. Bound to one core each, two ranks have two
    cores (not the one each sees: the planner's "oversubscribed", fine-tuning on one rank);
    bound to four each (PE=4), a rank has four threads (not 4 cores / 4 ranks = 1)."""
    assert [_threads.share_of_node(layout, r) for r in range(len(layout))] == threads
    assert _threads.node_cores(layout) == cores
    assert _threads.cores_per_node(TWO_HOSTS) == {"a": 2, "b": 4}


def test_the_layouts_threads_leave_a_chosen_or_fixed_count(monkeypatch):
    monkeypatch.setattr(_threads, "_FIXED", [False])
    monkeypatch.setenv("AEPAR_THREADS", "1")
    assert _threads.threads_for_layout(PE4_4_ON_16, 0) is None  # the user's AEPAR_THREADS stands
    monkeypatch.delenv("AEPAR_THREADS")
    assert _threads.threads_for_layout(PE4_4_ON_16, 2) == 4
    _threads.fix_threads()  # the GPU backend's one thread
    assert _threads.threads_for_layout(PE4_4_ON_16, 0) is None


@pytest.mark.parametrize("var", _threads._LOCAL_RANK_VARS)
def test_every_launchers_local_rank_is_read(monkeypatch, var):
    """A rank's index on its node (its GPU, the one rank per node that speaks) from whichever
    launcher started it, MVAPICH2's included, whose count of ranks on the node was read
    already; 0 where none says."""
    for other in _threads._LOCAL_RANK_VARS:
        monkeypatch.delenv(other, raising=False)
    assert _threads.local_rank() == 0
    monkeypatch.setenv(var, "3")
    assert _threads.local_rank() == 3


def test_more_threads_than_cores_is_said_once_per_node():
    """A rank bound to one core with AEPAR_THREADS=2 (mpirun's binding, here sched_setaffinity)
    gets one line naming the fix, from the node's first rank only; enough cores, none."""
    code = "import aepar; print(aepar.THREADS)"
    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS") and k != "AEPAR_THREADS"
            and k not in _threads._LOCAL_RANK_VARS}
    core = min(os.sched_getaffinity(0))

    def run(**env):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**base, **env}, preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    crowded = run(AEPAR_THREADS="2")
    assert crowded.stdout.split() == ["2"]
    assert "AEPAR_THREADS=2 on 1 core" in crowded.stderr and "--bind-to none" in crowded.stderr
    assert len(crowded.stderr.strip().splitlines()) == 1
    assert run(AEPAR_THREADS="2", OMPI_COMM_WORLD_LOCAL_RANK="1").stderr == ""  # the node's other ranks
    assert run(AEPAR_THREADS="1").stderr == ""
    assert _threads.crowded_note(4, 4) is None and _threads.crowded_note(5, 4) is not None


def test_a_cpu_without_fma_is_said_once_per_node_when_the_cpu_kernels_are_chosen(tmp_path):
    """Numba compiling for an x86 CPU without FMA (as on a Sandy Bridge, in a VM showing a
    generic CPU model, or told NUMBA_CPU_NAME=generic) gives other bits than a CPU with FMA:
    one line says so, once a process, from the node's first rank, when the Numba kernels
    are chosen, naming the variables where they took this CPU's FMA away; with FMA, or with
    the NumPy kernels, nothing."""
    from aepar.kernels.nb.simd import host_fma

    code = ("import aepar; from aepar import backend; backend.select('cpu', 'numpy'); print('numpy'); "
            "backend.select('cpu', 'numba', 'float32'); backend.select('cpu', 'numba', 'float64')")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU") and k != "AEPAR_ISA"
            and k not in _threads._LOCAL_RANK_VARS}
    base["NUMBA_CACHE_DIR"] = str(tmp_path)  # a foreign target's kernels never land in the checkout's cache

    def run(**env):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**base, **env})
    without = dict(NUMBA_CPU_NAME="sandybridge", NUMBA_CPU_FEATURES="-avx512f,-avx2,-fma")
    for env in (without, dict(NUMBA_CPU_NAME="generic")):  # generic: Numba's own empty feature list
        said = run(**env)
        assert said.stdout.split() == ["numpy"]
        assert len(said.stderr.strip().splitlines()) == 1, env
        assert "without fused multiply-add (FMA)" in said.stderr and "last bits" in said.stderr
        # where this CPU has FMA, the line names the variables that took it away
        assert all((f"{k}={v}" in said.stderr) == host_fma() for k, v in env.items())
    assert run(**without, OMPI_COMM_WORLD_LOCAL_RANK="1").stderr == ""  # the node's other ranks
    assert run(NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="-avx512f").stderr == ""  # Haswell's FMA
    assert run(NUMBA_CPU_NAME="bdver1", NUMBA_CPU_FEATURES="-fma,+fma4").stderr == ""  # Bulldozer's FMA4


@pytest.mark.parametrize("cpu,features,fma", [
    ("haswell", "+avx2,+fma", True), ("bdver1", "-fma,+fma4", True), ("sandybridge", "-avx512f,-avx2,-fma", False),
    ("generic", "", False), ("x86-64", "", False), ("sandybridge", "", False),  # the names' own features
    ("haswell", "", True), ("x86-64-v3", "", True), ("bdver2", "-fma", True)])  # bdver2 keeps its FMA4
def test_whether_the_target_has_fma_is_what_llvm_compiles_for_it(cpu, features, fma):
    """The kernels' FMAs follow the target's instructions, which a CPU name brings unless
    the feature list turns them off: LLVM compiles an fma for it and is taken at its word."""
    import platform

    from aepar.kernels.nb.simd import hardware_fma

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("these are x86-64 CPUs")
    assert hardware_fma(features, cpu) is fma


def test_blas_is_single_threaded_and_aepar_takes_the_cores():
    """BLAS and Numba run one thread per rank (their results change with their thread
    count); aepar's own threads take the rank's share of the cores."""
    code = ("import aepar, os; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['NUMBA_NUM_THREADS'], "
            "aepar.THREADS)")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS") and k != "AEPAR_THREADS"}
    env.pop("OMPI_COMM_WORLD_LOCAL_SIZE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["1", "1", str(len(os.sched_getaffinity(0)))]


def test_a_child_recomputes_what_its_parent_filled_in():
    # a driver that imported aepar launches ranks: they must not inherit its one-rank share
    code = "import aepar, os; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS") and k != "AEPAR_THREADS"}
    env.update(OPENBLAS_NUM_THREADS="8", MKL_NUM_THREADS="3", AEPAR_FILLED_THREADS="8:OPENBLAS_NUM_THREADS",
               AEPAR_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["1", "3"]  # the inherited 8 recomputed; the user's 3 kept


def test_bad_option_is_a_collective_user_error(capsys):
    parser = ArgumentParser(prog="x")
    add_common(parser, scheme="x")
    with pytest.raises(UserError) as err:
        parser.parse_args(["--no-such-option"])
    assert err.value.collective and "--no-such-option" in str(err.value)
    with pytest.raises(UserError):
        parser.parse_args(["--dtype", "float16"])
    for bad in (["--seed", "-1"], ["--checkpoint-minutes", "nan"], ["--timeout", "0"], ["--checkpoint-every", "-2"]):
        with pytest.raises(UserError) as err:
            parser.parse_args(bad)
        assert bad[0] in str(err.value) and "\n" not in str(err.value)
