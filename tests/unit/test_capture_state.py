"""sidecar.rank.capture.CaptureOwner: the one owner of a rank's capture state and its lock.
Admission, transitions and the outcomes each call returns, the hot-path flag kept in step,
and callers on several threads at once."""

from __future__ import annotations

import threading

from sidecar.common.records import State
from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank.capture import CancelOutcome, CaptureOwner, Finished
from sidecar.rank.hotpath import HotPath

ADMIT = {"rank": 1, "world_size": 4, "replica": "r1", "enabled": True}


def _owner() -> tuple[CaptureOwner, HotPath]:
    hot = HotPath()
    return CaptureOwner(hot), hot


def _request(request_id: str, **fields) -> ProfileRequest:
    return ProfileRequest(id=request_id, rank_filter=RankFilter(frozenset({1})), **fields)


def test_an_admitted_request_is_armed_and_gives_the_next_step_boundary_work():
    owner, hot = _owner()
    request = _request("req-1", start_step=12)
    decision = owner.admit(request, step=10, **ADMIT)
    assert (decision.action, decision.reason) == ("armed", "")
    assert owner.state is State.ARMED and owner.pending is request and owner.active is None
    assert hot._boundary_work is True
    fields = owner.record_fields()
    assert fields["state"] == "armed" and fields["request_id"] == "req-1" and fields["selected"] is True
    assert fields["request"]["start_step"] == 12 and fields["num_requests"] == 1


def test_a_busy_rank_refuses_naming_the_request_that_keeps_it_busy_and_leaves_the_flag_alone():
    owner, hot = _owner()
    owner.admit(_request("first", start_step=50), step=10, **ADMIT)
    hot.set_boundary_work(False)  # as if a boundary had settled it (never while armed: only to see it unset)
    decision = owner.admit(_request("second"), step=11, **ADMIT)
    assert decision.action == "refused"
    assert "rank 1 is busy with request first (start step 50, phase armed)" in decision.reason
    assert "`cosmos-profiler profile cancel r1` ends it." in decision.reason
    assert hot._boundary_work is False and owner.pending.id == "first"
    fields = owner.record_fields()
    assert (fields["num_requests"], fields["num_refused"], fields["refused"]) == (2, 1, decision.reason)
    assert fields["error"] is None  # a busy rank's refusal is not its error


def test_a_request_for_other_ranks_is_not_selected_and_arms_nothing():
    owner, hot = _owner()
    other = ProfileRequest(id="others", rank_filter=RankFilter(frozenset({0, 2})))
    assert owner.admit(other, step=3, **ADMIT).action == "not selected"
    assert owner.state is State.IDLE and owner.pending is None and hot._boundary_work is False
    assert owner.record_fields()["selected"] is False


def test_stacks_and_an_invalid_filter_are_answered_without_arming():
    owner, hot = _owner()
    assert owner.admit(_request("dump", kind="stacks"), step=3, **ADMIT).action == "stacks"
    wide = ProfileRequest(id="wide", rank_filter=RankFilter(frozenset({9})))
    invalid = owner.admit(wide, step=3, **ADMIT)
    assert invalid.action == "invalid" and "names rank 9, but world size is 4" in invalid.reason
    assert owner.state is State.IDLE and hot._boundary_work is False


def test_a_capture_runs_through_its_states_and_the_save_returns_the_rank_to_idle():
    owner, hot = _owner()
    request = _request("req-1", active_steps=2)
    owner.admit(request, step=4, **ADMIT)
    assert owner.claim(request) is True and owner.pending is None and owner.active is request
    owner.begin(5, misaligned=False)
    assert owner.state is State.TRACING and owner.is_capturing()
    finished = owner.finish(8)
    assert finished == Finished(request, 3) and owner.state is State.SAVING and owner.is_capturing()
    assert (owner.num_finished, owner.finished_id) == (1, "req-1")
    assert owner.settle_boundary() is False and hot._boundary_work is False
    owner.saved("trace", "/t/0_trace.json.gz", request, 9)
    assert owner.state is State.IDLE and not owner.is_capturing() and owner.num_captures == 1
    fields = owner.record_fields()
    assert fields["trace_path"] == "/t/0_trace.json.gz" and fields["capture_start_step"] == 5
    assert [(e["state"], e["step"]) for e in fields["history"]] == [("armed", 4), ("tracing", 5), ("saving", 8),
                                                                    ("idle", 9)]
    assert fields["history"][-1]["saved"] == "/t/0_trace.json.gz"


def test_a_cancel_disarms_an_armed_rank_and_the_claim_that_comes_late_takes_nothing():
    owner, hot = _owner()
    request = _request("req-1", start_step=20)
    owner.admit(request, step=4, **ADMIT)
    cancel = _request("stop-1", kind="cancel")
    assert owner.cancel(cancel, 6) == CancelOutcome("disarmed", request, State.ARMED)
    assert owner.state is State.IDLE and owner.pending is None
    assert owner.claim(request) is False and owner.active is None
    assert owner.record_fields()["cancel"]["outcome"] == "disarmed"


