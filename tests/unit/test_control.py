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


def test_a_rank_that_stopped_stepping_is_planned_at_once_too(tmp_path, monkeypatch):
    at = time.time() - 0.2
    _remote(tmp_path, 0, at, step=40, recent_steps=[[at - 5.0, 40]], last_step_at=at - 5.0, started_at=at - 0.3)
    _remote(tmp_path, 1, at, step=40, recent_steps=[], last_step_at=None, started_at=at - 0.3)
    reads = Reads(monkeypatch)
    result = control.set_profile(tmp_path, "r1", rank_filter="all", now=at + 2.5)
    assert reads.count == 0 and result.start_step == 40 + startstep.MIN_LEAD_STEPS


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
