"""Job scripts and the scaling harness, without a scheduler (`make test`).

- every shell script parses (`bash -n`), and scheduler directives come before any command
  (16 SLURM tasks and no node count; the signal before the time limit);
- the grid expansion (small points first), the time-left fit, and the speedup/efficiency
  arithmetic of bench.scaling over the current run's rows only;
- jobs/sparse_scaling.sh run as plain bash on a tiny grid, with the real aepar.sparse
  under mpirun (1 and 2 processes), writes strong.csv/weak.csv with the documented columns;
- a failing point makes the sweep fail but is recorded, and the others are still collected;
- with a stand-in scheme (seconds, no numerics): SIGUSR1 stops the sweep and reaches the
  running point, a resubmission keeps the finished points and runs the rest in fresh
  directories; other parameters or another scheduler reuse nothing; the default OUT of a
  job is not another scheduler's; a directory that is not a sweep is refused; a launcher
  that cannot start the largest point stops the sweep before any point; a launcher that
  fails before the program starts (Open MPI's PMIx listener) is tried once more;
- bench.textbook_sparse agrees with aepar's model and writes peers.csv, with the cost/gradient
  alone over the model's blocks and over one;
- jobs/train.sh (and its Grid Engine twin) asks to be requeued and signalled in its
  directives; as plain bash it runs a program with --resume-or-start (a second submission
  of a finished run ends at once with exit 0) and refuses an unknown scheme or --resume.

The SLURM and Grid Engine runs are `make test-cluster` (tests/cluster/).
"""
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import scaling

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [REPO / "jobs" / "sparse_scaling.sh", REPO / "jobs" / "lib.sh", REPO / "jobs" / "train.sh",
           REPO / "jobs" / "starcluster" / "sparse_scaling.sge", REPO / "jobs" / "starcluster" / "train.sge",
           *sorted((REPO / "tests" / "cluster").glob("*.sh"))]
DOCUMENTED = ["scheme", "processes", "samples", "iterations", "evaluations", "seconds", "speedup",
              "efficiency", "cores", "cpu_model", "blas", "blas_coretype", "threads", "mpi"]


def _env(**extra):
    env = dict(os.environ, AEPAR_THREADS="1", PYTHON=sys.executable, **extra)
    for var in ("SLURM_JOB_ID", "PE_HOSTFILE", "GRID", "PROCS", "SAMPLES", "WEAK", "ITERS", "OUT",
                "SCHEME", "ARGS", "MAXPROCS", "THREADS", "LAUNCHER", "RESUME", "REPEATS", "SEED",
                "JOB_ID", "NSLOTS", "RESTARTED", "SLURM_RESTART_COUNT"):
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
    directives = "\n".join(lines[i] for i in directives)
    if prefix == "#SBATCH":
        for option in ("--job-name", "--ntasks=16", "--time", "--output", "--signal=B:USR1@"):
            assert option in directives
        # no node count: SLURM spreads the 16 tasks over nodes of any size
        assert "--nodes" not in directives and "-N " not in directives
    else:
        assert "#$ -pe orte" in directives and "#$ -cwd" in directives
        assert "s_rt=" in directives and "h_rt=" in directives  # SIGUSR1 before the kill
    assert "--signal" in header or "s_rt" in header


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
    # small sample sizes first, then fewer processes: every row gets its baseline early
    assert full["points"][:6] == [(1, 10000), (2, 10000), (4, 10000), (8, 10000), (16, 10000),
                                  (1, 20000)]
    assert full["points"][-1] == (16, 160000)
    with pytest.raises(scaling.GridError):
        scaling.resolve(scaling.load_grid("full"), procs="1 x")
    with pytest.raises(scaling.GridError):
        scaling.load_grid("nope")


SWEEP_HEADER = ("name,scheme,processes,samples,iterations,repeat,threads,launcher,nodes,"
                "oversubscribed,status,wall_seconds,run,dir\n")


