"""bench.pretrain's accuracy table over seeds: one row per model, the mean and half the
min-max range of each figure, in the order the models first ran."""
import pytest

from bench.common import over_seeds


def test_a_row_per_model_with_the_mean_and_half_the_range_over_the_seeds():
    rows = [{"model": "greedy", "seed": s, "acc": a, "only": o} for s, a, o in ((0, 0.90, 0.5), (1, 0.94, 0.7))]
    rows += [{"model": "floor", "seed": s, "acc": a, "only": None} for s, a in ((0, 0.80), (1, 0.80))]
    table = over_seeds(rows, ["acc", "only"])
    assert [r["model"] for r in table] == ["greedy", "floor"]
    assert table[0]["acc"] == pytest.approx(0.92) and table[0]["acc_spread"] == pytest.approx(0.02)
    assert table[0]["only"] == pytest.approx(0.6) and table[0]["only_spread"] == pytest.approx(0.1)
    assert table[1]["acc_spread"] == 0.0 and table[1]["only"] is None and table[1]["only_spread"] is None


def test_the_stage_runs_every_scheme_and_the_floors_per_seed_and_writes_the_spread(tmp_path, monkeypatch):
    import bench.pretrain as bp
    launched = []

    def fake_launch(module, args, np_, work, name):
        launched.append((module, name, args[args.index("--seed") + 1]))
        seed = int(args[args.index("--seed") + 1])
        run = {"after": {"test": 0.9 + 0.01 * seed, "train": 0.95}, "before": {"test": 0.5}, "time_s": 2.0,
               "epochs": [{"epoch": e, "test_accuracy": 0.8 + 0.01 * e, "epoch_s": 1.0} for e in (1, 2, 3)]}
        floors = {k: {"after": {"test": 0.8, "train": 0.8}, "time_s": 1.0} for k in ("raw", "pca")}
        return {"classify": run, "pretrain_time_s": 3.0, "source": "fashion-mnist: 60000 train / 10000 test",
                "floors": floors}
    monkeypatch.setattr(bp, "launch", fake_launch)
    monkeypatch.setattr(bp, "RESULTS", tmp_path)
    bp.accuracy(tmp_path / "work", 30, "fashion", [0, 1, 2])
    assert len(launched) == 3 * 6 and len({name for _, name, _ in launched}) == 18  # no run reused by another
    text = (tmp_path / "pretrain_accuracy_fashion.md").read_text()
    assert "| greedy pre-training + fine-tuning | 1 | 30 + 30 | 91.00% ± 1.00 |" in text, text
    assert "Seeds 0, 1, 2: mean ± half the min-max range" in text
    assert len((tmp_path / "pretrain_accuracy_fashion.csv").read_text().splitlines()) == 1 + 3 * 8
    assert (tmp_path / "pretrain_accuracy_fashion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pretrain_accuracy_fashion.png" in text


def test_runs_read_back_from_records_keep_their_machine_and_date(tmp_path, monkeypatch):
    """--records: 15-618's table done in pieces. A recorded run is not launched again; a run
    found done in --work is recorded; every row names its own run's CPU and day, and the
    table's head names every machine."""
    import csv
    import json

    import bench.pretrain as bp

    monkeypatch.setattr(bp, "RECORDS", bp.Records("bench.pretrain", tmp_path / "records"))
    monkeypatch.setattr(bp, "run_to_end", lambda *a: (_ for _ in ()).throw(AssertionError("launched again")))
    elsewhere = {"pretrain_time_s": 3.0, "machine": {"cpu_model": "Another CPU", "isa": "avx2", "blas": "b",
                                                     "cores": 4, "mpi": "m"}}
    bp.RECORDS.keep("acc-greedy-seed0", ["aepar.pretrain", "--seed", 0], 1, elsewhere,
                    {"command": "x", "wall_s": 5.0, "date": "2026-01-02 03:04"})
    assert bp.launch("aepar.pretrain", ["--seed", 0], 1, tmp_path / "work", "acc-greedy-seed0")["_date"] == \
        "2026-01-02 03:04"
    (tmp_path / "work" / "acc-data-seed0").mkdir(parents=True)
    (tmp_path / "work" / "acc-data-seed0" / "summary.json").write_text(json.dumps({"pretrain_time_s": 2.0}))
    bp.launch("aepar.pretrain", ["--seed", 0], 2, tmp_path / "work", "acc-data-seed0")
    assert json.loads((tmp_path / "records" / "acc-data-seed0.json").read_text())["ranks"] == 2

    def fake_launch(module, args, np_, work, name):
        seed = int(args[args.index("--seed") + 1])
        run = {"after": {"test": 0.9, "train": 0.95}, "before": {"test": 0.5}, "time_s": 2.0, "epochs": []}
        floors = {k: {"after": {"test": 0.8, "train": 0.8}, "time_s": 1.0} for k in ("raw", "pca")}
        here = {"machine": {"cpu_model": "Another CPU", "isa": "avx2", "blas": "b", "cores": 4, "mpi": "m"},
                "_date": "2026-01-02 03:04"} if seed == 0 else {"_date": "2026-01-05 10:00"}
        return {"classify": run, "pretrain_time_s": 3.0, "source": "fashion-mnist: 60000 train / 10000 test",
                "floors": floors, **here}
    monkeypatch.setattr(bp, "launch", fake_launch)
    monkeypatch.setattr(bp, "RESULTS", tmp_path)
    bp.accuracy(tmp_path / "work", 30, "fashion", [0, 1])
    with open(tmp_path / "pretrain_accuracy_fashion.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["cpu"] for r in rows if r["seed"] == "0"} == {"Another CPU"}
    assert {r["cpu"] for r in rows if r["seed"] == "1"} == {bp.machine_fields()["cpu"]}
    head = (tmp_path / "pretrain_accuracy_fashion.md").read_text().splitlines()[2]
    assert head.startswith("Machines (each row's is in the CSV): ") and "Another CPU" in head
    assert "measured from 2026-01-02 to 2026-01-05 by" in head


class _FakeRun:
    """subprocess.Popen's stand-in: records the command, prints ``printed``, then exits with
    ``code`` (writing summary.json when it is 0); with ``ctrl_c`` the first read of its output
    raises KeyboardInterrupt (the terminal's Ctrl-C reaching the benchmark and its run
    together) and the run goes on to its end, as aepar does to save its checkpoint."""
    calls, code, ctrl_c, out = [], 0, False, None
    printed = ["[09:00:00] layer 1/4 epoch 1/30 reconstruction 12.3, 2m left"]

    def __init__(self, cmd, **kw):
        _FakeRun.calls.append([str(c) for c in cmd])
        self.returncode, self.stdout = None, self
        self.lines, self.waiting = list(_FakeRun.printed), _FakeRun.ctrl_c

    def __iter__(self):
        return self

    def __next__(self):
        if self.waiting:
            self.waiting = False
            raise KeyboardInterrupt
        if self.lines:
            return self.lines.pop(0) + "\n"
        if _FakeRun.code == 0:
            _FakeRun.out.mkdir(exist_ok=True)
            (_FakeRun.out / "summary.json").write_text('{"pretrain_time_s": 1.0}')
        self.returncode = _FakeRun.code
        raise StopIteration

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_launch_continues_a_run_left_unfinished_and_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    """A run an earlier call left without summary.json goes on from its checkpoint
    (--resume-or-start: aepar refuses a bare --out that exists); a run stopped by a signal
    (exit 75) ends the benchmark with the command that continues it."""
    import subprocess

    import bench.pretrain as bp
    monkeypatch.setattr(subprocess, "Popen", _FakeRun)
    monkeypatch.setattr(_FakeRun, "calls", [])
    monkeypatch.setattr(_FakeRun, "out", tmp_path / "acc-greedy")
    (tmp_path / "acc-greedy").mkdir()  # an earlier call's, stopped before its summary
    monkeypatch.setattr(_FakeRun, "code", 75)
    with pytest.raises(SystemExit) as stop:
        bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")
    assert stop.value.code == 75 and "the same command continues it" in capsys.readouterr().err
    monkeypatch.setattr(_FakeRun, "code", 0)
    assert bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")["pretrain_time_s"] == 1.0
    calls = _FakeRun.calls
    assert all("--resume-or-start" in c and c[c.index("--out") + 1] == str(tmp_path / "acc-greedy") for c in calls)
    printed = capsys.readouterr().out
    assert "acc-greedy: continuing" in printed
    assert "  acc-greedy | [09:00:00] layer 1/4 epoch 1/30 reconstruction 12.3, 2m left" in printed  # its progress
    assert bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")  # done: not run again
    assert len(calls) == 2


def test_ctrl_c_waits_for_the_run_and_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C reaches the benchmark and its run alike: the benchmark waits for the run to
    save its checkpoint (not killing it half-way), then says in one line how to go on, exit 75;
    a run that failed without a word on stderr says so rather than ending in a bare colon."""
    import subprocess

    import bench.pretrain as bp
    monkeypatch.setattr(subprocess, "Popen", _FakeRun)
    monkeypatch.setattr(_FakeRun, "out", tmp_path / "acc-greedy")
    monkeypatch.setattr(_FakeRun, "calls", [])
    monkeypatch.setattr(_FakeRun, "ctrl_c", True)
    for code, where in ((75, "with a checkpoint in"), (1, "before it had started"),
                        (0, "stopped after acc-greedy, which is complete: the same command goes on")):
        monkeypatch.setattr(_FakeRun, "code", code)
        with pytest.raises(SystemExit) as stop:
            bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")
        err = capsys.readouterr().err
        assert stop.value.code == 75 and where in err and "the same command" in err
        assert len(err.strip().splitlines()) == 1
    (tmp_path / "acc-greedy" / "summary.json").unlink()
    monkeypatch.setattr(_FakeRun, "ctrl_c", False)
    monkeypatch.setattr(_FakeRun, "code", 1)
    with pytest.raises(SystemExit, match=r"failed \(exit 1\): no message on stderr"):
        bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")


def test_a_table_names_the_mpi_its_runs_used_even_when_its_first_run_is_one_process():
    from bench.common import ONE_PROCESS
    from bench.pretrain import provenance

    machine = {"cpu": "AMD EPYC", "isa": "avx2", "blas": "openblas", "cores": 2, "date": "2026-12-06"}
    rows = [dict(machine, mpi=ONE_PROCESS), dict(machine, mpi="Open MPI v5.0.11")]
    where, when = provenance(rows)
    assert where.endswith(", Open MPI v5.0.11") and "2026-12-06" in when
    assert provenance(rows[:1])[0].endswith(", " + ONE_PROCESS)  # no run used MPI: it says so


def test_repeated_runs_go_in_rounds_and_a_row_keeps_the_fastest(tmp_path, monkeypatch):
    """--repeats: the whole grid once per round (a slow minute of a shared machine then hits
    one round, not one configuration's every run), each run under its own name; a row is
    the fastest run's, with every run's seconds beside it."""
    import bench.pretrain as bp
    launched = []
    seconds = iter([3.0, 5.0, 2.0, 6.0, 4.0, 4.5])

    def fake_launch(module, args, np_, work, name):
        launched.append((args[0], name))
        return {"pretrain_time_s": next(seconds), "name": name}
    monkeypatch.setattr(bp, "launch", fake_launch)
    grid = {"a": (["a"], 1, "run-a"), "b": (["b"], 2, "run-b")}
    runs = bp.launch_in_rounds(grid, 3, tmp_path)
    assert [args for args, _ in launched] == ["a", "b"] * 3
    assert len({name for _, name in launched}) == 6  # no run read back in place of another
    assert runs["a"][0]["name"] == "run-a-r1" and runs["a"][1] == {"repeats": 3, "all_seconds": "3.000 2.000 4.000"}
    assert runs["b"][0]["pretrain_time_s"] == 4.5 and runs["b"][1]["all_seconds"] == "5.000 6.000 4.500"


def test_the_profile_keeps_each_points_fastest_run_and_the_least_prediction(tmp_path, monkeypatch):
    """--stages profile with --repeats: every auto run and scheme run once per round; a row
    is its scheme's fastest run, beside the least of the auto runs' predictions (the
    planner's own timings taken at the machine's quiet moments, as every other figure)."""
    import bench.pretrain as bp
    from aepar.parallel.planner import SPLIT
    from aepar.report.profile import PHASES
    launched, measured = [], iter([0.9, 0.7, 0.8])
    predicted = iter([1.5, 1.1, 1.3])

    def fake_launch(module, args, np_, work, name):
        launched.append(name)
        scheme = args[args.index("--scheme") + 1]
        if scheme == "auto":
            t = next(predicted)
            return {"auto": {"predicted": {"sync": {"time_s": t, "split": dict.fromkeys(SPLIT, t / 4)}}}}
        rank = {"rank": 0, **{f"{k}_s": 0.1 for k, _ in PHASES}}
        return {"pretrain_time_s": next(measured), "profile": [rank], "name": name}
    monkeypatch.setattr(bp, "launch", fake_launch)
    monkeypatch.setattr(bp, "RESULTS", tmp_path)
    bp.profile(tmp_path / "work", runs=(("sync", 4),), repeats=3)
    assert launched == ["prof-auto-4", "prof-auto-4-r1", "prof-auto-4-r2", "prof-sync-4", "prof-sync-4-r1",
                        "prof-sync-4-r2"]
    table = (tmp_path / "pretrain_profile.md").read_text().splitlines()
    row = next(line for line in table if line.startswith("| sync"))
    assert "| 0.70 | 1.10 | 0.28 / 0.28 / 0.28 / 0.28 |" in row, row
