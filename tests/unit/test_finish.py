"""aepar.finish: what a finished run leaves behind when a figure cannot be drawn."""
import pytest

pytest.importorskip("PIL")


def test_a_run_whose_curves_hold_nothing_finite_finishes_without_the_figure(tmp_path, capsys):
    """NaN losses everywhere: metrics.png is left out with one line, the rest is written."""
    from aepar import metrics
    from aepar.comm import Comm
    from aepar.finish import finish
    from aepar.report.figures import NothingToDraw, metrics_png
    from aepar.rundir import RunDir

    rows = [dict(phase="pretrain", stage="1", epoch=str(e), train_loss="nan", val_loss="", train_error="inf",
                 val_error="") for e in (1, 2)]
    with pytest.raises(NothingToDraw, match="no finite values"):
        metrics_png(rows, tmp_path / "m.png")
    run = RunDir.open(Comm.serial(), "demo", out=str(tmp_path / "run"), argv=[])
    for e in (1, 2):
        metrics.of(run).add("pretrain", e, stage="1", train_loss=float("nan"))
    finish(run, Comm.serial(), {"scheme": "demo"}, prog="demo", quiet=True, plot=True)
    run.complete()
    assert "demo: no metrics.png (metrics.csv has no finite values to draw)" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.csv", "run.json", "summary.json"]
