"""sidecar.traces.catalog: finding a replica's captures in the sidecar's layout, written by hand."""

from __future__ import annotations

import pytest

from sidecar.common.exceptions import TraceError
from sidecar.traces.catalog import find_captures
from support.traces import step_trace


def test_find_captures_groups_by_index(tmp_path):
    root = tmp_path / "out" / "profile_trace"
    layout = {"r1_0": [0, 1, 2], "r1_1": [0, 1], "r1_2": [0, 2], "r2_0": [0], "r1_x_0": [5]}
    for rank_dir, indexes in layout.items():
        for n in indexes:
            step_trace(root / rank_dir / f"{n}_trace.json.gz", 0, [1])
    (root / "r1_0" / ".3_trace.json.tmp-99").write_text("{")  # a save in progress
    (root / "r1_1" / "notes.txt").write_text("")
    latest = find_captures(tmp_path / "out", "r1")
    assert (latest.index, latest.available, latest.missing_ranks) == (2, [0, 1, 2], [1])
    assert latest.paths == {0: root / "r1_0" / "2_trace.json.gz", 2: root / "r1_2" / "2_trace.json.gz"}
    first = find_captures(root, "r1", capture=1)
    assert sorted(first.paths) == [0, 1] and first.missing_ranks == [2]
    assert find_captures(root, "r1_x").paths == {0: root / "r1_x_0" / "5_trace.json.gz"}
    with pytest.raises(TraceError, match=r"no traces found for replica 'r3' .*\(traces found for: r1, r1_x, r2\)"):
        find_captures(root, "r3")
    with pytest.raises(TraceError, match="not a directory"):
        find_captures(tmp_path / "nowhere", "r1")


def test_layout_matches_the_sidecar(tmp_path):
    from sidecar.common import layout
    from sidecar.rank.core import build_sidecar

    sc = build_sidecar(output_dir=tmp_path / "out", replica="r1", rank=3, registry=tmp_path / "reg")
    assert sc.trace_dir == tmp_path / "out" / layout.TRACE_DIR / layout.RANK_DIR_TEMPLATE.format(replica="r1", rank=3)
