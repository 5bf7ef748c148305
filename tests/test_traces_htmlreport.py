"""sidecar.traces.htmlreport and `profile report`: one self-contained HTML page per capture, rendered by a
real headless Chromium (no console or script error, one bar group per rank in the DOM it produced),
with every string from a trace escaped."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from sidecar.traces import htmlreport
from sidecar.traces.htmlreport import build_page, report_traces
from sidecar.traces.summary import summarize
from support.browser import Elements, assert_self_contained, find_browser, render, rendered_ok
from support.cli import invoke
from support.traces import load_trace, span, write_trace


@pytest.fixture
def browser():
    path, why = find_browser()
    if path is None:
        pytest.skip(f"no browser to render the report: {why}")
    return path


def test_report_of_a_real_capture_renders_in_a_browser(ddp2_slowed, tmp_path):
    """`profile report` of the real 2-rank job (capture 0: rank 1 slowed): the files it writes, its
    JSON, and, where there is a browser, the page as headless Chromium builds it."""
    taken = ddp2_slowed
    out = tmp_path / "site" / "report.html"
    reg = ("--registry", str(taken.registry))
    done = invoke("profile", "report", taken.replica, "--capture", "0", "-o", str(out), *reg)
    assert done.exit_code == 0, done.output
    merged = tmp_path / "site" / "report.merged.json.gz"
    assert done.stdout.splitlines() == [
        f"Wrote {out} (capture 0 of replica ddp2, 2 ranks; straggler: rank 1).",
        f"Merged trace beside it: {merged}",
        f"Open it in a browser: {out.as_uri()}",
    ]
    doc = load_trace(merged)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert {"rank 0", "rank 1"} <= {n.split(" (")[0] for n in names}, names
    assert_self_contained(out.read_text())

    bare = tmp_path / "bare" / "report.html"
    data = json.loads(invoke("profile", "report", taken.replica, "--capture", "0", "-o", str(bare), "--no-merge",
                             "--json", *reg).stdout)
    assert data["report_path"] == str(bare) and data["merged_trace_path"] is None
    assert data["replica"] == "ddp2" and data["capture"] == 0 and data["straggler"]["rank"] == 1
    assert [(r["rank"], r["trace_path"]) for r in data["ranks"]] == [(k, str(p)) for k, p in taken.paths[0].items()]
    assert all(r["compute_s"] + r["collective_wait_s"] == pytest.approx(r["step_s"]) for r in data["ranks"])
    assert 'class="merged"' not in bare.read_text() and not list(bare.parent.glob("*.gz"))  # --no-merge

    browser, why = find_browser()
    if browser is None:
        pytest.skip(f"the report is written; no browser to render it: {why}")
    dom = rendered_ok(browser, out, tmp_path)
    groups = dom.find("g", "rank-group")
    assert [g["data-rank"] for g in groups] == ["0", "1"]  # one bar group per rank
    assert [g["data-straggler"] for g in groups] == ["false", "true"]
    steps = {k: [int(s["data-step"]) for s in dom.find("g", "step") if s["data-rank"] == str(k)] for k in (0, 1)}
    assert steps == {r.rank: r.step_numbers for r in summarize(taken.paths[0]).ranks} and len(steps[0]) == 5
    for bar in dom.find("g", "step"):  # each bar: compute + wait = the step, in ms with 3 decimals
        assert float(bar["data-compute-ms"]) + float(bar["data-wait-ms"]) == pytest.approx(
            float(bar["data-step-ms"]), abs=0.002)
    assert len(dom.find("rect", "compute")) == len(dom.find("rect", "wait")) == 10
    assert dom.find("div", "verdict")[0]["data-straggler"] == "1"
    assert any("Straggler: rank 1" in t for t in dom.text)
    assert [r["data-rank"] for r in dom.find("details", "ops")] == ["0", "1"]
    # the links resolve, from the page's folder, to the traces and the merged trace
    links = {a["data-rank"]: a["href"] for a in dom.find("a", "trace")}
    assert {k: (out.parent / href).resolve() for k, href in links.items()} == {
        str(k): p.resolve() for k, p in taken.paths[0].items()}
    assert [(out.parent / a["href"]).resolve() for a in dom.find("a", "merged")] == [merged.resolve()]


HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">&amp;'


def test_strings_from_traces_are_escaped(tmp_path):
    """An op name, a host and a folder name that hold markup show as text; nothing of them runs
    (checked on the page's text, then, where there is a browser, in the DOM it builds)."""
    root = tmp_path / 'odd <b>"folder"</b> & co'
    for rank in range(3):
        events = [span("ProfilerStep#5", 0, 1000, cat="user_annotation"), span(HOSTILE, 10, 500),
                  span("gloo:all_reduce", 600, 100 + 200 * (rank != 1), cat="user_annotation", tid=2)]
        write_trace(root / f"r1_{rank}" / "0_trace.json", events,
                    cosmos_profiler={"replica": "r1", "rank": rank, "host": f"<i>h{rank}</i>"})
    out = tmp_path / "report.html"
    result = report_traces(str(root), out)
    text = out.read_text()
    assert HOSTILE not in text and "<i>h0" not in text and '<b>"folder"' not in text
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;&lt;img src=x onerror=" in text
    assert text.count("<script") == 2  # the page's own two
    assert_self_contained(text)
    assert result.summary.straggler.rank is None  # 3 ranks, 0.2 ms apart in 1 ms steps: under the 1 ms floor

    browser, why = find_browser()
    if browser is None:
        pytest.skip(f"the page's text is escaped; no browser to render it: {why}")
    dom = rendered_ok(browser, out, tmp_path)
    assert len(dom.find("script")) == 2 and not dom.find("img") and not dom.find("i")
    assert [g["data-rank"] for g in dom.find("g", "rank-group")] == ["0", "1", "2"]
    assert any(HOSTILE in t for t in dom.text)  # shown as the text it is
    assert "pwned" not in "".join(t for t in dom.text if "Capture report" in t)


def test_the_browser_check_catches_a_script_error(tmp_path, browser):
    """The check above is not vacuous: a page whose script throws is caught, by console and by the DOM."""
    page = build_page(summarize([write_trace(tmp_path / "t.json", [span("ProfilerStep#1", 0, 10, cat="x")])]))
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace("})();</script>", "})();undefinedFunction();</script>"))
    shown = render(browser, broken, tmp_path / "chromium-profile")
    assert any("undefinedFunction is not defined" in line for line in shown.console), shown.console
    assert Elements(shown.dom).find("html")[0].get("data-js-error") == "1"


