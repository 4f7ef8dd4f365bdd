"""bench.eager's verdicts, computed from made-up rows: each verdict as the numbers give it,
and one wrong number planted per verdict that must turn it; runs reused from --work keep
the date they ran on."""
import argparse
import datetime
import json
import os
import time

import pytest

from bench import eager

# validation accuracy per seed and epoch: the parallel CAEs ahead at epochs 1-3 (mean gaps
# +8, +5, +2 points), half a point ahead at each method's last epoch (parallel 5, the
# monolithic CAE stopped by patience at 4)
PARALLEL = {0: [0.80, 0.85, 0.88, 0.90, 0.91], 1: [0.78, 0.84, 0.87, 0.89, 0.905]}
VOTE = {0: [0.75, 0.83, 0.87, 0.90, 0.91], 1: [0.74, 0.82, 0.86, 0.89, 0.905]}
MONO = {0: [0.70, 0.80, 0.86, 0.905], 1: [0.72, 0.79, 0.85, 0.90]}
# effective seconds when each epoch was classified
PARALLEL_S = [10.0, 20.0, 30.0, 40.0, 50.0]
MONO_S = [15.0, 35.0, 55.0, 75.0]


def rows(parallel=PARALLEL, vote=VOTE, mono=MONO, mono_s=MONO_S):
    out = []
    for method, accs, times in (("parallel", parallel, PARALLEL_S), ("vote", vote, PARALLEL_S),
                                ("mono", mono, mono_s)):
        for seed, curve in accs.items():
            out += [dict(seed=seed, method=method, epoch=e, validation_accuracy=a, effective_s=t)
                    for e, (a, t) in enumerate(zip(curve, times), start=1)]
    return out


def planted(accs, seed, epoch, value):
    """``accs`` with one accuracy replaced."""
    out = {s: list(c) for s, c in accs.items()}
    out[seed][epoch - 1] = value
    return out


def test_the_gaps_behind_the_verdicts():
    v = eager.verdict(rows())
    assert {e: pytest.approx(g) for e, g in v["low"].items()} == {1: [10.0, 6.0], 2: [5.0, 5.0], 3: [2.0, 2.0]}
    assert v["low_mean"] == pytest.approx(5.0)
    assert v["final_epochs"] == ({0: 5, 1: 5}, {0: 4, 1: 4})
    assert v["last"] == pytest.approx([0.5, 0.5]) and v["last_mean"] == pytest.approx(0.5)
    # the last epoch both classified: 4, where the parallel CAEs are still behind
    assert v["last_common"] == 4 and v["last_common_gaps"] == pytest.approx([-0.5, -1.0])
    assert v["vote_low"][1] == pytest.approx([5.0, 2.0])


def test_parallel_ahead_at_low_epochs():
    assert eager.verdict(rows())["ahead_low"] is True
    # one seed behind at epoch 3 but the mean over seeds still ahead (-1 and +2): still holds
    assert eager.verdict(rows(mono=planted(MONO, 0, 3, 0.89)))["ahead_low"] is True
    # planted: the monolithic CAE ahead at epoch 2 for both seeds
    behind = planted(planted(MONO, 0, 2, 0.95), 1, 2, 0.90)
    v = eager.verdict(rows(mono=behind))
    assert v["ahead_low"] is False and sum(v["low"][2]) < 0


def test_no_low_epoch_classified_for_both_is_not_ahead():
    only_late = [r for r in rows() if r["epoch"] > 3]
    v = eager.verdict(only_late)
    assert v["low"] == {} and v["ahead_low"] is False and v["low_mean"] is None and v["narrowed"] is False


def test_converged_by_the_last_epoch():
    assert eager.verdict(rows())["converged"] is True
    # planted: seed 0's parallel CAEs 2.5 points ahead at their last epoch: mean gap 1.5 > 1
    v = eager.verdict(rows(parallel=planted(PARALLEL, 0, 5, 0.93)))
    assert v["last_mean"] == pytest.approx(1.5) and v["converged"] is False
    # the other side counts as much: 1.5 points behind
    v = eager.verdict(rows(parallel=planted(planted(PARALLEL, 0, 5, 0.89), 1, 5, 0.885)))
    assert v["last_mean"] == pytest.approx(-1.5) and v["converged"] is False


def test_gap_narrowed_from_the_low_epochs():
    assert eager.verdict(rows())["narrowed"] is True  # +5 at epochs 1-3, +0.5 at the last
    # planted: the last epochs 6 points behind, wider than the +5 at epochs 1-3
    v = eager.verdict(rows(parallel=planted(planted(PARALLEL, 0, 5, 0.845), 1, 5, 0.84)))
    assert v["last_mean"] == pytest.approx(-6.0) and v["narrowed"] is False


