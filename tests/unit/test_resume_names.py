"""Checkpoints of an older aepar, whose records named seconds "seconds" (fine-tuning and
classification epochs, sync hand-overs), still resume with today's names ("epoch_s", "send_s")."""
from types import SimpleNamespace

from aepar.resume import BackpropRun


def test_older_epoch_names_are_read_as_todays():
    model = SimpleNamespace(params={})
    optimizer = SimpleNamespace(load_state=lambda state: None)
    fit = BackpropRun(SimpleNamespace(asarray=lambda a: a), None, model, optimizer, None, batch=1, what="fine-tuning",
                      params_tag="p/", opt_tag="o/", record_key="finetune", fields={})
    old = {"epochs": [{"epoch": 1, "loss": 0.5, "seconds": 2.0}], "time_s": 5.0, "eval_s": 0.1}
    assert fit.restore(({}, {}, {"finetune": old, "epoch": 1, "state": None}))
    assert fit.record["epochs"] == [{"epoch": 1, "loss": 0.5, "epoch_s": 2.0}]
    assert fit.epoch_seconds() == 3.0  # the epoch after the checkpoint's


def test_older_handover_names_are_read_as_todays():
    from aepar.parallel.synchronized import _merge_segments, handover_stats

    old = {"time_s": 1.0, "epochs": [{"stage": 0, "start": 0.0, "end": 1.0}], "receives": [], "waits": [],
           "handovers": [{"stage": 0, "version": 1, "t": 1.0, "seconds": 0.25, "bytes": 8, "remote": True}]}
    now = SimpleNamespace(epochs=[], receives=[], waits=[], time_s=1.0, layout={}, mode="data", handover="plan",
                          handovers=[{"stage": 0, "version": 2, "t": 0.5, "send_s": 0.75, "bytes": 8, "remote": True}])
    merged = _merge_segments(old, now)
    assert [h["send_s"] for h in merged["handovers"]] == [0.25, 0.75]
    assert handover_stats(merged, 2)[0]["producer_s_per_handover"] == 0.5
