"""sidecar.rank.publisher.RecordPublisher: the rank record, built in one room from the rooms it reads,
written whole, then only ticked while nothing changed. Real rooms, none started."""

from __future__ import annotations

import dataclasses
import os

from sidecar.common import layout
from sidecar.common.records import read_record
from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank.faulthandler_stacks import FaultStacks
from sidecar.rank.intake import RequestIntake
from sidecar.rank.publisher import RecordPublisher
from sidecar.rank.saver import Saver
from sidecar.rank.signalowner import SignalOwner
from sidecar.rank.watches import Watches
from support.rooms import advance, rank_context


def _publisher(tmp_path, **settings):
    ctx = rank_context(tmp_path, **settings)
    saver, watches = Saver(ctx), Watches(ctx)
    intake = RequestIntake(ctx, watches, saver)
    trigger = intake.file_trigger(layout.control_path(ctx.registry_root, "r1"), ctx.settings)
    publisher = RecordPublisher(ctx, signals=SignalOwner(ctx, {}), watches=watches, saver=saver,
                                file_trigger=trigger, fault_stacks=FaultStacks("off", tmp_path / "fault.txt", 1),
                                stall_watch=None)
    return ctx, publisher, intake


def test_the_record_says_who_the_rank_is_and_where_it_stands(tmp_path):
    ctx, publisher, intake = _publisher(tmp_path)
    assert ctx.heartbeat is publisher.heartbeat  # the publisher owns the heartbeat the rooms wake
    advance(ctx, 12)
    intake.accept(ProfileRequest(id="req-1", rank_filter=RankFilter(None), start_step=20))
    record = publisher.record()
    assert (record.replica, record.rank, record.world_size, record.job) == ("r1", 1, 4, "job-1")
    assert (record.step, record.state, record.request_id) == (12, "armed", "req-1")
    assert record.history[-1]["state"] == "armed" and record.num_requests == 1
    assert record.counts_steps_by == "step()" and record.cannot_trace is None and record.signal is None
    assert record.upload_to is None and record.slowdown is None and record.stall is None
    assert record.output_dir == str(ctx.output_dir) and record.exited_at is None
    ctx.cannot_trace = "no step boundary"
    assert publisher.record().counts_steps_by == "none"


def test_the_record_shows_the_identity_it_is_given(tmp_path):
    ctx, publisher, _ = _publisher(tmp_path)
    publisher.identity = dataclasses.replace(ctx.identity, world_size=8)  # as the Cosmos-RL profiler widens it
    assert publisher.record().world_size == 8 and ctx.identity.world_size == 4


def test_publish_writes_the_record_and_an_idle_heartbeat_only_ticks_it(tmp_path):
    ctx, publisher, _ = _publisher(tmp_path)
    advance(ctx, 3)
    publisher.publish()
    path = layout.record_path(ctx.registry_root, "r1", 1)
    first = os.stat(path)
    assert read_record(path).step == 3
    os.utime(path, (first.st_atime - 100, first.st_mtime - 100))
    publisher.idle_tick()  # nothing changed: the file's mtime moves, the file stays the same one
    ticked = os.stat(path)
    assert ticked.st_ino == first.st_ino and ticked.st_mtime > first.st_mtime - 100
    advance(ctx)
    publisher.publish()  # a new step: written anew
    assert read_record(path).step == 4 and os.stat(path).st_ino != first.st_ino
    publisher.publish(exited=True)
    assert read_record(path).exited_at is not None
