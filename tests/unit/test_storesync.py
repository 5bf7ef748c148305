"""The Redis registry's pure parts: one warning line per outage whichever part meets it
(sidecar.rank.storesync.Outage), the backoff, a node record's clock moved onto the CLI's view
(sidecar.fleet.storeview), and where a dump's copy lies (sidecar.common.layout)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sidecar.common import layout
from sidecar.fleet.storeview import _safe, _shift_offset
from sidecar.rank.storesync import MAX_BACKOFF_S, MIN_BACKOFF_S, Outage, next_backoff


def test_one_warning_per_outage_whichever_part_meets_it(caplog):
    outage = Outage("redis://h:1/0", "rank 0, its node's agent")
    with caplog.at_level(logging.INFO, logger="sidecar"):
        outage.failed("watch", "Redis at redis://h:1/0 cannot be reached (refused)")
        outage.failed("sync", "Redis at redis://h:1/0 cannot be reached (refused)")
        outage.failed("sync", "again")
        assert not outage.ok("sync")  # the watch has not reached it yet: still down
        assert outage.ok("watch")
        assert not outage.ok("watch")
        outage.failed("sync", "Redis at redis://h:1/0 did not answer within 1s")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "[Profiler] rank 0, its node's agent: Redis at redis://h:1/0 cannot be reached (refused); retrying with "
        "backoff (training goes on)",
        "[Profiler] rank 0, its node's agent: Redis at redis://h:1/0 did not answer within 1s; retrying with "
        "backoff (training goes on)"]
    assert outage.num_outages == 2
    assert any("answers again after" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_backoff_doubles_to_its_cap():
    delays = [0.0]
    for _ in range(8):
        delays.append(next_backoff(delays[-1]))
    assert delays[1] == MIN_BACKOFF_S and delays[-1] == MAX_BACKOFF_S
    assert all(b >= a for a, b in zip(delays, delays[1:], strict=False))


def test_a_node_records_clock_moves_and_nothing_else_does():
    node = {"node_format": 1, "clock_offset": 600.0, "ranks": [{"rank": 3, "summary": {"top_ops": ["aten::mm"]}}],
            "common": {"replica": "r"}}
    moved = json.loads(_shift_offset(json.dumps(node).encode(), -0.5))
    assert moved == {**node, "clock_offset": 599.5}  # a field another part adds travels as it is
    for raw in (b"not json", json.dumps({"clock_offset": None}).encode(), b"[1, 2]"):
        assert _shift_offset(raw, 3.0) == raw


def test_where_a_dump_copy_lies(tmp_path):
    root = tmp_path / "view"
    copy = layout.dump_copy_of(root, "/dev/shm/out/profile_trace/job_1_7/3_stacks.txt")
    assert copy == layout.dump_copy_path(root, "job_1", 7, "3_stacks.txt")
    assert copy == root / "replicas" / "job_1" / "dumps" / "rank-7" / "3_stacks.txt"
    assert layout.dump_copy_of(root, "/tmp/elsewhere/3_stacks.txt") is None


def test_a_key_path_stays_under_the_view():
    assert _safe("replicas/r/nodes/00/h.json")
    assert not any(_safe(p) for p in ("", "/etc/passwd", "replicas/../../x", "replicas//x", "replicas/./x"))
    assert Path("replicas/r").parts[0] == layout.REPLICAS_DIR
