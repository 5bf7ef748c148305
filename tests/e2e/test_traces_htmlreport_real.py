"""`profile report` pages rendered by a real headless Chromium: a real capture's page (no console or
script error, one bar group per rank in the DOM it produced), strings from traces escaped, and the
browser check itself catching a script error."""

from __future__ import annotations

import json

import pytest

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
