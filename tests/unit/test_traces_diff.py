"""sidecar.traces.diff and `profile diff` on hand-written traces: the comparison and its errors. Two
real captures of one job, and the page in a browser: tests/e2e/test_traces_diff_real.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.common.records import RankRecord
from sidecar.traces.catalog import FoundCapture, default_pair
from sidecar.traces.diff import Change, RankChange, diff_traces, stand_out
from support.cli import invoke
from support.traces import span, write_trace


def _traces(root: Path, ranks: tuple[int, ...], captures: tuple[int, ...]) -> Path:
    for rank in ranks:
        for n in captures:
            write_trace(root / f"r1_{rank}" / f"{n}_trace.json", [span("ProfilerStep#1", 0, 100, cat="user_annotation"),
                                                                span("aten::add", 10, 20)],
                        cosmos_profiler={"replica": "r1", "rank": rank})
    return root


@pytest.mark.parametrize(("args", "code", "message"), [
    (["nope"], "not_found", None),
    (["{one}"], "trace", "has no capture before capture 0 (captures: 0); a diff needs two"),
    (["{one}/r1_0/0_trace.json", "{other}"], "trace", "no rank is in both captures (base has rank 0, new has rank 1)"),
    (["{two}", "--rank", "3"], "trace", "rank 3 is not in both captures (base has ranks 0-1, new has ranks 0-1)"),
    (["r1:x"], "usage", "'r1:x': after r1: comes a capture number, as in r1:0"),
])
def test_diff_errors(tmp_path, args, code, message):
    one, other, two = _traces(tmp_path / "one", (0,), (0,)), _traces(tmp_path / "other", (1,), (0,)), _traces(
        tmp_path / "two", (0, 1), (0, 1))
    argv = [a.format(one=one, other=other, two=two) for a in args]
    (tmp_path / "registry").mkdir()
    registry = ("--registry", str(tmp_path / "registry"))
    done = invoke("profile", "diff", *argv, "--json", *registry)
    assert done.exit_code == (2 if code == "usage" else 1), done.output
    data = json.loads(done.stdout)
    assert set(data) <= {"error", "code", "hint"} and data["code"] == code, data
    if message:
        assert message in data["error"], data
    plain = invoke("profile", "diff", *argv, *registry)
    assert plain.exit_code == done.exit_code and plain.stdout == ""
    assert len([line for line in plain.stderr.splitlines() if line.startswith("Error")]) <= 1, plain.stderr


def test_the_default_pair_of_a_directory(tmp_path):
    """A directory in the sidecar's layout is a side too: alone, its last two captures."""
    root = _traces(tmp_path / "out", (0, 1), (0, 1, 2))
    result = diff_traces(str(root))
    assert (result.base.capture, result.new.capture) == (1, 2) and result.rank_numbers == [0, 1]
    assert result.ops[0].name == "aten::add" and result.ops[0].delta_s == 0.0
    assert result.mean_step_s.delta == 0.0 and not result.standing_out


def _watched(tmp_path: Path, baseline: int, slow: int) -> RankRecord:
    """A rank record whose slowdown watch w1 took capture `baseline` when armed and fired capture `slow`."""
    trace_dir = tmp_path / "out" / "profile_trace" / "job_0"
    history = [{"state": "idle", "request_id": "w1.baseline", "saved": str(trace_dir / f"{baseline}_trace.json.gz")},
               {"state": "idle", "request_id": "cli-1", "saved": str(trace_dir / "1_trace.json.gz")},
               {"state": "idle", "request_id": "w1.slow-1", "saved": str(trace_dir / f"{slow}_trace.json.gz")}]
    return RankRecord(replica="job", role="policy", rank=0, history=history,
                      slowdown={"id": "w1", "state": "spent", "fired_request_id": "w1.slow-1"})


@pytest.mark.parametrize(("latest", "available", "pair"), [
    (2, [0, 1, 2], (0, 2)),  # the watch fired last: its baseline and its slow capture, past capture 1
    (3, [0, 1, 2, 3], (2, 3)),  # a capture came after the slow one: the last two
])
def test_the_default_pair_after_a_slowdown_watch_fired(tmp_path, latest, available, pair):
    found = FoundCapture(target="job", replica="job", capture=latest, paths={}, available=available)
    assert default_pair(found, [_watched(tmp_path, 0, 2)]) == pair
    assert default_pair(found) == (latest - 1, latest)  # no records: the last two


@pytest.mark.parametrize(("compute_deltas_ms", "standing_out"), [
    ((10, 10, 10, 30), [3]),  # most ranks changed alike, one more: that one
    ((0, 0.5, -20), [2]),  # one rank got faster alone
    ((12, 12.5), []),  # every rank changed alike (within the 1 ms floor)
    ((0.2, 9), [1]),  # two ranks: the one that changed more
])
def test_which_ranks_stand_out(compute_deltas_ms, standing_out):
    """The rest's change is the lower median by size; a rank stands out beyond the noise bound."""
    changes = [RankChange(k, None, Change(0.1, 0.1), Change(0.05, 0.05 + ms / 1000), Change(0.0, 0.0))
               for k, ms in enumerate(compute_deltas_ms)]
    stand_out(changes, noise_s=0.001)
    assert [c.rank for c in changes if c.stands_out] == standing_out
