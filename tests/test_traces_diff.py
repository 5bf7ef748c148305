"""sidecar.traces.diff and `profile diff`: what changed between two real captures of one job.

The job (two ranks of tests/programs/train.py) is captured twice; between the captures a work file
makes rank 1 multiply two 768x768 matrices in each step instead of 8x8 (aten::mm grows) and add a
cumsum (aten::cumsum appears). The diff must name aten::mm first, aten::cumsum as appeared, rank 1
as the rank that stands out, and with --rank 0 see none of it. Its page is rendered by headless
Chromium (DOM and a screenshot). Errors are checked on hand-written traces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.cli.render_traces import diff_text
from sidecar.common.records import RankRecord
from sidecar.common.request import RankFilter
from sidecar.traces.catalog import FoundCapture, default_pair
from sidecar.traces.diff import Change, RankChange, diff_traces, stand_out
from support.browser import Elements, assert_self_contained, find_browser, rendered_ok, screenshot
from support.capture import two_rank_capture
from support.cli import invoke
from support.traces import span, write_trace

BIG = 768
REQUEST = {"rank_filter": "all", "active_steps": 2, "wait_steps": 1, "warmup_steps": 1}


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """Capture 0 with the same work on both ranks; capture 1 with rank 1's matmul grown."""
    tmp = tmp_path_factory.mktemp("diff")
    work = tmp / "work"

    def before(n: int) -> None:
        if n == 1:
            staged = tmp / "work.tmp"
            staged.write_text(f"{BIG} 1")
            os.replace(staged, work)

    return two_rank_capture(tmp, [(REQUEST, (0, 1)), (REQUEST, (0, 1))], args=["--work-file", str(work)],
                            before_request=before)


def reg(taken) -> tuple[str, str]:
    return ("--registry", str(taken.registry))


def test_diff_of_a_replica_names_the_op_that_grew(grown):
    done = invoke("profile", "diff", "r1", "--json", *reg(grown))
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert set(data) == {"base", "new", "ranks", "mean_step_s", "compute_s", "collective_wait_s", "ops", "kernels",
                         "appeared", "vanished", "stand_out", "noise_s", "warnings", "report_path"}
    # the replica's last two captures, the older as base
    assert (data["base"]["name"], data["new"]["name"]) == ("r1:0", "r1:1")
    assert (data["base"]["capture"], data["new"]["capture"]) == (0, 1)
    assert [(r["rank"], r["trace_path"]) for r in data["new"]["ranks"]] == [
        (k, rec["trace_path"]) for k, rec in sorted(grown.captures[1].items())]
    step = data["mean_step_s"]
    assert set(step) == {"base", "new", "delta"} and step["delta"] == pytest.approx(step["new"] - step["base"])
    assert step["base"] > 0 and step["new"] > step["base"]
    ops = data["ops"]
    assert all(set(o) == {"name", "base_s", "new_s", "delta_s"} for o in ops)
    assert [o["delta_s"] for o in ops] == sorted((o["delta_s"] for o in ops), reverse=True)
    assert ops[0]["name"] == "aten::mm", ops[:3]
    assert ops[0]["delta_s"] == pytest.approx(ops[0]["new_s"] - ops[0]["base_s"]) and ops[0]["delta_s"] > 0
    assert "aten::cumsum" in data["appeared"]["ops"] and data["vanished"] == {"ops": [], "kernels": []}
    assert data["kernels"] == [] and data["appeared"]["kernels"] == []  # CPU torch: no CUDA kernels
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["stand_out"] == [1] and [r["stands_out"] for r in data["ranks"]] == [False, True]
    assert data["report_path"] is None

    text = invoke("profile", "diff", "r1", *reg(grown))
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0] == "diff: base r1:0 -> new r1:1, ranks 0-1 (2 ranks)"
    assert lines[2].startswith("mean step time: ") and "collective wait per step: " in lines[4]
    head = lines.index("CPU ops whose self time per step changed most (largest growth first):")
    assert lines[head + 2].endswith("  aten::mm"), lines[head:head + 4]
    assert any(line.startswith("appeared: CPU ops: ") and "aten::cumsum" in line for line in lines)
    assert "CUDA kernels: none in either capture" in lines
    assert lines[-1].startswith("ranks that stand out: rank 1 (compute +")


