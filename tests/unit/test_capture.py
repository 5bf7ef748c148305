"""The capture state machine (sidecar.rank.capture): admission and transitions as plain
functions over data. No torch, no threads, no files."""

from __future__ import annotations

import pytest

from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank import capture
from sidecar.rank.capture import BUSY_STATES, CaptureState, State

RANK, WORLD, REPLICA = 1, 4, "r1"


def req(id_: str = "a", kind: str = "trace", ranks=(1,), start: int | None = None, source: str = "file"):
    filter_ = RankFilter(None) if ranks is None else RankFilter(frozenset(ranks))
    return ProfileRequest(id=id_, kind=kind, rank_filter=filter_, start_step=start, source=source)


def admit(cs: CaptureState, request: ProfileRequest, step: int = 10, **kw):
    args = dict(rank=RANK, world_size=WORLD, replica=REPLICA, step=step, enabled=True)
    args.update(kw)
    return capture.admit(cs, request, **args)


def test_states_read_as_the_record_spells_them():
    assert State.ARMED == "armed" and f"{State.TRACING}" == "tracing" and str(State.ERROR) == "error"
    assert [s.value for s in State] == ["idle", "armed", "tracing", "saving", "error", "stalled"]
    assert "saving" in BUSY_STATES and "idle" not in BUSY_STATES


def test_a_whole_capture_from_admission_to_saved():
    cs = CaptureState()
    request = req(start=12)
    assert admit(cs, request).action == "armed"
    assert (cs.state, cs.pending, cs.selected, cs.num_requests) == (State.ARMED, request, True, 1)
    assert capture.claim(cs, request) and cs.active is request and cs.pending is None
    capture.begin(cs, 12, misaligned=False)
    assert (cs.state, cs.capture_start) == (State.TRACING, 12)
    assert capture.finish(cs, 15) is request
    assert (cs.state, cs.active, cs.num_finished) == (State.SAVING, None, 1)
    capture.saved(cs, "trace", "/t/0_trace.json.gz", request, 16)
    assert (cs.state, cs.trace_path, cs.num_captures) == (State.IDLE, "/t/0_trace.json.gz", 1)
    assert [h["state"] for h in cs.history] == ["armed", "tracing", "saving", "idle"]
    assert cs.history[-1]["saved"] == "/t/0_trace.json.gz" and cs.history[0]["request_id"] == "a"


def test_the_next_request_keeps_the_entry_of_the_last_trace_saved():
    """A `--wait` following request "a" reads the rank's record after it armed "b" (a slowdown watch's
    capture right after its baseline): the entry that says where "a" was saved is still there."""
    cs = CaptureState()
    first = req("a", start=12)
    admit(cs, first)
    capture.claim(cs, first)
    capture.begin(cs, 12, misaligned=False)
    capture.finish(cs, 15)
    capture.saved(cs, "trace", "/t/0_trace.json.gz", first, 16)
    assert admit(cs, req("b", start=30)).action == "armed"
    assert [(h["request_id"], h["state"], h.get("saved")) for h in cs.history] == [
        ("a", "idle", "/t/0_trace.json.gz"), ("b", "armed", None)]
    assert admit(cs, req("c", start=40)).action == "refused"  # busy with b: the history stays b's
    capture.cancel(cs, req("stop", kind="cancel"), 20)  # b disarmed, nothing saved
    assert admit(cs, req("d", start=50)).action == "armed"
    assert [(h["request_id"], h["state"]) for h in cs.history] == [("a", "idle"), ("d", "armed")]


def test_a_busy_rank_refuses_naming_the_request_and_the_way_out():
    cs = CaptureState()
    admit(cs, req("first", start=99))
    decision = admit(cs, req("second"))
    assert decision.action == "refused"
    assert decision.reason == ("request second refused: rank 1 is busy with request first (start step 99, phase armed). "
                               "`cosmos-profiler profile cancel r1` ends it.")
    assert (cs.state, cs.pending.id, cs.num_requests, cs.num_refused) == (State.ARMED, "first", 2, 1)
    assert cs.error is None and cs.refused == decision.reason  # a busy refusal is not this rank's error