def _fake_point(run, p, s, seconds, status="ok", run_id="R1", wall=1.0, old_names=False):
    """A point as the sweep leaves it: a sweep.csv line and the scheme's summary.json in a
    directory of its own (``old_names``: as an older aepar named its times)."""
    name = f"p{p}_s{s}"
    d, k = f"points/{name}", 2
    while (run / d).exists():
        d, k = f"points/{name}.{k}", k + 1
    with open(run / "sweep.csv", "a") as f:
        f.write(f"{name},fake,{p},{s},10,1,1,mpirun,1,0,{status},{wall},{run_id},{d}\n")
    if status == "ok":
        (run / d).mkdir(parents=True)
        times = {"total_s": seconds, "compute_s": seconds * 0.8, "comm_s": seconds * 0.2,
                 "compute_per_rank_s": [seconds * (0.8 - 0.1 * r / p) for r in range(p)]}
        if old_names:
            times = {old: times[new] for old, new in scaling.OLD_SUMMARY_NAMES.items()}
        (run / d / "summary.json").write_text(json.dumps({
            "final_cost": 0.5, "iterations": 10, "evaluations": 12, "processes": p, "samples": s,
            **times, "dtype": "float64", "kernels": "numba"}))


def test_collect_computes_speedup_and_efficiency(tmp_path):
    subprocess.run([sys.executable, "-m", "bench.scaling", "points", "--procs", "1 2 4",
                    "--samples", "100 200", "--write", str(tmp_path / "grid.json"), "--run", "R1"],
                   cwd=REPO, check=True, capture_output=True)
    (tmp_path / "sweep.csv").write_text(SWEEP_HEADER)
    # an earlier run in the same directory, faster everywhere: not this run, never collected
    for p, s in [(1, 100), (2, 100), (4, 100), (1, 200), (2, 200), (4, 200), (4, 400)]:
        _fake_point(tmp_path, p, s, 0.5, run_id="R0")
    for p, s, t in [(1, 100, 8.0), (2, 100, 5.0), (4, 100, 4.0), (1, 200, 16.0), (2, 200, 8.0),
                    (2, 200, 9.0), (4, 400, 10.0)]:  # (2, 200) twice: the faster counts
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
    assert by[(2, 200)]["repeats"] == 2  # this run's two, not the earlier run's
    assert by[(4, 100)]["seconds_compute"] == "3.2000" and by[(4, 100)]["seconds_compute_fastest"] == "2.9000"


def test_collect_reads_the_older_names_of_a_points_times(tmp_path):
    # a resumed sweep keeps points an older aepar wrote (seconds_total, ...): they still count
    (tmp_path / "sweep.csv").write_text(SWEEP_HEADER)
    _fake_point(tmp_path, 1, 100, 8.0, old_names=True)
    _fake_point(tmp_path, 2, 100, 5.0)
    best = scaling.measured_points(tmp_path)
    assert set(best) == {(1, 100), (2, 100)}
    old, new = (scaling._row(best[(p, 100)], None, None, {}) for p in (1, 2))
    assert old["seconds"] == "8.0000" and old["seconds_compute"] == "6.4000" and old["seconds_comm"] == "1.6000"
    assert old["seconds_compute_fastest"] == "6.4000" and new["seconds_compute_fastest"] == "3.7500"