def test_gaps_at_equal_effective_time():
    """Parallel interpolated at the monolithic CAE's epoch-1/2/3 times: 15 s lies halfway
    between its epochs 1 and 2."""
    timed = eager.timed_gaps(rows())
    assert timed[1] == pytest.approx([100 * (0.825 - 0.70), 100 * (0.81 - 0.72)])
    assert timed[2] == pytest.approx([9.0, 9.0])  # 35 s: halfway between epochs 3 and 4
    assert 3 not in timed  # 55 s: past the parallel curve's last point (50 s), every seed left out
    # planted: the monolithic CAE's epoch 1 before the parallel curve starts: left out, not extrapolated
    assert 1 not in eager.timed_gaps(rows(mono_s=[5.0, *MONO_S[1:]]))


def test_final_rows_take_each_methods_last_classified_epoch():
    late = rows(mono=planted(MONO, 1, 4, None))  # seed 1's epoch 4 not classified: its epoch 3 counts
    assert {s: r["epoch"] for s, r in eager.final_rows(late, "mono").items()} == {0: 4, 1: 3}


def test_mean_and_spread_of_the_seeds():
    assert eager.stats([0.5, None, 0.7]) == (pytest.approx(0.6), 0.5, 0.7, 2)
    assert eager.stats([None]) is None
    assert eager.ms((0.6, 0.5, 0.7, 2), 100) == "60.00 ± 10.00"
    assert eager.ms((0.6, 0.6, 0.6, 1), 100) == "60.00" and eager.ms(None) == "–"


def verdict_words(v):
    text = "\n".join(eager.verdict_lines("Small", v, "small"))
    ahead = next(line for line in text.splitlines() if "*Parallel ahead" in line)
    converged = next(line for line in text.splitlines() if "*The two converged" in line)
    return ahead, converged


def test_the_verdict_lines_say_what_the_numbers_give():
    ahead, converged = verdict_words(eager.verdict(rows()))
    assert ahead.endswith("**holds**.") and "**holds**; the gap narrowed from +5.00" in converged
    behind_at_2 = planted(planted(MONO, 0, 2, 0.95), 1, 2, 0.90)
    ahead, _ = verdict_words(eager.verdict(rows(mono=behind_at_2)))
    assert ahead.endswith("**does not hold**.")
    far_behind_last = planted(planted(PARALLEL, 0, 5, 0.845), 1, 5, 0.84)
    _, converged = verdict_words(eager.verdict(rows(parallel=far_behind_last)))
    assert "**does not hold**; the gap did not narrow" in converged


def study_text(tmp_path, monkeypatch, verdicts, dates=("2020-01-02 03:04",)):
    monkeypatch.setattr(eager, "RESULTS", tmp_path)
    monkeypatch.setattr(eager.sys, "argv", ["bench.eager"])
    eager.study([], verdicts, [], argparse.Namespace(np=2), list(dates))
    return (tmp_path / "eager_study.md").read_text()


def test_the_regimes_claims(tmp_path, monkeypatch):
    small = eager.verdict(rows())
    # the large regime: converged, and its low-epoch gap (+0.5) smaller than the small one's (+5)
    large = eager.verdict(rows(parallel={s: [a - d for a, d in zip(c, (0.075, 0.045, 0.015, 0, 0))]
                                         for s, c in PARALLEL.items()}))
    assert large["low_mean"] == pytest.approx(0.5)
    text = study_text(tmp_path, monkeypatch, {"small": small, "large": large})
    assert "(parallel ahead at low epochs with little data) **holds** here." in text
    assert "(with more data the two converge) **holds** here. The low-epoch gap is smaller than" in text
    # planted: the large regime's gap wider (+8 at every low epoch) and not converged
    wide = eager.verdict(rows(parallel={s: [a + d for a, d in zip(c, (0, 0.03, 0.06, 0, 0.02))]
                                        for s, c in PARALLEL.items()}))
    text = study_text(tmp_path, monkeypatch, {"small": small, "large": wide})
    assert "(with more data the two converge) **does not hold** here. The low-epoch gap is not smaller" in text