@pytest.mark.parametrize(
    ("request_", "kwargs", "action", "reason"),
    [
        (req(ranks=(7,)), {}, "invalid", "rank_filter 7 names rank 7, but world size is 4"),
        (req(ranks=(0, 2)), {}, "not selected", ""),
        (req(), {"enabled": False}, "refused", "profiler is disabled for this job ([profiler] enable_profiler = false)"),
        (req(kind="memory"), {}, "refused", "kind 'memory' needs CUDA"),
        (req(kind="memory"), {"cuda_available": True}, "armed", ""),
        (req(kind="stacks"), {}, "stacks", ""),
        (req(kind="cancel", ranks=None), {}, "cancel", ""),
        (req(start=10 + 100_001), {}, "refused", "the limit is 100000 steps ahead"),
        (req(start=10 + 1000), {"recent_rate": 0.001}, "refused", "nothing was armed"),
        (req(start=10 + 1000), {"recent_rate": 10.0}, "armed", ""),
        (req(ranks=(5,), source="signal"), {}, "armed", ""),  # a signal is this rank's own request
    ],
)
def test_admission(request_, kwargs, action, reason):
    cs = CaptureState()
    decision = admit(cs, request_, **kwargs)
    assert decision.action == action
    assert reason in decision.reason
    assert (cs.state == State.ARMED) == (action == "armed")


def test_an_unselected_request_shows_in_an_idle_record_but_never_replaces_a_busy_one():
    cs = CaptureState()
    admit(cs, req("mine"))
    admit(cs, req("theirs", ranks=(0,)))
    assert cs.request.id == "mine"
    idle = CaptureState()
    admit(idle, req("theirs", ranks=(0,)))
    assert (idle.request.id, idle.selected, idle.num_requests) == ("theirs", False, 0)


def test_cancel_disarms_an_armed_rank_and_stops_a_tracing_one_at_the_next_step():
    cs = CaptureState()
    admit(cs, req("a", start=50))
    outcome, current = capture.cancel(cs, req("c", kind="cancel"), 20)
    assert (outcome, current.id, cs.state, cs.pending, cs.cancelled) == ("disarmed", "a", State.IDLE, None, True)
    assert cs.cancel["outcome"] == "disarmed" and cs.history[-1]["cancelled"] == "c"

    tracing = CaptureState()
    request = req("b")
    admit(tracing, request)
    capture.claim(tracing, request)
    capture.begin(tracing, 11, misaligned=False)
    cancel = req("c2", kind="cancel")
    assert capture.cancel(tracing, cancel, 12)[0] == "stopping"
    assert tracing.state == State.TRACING and tracing.stop_requested is cancel  # the training thread stops it
    capture.finish(tracing, 13, cancelled_by=cancel)
    assert (tracing.state, tracing.cancel["outcome"], tracing.cancelled) == (State.SAVING, "stopped", True)
    capture.saved(tracing, "trace", "/t/1_trace.json.gz", request, 14)
    assert tracing.cancel["trace_path"] == "/t/1_trace.json.gz" and tracing.history[-1]["cancelled"] == "c2"

    empty = CaptureState()
    assert capture.cancel(empty, req("c3", kind="cancel"), 5) == ("nothing to cancel", None)
    assert empty.state == State.IDLE and empty.cancel["outcome"] == "nothing to cancel"


def test_a_cancel_that_loses_the_race_to_the_schedules_end_is_reported_as_finished():
    cs = CaptureState()
    request = req("a")
    admit(cs, request)
    capture.claim(cs, request)
    capture.begin(cs, 11, misaligned=False)
    capture.cancel(cs, req("c", kind="cancel"), 12)
    capture.finish(cs, 13)  # the schedule ended before the training thread saw the cancel
    assert cs.cancel["outcome"] == "saving" and cs.stop_requested is None
    capture.saved(cs, "trace", "/t/0.json.gz", request, 14)
    assert cs.cancel["outcome"] == "finished"


def test_a_claim_after_a_cancel_takes_nothing():
    cs = CaptureState()
    request = req("a", start=30)
    admit(cs, request)
    capture.cancel(cs, req("c", kind="cancel"), 20)
    assert capture.claim(cs, request) is False and cs.active is None


def test_failure_and_recovery():
    cs = CaptureState()
    request = req("a")
    admit(cs, request)
    capture.claim(cs, request)
    capture.fail(cs, "kineto exploded", 11)
    assert (cs.state, cs.error, cs.active) == (State.ERROR, "kineto exploded", None)
    assert admit(cs, req("b")).action == "armed"  # the next request leaves the error
    assert cs.error is None and cs.history[0]["state"] == "armed"


def test_history_keeps_the_newest_entries():
    cs = CaptureState()
    for step in range(capture.MAX_HISTORY + 5):
        capture.note(cs, step)
    assert len(cs.history) == capture.MAX_HISTORY and cs.history[-1]["step"] == capture.MAX_HISTORY + 4


def test_reissue_gives_a_fresh_id_and_never_a_start_step_in_the_past():
    old = req("old", start=40)
    assert capture.reissue(old, "file-1-abcd", 50) == req("file-1-abcd", start=None)
    assert capture.reissue(old, "file-1-abcd", 30) == req("file-1-abcd", start=40)