def test_time_left_fits_the_finished_points(tmp_path):
    # start-up 2 s, compute 1e-4 s per sample per rank and iteration: the fit finds both
    plan = [("p1_s1000", 1, 1000, 10), ("p2_s1000", 2, 1000, 10), ("p1_s4000", 1, 4000, 10),
            ("p2_s4000", 2, 4000, 10), ("p4_s8000", 4, 8000, 10)]
    (tmp_path / "plan.tsv").write_text("".join(f"{n} {p} {s} {i} {p} 1 8\n" for n, p, s, i in plan))
    (tmp_path / "grid.json").write_text(json.dumps({"run": "R1"}))

    def finished(k, compute):
        (tmp_path / "sweep.csv").write_text(SWEEP_HEADER)
        for n, p, s, i in plan[:k]:
            _fake_point(tmp_path, p, s, compute(p, s, i), wall=2 + compute(p, s, i))
        _fake_point(tmp_path, 4, 8000, 1.0, run_id="R0", wall=999)  # another run's: ignored

    finished(0, None)
    assert scaling.time_left(tmp_path, 0) is None
    finished(3, lambda p, s, i: 1e-4 * s / p * i)
    seconds, points = scaling.time_left(tmp_path, 3)
    assert points == 2 and seconds == pytest.approx((2 + 2.0) + (2 + 2.0), rel=1e-6)
    # one point is enough: its start-up is its wall time less the scheme's own
    seconds, points = scaling.time_left(tmp_path, 1)
    assert points == 4 and seconds == pytest.approx(4 * 2 + 1e-4 * 10 * (500 + 4000 + 2000 + 2000), rel=1e-6)
    # two ranks no faster than one (a busy node): the whole-work term finds it
    finished(3, lambda p, s, i: 1e-4 * s * i)
    seconds, points = scaling.time_left(tmp_path, 3)
    assert points == 2 and seconds == pytest.approx((2 + 4.0) + (2 + 8.0), rel=1e-6)
    # ranks beyond the node's cores stretch a point: 4 ranks on 2 cores take twice as long
    (tmp_path / "plan.tsv").write_text("p1_s1000 1 1000 10 1 1 2\np4_s4000 4 4000 10 4 1 2\n")
    finished(1, lambda p, s, i: 1e-4 * s / p * i)
    assert scaling.time_left(tmp_path, 1)[0] == pytest.approx(2 + 1.0 * 2, rel=1e-6)
    out = subprocess.run([sys.executable, "-m", "bench.scaling", "eta", str(tmp_path), "--done", "1"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "about 4s left (1 point)"


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
    # MAXPROCS=2: the grid is clipped up front, and the log says so
    assert "clipped to the allocation's 2 tasks: 2 point(s) with 4 processes are skipped" in proc.stdout
    assert "p1_s2000 (1/3) ok" in proc.stdout and "left (2 points)" in proc.stdout
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
    t = {p: json.loads((out / "points" / f"p{p}_s2000" / "summary.json").read_text())["total_s"]
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
    assert "p1_s2000 (1/1) FAILED: rc=1" in proc.stdout
    rec = _csv(out / "sweep.csv")
    assert rec[0]["status"].startswith("failed")
    assert _csv(out / "strong.csv") == []


# ------------------------------------------------------------------ with a stand-in scheme
FAKE_SCHEME = '''"""Stand-in for aepar's schemes: sleeps --sleep x samples/1000/processes seconds, then
writes summary.json into --out, which must not exist; on SIGUSR1 keeps --out with a
checkpoint and exits 75, as aepar's schemes do."""
import argparse, json, os, signal, sys, time
import aepar.comm  # MPI's options as aepar's schemes set them (OMPI_MCA_btl)
from mpi4py import MPI

p = argparse.ArgumentParser()
p.add_argument("--limit", dest="samples", type=int, required=True)  # the patches, as aepar.sparse names them
for a in ("--iterations", "--seed"):
    p.add_argument(a, type=int, required=True)
p.add_argument("--out", required=True)
p.add_argument("--quiet", action="store_true")
p.add_argument("--sleep", type=float, default=0.0)
a = p.parse_args()
comm = MPI.COMM_WORLD
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
print("ready", flush=True)
t0 = time.time()
while time.time() < t0 + a.sleep * a.samples / 1000 / comm.size:
    if stop:
        if comm.rank == 0:
            os.makedirs(a.out)
            open(os.path.join(a.out, "checkpoint.h5"), "w").close()
        sys.exit(75)
    time.sleep(0.02)
comm.Barrier()
if comm.rank == 0:
    os.makedirs(a.out)
    t = time.time() - t0
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"final_cost": 0.5, "iterations": a.iterations, "evaluations": a.iterations + 1,
                   "processes": comm.size, "samples": a.samples, "total_s": t,
                   "compute_s": t, "comm_s": 0.0, "seed": a.seed}, f)
'''


@pytest.fixture
def fake(tmp_path):
    """run(out, **env) -> CompletedProcess of the sweep with the stand-in scheme."""
    (tmp_path / "fakescheme.py").write_text(FAKE_SCHEME)

    def env(out, **extra):
        extra = {"SCHEME": "fakescheme", "ARGS": "--sleep 0.2", "PROCS": "1 2", "SAMPLES": "1000",
                 "ITERS": "10", "REPORT": "0", "OUT": str(out), **extra}
        e = _env(**extra)
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), e.get("PYTHONPATH")]))
        return e

    def run(out, **extra):
        return subprocess.run(["bash", str(REPO / "jobs" / "sparse_scaling.sh")], cwd=REPO,
                              env=env(out, **extra), capture_output=True, text=True, timeout=180)
    run.env = env
    return run


def _rows(out):
    run_id = json.loads((out / "grid.json").read_text())["run"]
    return run_id, [r for r in _csv(out / "sweep.csv") if r["run"] == run_id]