# ---- reused runs keep their own dates ----------------------------------------------------------
def summary(seed=0):
    """A made-up aepar.eager summary.json: 2 CAEs in 2 groups, 2 epochs, the monolithic CAE 1."""
    acc = lambda v: {"validation": v, "test": v - 0.01, "time_s": 0.5}  # noqa: E731
    mono = {"epoch": 1, "validation": 0.7, "test": 0.69, "effective_s": 4.5}
    epochs = [{"val_loss": 3.0, "cum_s": 1.0}, {"val_loss": 2.0, "cum_s": 2.0}]
    return {"records": {"model0": {"epochs": epochs}, "model1": {"epochs": epochs},
                        "mono": {"epochs": [{"val_loss": 2.5, "cum_s": 4.0}]}},
            "models": 2, "groups": 2, "curve": [{"epoch": 1, "combined": acc(0.8), "vote": acc(0.78), "mono": mono}],
            "final": {"picked_epochs": {"model0": 2, "model1": 2}, "combined": acc(0.85), "vote": acc(0.84),
                      "mono": mono},
            "source": "mnist5k:embedded", "seed": seed, "n_train": 10, "n_validation": 5, "n_test": 5, "ranks": 2,
            "filters": [2, 4], "mono_filters": [4, 8], "machine": {"hostname": "made-up"}}


def done_run(work, name, finished, launch_date=None, seed=0):
    """An earlier run in ``work``: its summary.json, its own run.json (aepar's marker, local
    time with its offset) and, if given, bench.eager's launch record."""
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary(seed)))
    stamp = finished.astimezone().isoformat(timespec="seconds")
    (out / "run.json").write_text(json.dumps({"format": "aepar-run", "started": stamp, "updated": stamp}))
    if launch_date:
        (work / f"{name}.launch.json").write_text(json.dumps({"command": "x", "wall_s": 12.0, "date": launch_date}))


def fail_if_launched(*args, **kwargs):
    raise AssertionError("a reused run was launched again")


def test_a_stopped_run_goes_on_from_its_checkpoint(tmp_path, monkeypatch):
    """A run an earlier call left without summary.json (stopped by Ctrl-C or a time limit)
    is continued with --resume-or-start, its directory kept, not deleted and started over."""
    launched = []

    def finish(prog, name, cmd, out, env, cwd):
        launched.append([str(c) for c in cmd])
        done_run(tmp_path, name, datetime.datetime(2020, 1, 2, 3, 4, 5))
    monkeypatch.setattr(eager.common, "run_to_end", finish)
    (tmp_path / "large-seed0").mkdir()
    (tmp_path / "large-seed0" / "checkpoint.h5").write_text("an earlier stretch's")
    summary, meta = eager.launch(["--preset", "full"], 2, tmp_path, "large-seed0", 1)
    cmd, = launched
    assert "--resume-or-start" in cmd and cmd[cmd.index("--out") + 1] == str(tmp_path / "large-seed0")
    assert (tmp_path / "large-seed0" / "checkpoint.h5").exists() and meta["wall_s"] is None


def test_a_reused_run_keeps_its_own_date(tmp_path, monkeypatch):
    monkeypatch.setattr(eager.common, "run_to_end", fail_if_launched)
    done_run(tmp_path, "small-seed0", datetime.datetime(2020, 1, 2, 3, 4, 5))
    done_run(tmp_path, "small-seed1", datetime.datetime(2020, 1, 2, 3, 4, 5), launch_date="2019-05-06 07:08")
    # no launch record: the run's own run.json says when it ran
    assert eager.launch([], 2, tmp_path, "small-seed0", 1)[1]["date"] == "2020-01-02 03:04"
    # a launch record: its date
    assert eager.launch([], 2, tmp_path, "small-seed1", 1)[1]["date"] == "2019-05-06 07:08"
    # no run.json either: when its summary.json was written
    (tmp_path / "small-seed0" / "run.json").unlink()
    written = time.mktime((2021, 3, 4, 5, 6, 0, 0, 0, -1))
    os.utime(tmp_path / "small-seed0" / "summary.json", (written, written))
    assert eager.launch([], 2, tmp_path, "small-seed0", 1)[1]["date"] == "2021-03-04 05:06"


def test_reused_runs_rows_and_study_carry_their_dates_not_today(tmp_path, monkeypatch):
    monkeypatch.setattr(eager.common, "run_to_end", fail_if_launched)
    monkeypatch.setattr(eager, "figures", lambda *args: [])
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(eager, "RESULTS", results)
    work = tmp_path / "work"
    done_run(work, "small-seed0", datetime.datetime(2020, 1, 2, 3, 4, 5))
    done_run(work, "small-seed1", datetime.datetime(2020, 1, 2, 3, 4, 5), launch_date="2020-01-05 07:08", seed=1)
    args = argparse.Namespace(np=2)
    rows, runs = eager.run_regime("small", ["--preset", "small"], [0, 1], args, work)
    lines, v, dates = eager.publish_regime("small", "Small", ["--preset", "small"], [0, 1], work, rows, runs)
    assert dates == ["2020-01-02 03:04", "2020-01-05 07:08"]
    csv = (results / "eager_small.csv").read_text().splitlines()
    column = csv[0].split(",").index("date")
    assert {(line.split(",")[2], line.split(",")[column]) for line in csv[1:]} == {
        ("0", "2020-01-02 03:04"), ("1", "2020-01-05 07:08")}
    assert "- `small-seed0`: time unknown (reused or continued), run 2020-01-02 03:04" in lines
    assert "- `small-seed1`: 12 s, run 2020-01-05 07:08" in lines
    monkeypatch.setattr(eager.sys, "argv", ["bench.eager"])
    eager.study([lines], {"small": v}, [], args, dates)
    text = (results / "eager_study.md").read_text()
    assert "measured from 2020-01-02 to 2020-01-05 by" in text
    assert time.strftime("%Y-%m-%d") not in text


