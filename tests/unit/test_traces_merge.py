"""sidecar.traces.merge: one timeline of synthetic traces, in bounded memory."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from sidecar.common.exceptions import TraceError
from sidecar.traces.merge import merge
from sidecar.traces.reader import iter_events
from support.traces import span, step_trace, write_huge_trace, write_trace


def test_merge_streams_in_bounded_memory(tmp_path):
    path = tmp_path / "big.json"
    num_events, _ = write_huge_trace(path, 20_000, pad=1500)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        result = merge([path], tmp_path / "merged.json.gz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 8, f"peak {peak} bytes for a {size}-byte trace"
    assert result.num_events == num_events
    assert sum(1 for e in iter_events(result.path) if e["ph"] != "M") == num_events


def test_merge_lines_up_different_base_times(tmp_path):
    base = 1_700_000_000_000_000_000
    a = write_trace(tmp_path / "r1_0" / "0_trace.json", [span("a", 100.5, 1)], baseTimeNanoseconds=base + 2_000_000)
    b = write_trace(tmp_path / "r1_1" / "0_trace.json", [span("b", 100.5, 1)], baseTimeNanoseconds=base)
    # the base after the events: read before merging them
    c = tmp_path / "r1_2" / "0_trace.json"
    c.parent.mkdir()
    c.write_text(json.dumps({"traceEvents": [span("c", 100.5, 1)], "baseTimeNanoseconds": base + 1000}))
    result = merge([a, b, c], tmp_path / "m.json")
    merged = json.loads(result.path.read_text())
    assert merged["baseTimeNanoseconds"] == result.base_time_ns == base
    assert result.shifts_us == {0: 2000.0, 1: 0.0, 2: 1.0}
    ts = {e["name"]: e["ts"] for e in merged["traceEvents"] if e["ph"] == "X"}
    assert ts == {"a": 2100.5, "b": 100.5, "c": 101.5}
    names = sorted(e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name")
    assert names == ["rank 0", "rank 1", "rank 2"]


def test_merge_refuses_two_traces_of_one_rank(tmp_path):
    a = step_trace(tmp_path / "a" / "t.json", 0, [1])
    with pytest.raises(TraceError, match="two traces are for rank 0"):
        merge([a, step_trace(tmp_path / "b" / "t.json", 0, [1])], tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()