def test_a_cancel_of_a_running_capture_asks_the_next_boundary_to_stop_and_save():
    owner, hot = _owner()
    request = _request("req-1")
    owner.admit(request, step=1, **ADMIT)
    owner.claim(request)
    owner.begin(2, misaligned=False)
    hot.set_boundary_work(False)
    cancel = _request("stop-1", kind="cancel")
    outcome = owner.cancel(cancel, 3)
    assert outcome == CancelOutcome("stopping", request, State.TRACING)
    assert hot._boundary_work is True and owner.stop_requested is cancel
    assert owner.finish(3, cancelled_by=owner.stop_requested).request is request
    owner.saved("trace", "/t/0_trace.json.gz", request, 4)
    last = owner.record_fields()["cancel"]
    assert (last["outcome"], last["trace_path"], last["request_id"]) == ("stopped", "/t/0_trace.json.gz", "req-1")


def test_nothing_to_cancel_is_an_outcome_too():
    owner, _ = _owner()
    assert owner.cancel(_request("stop-1", kind="cancel"), 3) == CancelOutcome("nothing to cancel", None, State.IDLE)
    assert owner.record_fields()["num_requests"] == 1


def test_a_claimed_request_that_cannot_start_is_counted_as_refused():
    owner, _ = _owner()
    request = _request("req-1")
    owner.admit(request, step=1, **ADMIT)
    owner.claim(request)
    owner.refuse_claimed("request req-1 refused: another torch.profiler is already running", 2)
    fields = owner.record_fields()
    assert fields["state"] == "error" and owner.active is None
    assert fields["refused"] == fields["error"] == "request req-1 refused: another torch.profiler is already running"
    assert fields["num_requests"] == fields["num_captures"] + fields["num_refused"]


def test_a_failure_can_settle_the_boundary_flag_with_it():
    owner, hot = _owner()
    request = _request("req-1")
    owner.admit(request, step=1, **ADMIT)
    owner.claim(request)
    owner.fail("capture failed at step 2: RuntimeError: boom", 2, settle=True)
    assert owner.state is State.ERROR and hot._boundary_work is False
    assert owner.record_fields()["history"][-1]["error"] == "capture failed at step 2: RuntimeError: boom"


def test_the_boundary_settles_on_what_the_caller_adds():
    owner, hot = _owner()
    assert owner.settle_boundary(lambda: True) is True and hot._boundary_work is True
    assert owner.settle_boundary(lambda: False) is False and hot._boundary_work is False
    owner.mark_boundary_work()
    assert hot._boundary_work is True


def test_close_fails_the_running_capture_and_disarms():
    owner, _ = _owner()
    owner.admit(_request("req-1", start_step=30), step=1, **ADMIT)
    owner.close(2)
    assert owner.pending is None and owner.state is State.ARMED  # nothing ran: no failure to say
    owner.close(2, "capture req-1 aborted: the sidecar closed")
    assert owner.state is State.ERROR and owner.record_fields()["error"] == "capture req-1 aborted: the sidecar closed"


def test_stacks_saved_and_uploads_are_in_the_history_of_the_current_request():
    owner, _ = _owner()
    owner.stacks_saved("/t/0_stacks.txt", 7, "dump-1", flight_recorder="/t/0_flight_recorder.json")
    owner.note(8, upload="/t/0_trace.json.gz", url="s3://b/0_trace.json.gz")
    fields = owner.record_fields()
    assert fields["stacks_path"] == "/t/0_stacks.txt"
    assert fields["history"][0]["flight_recorder"] == "/t/0_flight_recorder.json"
    assert fields["history"][1]["url"] == "s3://b/0_trace.json.gz"
    owner.stacks_failed("request dump-2: writing stacks to /t/1_stacks.txt failed: No space left")
    assert owner.record_fields()["error"].endswith("No space left")


def test_the_record_fields_are_a_copy():
    owner, _ = _owner()
    owner.admit(_request("req-1"), step=1, **ADMIT)
    fields = owner.record_fields()
    fields["history"].clear()
    assert len(owner.record_fields()["history"]) == 1


def _on_threads(num: int, target) -> list:
    """Run `target(i)` on `num` threads released together; their results, in order."""
    barrier = threading.Barrier(num)
    results: list = [None] * num

    def run(i: int) -> None:
        barrier.wait(timeout=5)
        results[i] = target(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(num)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)
    return results


def test_of_many_requests_admitted_at_once_exactly_one_is_armed():
    owner, hot = _owner()
    results = _on_threads(8, lambda i: owner.admit(_request(f"req-{i}"), step=1, **ADMIT).action)
    assert sorted(results) == ["armed"] + ["refused"] * 7
    fields = owner.record_fields()
    assert (fields["num_requests"], fields["num_refused"]) == (8, 7) and hot._boundary_work is True
    assert owner.pending is not None and owner.pending.id == f"req-{results.index('armed')}"


def _claim_and_cancel_at_once(owner: CaptureOwner, request: ProfileRequest) -> tuple[bool, CancelOutcome]:
    cancel = _request("stop-1", kind="cancel")
    claimed, cancelled = _on_threads(2, lambda i: owner.claim(request) if i == 0 else owner.cancel(cancel, 1))
    return claimed, cancelled


def test_a_claim_and_a_cancel_at_once_agree_on_who_won():
    for _ in range(50):
        owner, _ = _owner()
        request = _request("req-1")
        owner.admit(request, step=1, **ADMIT)
        claimed, cancelled = _claim_and_cancel_at_once(owner, request)
        if claimed:  # the training thread took it first: the cancel stops the capture it started
            assert cancelled.outcome == "stopping" and owner.active is request
        else:  # the cancel came first: nothing runs
            assert cancelled.outcome == "disarmed" and owner.active is None and owner.state is State.IDLE
