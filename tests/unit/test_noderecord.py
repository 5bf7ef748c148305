"""Node records read back (sidecar.common.noderecord): what `build` writes, `expand` turns into rank
records as if ticked at the file's mtime: the pace projected to the last tick, on the filesystem's
clock whatever the node's clock says; quiet and exited ranks aged from their own heartbeat; bad
entries named, the good ones kept."""

from __future__ import annotations

import json
import math
import os

import pytest

from sidecar.common import clock, noderecord
from sidecar.common.noderecord import Pace
from sidecar.common.records import RankRecord, RecordError
from sidecar.common.startstep import projected_step, recent_rate, step_rate
from sidecar.fleet.replicas import liveness

FS_NOW = 1_800_000_000.0  # the filesystem's clock, now


def _record(rank: int, **fields) -> RankRecord:
    values = {"replica": "r1", "role": "policy", "rank": rank, "local_rank": rank % 8, "world_size": 16,
              "host": "node-a", "pid": 100 + rank, "started_at": FS_NOW - 600.0, "heartbeat_at": FS_NOW - 1.0,
              "step": 500, "watch": "inotify", "job": "j1", "recent_steps": [[FS_NOW - 1.5, 495], [FS_NOW - 1.0, 500]],
              "last_step_at": FS_NOW - 1.0, "defaults": {"active_steps": 2}}
    values.update(fields)
    return RankRecord(**values)


def _node(records, paces=None, stale=(), written_at=FS_NOW - 0.5, clock_offset=0.0, interval=2.0) -> dict:
    entries = [noderecord.entry(r, (paces or {}).get(r.rank), r.rank not in stale) for r in records]
    data = noderecord.build("r1", "node-a", {"rank": 0, "pid": 100, "epoch": 1}, entries, written_at, clock_offset,
                            interval)
    return noderecord.parse_node_bytes(data, "n.json")


def test_build_writes_what_the_entries_share_once_and_reading_gives_every_entry_whole():
    records = [_record(k) for k in range(4)]
    entries = [noderecord.entry(r, Pace(FS_NOW - 1.0, 500, 10.0), True) for r in records]
    node = json.loads(noderecord.build("r1", "node-a", {"rank": 0, "pid": 100, "epoch": 1}, entries, FS_NOW, 0.0, 2.0))
    assert node["common"]["host"] == "node-a" and node["common"]["defaults"] == {"active_steps": 2}
    assert all(set(raw) == {"rank", "local_rank", "pid"} for raw in node["ranks"])  # only what differs
    assert noderecord.node_entries(node) == entries
    one = json.loads(noderecord.build("r1", "node-a", {}, entries[:1], FS_NOW, 0.0, 2.0))
    assert one["ranks"] == [{}] and noderecord.node_entries(one) == entries[:1]


def test_expand_projects_the_pace_to_the_last_tick_and_the_cli_reads_its_rate_exactly():
    anchor = Pace(FS_NOW - 10.0, 500, 7.3)
    node = _node([_record(0), _record(1, step=480)], paces={0: anchor}, written_at=FS_NOW - 9.0)
    mtime = FS_NOW - 0.5  # ticked since the write
    records, problems = noderecord.expand(node, mtime, "n.json")
    assert problems == []
    first, second = records
    assert first.step == math.floor(500 + 7.3 * 9.5) and first.heartbeat_at == mtime and first.file_mtime == mtime
    assert first.last_step_at == mtime and first.mtime_heartbeat and first.heartbeat_interval == 2.0
    assert recent_rate([(t, int(n)) for t, n in first.recent_steps]) == pytest.approx(7.3, rel=1e-6)
    assert step_rate(first) == pytest.approx(7.3, rel=1e-6)
    # The CLI's own projection on top: from the tick to now, at that rate.
    # and the steps it may be ahead of its anchor before the agent writes a new one.
    assert first.step_slack == noderecord.ahead_slack(7.3) and second.step_slack == 0.0
    assert projected_step(first, FS_NOW)[0] == pytest.approx(first.step + first.step_slack + 7.3 * 0.5)
    # Without a pace: the entry's own step and samples, heartbeat at the tick.
    assert (second.step, second.heartbeat_at, second.recent_steps) == (480, mtime, [[FS_NOW - 1.5, 495], [FS_NOW - 1.0, 500]])


