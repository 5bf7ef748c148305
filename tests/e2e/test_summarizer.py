"""The rank's summarizer (sidecar.rank.summarizer) on its own: a child process writes `<n>_summary.json`
beside a saved trace and the record's copy comes back; a trace it cannot read costs that summary
only (the reason, one log line); close() ends a child still running. In a real job:
tests/e2e/test_traces_carried_real.py."""

from __future__ import annotations

import json
import logging
import queue
from pathlib import Path

from sidecar.common.capturesummary import MAX_ENTRY_BYTES, size
from sidecar.rank.summarizer import TraceSummarizer
from support.traces import step_trace, write_huge_trace
from support.wait import wait_for


class Calls:
    def __init__(self) -> None:
        self.done: queue.Queue = queue.Queue()
        self.logged: list[tuple[str, int, str]] = []

    def on_done(self, path, summary, error) -> None:
        self.done.put((path, summary, error))

    def log_once(self, key: str, level: int, message: str) -> None:
        if key not in {k for k, _, _ in self.logged}:
            self.logged.append((key, level, message))


def test_a_saved_trace_gets_its_summary_file_and_a_bad_one_only_a_reason(tmp_path):
    calls = Calls()
    summarizer = TraceSummarizer(3, calls.on_done, calls.log_once)
    good = step_trace(tmp_path / "r1_3" / "0_trace.json.gz", 3, [1000.0, 1200.0])
    bad = tmp_path / "r1_3" / "1_trace.json.gz"
    bad.write_bytes(b"\x1f\x8b not gzip at all")
    worse = tmp_path / "r1_3" / "2_trace.json.gz"
    worse.write_text('{"traceEvents": [')
    try:
        for path in (good, bad, worse):
            summarizer.summarize(path)
        results = [calls.done.get(timeout=120) for _ in range(3)]
    finally:
        assert summarizer.close()
    (path0, summary, error), (path1, none1, error1), (path2, none2, error2) = results
    assert (path0, error) == (good, None)
    beside = json.loads((tmp_path / "r1_3" / "0_summary.json").read_text())
    assert beside["rank"] == 3 and [s[0] for s in beside["steps"]] == [10, 11] and not beside["compact"]
    assert summary == dict(beside, compact=True, summary_path=str(tmp_path / "r1_3" / "0_summary.json"))
    assert size(summary) <= MAX_ENTRY_BYTES
    assert (path1, none1, path2, none2) == (bad, None, worse, None)
    assert "summary writer process" in error1 and "gzip" in error1
    assert "truncated" in error2
    assert not (tmp_path / "r1_3" / "1_summary.json").exists() and not (tmp_path / "r1_3" / "2_summary.json").exists()
    assert [(k, lvl) for k, lvl, _ in calls.logged] == [("summary", logging.WARNING)]  # once for both
    assert "the trace is saved" in calls.logged[0][2]
    assert not list((tmp_path / "r1_3").glob(".*"))  # no temp file left


def test_close_ends_a_child_still_running(tmp_path):
    calls = Calls()
    summarizer = TraceSummarizer(0, calls.on_done, calls.log_once)
    big = tmp_path / "r1_0" / "0_trace.json.gz"
    big.parent.mkdir()
    write_huge_trace(big, 3_000_000)
    summarizer.summarize(big)
    wait_for(lambda: summarizer._child is not None, 60, what="the summary writer to start")
    child = summarizer._child
    assert not summarizer.close(timeout=0.0)
    assert child.wait(timeout=30) < 0  # killed
    path, summary, error = calls.done.get(timeout=30)
    assert (path, summary) == (big, None) and "killed" in error
    assert not Path(big.with_name("0_summary.json")).exists()
    assert not list(big.parent.glob(".*")), "the killed child's temp file left behind"
