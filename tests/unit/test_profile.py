"""The per-operation profile: phases timed in every data-parallel epoch, read back from
the trace per rank (aepar.report.profile)."""
import numpy as np
import pytest

from aepar import backend
from aepar.models.rbm import RBM
from aepar.parallel.data_parallel import train_epoch
from aepar.report.profile import PHASES, profile_csv, profile_png, profile_rows
from aepar.rows import Shard


def _span(pid, name, dur_s, **args):
    return {"name": name, "ph": "X", "pid": pid, "tid": 0, "ts": 0.0, "dur": dur_s * 1e6, "args": args}


def test_the_rows_add_each_ranks_phases_and_the_rest_of_its_epochs():
    doc = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "rank 1"}},
        _span(1, "epoch", 1.0, gradient_s=0.5, block_sums_s=0.2, reduction_s=0.1, update_s=0.1),
        _span(1, "epoch", 2.0, gradient_s=1.0, block_sums_s=0.4, reduction_s=0.2, update_s=0.2),
        _span(1, "wait", 0.7), _span(1, "handover", 0.3), _span(1, "recompute", 0.2), _span(1, "eval", 0.1),
        _span(0, "layer1", 0.5, fused_step_s=0.45),
        _span(0, "load", 9.0),  # not an epoch's operation: left out
        _span(0, "layer1", 4.0, gradient_s=3.0, part="compared greedy"),  # another part of the run: left out
    ]}
    rows = profile_rows(doc)
    assert [r["rank"] for r in rows] == [0, 1]
    r0, r1 = rows
    assert r0["epochs"] == 1 and r0["fused_step_s"] == pytest.approx(0.45) and r0["other_s"] == pytest.approx(0.05)
    assert r0["total_s"] == pytest.approx(0.5)
    assert r1["epochs"] == 2 and r1["gradient_s"] == pytest.approx(1.5) and r1["block_sums_s"] == pytest.approx(0.6)
    assert r1["other_s"] == pytest.approx(0.3) and r1["wait_s"] == pytest.approx(0.7)
    assert r1["handover_s"] == pytest.approx(0.5) and r1["eval_s"] == pytest.approx(0.1)
    assert r1["total_s"] == pytest.approx(3.0 + 0.7 + 0.5 + 0.1)
    text = profile_csv(rows)
    assert text.splitlines()[0].split(",") == ["rank", "epochs"] + [f"{k}_s" for k, _ in PHASES] + ["total_s"]
    assert len(text.splitlines()) == 3


def test_the_figure_has_a_bar_per_rank_and_the_prediction(tmp_path):
    pytest.importorskip("matplotlib")
    rows = profile_rows({"traceEvents": [_span(r, "epoch", 1.0, gradient_s=0.6, update_s=0.2) for r in range(3)]})
    path = profile_png(rows, tmp_path / "profile.png", title="t",
                       predicted={"training": 0.6, "reduction": 0.1, "handover": 0.0, "wait": 0.2})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("blocks, fused", [(1, True), (4, True), (4, False)])
def test_an_epoch_reports_where_its_time_went(blocks, fused):
    """One block, or every block on one process with the model's fused_blocks_step: the
    fused step alone; the blocks' own path: its four phases."""
    be = backend.select("cpu", "numba", "float32")
    x = np.random.default_rng(0).random((400, 20), dtype=np.float32)
    model = RBM(be, 20, 8, hidden="bernoulli", lr=0.1, batch=50, seed=0, layer_index=0)
    if not fused:
        model.fused_blocks_step = None
    result = train_epoch(model, Shard.of(be, x, blocks), 0)
    phases = result.phases
    expected = {"fused step"} if fused else {"gradient", "block sums", "reduction", "update"}
    assert set(phases) == expected and all(v > 0 for v in phases.values()), phases  # each one timed
    assert set(result.phase_args) == {f"{k.replace(' ', '_')}_s" for k in expected}
    assert set(result.phase_args) <= {f"{k}_s" for k, _ in PHASES}  # the report reads every one