def test_a_tick_within_one_step_of_the_anchor_still_gives_its_rate():
    anchor = Pace(FS_NOW - 0.05, 500, 4.0)  # 0.2 of a step since the anchor
    records, _ = noderecord.expand(_node([_record(0)], paces={0: anchor}), FS_NOW, "n.json")
    assert records[0].step == 500
    assert step_rate(records[0]) == pytest.approx(4.0, rel=1e-6)


def test_a_skewed_node_clock_is_read_on_the_filesystems_clock():
    """The node's clock an hour ahead of the filesystem's (clock_offset measured): ages, projections
    and the rank's own times line up on the filesystem's clock."""
    skew = 3600.0
    on_node = lambda t: t + skew  # noqa: E731
    rec = _record(0, started_at=on_node(FS_NOW - 600.0), heartbeat_at=on_node(FS_NOW - 1.0),
                  last_step_at=on_node(FS_NOW - 1.0), recent_steps=[])
    anchor = Pace(on_node(FS_NOW - 4.0), 500, 5.0)
    node = _node([rec, _record(1, heartbeat_at=on_node(FS_NOW - 400.0), host="node-a")], paces={0: anchor},
                 stale=(1,), written_at=on_node(FS_NOW - 3.0), clock_offset=-skew)
    mtime = FS_NOW - 1.0
    (fresh, quiet), _ = noderecord.expand(node, mtime, "n.json")
    assert fresh.heartbeat_at == pytest.approx(on_node(mtime)) and fresh.file_mtime == mtime
    assert fresh.step == 515  # 3 s of the anchor's pace to the tick, on the node's clock
    assert clock.record_age(fresh, FS_NOW) == pytest.approx(1.0)
    assert liveness(fresh, "login", FS_NOW) == (True, "alive")
    assert clock.to_fs_clock(fresh, fresh.started_at) == pytest.approx(FS_NOW - 600.0)
    assert clock.step_age(fresh, FS_NOW) == pytest.approx(1.0)
    assert projected_step(fresh, FS_NOW)[0] == pytest.approx(520.0 + fresh.step_slack)
    # A quiet rank ages from its own last heartbeat, shifted onto the filesystem's clock.
    assert quiet.file_mtime == pytest.approx(FS_NOW - 400.0)
    assert liveness(quiet, "login", FS_NOW) == (False, "no heartbeat for 6m40s")


def test_without_a_measured_offset_the_write_stands_for_it():
    node = _node([_record(0)], written_at=FS_NOW - 7200.0 - 3.0, clock_offset=None)  # the node 2 h behind
    mtime = FS_NOW - 3.0  # not ticked since: the write's own mtime
    (record,), _ = noderecord.expand(node, mtime, "n.json")
    assert record.heartbeat_at == pytest.approx(FS_NOW - 7200.0 - 3.0) and record.file_mtime == mtime
    assert clock.record_age(record, FS_NOW) == pytest.approx(3.0)


def test_quiet_and_exited_ranks_age_from_their_own_heartbeat_while_the_file_ticks():
    quiet = _record(1, heartbeat_at=FS_NOW - 60.0)
    gone = _record(2, heartbeat_at=FS_NOW - 30.0, exited_at=FS_NOW - 30.0)
    node = _node([_record(0), quiet, gone], paces={1: Pace(FS_NOW - 61.0, 500, 3.0)}, stale=(1,))
    records, _ = noderecord.expand(node, FS_NOW - 0.2, "n.json")
    by_rank = {r.rank: r for r in records}
    assert by_rank[0].file_mtime == FS_NOW - 0.2 and liveness(by_rank[0], "login", FS_NOW)[0]
    assert by_rank[1].file_mtime == FS_NOW - 61.0  # the anchor's time is what its entry kept
    assert by_rank[1].step == 500 and liveness(by_rank[1], "login", FS_NOW) == (False, "no heartbeat for 1m01s")
    assert by_rank[2].file_mtime == FS_NOW - 30.0 and by_rank[2].step == 500  # no projection past an exit
    assert liveness(by_rank[2], "login", FS_NOW) == (False, "exited")


