"""bench.kernels: every kernel set checked against the oracle, rows that carry the machine,
a wrong kernel reported as a failure, and the CSV merge keeping other machines' rows."""
import aepar  # noqa: F401  (first: threads before numpy)
import csv

import numpy as np
import pytest

from aepar import kernels
from aepar.machine import FIELDS
from bench import kernel_cases
from bench import kernels as bench
from bench.common import Timing

EXTRA = ("numba_cpu_name", "numba_cpu_features", "numba_isa", "openblas_coretype", "openblas_arch")


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_quick_run_checks_every_family_and_records_the_machine(tmp_path):
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = read(tmp_path / "kernels.csv")
    kern = [r for r in rows if r["family"] != "peak"]
    assert {r["family"] for r in kern} == set(kernel_cases.FAMILIES)
    assert {"numba", "numpy"} <= {r["set"] for r in kern}
    bad = [(r["kernel"], r["set"], r["check"]) for r in kern if r["check"] != "ok"]
    assert not bad, bad
    assert {r["kernel"] for r in rows if r["family"] == "peak"} == {"sgemm", "dgemm", "copy"}
    for col in FIELDS + EXTRA:
        assert col in rows[0], col
    assert all(r["cpu_model"] and r["numba_cpu_name"] and r["hostname"] for r in rows)
    timed = [r for r in kern if int(r["flops"]) > 0]
    assert all(float(r["gflops"]) > 0 and float(r["intensity"]) > 0 and float(r["frac_compute_peak"]) > 0
               for r in timed)
    assert (tmp_path / "kernels.md").read_text().count("| sparse_ae_partials |") == 3
    assert (tmp_path / "kernels_roofline.png").stat().st_size > 10_000


def test_wrong_kernel_fails_and_merge_keeps_other_rows(tmp_path, monkeypatch):
    other = {name: "" for name in bench.ROW_FIELDS}
    other.update(family="dense", kernel="dense_forward", set="numba", shape="8x24x16 sigmoid", dtype="float32",
                 check="ok", threads="1", numba_cpu_name="haswell", cpu_model="Some Other CPU")
    bench.merge_csv(tmp_path / "kernels.csv", [other])

    nb, ref = kernels.load("numba"), kernels.load("numpy")
    monkeypatch.setattr(nb, "relu_forward", lambda z: ref.relu_forward(z) * np.float32(1.001))
    argv = ["--quick", "--only", "activation", "--sets", "numba", "--out", str(tmp_path)]
    assert bench.main(argv) == 1
    assert bench.main(argv) == 1  # a second run replaces its rows, it does not add to them
    rows = read(tmp_path / "kernels.csv")
    checks = {r["kernel"]: r["check"] for r in rows if r["family"] == "activation"}
    assert checks["relu_forward"].startswith("FAIL: a:"), checks
    assert all(c == "ok" for k, c in checks.items() if k != "relu_forward")
    assert sum(r["family"] == "activation" for r in rows) == 4
    assert any(r["cpu_model"] == "Some Other CPU" for r in rows)
    assert "FAIL" in (tmp_path / "kernels.md").read_text()


def test_conv_flops_count_only_taps_on_the_image():
    assert kernel_cases._taps(28, 28, 3, 1, 1) == 28 * 3 - 2   # the two border outputs lose one tap each
    assert kernel_cases._taps(7, 14, 2, 2, 0) == 7 * 2          # a 2x2/2 transposed conv (7 -> 14): every tap


def test_warm_runs_every_small_case_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "warm_commands", lambda: 8)  # below, without running the commands
    assert bench.main(["--warm"]) == 0
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert f"{len(kernel_cases.catalog(quick=True))} kernel cases compiled" in out and "8 tiny command runs" in out


