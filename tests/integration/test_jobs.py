"""Job scripts and the scaling harness, without a scheduler (`make test`).

- every shell script parses (`bash -n`), and scheduler directives come before any command;
- the grid expansion and the speedup/efficiency arithmetic of bench.scaling;
- jobs/sparse_scaling.sh run as plain bash on a tiny grid, with the real aepar.sparse
  under mpirun (1 and 2 processes), writes strong.csv/weak.csv with the documented columns;
- a failing point makes the sweep fail but is recorded, and the others are still collected;
- bench.textbook_sparse agrees with aepar's model and writes peers.csv.

The SLURM and Grid Engine runs are `make test-cluster` (tests/cluster/).
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scaling

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [REPO / "jobs" / "sparse_scaling.sh", REPO / "jobs" / "lib.sh",
           REPO / "jobs" / "starcluster" / "sparse_scaling.sge",
           *sorted((REPO / "tests" / "cluster").glob("*.sh"))]
DOCUMENTED = ["scheme", "processes", "samples", "iterations", "evaluations", "seconds", "speedup",
              "efficiency", "cores", "cpu_model", "blas", "blas_coretype", "threads", "mpi"]


def _env(**extra):
    env = dict(os.environ, AEPAR_THREADS="1", PYTHON=sys.executable, **extra)
    for var in ("SLURM_JOB_ID", "PE_HOSTFILE", "GRID", "PROCS", "SAMPLES", "WEAK", "ITERS", "OUT",
                "SCHEME", "ARGS", "MAXPROCS", "THREADS", "LAUNCHER"):
        env.pop(var, None) if var not in extra else None
    return env


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_scripts_parse(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("script, prefix", [("jobs/sparse_scaling.sh", "#SBATCH"),
                                            ("jobs/starcluster/sparse_scaling.sge", "#$")])
def test_directives_precede_the_first_command(script, prefix):
    # sbatch stops reading #SBATCH at the first command; a directive below it is ignored
    lines = (REPO / script).read_text().splitlines()
    first_cmd = next(i for i, l in enumerate(lines) if l.strip() and not l.startswith("#"))
    directives = [i for i, l in enumerate(lines) if l.startswith(prefix)]
    assert directives and max(directives) < first_cmd
    header = "\n".join(lines[:first_cmd])
    if prefix == "#SBATCH":
        for option in ("--job-name", "--nodes", "--ntasks=16", "--time", "--output"):
            assert option in header
    else:
        assert "#$ -pe orte" in header and "#$ -cwd" in header


def test_grid_file_and_overrides():
    full = scaling.resolve(scaling.load_grid("full"))
    assert full["processes"] == [1, 2, 4, 8, 16]
    assert full["samples"] == [10000, 20000, 40000, 80000, 160000]
    assert full["weak"] == [(1, 10000), (2, 20000), (4, 40000), (8, 80000), (16, 160000)]
    assert len(full["points"]) == 25  # the weak points are all on the strong grid
    quick = scaling.resolve(scaling.load_grid("quick"))
    assert max(quick["processes"]) <= 2
    # overriding samples moves the weak base to the smallest size unless given
    g = scaling.resolve(scaling.load_grid("full"), procs="1 2", samples="2000 4000", iterations="20")
    assert g["weak"] == [(1, 2000), (2, 4000)] and g["iterations"] == 20
    assert set(g["points"]) == {(1, 2000), (2, 2000), (1, 4000), (2, 4000)}
    g = scaling.resolve(scaling.load_grid("full"), procs="1 2", samples="2000", weak="1000")
    assert set(g["points"]) == {(1, 2000), (2, 2000), (1, 1000)}
    with pytest.raises(scaling.GridError):
        scaling.resolve(scaling.load_grid("full"), procs="1 x")
    with pytest.raises(scaling.GridError):
        scaling.load_grid("nope")


def _fake_point(run, p, s, seconds, status="ok"):
    """A point as the sweep leaves it: a sweep.csv line and the scheme's summary.json."""
    name = f"p{p}_s{s}"
    with open(run / "sweep.csv", "a") as f:
        f.write(f"{name},fake,{p},{s},10,1,1,mpirun,1,0,{status},1.0\n")
    if status == "ok":
        (run / "points" / name).mkdir(parents=True)
        (run / "points" / name / "summary.json").write_text(json.dumps({
            "final_cost": 0.5, "iterations": 10, "evaluations": 12, "processes": p, "samples": s,
            "seconds_total": seconds, "seconds_compute": seconds * 0.8, "seconds_comm": seconds * 0.2,
            "dtype": "float64", "kernels": "numba"}))


