"""sidecar.common.stackdump: a stacks dump formats and parses back to the same threads."""

from __future__ import annotations

import threading

from sidecar.common.stackdump import format_stacks, parse_stacks


def test_format_and_parse_round_trip():
    started = threading.Event()
    release = threading.Event()

    def parked_worker():
        started.set()
        release.wait(10)

    t = threading.Thread(target=parked_worker, name="parked")
    t.start()
    started.wait(5)
    try:
        text = format_stacks({"rank": 3}, skip_current=False)
    finally:
        release.set()
        t.join()
    assert text.startswith("# cosmos-profiler stacks rank=3")
    threads = {s.name: s for s in parse_stacks(text)}
    assert "MainThread" in threads and "parked" in threads
    assert any("in parked_worker" in frame for frame in threads["parked"].frames)
    assert any("test_format_and_parse_round_trip" in frame for frame in threads["MainThread"].frames)