@pytest.mark.mpi
def test_sigusr1_stops_the_sweep_and_a_resubmission_runs_the_rest(fake, tmp_path):
    out = tmp_path / "run"
    env = fake.env(out, PROCS="1", SAMPLES="1000 2000 4000", ARGS="--sleep 2")
    sweep = subprocess.Popen(["bash", str(REPO / "jobs" / "sparse_scaling.sh")], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    log = out / "logs" / "p1_s2000.log"
    while not (log.exists() and "ready" in log.read_text()):  # the second point is running
        assert sweep.poll() is None and time.time() < deadline, "the second point never started"
        time.sleep(0.1)
    sweep.send_signal(signal.SIGUSR1)  # as SLURM's --signal=B:USR1@120 does
    text = sweep.communicate(timeout=60)[0]
    assert sweep.returncode == 75, text
    assert "SIGUSR1: no new points; sending SIGUSR1 to the running point" in text
    assert "p1_s2000 (2/3) INTERRUPTED: rc=75 (checkpoint saved)" in text
    assert "resubmit with OUT=" in text
    run_id, rows = _rows(out)
    assert [(r["name"], r["status"].split()[0]) for r in rows] == [("p1_s1000", "ok"),
                                                                  ("p1_s2000", "interrupted")]
    assert (out / "points" / "p1_s2000" / "checkpoint.h5").exists()
    assert [r["processes"] for r in _csv(out / "strong.csv")] == ["1"]  # what finished

    # the same command again: the finished point is kept, the rest runs, the interrupted
    # point in a directory of its own (its checkpoint stays)
    proc = subprocess.run(["bash", str(REPO / "jobs" / "sparse_scaling.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"OUT holds run {run_id} with these settings: its finished points are kept" in proc.stdout
    assert "1 point run(s) already finished" in proc.stdout and "2 point run(s) to go" in proc.stdout
    again, rows = _rows(out)
    assert again == run_id
    done = {r["name"]: r["dir"] for r in rows if r["status"] == "ok"}
    assert done == {"p1_s1000": "points/p1_s1000", "p1_s2000": "points/p1_s2000.2",
                    "p1_s4000": "points/p1_s4000"}
    assert (out / "points" / "p1_s2000" / "checkpoint.h5").exists()
    assert sorted(int(r["samples"]) for r in _csv(out / "strong.csv")) == [1000, 2000, 4000]


@pytest.mark.mpi
def test_other_parameters_or_scheduler_reuse_nothing(fake, tmp_path):
    out = tmp_path / "run"
    first = fake(out)
    assert first.returncode == 0, first.stdout + first.stderr
    run1, _ = _rows(out)
    # ITERS=20 where ITERS=10 ran: a new run, every point again, only its rows collected
    second = fake(out, ITERS="20")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "with other settings (iterations=10 -> iterations=20): a new run there" in second.stdout
    run2, rows = _rows(out)
    assert run2 != run1 and len(rows) == 3
    assert {r["dir"] for r in rows} == {"points/p1_s1000.2", "points/p2_s1000.2", "points/p2_s2000.2"}
    assert {r["iterations"] for r in _csv(out / "strong.csv") + _csv(out / "weak.csv")} == {"20"}
    # the same settings under Grid Engine (job 4): another scheduler's run, reused nothing
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text(f"{socket.gethostname()} 2 all.q@{socket.gethostname()} UNDEFINED\n")
    third = fake(out, ITERS="20", PE_HOSTFILE=str(hostfile), NSLOTS="2", JOB_ID="4")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "Grid Engine job 4: 2 slots" in third.stdout
    assert "-> where=sge:" in third.stdout and "nothing of it reused" in third.stdout
    assert "mpirun starts 2 rank(s) on 1 node(s) (the largest point)" in third.stdout
    run3, rows = _rows(out)
    assert run3.startswith("sge-4@") and len(rows) == 3
    assert all(r["dir"].endswith(".3") for r in rows)
    # RESUME=0: the same settings again, still a new run
    fourth = fake(out, ITERS="20", PE_HOSTFILE=str(hostfile), NSLOTS="2", JOB_ID="4", RESUME="0",
                  PROCS="1")
    assert "RESUME=0: a new run" in fourth.stdout and _rows(out)[0] != run3


def test_default_out_is_the_jobs_own(tmp_path):
    (tmp_path / "sge-4").mkdir()  # SLURM's or an earlier cluster's job 4 is not this job 4

    def default_out(jobtag, **env):
        script = f". {REPO}/jobs/lib.sh; JOBTAG={jobtag}; aepar_default_out {tmp_path}"
        return subprocess.run(["bash", "-c", script], env=_env(**env), capture_output=True,
                              text=True, check=True).stdout.strip()
    assert default_out("slurm-4") == f"{tmp_path}/slurm-4"
    other = default_out("sge-4")
    assert other.startswith(f"{tmp_path}/sge-4-") and not os.path.exists(other)
    assert default_out("sge-4", RESTARTED="1") == f"{tmp_path}/sge-4"  # a restarted job comes back
    assert default_out("slurm-4", SLURM_RESTART_COUNT="1") == f"{tmp_path}/slurm-4"


def test_a_directory_that_is_not_a_sweep_is_refused(fake, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = fake(out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"sparse_scaling: error: OUT={out} exists and is not a sweep directory (no run.key): name a new one"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_launcher_that_cannot_start_the_largest_point_stops_the_sweep(fake, tmp_path):
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text(f"{socket.gethostname()} 2 all.q@{socket.gethostname()} UNDEFINED\n")
    out = tmp_path / "run"
    proc = fake(out, PE_HOSTFILE=str(hostfile), NSLOTS="2", JOB_ID="5", MPIRUN="false")
    assert proc.returncode == 2
    assert "sparse_scaling: error: mpirun cannot start 2 rank(s) on" in proc.stderr
    assert not any((out / "points").iterdir())


FLAKY_MPIRUN = """#!/bin/bash
# fails as Open MPI's launcher now and then does, before any rank starts: on the first call
if [ ! -e "$0.called" ]; then
  : >"$0.called"
  echo "The PMIx server's listener thread failed to start. We cannot"
  exit 213
fi
exec {mpirun} "$@"
"""


def test_a_launch_that_fails_before_the_program_starts_is_tried_once_more(fake, tmp_path):
    mpirun = tmp_path / "flaky-mpirun"
    mpirun.write_text(FLAKY_MPIRUN.format(mpirun=os.environ.get("MPIRUN") or Path(sys.executable).with_name("mpirun")))
    mpirun.chmod(0o755)
    out = tmp_path / "run"
    proc = fake(out, PROCS="1", MPIRUN=str(mpirun))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the launcher failed before the program started (rc=213" in proc.stdout
    assert [r["status"] for r in _rows(out)[1]] == ["ok"]
    assert "PMIx server" in (out / "logs" / "p1_s1000.launch-failed.log").read_text()
    # a failure of the program itself is its own: not launched again
    mpirun.write_text("#!/bin/bash\nexit 2\n")
    proc = fake(tmp_path / "run2", PROCS="1", MPIRUN=str(mpirun))
    assert proc.returncode == 1 and "launching it once more" not in proc.stdout


def test_textbook_peer_agrees_and_writes_peers_csv(tmp_path):
    out = tmp_path / "peers.csv"
    proc = subprocess.run([sys.executable, "-m", "bench.textbook_sparse", "--samples", "1000",
                           "--iterations", "15", "--out", str(out)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["implementation"]: r for r in _csv(out)}
    # the cost/gradient alone, with the model's blocks and with one: what the same bits cost
    for key in ("aepar cost/gradient, blocks of 128", "aepar cost/gradient, one block"):
        r = rows.pop(key)
        assert float(r["gflop_per_evaluation"]) == pytest.approx(0.016)
        runs = [float(t) for t in r["all_seconds"].split()]
        assert len(runs) == int(r["repeats"]) == 3 and float(r["seconds_per_evaluation"]) > 0
    assert set(rows) == {"textbook", "aepar", "aepar lbfgs", "aepar float32"}
    for r in rows.values():
        assert float(r["seconds"]) > 0 and float(r["dgemm_peak_gflops"]) > 0
        assert 0 < float(r["optimizer_ms_per_evaluation"]) * 1e-3 * int(r["evaluations"]) < float(r["seconds"])
        # 10·m·v·h FLOPs per evaluation at m = 1000, v = 64, h = 25
        assert float(r["gflop_per_evaluation"]) == pytest.approx(0.016)
        runs = [float(t) for t in r["all_seconds"].split()]
        assert len(runs) == int(r["repeats"]) == 3 and float(r["seconds"]) == pytest.approx(min(runs), abs=6e-4)
        # the speedup is the ratio of the seconds as written (not of unrounded times)
        speedup = float(rows["textbook"]["seconds"]) / float(r["seconds"])
        assert float(r["speedup_vs_textbook"]) == round(speedup, 2)
    # same function, same start, same optimiser: the same minimum to a few digits
    assert float(rows["aepar"]["final_cost"]) == pytest.approx(float(rows["textbook"]["final_cost"]), rel=1e-3)
    # aepar's L-BFGS takes its own steps to about the same cost
    assert float(rows["aepar lbfgs"]["final_cost"]) == pytest.approx(float(rows["aepar"]["final_cost"]), rel=0.05)
    # float32 (the sparse command's default) parts from float64 by its rounding only
    assert float(rows["aepar float32"]["final_cost"]) == pytest.approx(float(rows["aepar"]["final_cost"]), rel=1e-2)
    assert float(rows["aepar float32"]["sgemm_peak_gflops"]) > 0


@pytest.mark.parametrize("script, prefix, wanted", [
    ("jobs/train.sh", "#SBATCH", ["--requeue", "--signal=B:USR1@", "--cpus-per-task=", "--mem=", "--time=",
                                  "--output=", "--open-mode=append"]),
    ("jobs/starcluster/train.sge", "#$", ["-r y", "-notify", "s_rt=", "h_rt=", "-pe orte", "-cwd"])])
def test_train_directives_ask_for_requeue_and_the_signal(script, prefix, wanted):
    lines = (REPO / script).read_text().splitlines()
    first_cmd = next(i for i, l in enumerate(lines) if l.strip() and not l.startswith("#"))
    directives = "\n".join(l for l in lines[:first_cmd] if l.startswith(prefix))
    assert not any(l.startswith(prefix) for l in lines[first_cmd:])
    for option in wanted:
        assert option in directives, option


def _train(cwd, *args, **env):
    return subprocess.run(["bash", str(REPO / "jobs" / "train.sh"), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=_env(NP="1", **env), timeout=240)


def test_train_script_starts_a_run_and_finds_it_complete_the_second_time(tmp_path):
    args = ["greedy", "--dataset", "mnist5k", "--layers", "784-16-8", "--epochs", "1", "--finetune-epochs", "0",
            "--limit", "300", "--quiet", "--out", "run"]
    mpirun = tmp_path.parent / f"{tmp_path.name}-flaky-mpirun"  # fails once, before any rank starts
    mpirun.write_text(FLAKY_MPIRUN.format(mpirun=os.environ.get("MPIRUN") or Path(sys.executable).with_name("mpirun")))
    mpirun.chmod(0o755)
    first = _train(tmp_path, *args, MPIRUN=str(mpirun))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "the launcher failed before aepar.greedy started (rc=213): launching it once more" in first.stdout
    assert "aepar.greedy --dataset mnist5k" in first.stdout and "--resume-or-start: 1 rank(s)" in first.stdout
    marker = json.loads((tmp_path / "run" / "run.json").read_text())
    assert marker["state"] == "complete" and "--resume-or-start" in marker["argv"]
    again = _train(tmp_path, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "aepar.greedy: run holds this run, complete: nothing to do" in again.stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == marker  # not run again


@pytest.mark.parametrize("args, message", [
    (["resnet"], "no program or scheme 'resnet'"),
    (["greedy", "--resume", "run"], "--resume: the job starts or continues its run by itself"),
    ([], "usage: train.sh SCHEME")])
def test_train_script_refuses_an_unknown_scheme_or_resume(tmp_path, args, message):
    r = _train(tmp_path, *args)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.mpi
def test_repeats_run_the_grid_in_rounds(fake, tmp_path):
    """REPEATS=2: the whole grid once per round (a slow minute of a shared machine then hits
    one round, not both runs of one point); strong.csv has a row per point from both runs."""
    out = tmp_path / "run"
    proc = fake(out, ARGS="--sleep 0.05", REPEATS="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, rows = _rows(out)
    assert [r["name"] for r in rows] == ["p1_s1000_r1", "p2_s1000_r1", "p2_s2000_r1",
                                         "p1_s1000_r2", "p2_s1000_r2", "p2_s2000_r2"]
    strong = _csv(out / "strong.csv")
    assert {r["repeats"] for r in strong} == {"2"} and len(strong) == 2
