"""sidecar.rank.watches.Watches: the slowdown watch of one rank, armed, fed each step through the hot
path's one attribute, told of the capture it asked for or of a cancel, and stopped."""

from __future__ import annotations

import threading

import pytest

from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank.slowdown import always_on_request
from sidecar.rank.watches import Watches
from support.records import alive_record
from support.rooms import advance, rank_context, was_woken


def _watch_request(request_id: str = "w-1", **fields) -> ProfileRequest:
    values = {"kind": "watch", "factor": 3.0, "consecutive": 2, "repeat": 1, "baseline": False,
              "rank_filter": RankFilter(None), **fields}
    return ProfileRequest(id=request_id, **values)


@pytest.fixture
def watches(tmp_path):
    ctx = rank_context(tmp_path)
    room = Watches(ctx)
    yield ctx, room
    room.stop()


def test_an_armed_watch_is_the_one_step_feeds_and_stop_takes_it_away(watches):
    ctx, room = watches
    room.install(_watch_request())
    assert ctx.hot._watch is room.current is room.shown and room.current.id == "w-1"
    assert "profiler-slowdown" in [t.name for t in threading.enumerate()] and was_woken(ctx)
    shown = room.to_json()
    assert (shown["id"], shown["state"], shown["factor"], shown["consecutive"], shown["repeat_left"]) == (
        "w-1", "watching", 3.0, 2, 1)
    room.stop()
    assert ctx.hot._watch is None and room.current is None
    assert "profiler-slowdown" not in [t.name for t in threading.enumerate()]
    assert room.to_json()["id"] == "w-1"  # the record still shows the last one


def test_steps_feed_the_watch_except_while_a_capture_runs(watches):
    ctx, room = watches
    room.install(_watch_request())
    for _ in range(3):
        room.on_step(advance(ctx))
    assert room.current.times.steps_seen == 2  # the first step only starts the clock
    request = ProfileRequest(id="req-1", rank_filter=RankFilter(None))
    ctx.capture.admit(request, step=ctx.steps(), rank=1, world_size=4, replica="r1", enabled=True)
    ctx.capture.claim(request)
    assert ctx.capture.is_capturing()
    for _ in range(3):
        room.on_step(advance(ctx))
    assert room.current.times.steps_seen == 2  # a captured step is not the job's own pace
    ctx.capture.fail("capture req-1 failed", ctx.steps())
    room.on_step(advance(ctx))
    assert not ctx.capture.is_capturing() and room.current.times.steps_seen == 3


def test_the_capture_the_watch_asked_for_fires_it(watches):
    ctx, room = watches
    room.install(_watch_request())
    capture = ProfileRequest(id="w-1.slow-2", rank_filter=RankFilter(None), start_step=40, reason="step 3.4x")
    room.on_request(capture, advance(ctx, 30))
    shown = room.to_json()
    assert (shown["state"], shown["num_fired"], shown["fired_request_id"], shown["message"]) == (
        "fired", 2, "w-1.slow-2", "step 3.4x")
    assert shown["last_capture_at"] is not None
    room.on_request(ProfileRequest(id="other", rank_filter=RankFilter(None)), ctx.steps())
    assert room.to_json()["fired_request_id"] == "w-1.slow-2"  # someone else's request is not its capture


def test_a_cancel_disarms_the_watch(watches):
    ctx, room = watches
    room.install(_watch_request())
    room.cancel("stop-1")
    assert ctx.hot._watch is None and room.current is None
    shown = room.to_json()
    assert (shown["state"], shown["note"]) == ("cancelled", "cancelled by request stop-1")


def test_a_new_arming_keeps_the_pace_the_last_one_learned(watches):
    ctx, room = watches
    room.install(_watch_request())
    for _ in range(5):
        room.on_step(advance(ctx))
    room.install(_watch_request("w-2", factor=5.0))
    assert room.current.id == "w-2" and ctx.hot._watch is room.current
    assert len(room.current.times.ring) == 4 and room.current.times.factor == 5.0


def test_the_always_on_watch_keeps_its_budget_across_a_restart(watches):
    ctx, room = watches
    assert room.last_capture_at() is None  # no record yet
    alive_record(ctx.registry_root, "r1", 1, slowdown={"always_on": True, "last_capture_at": 1234.5})
    assert room.last_capture_at() == 1234.5
    room.install(always_on_request(2.0, "job-1", {}), always_on=True, last_capture_at=room.last_capture_at())
    assert room.to_json()["always_on"] is True and room.to_json()["last_capture_at"] == 1234.5