def test_bad_entries_are_named_and_the_others_kept():
    node = _node([_record(k) for k in range(4)], paces={2: Pace(FS_NOW, 500, 1.0)})
    node["ranks"][0]["step"] = "many"
    node["ranks"][1] = ["not", "an", "entry"]
    node["ranks"][2]["pace"] = {"t": FS_NOW, "step": -3, "rate": 1.0}
    records, problems = noderecord.expand(node, FS_NOW, "n.json")
    assert [r.rank for r in records] == [3]
    assert problems == [
        (0, "node record n.json: rank 0: field 'step' must be an integer, got string"),
        (None, "node record n.json: an entry is not an object"),
        (2, "node record n.json: rank 2: its pace's step must be an integer between 0 and 9007199254740991, got -3"),
    ]


def test_a_bad_shared_field_makes_every_entry_bad_and_a_missing_required_one_is_named():
    node = _node([_record(0), _record(1)])
    node["common"]["world_size"] = -1
    records, problems = noderecord.expand(node, FS_NOW, "n.json")
    assert records == [] and [p[0] for p in problems] == [0, 1]
    assert "field 'world_size' must be between 0" in problems[0][1] and "(in the fields its ranks share)" in problems[0][1]
    node = _node([_record(0), _record(1)])
    del node["common"]["replica"]
    assert noderecord.expand(node, FS_NOW, "n.json")[1][0] == (0, "node record n.json: rank 0: field 'replica' is missing")


@pytest.mark.parametrize("pace", [{"t": "now", "step": 1, "rate": 1.0}, {"t": 1.0, "step": 1, "rate": math.inf},
                                  {"t": 1.0, "step": 1, "rate": -1.0}, {"t": 1.0, "step": True, "rate": 1.0}, [1, 2]])
def test_a_bad_pace_is_a_bad_entry(pace):
    node = _node([_record(0)])
    node["ranks"][0]["pace"] = pace
    records, problems = noderecord.expand(node, FS_NOW, "n.json")
    assert records == [] and problems[0][0] == 0 and "pace" in problems[0][1]


def test_a_pace_at_rate_zero_is_a_rank_standing_still_and_a_wild_one_stays_in_bounds():
    node = _node([_record(0), _record(1)], paces={0: Pace(FS_NOW - 100, 500, 0.0), 1: Pace(-1e300, 500, 1e6)})
    (still, wild), problems = noderecord.expand(node, FS_NOW, "n.json")
    assert problems == [] and still.step == 500 and still.last_step_at == FS_NOW - 1.0
    assert wild.step == (1 << 53) - 1


def test_projections_at_two_ticks_leave_the_parsed_entries_as_they_were():
    parsed = noderecord.parse_node(_node([_record(0)], paces={0: Pace(FS_NOW - 2.0, 500, 10.0)}), "n.json")
    first = noderecord.project(parsed, FS_NOW - 1.0)
    second = noderecord.project(parsed, FS_NOW)
    assert (first[0].step, second[0].step) == (510, 520)
    assert first[0].defaults is not second[0].defaults or first[0].defaults == second[0].defaults
    assert parsed.entries[0][0].step == 500 and parsed.entries[0][0].file_mtime is None


def test_read_node_file_refuses_what_is_not_a_node_record(tmp_path):
    good = tmp_path / "a.json"
    good.write_bytes(noderecord.build("r1", "a", {}, [noderecord.entry(_record(0), None, True)], FS_NOW, 0.0, 2.0))
    node, mtime = noderecord.read_node_file(good)
    assert node["host"] == "a" and mtime == os.stat(good).st_mtime
    cases = {"notjson.json": b"{nope", "format.json": b'{"node_format": 9, "ranks": []}',
             "common.json": b'{"node_format": 1, "ranks": [], "common": []}'}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(RecordError, match=f"node record .*{name}"):
            noderecord.read_node_file(tmp_path / name)
    (tmp_path / "link.json").symlink_to(good)
    with pytest.raises(RecordError, match="symlink"):
        noderecord.read_node_file(tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(RecordError, match="not a regular file"):
        noderecord.read_node_file(tmp_path / "fifo.json")
    with pytest.raises(FileNotFoundError):
        noderecord.read_node_file(tmp_path / "gone.json")