def test_warm_runs_each_command_at_one_thread_the_machines_and_pretraining_at_each_group_length(monkeypatch):
    import subprocess
    import threading
    from pathlib import Path

    ran, running, most, wanted = [], [0], [0], [4]
    lock, all_running = threading.Lock(), threading.Event()

    class Done:
        returncode, stderr = 0, ""

    def run(cmd, env, **kw):
        out = Path(cmd[cmd.index("--out") + 1])
        assert not out.exists() and out.parent.is_dir()  # a fresh directory under the warm-up's own
        with lock:
            ran.append((cmd[2], env["AEPAR_THREADS"], out.parent))
            running[0] += 1
            most[0] = max(most[0], running[0])
            if running[0] >= wanted[0]:
                all_running.set()
        all_running.wait(timeout=1)  # the first runs wait for the others to start theirs
        with lock:
            running[0] -= 1
        return Done()
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr("aepar._threads.usable_cores", lambda: 4)
    # pre-training at every group length of 8 blocks (8, 4, 3 and 2, 1) and the machine's threads
    pretrain = ("1", "2", "3", "4", "8")
    expected = [(m, t) for m, _ in bench.WARM_COMMANDS for t in (pretrain if m == "aepar.pretrain" else ("1", "4"))]
    assert bench.warm_commands() == len(expected)
    assert sorted((m, t) for m, t, _ in ran) == sorted(expected)
    assert {"aepar.sparse", "aepar.pretrain", "aepar.eager"} <= {m for m, _, _ in ran}
    assert most[0] == 4  # a run a core at once (Numba's cache saves hold a lock)
    assert [t for _, t, _ in ran[:len(bench.WARM_COMMANDS)]] == ["1"] * len(bench.WARM_COMMANDS)  # these first
    assert not ran[0][2].exists()  # removed afterwards
    ran.clear()
    most[0], wanted[0] = 0, 1
    all_running.clear()
    monkeypatch.setattr("aepar._threads.usable_cores", lambda: 1)
    bench.warm_commands()  # one core: one pass of the others, one run at a time
    assert sorted((m, t) for m, t, _ in ran if m != "aepar.pretrain") == sorted(
        (m, "1") for m, _ in bench.WARM_COMMANDS if m != "aepar.pretrain")
    assert most[0] == 1

    class Failed:
        returncode, stderr = 2, "aepar.eager: error: unknown option"
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, **kw: Failed())
    with pytest.raises(SystemExit, match=r"aepar.sparse .* failed \(exit 2\):\naepar.eager: error"):
        bench.warm_commands()


def test_roofline_draws_every_family_of_this_code_path_from_the_csv():
    def row(family, kernel, **kw):
        r = {name: "" for name in bench.ROW_FIELDS}
        r.update(family=family, kernel=kernel, set="numba", device="cpu", threads="1", numba_cpu_name="host",
                 cpu_model="EPYC", quick="0")
        r.update(kw)
        return r
    earlier = row("dense", "dense_forward")
    other_path = row("dense", "dense_forward", numba_cpu_name="haswell")
    other_cpu = row("dense", "dense_forward", cpu_model="Xeon")
    this_run = [row("blocksum", "block_outer_sum"), row("peak", "sgemm")]
    drawn = bench._on_this_path([earlier, other_path, other_cpu] + this_run, this_run)
    assert drawn == [earlier, this_run[0]]


def test_later_rounds_keep_each_kernels_fastest_pass(tmp_path, monkeypatch, capsys):
    passes = [5e-3, 2e-3, 4e-3]  # one kernel's seconds in each pass: the second one is the fastest
    seen = []
    real = bench.time_call

    def spy(fn, repeats, **options):
        timing = real(fn, repeats, **options)
        if fn.__defaults__ and fn.__defaults__[0].kernel == "sigmoid_forward":
            seen.append(passes[len(seen)])
            return Timing((seen[-1],), timing.calls)
        return timing
    monkeypatch.setattr(bench, "time_call", spy)
    argv = ["--quick", "--rounds", "3", "--only", "activation", "--sets", "numba", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    assert "round 3 of 3" in capsys.readouterr().out and len(seen) == 3
    rows = [r for r in read(tmp_path / "kernels.csv") if r["kernel"] == "sigmoid_forward"]
    assert len(rows) == 1 and float(rows[0]["seconds"]) == 2e-3  # not the first pass's, nor the last's


def test_no_rounds_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--rounds", "0", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--rounds" in capsys.readouterr().err and not list(tmp_path.iterdir())
