"""The slowdown watch's detector (sidecar.rank.slowdown) over step times given by hand. Real 2-rank
torchrun jobs slowed while they run: tests/e2e/test_slowdown_jobs.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sidecar.common.config import SubProfilerConfig
from sidecar.common.exceptions import RequestError
from sidecar.common.request import ProfileRequest, RankFilter, defaults_from_config, parse_request
from sidecar.rank.slowdown import MIN_STEPS, SlowdownWatch, StepTimes, fired_message


def _feed(times: StepTimes, durations, excluded=()):
    t, fired = 0.0, []
    if times.steps_seen == 0:
        times.observe(t, False)
    else:
        t = times._last
    for i, d in enumerate(durations):
        t += d
        if times.observe(t, i in excluded) is not None:
            fired.append(i)
    return fired


def test_the_median_leaves_out_profiled_and_saved_steps():
    times = StepTimes(factor=2.5, consecutive=3)
    # 40 steps of 10 ms, of which 20 "profiled" at 1 s each: left out of the median, and never slow
    durations = [0.01] * 20 + [1.0] * 20 + [0.01] * 20
    assert _feed(times, durations, excluded=set(range(20, 40))) == []
    assert times.median == pytest.approx(0.01)
    assert times.steps_seen == 40


def test_k_consecutive_slow_steps_fire_and_fewer_do_not():
    times = StepTimes(factor=2.5, consecutive=3)
    assert _feed(times, [0.01] * MIN_STEPS * 2) == []
    assert _feed(times, [0.03, 0.03, 0.01, 0.03, 0.03, 0.01]) == []  # 2 in a row, twice
    assert _feed(times, [0.02, 0.03, 0.03, 0.03]) == [3]  # 2x is not slow; 3 at 3x in a row are


def test_a_watch_fires_once_then_is_spent_and_says_what_fired_it():
    request = ProfileRequest(id="w", kind="watch", factor=2.0, rank_filter=RankFilter(None), active_steps=2,
                             warmup_steps=1, wait_steps=0)
    watch = SlowdownWatch(request)
    t, step = 0.0, 0
    for _ in range(20):
        step, t = step + 1, t + 0.01
        assert not watch.on_step(step, t, False)
    fired = False
    for _ in range(3):
        step, t = step + 1, t + 0.05
        fired = watch.on_step(step, t, False)
    assert fired and watch.state == "firing" and watch.fire.step == step
    assert fired_message(watch.fire, 30, 31) == f"step time 5.0x the median (50 ms vs 10 ms) at step {step}; capturing 30-31"
    trace = ProfileRequest(id="w.slow-1", start_step=step + 3, active_steps=2, warmup_steps=1, wait_steps=0,
                           rank_filter=RankFilter(None), reason="step time ...")
    assert watch.is_ours(trace) and not watch.is_ours(ProfileRequest(id="other.slow-1"))
    watch.on_request(trace, step)
    assert watch.state == "fired" and watch.num_fired == 1
    for _ in range(10):  # slow on: the capture's steps pass, then the watch is spent
        step, t = step + 1, t + 0.05
        assert not watch.on_step(step, t, False)
    assert watch.state == "spent" and watch.is_done


def test_a_capture_clears_the_note_of_a_slowdown_left_uncaptured_before_it():
    """`profile status` shows the note before the message: a note older than the capture must not stay."""
    watch, step, t = _fired_watch()
    step, t = _slow_steps(watch, step, t)
    watch.not_captured("step time 5.0x the median at step 23: not captured, 3.0% free under /t")
    assert (watch.state, watch.note) == ("watching", "step time 5.0x the median at step 23: not captured, 3.0% free under /t")
    watch.on_request(_other_ranks_capture(watch, step), step)
    assert (watch.state, watch.note, watch.message) == ("fired", None, "step time ... (rank 1 asked)")


def _fired_watch(request_id: str = "w") -> tuple[SlowdownWatch, int, float]:
    request = ProfileRequest(id=request_id, kind="watch", factor=2.0, rank_filter=RankFilter(None), active_steps=2,
                             warmup_steps=1, wait_steps=0)
    watch, t, step = SlowdownWatch(request), 0.0, 0
    for _ in range(20):
        step, t = step + 1, t + 0.01
        watch.on_step(step, t, False)
    return watch, step, t


def _slow_steps(watch: SlowdownWatch, step: int, t: float) -> tuple[int, float]:
    """Three steps at 5x the median after `step`: a watch armed as `_fired_watch`'s fires."""
    for _ in range(3):
        step, t = step + 1, t + 0.05
        watch.on_step(step, t, False)
    return step, t


