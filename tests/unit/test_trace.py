"""aepar.trace: spans and instants, gathered and written as a valid Chrome trace."""
import json
import time

from aepar.comm import Comm
from aepar.trace import Trace, chrome_events, validate_chrome


def test_spans_instants_and_chrome_json(tmp_path):
    tr = Trace(Comm.serial())
    tr.label(stage=1)
    with tr.span("epoch", "train", stage=1, epoch=1) as info:
        time.sleep(0.01)
        info["error"] = 1.5
    tr.instant("handover", stage=1, version=2)
    tr.add_span("wait", 0.02, 0.05, what="input")
    path = tr.to_chrome_json(tmp_path / "trace.json", extra={"scheme": "test"})
    doc = json.loads(path.read_text())
    assert validate_chrome(doc) == []
    events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert [e["name"] for e in events] == ["epoch", "handover", "wait"]
    epoch = events[0]
    assert epoch["ph"] == "X" and epoch["dur"] >= 9_000  # microseconds
    assert epoch["args"]["error"] == 1.5 and epoch["args"]["stage"] == 1
    # a span's CPU time is the rank's: busy work shows, sleeping does not (compared, so that
    # BLAS threads still spinning from an earlier test add to both alike)
    with tr.span("busy"):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.03:  # 30 ms of this thread's CPU, however busy the box
            pass
    with tr.span("asleep"):
        time.sleep(0.03)
    spans = {e["name"]: e for e in tr.events}
    assert spans["busy"]["args"]["cpu_s"] - spans["asleep"]["args"]["cpu_s"] > 0.02
    assert events[1]["ph"] == "i" and events[1]["ts"] >= epoch["ts"] + epoch["dur"]
    assert events[2]["dur"] == 30_000 and events[2]["ts"] == 20_000
    names = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert names and "stage 1" in names[0]["args"]["name"]
    assert doc["otherData"]["scheme"] == "test"


def test_span_records_even_when_the_block_raises():
    tr = Trace(Comm.serial())
    try:
        with tr.span("boom"):
            raise ValueError
    except ValueError:
        pass
    assert [e["name"] for e in tr.events] == ["boom"]


def test_disabled_trace_records_nothing(tmp_path):
    tr = Trace(Comm.serial(), enabled=False)
    with tr.span("x"):
        pass
    tr.instant("y")
    assert tr.events == []


def test_gather_and_events_of_several_ranks():
    parts = [{"rank": r, "labels": {"stage": r + 1}, "events": [
        {"name": "epoch", "ph": "X", "t": 0.5 * r, "dur": 0.25, "args": {}}]} for r in range(3)]
    events = chrome_events(parts)
    assert validate_chrome({"traceEvents": events}) == []
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["pid"] for e in spans] == [0, 1, 2]
    assert [e["ts"] for e in spans] == [0.0, 500_000.0, 1_000_000.0]
    tr = Trace(Comm.serial())
    tr.instant("a")
    gathered = tr.gather()
    assert gathered[0]["rank"] == 0 and gathered[0]["name"] == "a"


def test_validate_catches_broken_traces():
    assert validate_chrome({}) == ["no traceEvents list"]
    bad = {"traceEvents": [{"name": "x", "ph": "X", "pid": 0, "tid": 0, "ts": 1.0, "dur": -1},
                           {"name": "y", "ph": "Q", "pid": 0, "tid": 0, "ts": 0}]}
    problems = validate_chrome(bad)
    assert any("dur" in p for p in problems) and any("phase" in p for p in problems)


def test_events_within_a_part_say_so_and_the_rest_do_not():
    tr = Trace(Comm.serial())
    with tr.span("epoch"):
        pass
    with tr.within("compared greedy"):
        with tr.span("layer1"):
            tr.instant("handover")
        tr.add_span("wait", 0.0, 0.1)
    with tr.span("eval"):
        pass
    parts = [e["args"].get("part") for e in tr.events]
    assert parts == [None, "compared greedy", "compared greedy", "compared greedy", None]
