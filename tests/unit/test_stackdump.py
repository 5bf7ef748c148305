"""sidecar.common.stackdump: a stacks dump formats and parses back to the same threads."""

from __future__ import annotations

from sidecar.common.stackdump import format_stacks, parse_stacks
from support.threads import parked_thread


def test_format_and_parse_round_trip():
    with parked_thread():
        text = format_stacks({"rank": 3}, skip_current=False)
    assert text.startswith("# cosmos-profiler stacks rank=3")
    threads = {s.name: s for s in parse_stacks(text)}
    assert "MainThread" in threads and "parked" in threads
    assert any("in parked_worker" in frame for frame in threads["parked"].frames)
    assert any("test_format_and_parse_round_trip" in frame for frame in threads["MainThread"].frames)
