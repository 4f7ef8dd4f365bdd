"""bench.handoff: each way runs its rounds in a process of its own and writes a row with the
machine; a rerun replaces that machine's rows; impossible options end with one line."""
import csv

import pytest

from bench import handoff


def test_rows_per_way_and_a_rerun_replaces_them(tmp_path, capsys):
    out = tmp_path / "handoff.csv"
    for _ in range(2):
        assert handoff.main(["--ways", "parallel_map,team", "--rounds", "20", "--share-us", "20",
                             "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [r["way"] for r in rows] == ["parallel_map", "team"]
    for r in rows:
        assert r["cpu_model"] and r["threads"] == "2" and float(r["share_us"]) > 0
        assert float(r["round_median_us"]) <= float(r["round_p90_us"])
        # the difference of the columns as written (each rounded to 0.1 µs)
        assert float(r["overhead_us"]) == pytest.approx(float(r["round_median_us"]) - float(r["share_us"]),
                                                       abs=1e-9)
    assert "team" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--threads", "1"], ["--rounds", "0"], ["--share-us", "0"], ["--ways", "team,pool"]])
def test_impossible_options_are_refused(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        handoff.main(argv + ["--out", str(tmp_path / "handoff.csv")])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