def test_build_page_without_browser(tmp_path, monkeypatch):
    """The page's parts from hand-written traces (no browser): the bars' geometry, the verdict, the links."""
    paths = []
    for rank, wait in enumerate((30, 2)):
        events = []
        for n in range(3):
            events += [span(f"ProfilerStep#{n}", n * 100, 100, cat="user_annotation"),
                       span("gloo:all_reduce", n * 100 + 100 - wait, wait, cat="user_annotation", tid=2)]
        paths.append(write_trace(tmp_path / f"r1_{rank}" / "0_trace.json", events,
                                 cosmos_profiler={"replica": "r1", "rank": rank}))
    summary = summarize(paths, top_k=3)
    summary.straggler.rank = 1  # (3 ms steps sit under the 1 ms noise floor; the page shows what it is given)
    text = build_page(summary, {0: "a%20b/0.json", 1: "x&y.json"}, "m.json.gz", notes=["rank 2 has none"],
                      generated="now")
    doc = Elements(text)
    assert [g["data-rank"] for g in doc.find("g", "rank-group")] == ["0", "1"]
    heights = [(float(r["height"]), float(w["height"])) for r, w in
               zip(doc.find("rect", "compute"), doc.find("rect", "wait"), strict=True)]
    scale = htmlreport.CHART_HEIGHT / 100
    assert heights == [(70 * scale, 30 * scale)] * 3 + [(98 * scale, 2 * scale)] * 3
    assert [a["href"] for a in doc.find("a", "trace")] == ["a%20b/0.json", "x&y.json"]  # attribute-escaped, read back
    assert 'href="x&amp;y.json"' in text and "note: rank 2 has none" in text
    assert doc.find("tr")[2].get("class") == "straggler"
    assert text.startswith("<!DOCTYPE html>")


def test_report_refuses_to_write_over_a_trace(tmp_path):
    trace = write_trace(tmp_path / "r1_0" / "0_trace.json", [span("ProfilerStep#1", 0, 10, cat="user_annotation")])
    done = invoke("profile", "report", str(tmp_path), "-o", str(trace))
    assert done.exit_code == 2  # a usage error, as for `profile merge -o` onto a trace
    assert done.stderr.endswith(f"\nError: {trace} (the report) is one of the traces of the capture; "
                                "write the report elsewhere\n"), done.stderr
    assert load_trace_plain(trace)["traceEvents"][0]["name"] == "ProfilerStep#1"  # untouched
    merged_clash = tmp_path / "r1_0" / "0_trace.html"  # its merged trace would be 0_trace.merged.json.gz: fine
    assert invoke("profile", "report", str(tmp_path), "-o", str(merged_clash)).exit_code == 0


def load_trace_plain(path: Path) -> dict:
    return json.loads(path.read_text())


def test_report_shows_the_captures_warnings(tmp_path):
    step = [span("ProfilerStep#1", 0, 10, cat="user_annotation")]
    for name in ("r1_0/0_trace.json", "r1_0/1_trace.json", "r1_1/0_trace.json"):
        write_trace(tmp_path / "out" / name, step)
    result = report_traces(str(tmp_path / "out"), tmp_path / "r.html", capture=1)
    assert result.capture == 1 and [r.rank for r in result.summary.ranks] == [0]
    text = (tmp_path / "r.html").read_text()
    assert result.warnings and all(f"note: {html.escape(w)}" in text for w in result.warnings)
    assert any("rank 1" in w for w in result.warnings), result.warnings
