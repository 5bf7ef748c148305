"""sidecar.traces.htmlreport and `profile report`: one self-contained HTML page per capture, checked
as HTML here; rendered by a real headless Chromium in tests/e2e/test_traces_htmlreport_real.py."""

from __future__ import annotations

import html
import json
from pathlib import Path

from sidecar.traces import htmlreport
from sidecar.traces.htmlreport import build_page, report_traces
from sidecar.traces.summary import summarize
from support.browser import Elements
from support.cli import invoke
from support.traces import span, write_trace


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