def test_collect_computes_speedup_and_efficiency(tmp_path):
    subprocess.run([sys.executable, "-m", "bench.scaling", "points", "--procs", "1 2 4",
                    "--samples", "100 200", "--write", str(tmp_path / "grid.json")],
                   cwd=REPO, check=True, capture_output=True)
    (tmp_path / "sweep.csv").write_text("name,scheme,processes,samples,iterations,repeat,threads,"
                                        "launcher,nodes,oversubscribed,status,wall_seconds\n")
    for p, s, t in [(1, 100, 8.0), (2, 100, 5.0), (4, 100, 4.0), (1, 200, 16.0), (2, 200, 8.0),
                    (2, 200, 9.0), (4, 400, 10.0)]:  # (2, 200) twice: the faster counts
        if not (tmp_path / "points" / f"p{p}_s{s}").exists():
            _fake_point(tmp_path, p, s, t)
    _fake_point(tmp_path, 4, 200, 0, status="failed rc=1")
    strong, weak = scaling.collect(tmp_path, machine={"cores": 2, "threads": 1})
    by = {(r["processes"], r["samples"]): r for r in strong}
    assert set(by) == {(1, 100), (2, 100), (4, 100), (1, 200), (2, 200)}  # (4, 200) failed
    assert by[(2, 100)]["speedup"] == "1.600" and by[(2, 100)]["efficiency"] == "0.800"
    assert by[(4, 100)]["speedup"] == "2.000" and by[(4, 100)]["efficiency"] == "0.500"
    assert by[(2, 200)]["speedup"] == "2.000"
    wk = {r["processes"]: r for r in weak}
    # weak: 100 per process; t1 = 8 s, t2 = t(2, 200) = 8 s, t4 = t(4, 400) = 10 s
    assert wk[2]["efficiency"] == "1.000" and wk[4]["efficiency"] == "0.800"
    assert wk[4]["speedup"] == "3.200"
    header = _csv(tmp_path / "strong.csv")[0].keys()
    assert all(c in header for c in DOCUMENTED)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "run"
    env = _env(PROCS="1 2 4", MAXPROCS="2", SAMPLES="2000", ITERS="10", OUT=str(out))
    proc = subprocess.run(["bash", str(REPO / "jobs" / "sparse_scaling.sh")], cwd="/", env=env,
                          capture_output=True, text=True, timeout=300)
    return proc, out


@pytest.mark.mpi
def test_plain_bash_sweep_writes_the_csvs(tiny_run):
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no scheduler: mpirun on" in proc.stdout
    assert "skip 4 processes x 2000 samples" in proc.stdout  # MAXPROCS=2
    strong, weak = _csv(out / "strong.csv"), _csv(out / "weak.csv")
    assert all(c in strong[0] for c in DOCUMENTED)
    assert sorted((int(r["processes"]), int(r["samples"])) for r in strong) == [(1, 2000), (2, 2000)]
    assert sorted((int(r["processes"]), int(r["samples"])) for r in weak) == [(1, 2000), (2, 4000)]
    for r in strong + weak:
        assert r["scheme"] == "aepar.sparse" and r["launcher"] == "mpirun"
        assert float(r["seconds"]) > 0 and int(r["evaluations"]) >= int(r["iterations"]) > 0
        assert r["threads"] == "1" and int(r["cores"]) >= 1 and r["mpi"] and r["blas"]
    one, two = sorted(strong, key=lambda r: int(r["processes"]))
    assert one["speedup"] == "1.000"
    # from the scheme's own full-precision times (the CSV rounds speedup to 3 decimals)
    t = {p: json.loads((out / "points" / f"p{p}_s2000" / "summary.json").read_text())["seconds_total"]
         for p in (1, 2)}
    assert float(two["speedup"]) == pytest.approx(t[1] / t[2], abs=6e-4)
    assert float(two["seconds"]) == pytest.approx(t[2], abs=6e-5)
    assert float(two["efficiency"]) == pytest.approx(float(two["speedup"]) / 2, abs=1e-3)
    # the scheme's own outputs are kept per point; plots and the table come along
    assert (out / "points" / "p2_s2000" / "summary.json").exists()
    assert (out / "scaling.md").exists() and (out / "speedup.png").stat().st_size > 0


@pytest.mark.mpi
def test_a_failing_point_fails_the_sweep_but_is_recorded(tmp_path):
    out = tmp_path / "run"
    env = _env(PROCS="1", SAMPLES="2000", ITERS="5", OUT=str(out), SCHEME="aepar.no_such_scheme",
               REPORT="0")
    proc = subprocess.run(["bash", str(REPO / "jobs" / "sparse_scaling.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "p1_s2000 FAILED" in proc.stdout
    rec = _csv(out / "sweep.csv")
    assert rec[0]["status"].startswith("failed")
    assert _csv(out / "strong.csv") == []


def test_textbook_peer_agrees_and_writes_peers_csv(tmp_path):
    out = tmp_path / "peers.csv"
    proc = subprocess.run([sys.executable, "-m", "bench.textbook_sparse", "--samples", "1000",
                           "--iterations", "15", "--out", str(out)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["implementation"]: r for r in _csv(out)}
    assert set(rows) == {"textbook", "aepar"}
    for r in rows.values():
        assert float(r["seconds"]) > 0 and float(r["dgemm_peak_gflops"]) > 0
        # 10·m·v·h FLOPs per evaluation at m = 1000, v = 64, h = 25
        assert float(r["gflop_per_evaluation"]) == pytest.approx(0.016)
        runs = [float(t) for t in r["all_seconds"].split()]
        assert len(runs) == int(r["repeats"]) == 3 and float(r["seconds"]) == pytest.approx(min(runs), abs=6e-4)
    # same function, same start, same optimiser: the same minimum to a few digits
    assert float(rows["aepar"]["final_cost"]) == pytest.approx(float(rows["textbook"]["final_cost"]), rel=1e-3)
