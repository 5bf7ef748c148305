"""sidecar.traces.diff and `profile diff`: what changed between two real captures of one job.

The job (two ranks of tests/programs/train.py) is captured twice; between the captures a work file
makes rank 1 multiply two 1024x1024 matrices in each step instead of 8x8 (aten::mm grows) and add a
small cumsum (aten::cumsum appears). The diff must name aten::mm first, aten::cumsum as appeared, rank 1
as the rank that stands out, and with --rank 0 see none of it. Its page is rendered by headless
Chromium (DOM and a screenshot). Errors on hand-written traces are tests/unit/test_traces_diff.py's."""

from __future__ import annotations

import json
import os

import pytest

from sidecar.cli.render_traces import diff_text
from sidecar.common.request import RankFilter
from sidecar.traces.diff import diff_traces
from support.browser import Elements, assert_self_contained, find_browser, rendered_ok, screenshot
from support.capture import two_rank_capture
from support.cli import invoke

BIG = 1024  # the matmul: about 20 ms a step on one core, against microseconds for 8x8

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
                         "appeared", "vanished", "stand_out", "noise_s", "warnings", "report_path", "from_summaries"}
    assert data["from_summaries"] == {"base": [], "new": []}  # every rank read from its trace
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