def _other_ranks_capture(watch: SlowdownWatch, step: int) -> ProfileRequest:
    return ProfileRequest(id=f"{watch.id}.slow-1", start_step=step + 40, active_steps=2, warmup_steps=1,
                          wait_steps=0, rank_filter=RankFilter(None), reason="step time ... (rank 1 asked)")


def _place(tmp_path: Path, step: int):
    from sidecar.common import layout
    from sidecar.rank import slowdown

    layout.replica_dir(tmp_path, "rep").mkdir(parents=True)
    return slowdown.WatchPlace(tmp_path, "rep", 0, tmp_path / "traces", 0.0, lambda: step)


def test_the_other_ranks_capture_arriving_while_this_rank_asks_is_the_one_capture(tmp_path, monkeypatch):
    """Both ranks slow down together: rank 1 claims capture 1 and its request reaches rank 0 while rank 0's
    watch thread is between reading its fire and taking a claim. Rank 0 must not ask for a capture 2 (it would
    be refused on every rank, busy with capture 1)."""
    from sidecar.common import layout
    from sidecar.rank import slowdown

    watch, step, t = _fired_watch()
    step, t = _slow_steps(watch, step, t)
    assert watch.state == "firing"
    place = _place(tmp_path, step)
    layout.slowdown_claim_path(tmp_path, "rep", watch.id, 1).parent.mkdir(parents=True, exist_ok=True)
    layout.slowdown_claim_path(tmp_path, "rep", watch.id, 1).write_text("1\n")  # rank 1 won capture 1
    arrived = []

    def disk_check_meanwhile(path):  # the watcher thread delivers rank 1's request during the disk check
        if not arrived:
            arrived.append(True)
            watch.on_request(_other_ranks_capture(watch, step), step)
        return 50.0

    monkeypatch.setattr(slowdown, "free_pct", disk_check_meanwhile)
    assert slowdown.ask_for_capture(watch, place) is None
    assert arrived and watch.state == "fired" and watch.fired_request_id == f"{watch.id}.slow-1"
    assert not layout.slowdown_claim_path(tmp_path, "rep", watch.id, 2).exists()
    assert not layout.control_path(tmp_path, "rep").exists(), "a second capture was asked for"


