"""`profile set`'s wait for a pace (sidecar.fleet.control): a rank whose record has no pace yet is
read again after its next rewrite, unless its counter stood still a while (it has not stepped, or
stopped): then its rate is known, none, and the plan is made at once."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import pytest

from sidecar.common import startstep
from sidecar.common.records import RankRecord, write_record
from sidecar.common.recordscan import read_records
from sidecar.fleet import control


def _remote(registry: Path, rank: int, at: float, **fields) -> RankRecord:
    """A rank on another host whose record was written at `at` (its mtime) and not since."""
    values = {"replica": "r1", "role": "policy", "rank": rank, "world_size": 2, "host": "node-elsewhere",
              "pid": 4000 + rank, "started_at": at, "heartbeat_at": at, "last_step_at": at, "heartbeat_interval": 5.0,
              "step": 0, "recent_steps": [[at, 0]], "watch": "inotify"}
    values.update(fields)
    record = RankRecord(**values)
    os.utime(write_record(registry, record), (at, at))
    return record


class Reads:
    """`read_records` in sidecar.fleet.control, counted; each read can hand back rewritten records."""

    def __init__(self, monkeypatch, rewrite=None) -> None:
        self.count = 0
        self.rewrite = rewrite

        def read(root, name):
            self.count += 1
            if self.rewrite is not None:
                self.rewrite()
            return read_records(root, name)

        monkeypatch.setattr(control, "read_records", read)

        def no_sleep(seconds):
            raise AssertionError(f"profile set waited for a pace ({seconds}s)")

        monkeypatch.setattr(control.time, "sleep", no_sleep)


def test_ranks_that_have_not_stepped_are_planned_at_once(tmp_path, monkeypatch):
    at = time.time() - 3.0  # written at their start, 3 s ago: longer than STILL_AFTER_S, shorter than a heartbeat
    for k in range(2):
        _remote(tmp_path, k, at)
    reads = Reads(monkeypatch)
    result = control.set_profile(tmp_path, "r1", rank_filter="all", now=at + 3.0)
    assert reads.count == 0
    assert (result.start_step, result.lead_steps, result.ranks) == (startstep.MIN_LEAD_STEPS, startstep.MIN_LEAD_STEPS,
                                                                     [0, 1])
    assert result.warnings == [control.unpaced_warning([0, 1], startstep.MIN_LEAD_STEPS)]
    assert result.warnings[0].startswith("ranks 0-1 (2) have not stepped since starting, so no pace is known: step 3 ")


def test_a_rank_that_stopped_stepping_is_planned_at_once_too(tmp_path, monkeypatch):
    at = time.time() - 0.2
    _remote(tmp_path, 0, at, step=40, recent_steps=[[at - 5.0, 40]], last_step_at=at - 5.0, started_at=at - 0.3)
    _remote(tmp_path, 1, at, step=40, recent_steps=[], last_step_at=None, started_at=at - 0.3)
    reads = Reads(monkeypatch)
    result = control.set_profile(tmp_path, "r1", rank_filter="all", now=at + 2.5)
    assert reads.count == 0 and result.start_step == 40 + startstep.MIN_LEAD_STEPS
    assert result.warnings == []  # they stepped: not "not stepped since starting"


def test_a_rank_that_steps_without_a_pace_yet_is_read_again_after_its_rewrite(tmp_path, monkeypatch, caplog):
    at = time.time()
    young = _remote(tmp_path, 0, at, step=3, recent_steps=[[at, 3]], started_at=at - 0.1)  # stepped, one sample
    _remote(tmp_path, 1, at - 3.0)  # and one standing still: not waited for

    def rewrite() -> None:  # its heartbeat: a pace of 10 steps/s
        write_record(tmp_path, dataclasses.replace(young, heartbeat_at=at + 1.0, step=13,
                                                   recent_steps=[[at, 3], [at + 1.0, 13]]))

    reads = Reads(monkeypatch, rewrite)
    with caplog.at_level(logging.DEBUG, logger="sidecar"):
        result = control.set_profile(tmp_path, "r1", rank_filter="all", now=at + 0.2)
    assert reads.count == 1
    assert "profile set r1: waiting up to 5.0s for the pace of rank 0 (no pace in its record yet)" in caplog.text
    assert result.start_step >= 13 + 10 * startstep.LEAD_SECONDS


def test_a_ticked_record_of_a_rank_that_has_not_stepped_is_waited_for_only_until_it_stood_still(tmp_path, monkeypatch):
    """A rank standing still is never rewritten, only ticked (its file's mtime): right after a tick
    its record cannot show the 2 s it stood still. It is read again until it can, not for 5 s."""
    at = time.time() - 100.0
    _remote(tmp_path, 0, at, started_at=at - 0.4, last_step_at=at - 0.3)  # written 0.4 s after its start
    path = tmp_path / "replicas" / "r1" / "rank-0.json"
    ticked = at + 60.0
    os.utime(path, (ticked, ticked))
    clock_now = iter(ticked + 0.5 * k for k in range(1, 100))  # the filesystem's clock, polled
    monkeypatch.setattr(control.clock, "fs_now", lambda root: next(clock_now))
    reads = Reads(monkeypatch)
    monkeypatch.setattr(control.time, "sleep", lambda seconds: None)
    result = control.set_profile(tmp_path, "r1", rank_filter="all", now=ticked + 0.2)
    assert reads.count == 4  # 0.5, 1.0, 1.5 and 2.0 s after the tick: by then 2.1 s since its last step
    assert result.start_step == startstep.MIN_LEAD_STEPS
    assert result.warnings == [control.unpaced_warning([0], startstep.MIN_LEAD_STEPS)]


@pytest.mark.parametrize(("fields", "age", "still"), [
    ({}, 3.0, True),  # never stepped, up 3 s
    ({}, 1.0, False),  # just started: it may step any moment
    ({"step": 7, "recent_steps": [[0.0, 5], [1.0, 7]]}, 30.0, False),  # its samples show steps: a pace
    ({"step": 7, "recent_steps": [[1.0, 7]], "last_step_at": 0.2}, 1.5, True),  # stepped, then stood still 2.3 s
    ({"step": 7, "recent_steps": [[1.0, 7]], "last_step_at": 1.0}, 1.5, False),  # 1.5 s: not yet
    ({"last_step_at": None}, 2.5, True),  # an older sidecar's record: from its start
])
def test_standing_still(fields, age, still):
    record = RankRecord(replica="r1", role="p", rank=0, started_at=0.0, heartbeat_at=1.0,
                        **{"step": 0, "recent_steps": [[1.0, 0]], "last_step_at": 0.0, **fields})
    record.file_mtime = 1.0
    assert startstep.standing_still(record, 1.0 + age) is still