def test_runs_recorded_elsewhere_are_read_back_with_their_own_machine(tmp_path, monkeypatch):
    """--records: the study done in pieces. A run recorded by an earlier job (another clone,
    another CPU) is not launched again; its rows and the study name its machine; a run done
    here is recorded for the next job."""
    monkeypatch.setattr(eager, "figures", lambda *args: [])
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(eager, "RESULTS", results)
    records = eager.common.Records("bench.eager", tmp_path / "records")
    elsewhere = dict(summary(0), machine={"cpu_model": "Another CPU"})
    records.keep("small-seed0", ["--preset", "small", "--seed", 0], 2, elsewhere,
                 {"command": "x", "wall_s": 30.0, "date": "2026-01-02 03:04"})
    work = tmp_path / "work"

    def finish(prog, name, cmd, out, env, cwd):
        assert name == "small-seed1", "a recorded run was launched again"
        done_run(work, name, datetime.datetime(2026, 1, 3, 3, 4, 5), seed=1)
    monkeypatch.setattr(eager.common, "run_to_end", finish)
    args = argparse.Namespace(np=2)
    rows, runs = eager.run_regime("small", ["--preset", "small"], [0, 1], args, work, "", records)
    assert {r["cpu_model"] for r in rows if r["seed"] == 0} == {"Another CPU"}
    assert json.loads((tmp_path / "records" / "small-seed1.json").read_text())["summary"]["seed"] == 1
    lines, v, dates = eager.publish_regime("small", "Small", ["--preset", "small"], [0, 1], work, rows, runs)
    assert "- `small-seed0`: 30 s, run 2026-01-02 03:04 on Another CPU" in lines
    monkeypatch.setattr(eager.sys, "argv", ["bench.eager"])
    eager.study([lines], {"small": v}, [], args, dates, [meta["machine"] for _, meta in runs])
    head = (results / "eager_study.md").read_text().splitlines()[2]
    assert head.startswith("Machines (each run's is listed under its regime): ") and "Another CPU" in head


def test_the_days_of_the_runs():
    assert eager.common.dates_text(["2020-01-02 03:04", "2020-01-02 09:00"]) == "on 2020-01-02"
    assert eager.common.dates_text(["2020-01-05 07:08", None, "2020-01-02 03:04"]) == "from 2020-01-02 to 2020-01-05"
    assert eager.common.dates_text([None]) == "on unknown dates"


def test_a_reused_run_of_an_older_aepar_gives_the_same_rows():
    # its epoch records name the cumulative seconds "cum_seconds"
    old = summary()
    old["records"] = {n: {"epochs": [{"val_loss": e["val_loss"], "cum_seconds": e["cum_s"]} for e in r["epochs"]]}
                      for n, r in old["records"].items()}
    assert eager.run_rows("small", old) == eager.run_rows("small", summary())


def test_a_study_stopped_half_way_leaves_the_results_as_they_were(tmp_path, monkeypatch):
    """The small regime's runs are done, the large regime's first run is stopped (Ctrl-C, exit
    75): nothing is written into --results, not even the finished regime's CSV and figures,
    which would then disagree with the study beside them; the same command goes on later."""
    def stop(prog, name, cmd, out, env, cwd):
        raise SystemExit(75)
    monkeypatch.setattr(eager.common, "run_to_end", stop)
    monkeypatch.setattr(eager, "FASHION", tmp_path)  # "installed"
    monkeypatch.setattr(eager, "RESULTS", eager.RESULTS)  # main() points it at --results
    work, results = tmp_path / "work", tmp_path / "results"
    results.mkdir()
    done_run(work, "small-seed0", datetime.datetime(2020, 1, 2, 3, 4, 5))
    with pytest.raises(SystemExit):
        eager.main(["--stages", "small,large", "--seeds", "0", "--large-seeds", "0", "--work", str(work),
                    "--results", str(results)])
    assert list(results.iterdir()) == []