def test_rank_selection_and_explicit_sides(grown):
    """--rank 0 compares only rank 0, whose work did not change; REPLICA:CAPTURE names a side; the
    sides the other way round turn growth into shrinkage and appeared into vanished."""
    rank1 = diff_traces("r1", root=grown.registry, ranks=RankFilter(frozenset({1})))
    assert rank1.rank_numbers == [1] and rank1.ops[0].name == "aten::mm"
    data = json.loads(invoke("profile", "diff", "r1:0", "r1:1", "--rank", "0", "--json", *reg(grown)).stdout)
    assert [r["rank"] for r in data["ranks"]] == [0] and [r["rank"] for r in data["base"]["ranks"]] == [0]
    rank0_mm = next(o for o in data["ops"] if o["name"] == "aten::mm")
    assert abs(rank0_mm["delta_s"]) < rank1.ops[0].delta_s / 4, (rank0_mm, rank1.ops[0])
    assert "aten::cumsum" not in data["appeared"]["ops"] and data["stand_out"] == []

    back = json.loads(invoke("profile", "diff", "r1:1", "r1:0", "--json", *reg(grown)).stdout)
    assert back["ops"][-1]["name"] == "aten::mm" and back["ops"][-1]["delta_s"] < 0
    assert "aten::cumsum" in back["vanished"]["ops"] and back["appeared"]["ops"] == []

    # one rank directory per side, by path: the same numbers as by name
    by_path = diff_traces(str(grown.captures[0][1]["trace_path"]), str(grown.captures[1][1]["trace_path"]))
    assert by_path.rank_numbers == [1] and by_path.ops[0].name == "aten::mm"
    assert "ranks that stand out: none (one rank compared)" in diff_text(by_path, 10)


def test_the_diff_page_in_a_browser(grown, tmp_path):
    """`profile diff -o`: the page with both captures' bars side by side on one scale and the top
    changes, as headless Chromium builds and paints it."""
    out = tmp_path / "site" / "diff.html"
    done = invoke("profile", "diff", "r1", "-o", str(out), "--json", *reg(grown))
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["report_path"] == str(out)
    text = out.read_text()
    assert_self_contained(text)
    doc = Elements(text)
    assert [a["data-side"] for a in doc.find("div", "side")] == ["base", "new"]
    assert [r["data-name"] for r in doc.find("tr", "grew")][0] == "aten::mm"

    browser, why = find_browser()
    if browser is None:
        pytest.skip(f"the page is written; no browser to render it: {why}")
    dom = rendered_ok(browser, out, tmp_path)
    groups = [g["data-rank"] for g in dom.find("g", "rank-group")]
    assert groups == ["0", "1", "0", "1"]  # base's two ranks, then new's
    assert len(dom.find("g", "step")) == 8  # 2 sides x 2 ranks x 2 steps
    changes = [t for t in dom.find("table", "changes")]
    assert [t["data-kind"] for t in changes] == ["ops", "kernels"]
    assert dom.find("tr", "grew")[0]["data-name"] == "aten::mm"
    assert any("aten::cumsum" in t for t in dom.text)
    assert [r["data-rank"] for r in dom.find("tr") if r.get("class") == "straggler"] == ["1"]

    shot = screenshot(browser, out, tmp_path / "shot.png", tmp_path / "chromium-shot")
    compute = (0x4E, 0x79, 0xA7)  # rect.compute's fill
    left, right = shot.count(compute, 0, shot.width // 2), shot.count(compute, shot.width // 2, shot.width)
    assert left > 200 and right > 200, (left, right)  # bars painted on both sides


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
