"""bench.pretrain's accuracy table over seeds: one row per model, the mean and half the
min-max range of each figure, in the order the models first ran."""
import pytest

from bench.pretrain import over_seeds


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
        run = {"after": {"test": 0.9 + 0.01 * seed, "train": 0.95}, "before": {"test": 0.5}, "time_s": 2.0}
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


def test_launch_continues_a_run_left_unfinished_and_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    """A run an earlier call left without summary.json goes on from its checkpoint
    (--resume-or-start: aepar refuses a bare --out that exists); a run stopped by a signal
    (exit 75) ends the benchmark with the command that continues it."""
    import subprocess
    import types

    import bench.pretrain as bp
    calls = []

    def fake_run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        out = tmp_path / "acc-greedy"
        if code == 0:
            (out / "summary.json").write_text('{"pretrain_time_s": 1.0}')
        return types.SimpleNamespace(returncode=code, stderr="")
    monkeypatch.setattr(subprocess, "run", fake_run)
    (tmp_path / "acc-greedy").mkdir()  # an earlier call's, stopped before its summary
    code = 75
    with pytest.raises(SystemExit, match="the same command continues it"):
        bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")
    code = 0
    assert bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")["pretrain_time_s"] == 1.0
    assert all("--resume-or-start" in c and c[c.index("--out") + 1] == str(tmp_path / "acc-greedy") for c in calls)
    assert "acc-greedy: continuing" in capsys.readouterr().out
    assert bp.launch("aepar.pretrain", ["--scheme", "greedy"], 1, tmp_path, "acc-greedy")  # done: not run again
    assert len(calls) == 2