def test_a_disk_under_the_floor_is_logged_once_until_it_has_room_again(tmp_path, monkeypatch, caplog):
    """Every fire under the floor leaves its note; the job's log gets one warning per spell under it
    (a job slowing down every few steps on a full disk got a warning each time)."""
    import logging

    from sidecar.rank import slowdown

    watch, step, t = _fired_watch()
    place = dataclasses.replace(_place(tmp_path, step), min_free_pct=5.0)
    free = [3.0]
    monkeypatch.setattr(slowdown, "free_pct", lambda path: free[0])

    def fire_and_ask(pct: float) -> str | None:
        nonlocal step, t
        free[0] = pct
        step, t = _slow_steps(watch, step, t)
        assert watch.state == "firing"
        return slowdown.ask_for_capture(watch, place)

    caplog.set_level(logging.DEBUG, logger="sidecar")
    assert [fire_and_ask(pct) for pct in (3.0, 2.0, 4.9)] == [None, None, None]
    assert "4.9% free" in (watch.note or "") and watch.state == "watching"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "3.0% free" in warned[0] and warned[0].endswith("said once until the disk has room again")
    caplog.clear()
    assert fire_and_ask(20.0) == f"{watch.id}.slow-1"  # room again: said, and captured
    assert any("20.0% free under" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    watch.on_request(_other_ranks_capture(watch, step), step)  # the capture came; the watch re-arms after it
    assert not watch.under_floor


def test_no_capture_while_another_rank_records_or_saves(tmp_path, monkeypatch):
    """Rank 1 still saves the watch's baseline; in synchronous training its save slows rank 0, whose watch
    fires: not a slowdown of the job (it asked for a capture at once, and its `--wait` lost the baseline)."""
    from sidecar.common import layout
    from sidecar.rank import slowdown
    from support.records import alive_record, update_record

    watch, step, t = _fired_watch()
    place = _place(tmp_path, step)
    saving = alive_record(tmp_path, "rep", 1, state="saving", request_id=f"{watch.id}.baseline")
    monkeypatch.setattr(slowdown, "free_pct", lambda path: 50.0)

    def fire_and_ask() -> str | None:
        nonlocal step, t
        step, t = _slow_steps(watch, step, t)
        assert watch.state == "firing"
        return slowdown.ask_for_capture(watch, place)

    assert fire_and_ask() is None and watch.state == "watching"
    assert watch.note is not None and watch.note.endswith(
        f"not captured, rank 1 is saving for request {watch.id}.baseline (a capture slows the other ranks too)")
    assert not layout.slowdown_claim_path(tmp_path, "rep", watch.id, 1).exists()
    update_record(tmp_path, saving, state="armed", request_id=f"{watch.id}.slow-1")  # its own capture: the claim decides
    layout.slowdown_claim_path(tmp_path, "rep", watch.id, 1).write_text("1\n")
    assert fire_and_ask() is None and watch.state == "waiting"
    watch._waiting_until = 0.0  # rank 1's request never came: back to watching, past claim 1
    update_record(tmp_path, saving, state="idle", request_id=f"{watch.id}.baseline")
    step, t = step + 1, t + 0.01
    watch.on_step(step, t, False)
    assert (watch.state, watch.next_claim) == ("watching", 2)
    assert fire_and_ask() == f"{watch.id}.slow-2"  # every other rank idle: captured


def test_a_capture_arriving_while_the_training_thread_fires_wins(monkeypatch):
    """The watcher thread delivers the replica's capture while this rank's training thread is inside the step
    that completes its own run of slow steps (after it saw "watching"): the watch stays fired, it does not
    fire again."""
    from sidecar.rank import slowdown

    watch, step, t = _fired_watch()
    for _ in range(2):
        step, t = step + 1, t + 0.05
        assert not watch.on_step(step, t, False)
    real_fire = slowdown.Fire

    def fire_meanwhile(*args):
        watch.on_request(_other_ranks_capture(watch, step), step)
        return real_fire(*args)

    monkeypatch.setattr(slowdown, "Fire", fire_meanwhile)
    step, t = step + 1, t + 0.05
    assert not watch.on_step(step, t, False)
    assert watch.state == "fired" and watch.fire is None


def test_watch_fields_belong_to_watch_requests():
    defaults = defaults_from_config(SubProfilerConfig())
    parse = lambda text: parse_request(text.encode(), defaults, "x")  # noqa: E731
    watch = parse('{"kind": "watch", "factor": 3, "consecutive": 2, "repeat": 1, "baseline": false}')
    assert (watch.factor, watch.consecutive, watch.repeat, watch.baseline) == (3.0, 2, 1, False)
    assert watch.to_json()["factor"] == 3.0 and "factor" not in parse('{"kind": "trace"}').to_json()
    with pytest.raises(RequestError, match="needs a factor"):
        parse('{"kind": "watch"}')
    with pytest.raises(RequestError, match="factor must be a number above 1"):
        parse('{"kind": "watch", "factor": 1}')
    with pytest.raises(RequestError, match="'repeat' has meaning only in a watch request"):
        parse('{"kind": "trace", "repeat": 2}')


def test_a_restart_keeps_the_always_on_budget(tmp_path, monkeypatch):
    import sidecar

    monkeypatch.setenv("COSMOS_PROFILER_SLOWDOWN_FACTOR", "3")
    where = {"output_dir": tmp_path / "out", "replica": "rs", "rank": 0, "registry": tmp_path / "reg"}
    with sidecar.install(**where) as sc:
        watch = sc.record().slowdown
        assert watch["always_on"] and watch["factor"] == 3.0 and watch["last_capture_at"] is None
        sc._watches.shown.last_capture_at = 1234.5  # as on_request sets it when a capture came
    with sidecar.install(**where) as sc:
        assert sc.record().slowdown["last_capture_at"] == 1234.5


def test_watch_options_need_on_slowdown(tmp_path):
    from support.cli import invoke

    result = invoke("profile", "set", "r1", "--repeat", "2", "--registry", str(tmp_path))
    assert result.exit_code == 2
    assert "--repeat is an option of the slowdown watch; give --on-slowdown FACTOR too" in result.output
