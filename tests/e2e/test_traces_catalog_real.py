"""sidecar.traces.catalog finds the real 2-rank capture (tests/e2e/conftest.py's `capture`)."""

from __future__ import annotations

import pytest

from sidecar.common.exceptions import TraceError
from sidecar.traces.catalog import find_captures


def test_find_captures_finds_the_real_capture(capture):
    found = find_captures(capture.out, "r1")
    assert found.index == 0 and found.available == [0] and found.missing_ranks == []
    assert found.paths == capture.paths
    assert find_captures(capture.out / "profile_trace", "r1").paths == capture.paths
    assert find_captures(capture.paths[1].parent, "r1").paths == capture.paths
    with pytest.raises(TraceError, match="has no capture 3; captures: 0"):
        find_captures(capture.out, "r1", capture=3)
    with pytest.raises(TraceError, match=r"no traces found for replica 'r2' .*\(traces found for: r1\)"):
        find_captures(capture.out, "r2")
