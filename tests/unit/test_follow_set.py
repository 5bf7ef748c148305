"""`profile set --wait`'s flow (`fleet.follow.follow_set`) over real rank records in a registry."""

from __future__ import annotations

import time

from sidecar.fleet.follow import follow_set
from support.records import alive_record, update_record


def _saved(registry, rank: int, request_id: str, **fields):
    return alive_record(registry, "r1", rank, request_id=request_id, history=[{"saved": f"/t/{rank}_trace.json.gz"}],
                        **fields)


def test_a_plain_capture_is_followed_until_each_rank_saved(tmp_path):
    for rank in (0, 1):
        _saved(tmp_path, rank, "cli-1")
    followed = follow_set(tmp_path, "r1", "cli-1", [0, 1], timeout=5.0)
    assert (followed.stage, followed.request_id) == ("capture", "cli-1")
    assert [(c.rank, c.phase, c.trace_path) for c in followed.captures or []] == [
        (0, "saved", "/t/0_trace.json.gz"), (1, "saved", "/t/1_trace.json.gz")]


def test_a_watch_is_followed_through_its_baseline_its_firing_and_the_slow_capture(tmp_path):
    watch = {"id": "w", "fired_request_id": "w.slow-1"}
    record = _saved(tmp_path, 0, "w.baseline", slowdown=watch)
    seen: list[object] = []

    def on_fired(request_id: str) -> None:  # the slow capture is saved as soon as it is asked for
        seen.append(request_id)
        update_record(tmp_path, record, request_id=request_id, history=[{"saved": "/t/0_slow.json.gz"}])

    followed = follow_set(tmp_path, "r1", "w", [0], timeout=5.0, watch=True, on_baseline=seen.append,
                          on_fired=on_fired)
    baseline, fired = seen
    assert [(c.phase, c.trace_path) for c in baseline] == [("saved", "/t/0_trace.json.gz")]  # type: ignore[attr-defined]
    assert fired == "w.slow-1"
    assert (followed.stage, followed.request_id) == ("capture", "w.slow-1")
    assert [(c.phase, c.trace_path) for c in followed.captures or []] == [("saved", "/t/0_slow.json.gz")]


def test_a_baseline_that_does_not_finish_ends_the_flow(tmp_path):
    alive_record(tmp_path, "r1", 0, request_id="w.baseline", state="error", error="boom")
    followed = follow_set(tmp_path, "r1", "w", [0], timeout=5.0, watch=True)
    assert followed.stage == "baseline" and [c.phase for c in followed.captures or []] == ["error"]


def test_a_watch_that_does_not_fire_in_time_ends_without_captures(tmp_path):
    alive_record(tmp_path, "r1", 0, slowdown={"id": "w", "fired_request_id": None})
    followed = follow_set(tmp_path, "r1", "w", [0], timeout=0.3, watch=True, baseline=False)
    assert (followed.stage, followed.request_id, followed.captures, followed.timeout) == ("watch", "w", None, 0.3)


def test_a_watch_that_does_not_fire_says_why_each_rank_left_its_slowdown_uncaptured(tmp_path):
    """The disk budget refused the capture: the ranks' notes come back (each rank's first, once, as
    it appears; the last of each at the end), where before the flow only timed out."""
    full = "step time 4.0x the median at step 40: not captured, 3.1% free under /t (slowdown_min_free_pct = 5)"
    alive_record(tmp_path, "r1", 0, slowdown={"id": "w", "fired_request_id": None, "note": full})
    alive_record(tmp_path, "r1", 1, slowdown={"id": "w", "fired_request_id": None, "note": None})
    alive_record(tmp_path, "r1", 2, slowdown={"id": "other", "note": "an older watch's"})
    seen: list[tuple[int, str]] = []
    followed = follow_set(tmp_path, "r1", "w", [0, 1, 2], timeout=0.3, watch=True, baseline=False,
                          on_note=lambda rank, note: seen.append((rank, note)))
    assert followed.stage == "watch" and followed.notes == {0: full}
    assert seen == [(0, full)]


def test_a_watch_cancelled_on_every_rank_ends_the_flow_at_once(tmp_path):
    """`profile cancel` disarmed the watch: the waiting CLI ends with the cancel, where it waited out its
    timeout and then said the watch "stays armed"."""
    cancelled = {"id": "w", "state": "cancelled", "fired_request_id": None, "note": "cancelled by request c-1"}
    alive_record(tmp_path, "r1", 0, slowdown=cancelled)
    record = alive_record(tmp_path, "r1", 1, slowdown=dict(cancelled, state="watching", note=None))
    assert follow_set(tmp_path, "r1", "w", [0, 1], timeout=0.3, watch=True, baseline=False).stage == "watch"
    update_record(tmp_path, record, slowdown=cancelled)
    started = time.monotonic()
    followed = follow_set(tmp_path, "r1", "w", [0, 1], timeout=60.0, watch=True, baseline=False)
    assert time.monotonic() - started < 30  # not the timeout
    assert (followed.stage, followed.captures, followed.notes) == (
        "ended", None, {0: "cancelled by request c-1", 1: "cancelled by request c-1"})


def test_a_watch_whose_ranks_exited_ends_the_flow(tmp_path):
    alive_record(tmp_path, "r1", 0, slowdown={"id": "w", "state": "cancelled", "note": "cancelled by request c-1"})
    alive_record(tmp_path, "r1", 1, exited_at=time.time(), slowdown={"id": "w", "state": "watching"})
    seen: list[tuple[int, str]] = []
    followed = follow_set(tmp_path, "r1", "w", [0, 1], timeout=60.0, watch=True, baseline=False,
                          on_note=lambda rank, note: seen.append((rank, note)))
    assert followed.stage == "ended" and followed.notes == dict(seen) == {
        0: "cancelled by request c-1", 1: "the rank exited before the watch fired"}
