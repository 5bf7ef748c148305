"""Live progress's stall warning: its threshold follows the rank's pace above a floor and counts from
the rank's own last step (pure functions over hand-written records)."""

from __future__ import annotations

from sidecar.cli.progress import WaitProgress
from sidecar.common.records import RankRecord
from sidecar.fleet.answers import RankCapture


def test_the_stall_threshold_follows_the_ranks_pace_above_a_floor():
    lines = []
    live = WaitProgress("r1", enabled=True, floor_s=30.0)
    live.echo = lambda line, err=False: lines.append(line)  # type: ignore[method-assign]
    live.show = lambda text: None  # type: ignore[method-assign]
    # Written at its last step (built in memory: its file's time is its heartbeat_at).
    slow = RankRecord(replica="r1", role="policy", rank=3, step=1234, heartbeat_at=1080.0,
                      recent_steps=[[1000.0, 1230], [1040.0, 1232], [1060.0, 1233], [1080.0, 1234]])  # 20 s a step
    pending = RankCapture(rank=3, phase="armed", alive=True)
    live(pending, slow, 1100.0)
    live(pending, slow, 1279.0)  # 199 s at step 1234: under 10 steps at its pace
    assert lines == []
    live(pending, slow, 1281.0)
    assert lines == ["Warning: rank 3 has not stepped for 201 s (step 1234): "
                     "`cosmos-profiler profile hang r1` shows where it is"]
    live(pending, slow, 1400.0)
    assert len(lines) == 1  # once per stall
    fast = RankRecord(replica="r1", role="policy", rank=4, step=50, heartbeat_at=1001.0,
                      recent_steps=[[1000.0, 40], [1001.0, 50]])
    live(RankCapture(rank=4, phase="armed", alive=True), fast, 1031.2)  # 10 steps a second: the floor, 30 s
    assert lines[-1].startswith("Warning: rank 4 has not stepped for 30 s (step 50)")


def test_the_stall_warning_counts_from_the_ranks_own_last_step():
    # The record says when the step counter last moved: a rank found stuck says for how long it has
    # been stuck, not the threshold (it was 5 s for a rank stuck 12 s).
    lines = []
    live = WaitProgress("r1", enabled=True, floor_s=5.0)
    live.echo = lambda line, err=False: lines.append(line)  # type: ignore[method-assign]
    live.show = lambda text: None  # type: ignore[method-assign]
    # Its clock runs 300 s ahead of the registry's: it stepped last at 1301 by its own clock, and its
    # record, last written at 1303 by that clock, is 1003 on the registry's (sidecar.common.clock).
    stuck = RankRecord(replica="r1", role="policy", rank=0, step=40, recent_steps=[[1290.0, 20], [1300.0, 30]],
                       last_step_at=1301.0, heartbeat_at=1303.0)
    stuck.file_mtime = 1003.0
    live(RankCapture(rank=0, phase="armed", alive=True), stuck, 1013.0)
    assert lines == ["Warning: rank 0 has not stepped for 12 s (step 40): "
                     "`cosmos-profiler profile hang r1` shows where it is"]
