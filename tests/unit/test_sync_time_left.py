"""The synchronized pipeline's time left follows its plan's clock: the small layers' stages
finish their epochs early, and counting epochs made a run say minutes left that had the first
layer's many epochs still to go."""
import re
from types import SimpleNamespace

from aepar import metrics
from aepar.comm import Comm
from aepar.parallel.pipeline import plan_schedule
from aepar.parallel.synchronized import _on_epoch


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _job(plan):
    layer = SimpleNamespace(n_in=4, n_out=2, lr=0.1)
    return SimpleNamespace(args=SimpleNamespace(quiet=False), layers=[layer, layer], state={"plan": plan},
                           ckpt=SimpleNamespace(run=None), comm=Comm.serial())


def _record(planned):
    return {"stage": planned.stage, "epoch": planned.epoch, "version": planned.version, "extra": planned.extra,
            "train_error": 1.0, "val_error": None, "start": 0.0, "end": 0.0}


def _left(text):
    m = re.search(r"(\d+)m(\d\d)s left", text) or re.search(r"(\d+)s left", text)
    return int(m.group(1)) * 60 + int(m.group(2)) if m.lastindex == 2 else int(m.group(1))


def test_the_time_left_is_the_plans_not_the_count_of_epochs(monkeypatch, capsys):
    # stage 0 ten times as dear as stage 1: stage 1 finishes each epoch soon after stage 0's
    plan = plan_schedule([10.0, 1.0], [0.0, 0.0], [10, 10], [0, 0])
    clock = Clock()
    monkeypatch.setattr(metrics.time, "monotonic", clock)
    on_epoch = _on_epoch(_job(plan), None)
    events = sorted(((e.end, e) for stage in plan.stages for e in stage), key=lambda pair: pair[0])
    for end, planned in events[:8]:  # one wall second per unit of the plan's clock
        clock.t = end
        on_epoch(_record(planned))
    lines = [l for l in capsys.readouterr().out.splitlines() if "left" in l]
    reached = max(e.end for _, e in events[:8])
    assert abs(_left(lines[-1]) - (plan.makespan - reached)) <= 1, (lines[-1], plan.makespan, reached)


def test_a_resumed_pipeline_starts_from_where_its_plan_had_reached(monkeypatch, capsys):
    plan = plan_schedule([10.0, 1.0], [0.0, 0.0], [10, 10], [0, 0])
    events = sorted(((e.end, e) for stage in plan.stages for e in stage), key=lambda pair: pair[0])
    done = {"epochs": [_record(e) for _, e in events[:6]]}
    clock = Clock()
    monkeypatch.setattr(metrics.time, "monotonic", clock)
    on_epoch = _on_epoch(_job(plan), done)
    start = events[5][0]
    end, planned = events[6]
    clock.t = end - start  # this process's seconds since it began, at the plan's pace
    on_epoch(_record(planned))
    line = [l for l in capsys.readouterr().out.splitlines() if "left" in l][-1]
    assert abs(_left(line) - (plan.makespan - end)) <= 1, (line, plan.makespan, end)


def test_a_paused_epochs_steps_count_as_done_before_the_resume():
    """A run resumed inside an epoch finishes that epoch in a fraction of an epoch's time:
    the time left counts the steps before the pause as done, or its first estimate is far
    too short (a Fashion-MNIST run said 1m05s with 8 minutes to go)."""
    from aepar.parallel.data_parallel import EpochState
    from aepar.resume import BackpropRun

    state = EpochState(3, 150, [0.0], {})
    assert state.share_done(60_000, 100) == 0.25  # batch 150 of 600
    fit = BackpropRun(None, Comm.serial(), None, None, SimpleNamespace(blocks=SimpleNamespace(n=60_000)), batch=100,
                      what="fine-tuning", params_tag="p/", opt_tag="o/", record_key="finetune", fields={})
    fit.first, fit.state = 3, state
    assert fit.done_before == 3.25
    fit.state = None
    assert fit.done_before == 3
