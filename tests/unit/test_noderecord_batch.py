"""Node records parsed together (sidecar.common.noderecord.parse_nodes): the entries of many node
records alike are checked a column at a time for all of them, and each record is made from what its
node's entries share plus its own fields; whatever the records hold, that gives what checking each
node alone (`_parse_alone`) gives: the same records, anchors and problems, and the same projection."""

from __future__ import annotations

import copy
import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.common import noderecord
from sidecar.common.noderecord import Pace
from sidecar.common.records import RECORD_FIELDS, RECORD_SCHEMA, RankRecord

FS_NOW = 1_800_000_000.0
SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                    suppress_health_check=[HealthCheck.too_slow])

# Values that break a field or a pace, each of a kind the checker refuses.
BAD_VALUES = [-1, True, "x", math.nan, math.inf, 1 << 60, None, [1], {"a": 1}, 1e301]
FIELDS = ["pid", "local_rank", "rank", "heartbeat_at", "step", "world_size", "state", "replica", "history",
          "recent_steps", "conflict", "exited_at", "defaults"]


@st.composite
def node_records(draw: st.DrawFn) -> tuple[dict, str]:
    """A node record as an agent writes it (`build`), its entries mixed (paced, standing still, no
    pace, quiet, exited, of a job setting of its own), then maybe broken in one place."""
    host = draw(st.sampled_from(["node-a", "node-b"]))
    first = draw(st.integers(0, 40))
    entries = []
    for k in range(first, first + draw(st.integers(0, 5))):
        fields = {"replica": "r1", "role": "policy", "rank": k, "local_rank": k % 8, "world_size": 64, "host": host,
                  "pid": 100 + k, "started_at": FS_NOW - 600.0, "heartbeat_at": FS_NOW - draw(st.sampled_from([1.0, 30.0])),
                  "step": 500, "heartbeat_interval": draw(st.sampled_from([2.0, 2.0, 7.5])),
                  "exited_at": draw(st.sampled_from([None, None, None, FS_NOW - 3.0])),
                  "defaults": draw(st.sampled_from([None, {"active_steps": 2}])),
                  "history": draw(st.sampled_from([[], [{"request_id": "a"}]]))}
        record = RankRecord(**fields)
        rate = draw(st.sampled_from([None, 0.0, 5.0, 5.0, 0.25]))
        pace = None if rate is None else Pace(FS_NOW - draw(st.sampled_from([1.0, 2.5])), 500, rate)
        entries.append(noderecord.entry(record, pace, draw(st.booleans())))
    data = noderecord.build("r1", host, {"rank": first, "pid": 100 + first, "epoch": 1}, entries, FS_NOW - 0.5,
                            draw(st.sampled_from([0.0, None, 3.0])), 2.0)
    node = noderecord.parse_node_bytes(data, f"{host}.json")
    breakage = draw(st.sampled_from(["none", "none", "none", "field", "pace", "common", "drop", "unknown", "entry"]))
    ranks = node["ranks"]
    if breakage == "field" and ranks:
        draw(st.sampled_from(ranks))[draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(BAD_VALUES))
    elif breakage == "pace" and ranks:
        raw = draw(st.sampled_from(ranks))
        raw["pace"] = draw(st.sampled_from([{"t": 1, "step": 1, "rate": 1.0}, {"t": 1.0, "step": -1, "rate": 1.0},
                                            {"t": 1.0, "step": 1, "rate": -2.0}, {"t": math.nan, "step": 1, "rate": 1},
                                            {"t": 1.0, "step": 1, "rate": 2}, [1, 2, 3], "fast", None]))
    elif breakage == "common":
        node["common"][draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(BAD_VALUES))
    elif breakage == "drop":
        where = draw(st.sampled_from([node["common"], *ranks]))
        if where:
            del where[draw(st.sampled_from(sorted(where)))]
    elif breakage == "unknown" and ranks:
        draw(st.sampled_from(ranks))["from_a_newer_sidecar"] = 1
    elif breakage == "entry" and ranks:
        ranks[draw(st.integers(0, len(ranks) - 1))] = draw(st.sampled_from([["not"], 3, None]))
    return node, f"{host}.json"


def _whole(record: RankRecord) -> dict:
    return {**{name: getattr(record, name) for name in RECORD_FIELDS},
            "file_mtime": record.file_mtime, "step_slack": record.step_slack}


def _read(parsed: noderecord.ParsedNode, mtime: float) -> tuple:
    entries = [(_whole(record), pace, fresh) for record, pace, fresh in parsed.entries]
    projected = [_whole(record) for record in noderecord.project(parsed, mtime)]
    return parsed.interval, parsed.written, parsed.clock_offset, entries, parsed.problems, projected


@SETTINGS
@given(st.lists(node_records(), max_size=5))
def test_nodes_parsed_together_read_as_each_parsed_alone(nodes):
    alone = [noderecord._parse_alone(node, path) for node, path in copy.deepcopy(nodes)]
    together = noderecord.parse_nodes(copy.deepcopy(nodes))
    assert [_read(p, FS_NOW) for p in together] == [_read(p, FS_NOW) for p in alone]
    # Each record its own lists and objects: one rank's history is not another's.
    records = [record for parsed in together for record, _, _ in parsed.entries]
    for name in ("history", "recent_steps"):
        assert len({id(getattr(r, name)) for r in records}) == len(records)


def test_a_record_holds_only_what_differs_from_its_class_and_reads_every_field():
    """A node's records keep in their dict what they say (the fields at a plain default are the
    dataclass's class attributes): every field without one is required or made by a factory, so
    each record reads every field, as a whole one does."""
    no_class_value = {f.name for f in dataclasses.fields(RankRecord) if f.name not in vars(RankRecord)}
    assert no_class_value == set(RECORD_SCHEMA.required) | {name for name, _ in RECORD_SCHEMA.factories}
    record = RankRecord(replica="r1", role="policy", rank=3, host="node-a", pid=7)
    entry = noderecord.entry(record, None, True)
    node = noderecord.parse_node_bytes(noderecord.build("r1", "node-a", {}, [entry, dict(entry, rank=4)], FS_NOW, 0.0, 2.0))
    first, second = (r for r, _, _ in noderecord.parse_nodes([(node, "n.json")])[0].entries)
    assert "world_size" not in vars(first) and first.world_size == 1
    assert _whole(first) == _whole(record)
    assert first == dataclasses.replace(record) and second.rank == 4
    first.history.append({"request_id": "a"})
    assert second.history == []
    # Keyed by the field names themselves, not the JSON parser's strings: attributes found by pointer.
    assert all(key is RECORD_SCHEMA.canonical[key] for key in vars(first))
    alone = noderecord._parse_alone(noderecord.parse_node_bytes(noderecord.build(
        "r1", "node-a", {}, [entry, dict(entry, rank=4, pid="bad")], FS_NOW, 0.0, 2.0)), "n.json")
    assert len(alone.entries) == 1 and all(key is RECORD_SCHEMA.canonical[key] for key in vars(alone.entries[0][0]))
