"""sidecar.rank.intake.RequestIntake: requests into one rank, from the control file, a signal or the
training thread; what each is answered, in the capture owner's state and the files it writes."""

from __future__ import annotations

import json
import threading

from sidecar.common.registry import ControlFile
from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank.intake import RequestIntake
from sidecar.rank.saver import Saver
from sidecar.rank.watches import Watches
from support.rooms import advance, published, rank_context, was_woken


def _intake(tmp_path, **kwargs):
    ctx = rank_context(tmp_path, **kwargs)
    watches = Watches(ctx)
    return ctx, RequestIntake(ctx, watches, Saver(ctx)), watches


def _control(obj: dict | None, mtime_ns: int = 1_700_000_000_000_000_000, repeat: bool = False) -> ControlFile:
    data = b"" if obj is None else json.dumps(obj).encode()
    return ControlFile(data=data, mtime_ns=mtime_ns, size=len(data), inode=1, mode=0o100644, repeat=repeat)


def test_a_control_file_request_is_armed_and_published_from_the_watcher_thread(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    advance(ctx, 10)
    intake.on_watched_file(_control({"id": "req-1", "rank_filter": [1], "start_step": 14, "active_steps": 2}))
    fields = ctx.capture.record_fields()
    assert fields["state"] == "armed" and fields["request_id"] == "req-1" and fields["request"]["start_step"] == 14
    assert ctx.hot._boundary_work is True
    assert published(ctx) == 1 and not was_woken(ctx)  # one publish, on this thread: no hand-off


def test_a_request_that_cannot_be_read_is_refused_with_the_reason(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    intake.on_watched_file(_control({"id": "bad", "active_steps": "many"}))
    fields = ctx.capture.record_fields()
    assert fields["state"] == "idle" and fields["num_refused"] == 1
    assert fields["error"].startswith("request refused: ") and "active_steps" in fields["error"]
    assert ctx.hot._boundary_work is False


def test_the_same_content_again_is_a_new_request_that_starts_at_the_next_step(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    advance(ctx, 20)
    request = {"id": "req-1", "rank_filter": [1], "start_step": 25}
    intake.on_watched_file(_control(request))
    assert ctx.capture.pending.id == "req-1"
    intake.accept(ProfileRequest(id="stop-1", kind="cancel", rank_filter=RankFilter(None)))
    advance(ctx, 10)  # step 30: start_step 25 has passed
    intake.on_watched_file(_control(request, mtime_ns=1_700_000_001_000_000_000, repeat=True))
    armed = ctx.capture.pending
    assert armed is not None and armed.id not in ("req-1", "stop-1") and armed.start_step is None


def test_a_cancel_disarms_the_armed_request(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    intake.on_watched_file(_control({"id": "req-1", "rank_filter": [1], "start_step": 50}))
    intake.on_watched_file(_control({"id": "stop-1", "kind": "cancel", "rank_filter": "all"},
                                    mtime_ns=1_700_000_001_000_000_000))
    fields = ctx.capture.record_fields()
    assert fields["state"] == "idle" and ctx.capture.pending is None and fields["cancelled"] is True
    assert fields["cancel"]["outcome"] == "disarmed" and fields["cancel"]["request_id"] == "req-1"


def test_a_stacks_request_is_answered_at_once_with_a_file(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    advance(ctx, 7)
    watcher = threading.Thread(target=intake.on_watched_file, name="watcher",
                               args=(_control({"id": "dump-1", "kind": "stacks", "rank_filter": "all"}),))
    watcher.start()
    watcher.join(timeout=10)
    path = ctx.trace_dir / "0_stacks.txt"
    text = path.read_text()
    assert "replica=r1 rank=1" in text and "step=7" in text and "request=dump-1" in text
    # every thread but the one answering: the main thread, here starting the watcher or waiting for it
    assert "--- thread MainThread" in text and "in test_a_stacks_request_is_answered_at_once_with_a_file" in text
    assert "--- thread watcher" not in text
    fields = ctx.capture.record_fields()
    assert fields["stacks_path"] == str(path) and fields["state"] == "idle"
    assert fields["history"][-1]["request_id"] == "dump-1" and ctx.hot._boundary_work is False


def test_a_signal_is_a_request_of_this_ranks_defaults_on_this_rank_alone(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    intake.on_signal(3)
    armed = ctx.capture.pending
    assert armed is not None and armed.id == "signal-1-3" and armed.source == "signal"
    assert armed.rank_filter == RankFilter(frozenset({1})) and armed.active_steps == ctx.defaults["active_steps"]
    assert was_woken(ctx)


def test_a_rank_that_cannot_count_steps_refuses_a_trace_with_the_reason(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    ctx.cannot_trace = "this worker runs inference only"
    accepted = intake.accept(ProfileRequest(id="req-1", rank_filter=RankFilter(None)))
    assert accepted is False
    assert ctx.capture.record_fields()["refused"] == "request req-1 refused: this worker runs inference only"


def test_a_disabled_profiler_refuses_and_says_how_to_turn_it_on(tmp_path):
    ctx, intake, _ = _intake(tmp_path, enabled=False)
    assert intake.accept(ProfileRequest(id="req-1", rank_filter=RankFilter(None))) is False
    assert "set [profiler] enable_profiler = true" in ctx.capture.record_fields()["error"]


def test_a_watch_request_arms_the_slowdown_watch_that_step_feeds(tmp_path):
    ctx, intake, watches = _intake(tmp_path)
    try:
        watch = {"id": "w-1", "kind": "watch", "factor": 3, "baseline": False, "rank_filter": "all"}
        intake.on_watched_file(_control(watch))
        assert ctx.hot._watch is watches.current and watches.current.id == "w-1"
        assert watches.to_json()["state"] == "watching"
        assert ctx.capture.state.value == "idle"  # a watch arms no capture
    finally:
        watches.stop()
    assert ctx.hot._watch is None


def test_each_stacks_request_takes_the_next_number_and_replaces_no_file(tmp_path):
    ctx, intake, _ = _intake(tmp_path)
    for n in range(3):
        intake.on_watched_file(_control({"id": f"s-{n}", "kind": "stacks", "rank_filter": "all"}, mtime_ns=n))
    names = sorted(p.name for p in ctx.trace_dir.iterdir())
    assert names == ["0_stacks.txt", "1_stacks.txt", "2_stacks.txt"]
    assert "request=s-2" in (ctx.trace_dir / "2_stacks.txt").read_text()
