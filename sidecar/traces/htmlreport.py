"""One capture as one self-contained HTML page: compute vs collective wait per rank and step, the
straggler verdict, the top ops, and links to the traces and the merged trace.

    html_text = build_page(summary, trace_hrefs={0: "out/r1_0/0_trace.json.gz"}, merged_href="r.merged.json.gz")
    result = report_traces("r1", "report.html", root)   # what `profile report` calls
    write_diff_page(diff_traces("r1"), "diff.html")     # what `profile diff -o` writes: a diff as a page

The page loads nothing: its CSS and its one small script are inline and the
chart is SVG, so it opens from a file, offline, in any browser. Every string
that comes from a trace (op names, hosts, paths, replica names) goes through
`html.escape`; the script reads only `data-*` attributes and writes only
`textContent`. Standard library only, like the rest of `sidecar.traces`.
"""

from __future__ import annotations

import html
import os
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.common.exceptions import BadOption
from sidecar.common.roster import ControllerReplica
from sidecar.traces.catalog import find_traces
from sidecar.traces.merge import merge, write_output
from sidecar.traces.straggler import step_figure
from sidecar.traces.summary import TOP_K, OpStat, RankSummary, TraceSummary, summarize_found, summary_notes

if TYPE_CHECKING:
    from sidecar.traces.diff import CaptureDiff, OpChange

__all__ = ["ReportResult", "build_diff_page", "build_page", "merged_path_for", "report_traces", "write_diff_page"]

CHART_HEIGHT = 240  # px of the tallest step
CHART_BARS_WIDTH = 900  # px the bars share, while each stays within BAR_WIDTHS
BAR_WIDTHS = (6, 40)
STEP_LABEL_MIN_WIDTH = 24  # bars this wide get their step number under them
BAR_GAP = 3
GROUP_GAP = 28
AXIS_WIDTH = 56
MERGED_SUFFIX = ".merged.json.gz"


@dataclass
class ReportResult:
    """What `report_traces` wrote."""

    replica: str | None
    capture: int | None
    report_path: str
    merged_trace_path: str | None  # None with merged=False
    summary: TraceSummary
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """`profile report --json`: the files written, each rank's trace and its split (seconds), the verdict."""
        ranks = []
        for r in self.summary.ranks:
            ranks.append({
                "rank": r.rank, "host": r.host, "trace_path": r.path, "steps": r.step_numbers,
                "step_s": _seconds(r.mean_step_us), "compute_s": _seconds(r.mean_compute_us),
                "collective_wait_s": _seconds(r.mean_wait_us), "source": r.source, "trace_url": r.trace_url,
            })
        return {"replica": self.replica, "capture": self.capture, "report_path": self.report_path,
                "merged_trace_path": self.merged_trace_path, "ranks": ranks,
                "straggler": self.summary.straggler.to_json(), "warnings": self.warnings,
                "from_summaries": self.summary.from_summaries}


def _seconds(us: float | None) -> float | None:
    return None if us is None else us / 1e6


def merged_path_for(report_path: str | os.PathLike[str]) -> Path:
    """report.html -> report.merged.json.gz, beside it."""
    path = Path(report_path)
    return path.with_name(path.stem + MERGED_SUFFIX)


def report_traces(
    target: str,
    out_path: str | os.PathLike[str],
    root: Path | None = None,
    capture: int | None = None,
    controller: list[ControllerReplica] | None = None,
    top_k: int = TOP_K,
    merged: bool = True,
) -> ReportResult:
    """`find_traces`, `summarize`, `merge` (to `<report stem>.merged.json.gz` beside the page, unless
    `merged` is False), then write the page to `out_path`; its links are relative to the page's folder.

    Raises:
        as `find_traces`; BadOption: `out_path` is one of the traces; TraceError: a trace cannot be
        read or a file cannot be written.
    """
    found = find_traces(target, root, capture, controller)
    out = Path(os.path.abspath(out_path))
    merged_out = merged_path_for(out) if merged else None
    for path, what in ((out, "the report"), (merged_out, "the merged trace")):
        if path is not None and found.holds(path):
            raise BadOption("output", f"{path} ({what}) is one of the traces of the capture; write the report elsewhere")
    summary = summarize_found(found, top_k=top_k)
    if merged_out is not None and not found.paths:
        merged_out = None
        found.warnings.append("no merged trace: no trace of this capture is on this machine")
    elif merged_out is not None:
        merge(found.paths, merged_out)
        if found.summaries:
            found.warnings.append(f"the merged trace holds the ranks whose traces are here, not rank"
                                  f"{'s' if len(found.summaries) > 1 else ''} {', '.join(map(str, found.summaries))}")
    hrefs = {r.rank: _href(Path(r.path), out.parent) for r in summary.ranks if r.source == "trace"}
    page = build_page(summary, hrefs, _href(merged_out, out.parent) if merged_out else None, found.warnings,
                      generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    write_output(out, lambda f: f.write(page))
    return ReportResult(found.replica, found.capture, str(out), str(merged_out) if merged_out else None, summary,
                        found.warnings)


def _href(path: Path, base: Path) -> str:
    """A URL for `path` relative to the page's folder (the page and the traces move together), quoted."""
    try:
        rel = os.path.relpath(path, base)
    except ValueError:  # another drive
        return Path(path).absolute().as_uri()
    return urllib.parse.quote(rel.replace(os.sep, "/"))


# --- the page ---------------------------------------------------------------------------------


def _esc(value: Any) -> str:
    """Escaped for text and for quoted attribute values."""
    return html.escape(str(value), quote=True)


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000.0:.3f}"


def build_page(
    summary: TraceSummary,
    trace_hrefs: Mapping[int, str] | None = None,
    merged_href: str | None = None,
    notes: Sequence[str] = (),
    generated: str | None = None,
) -> str:
    """The summary as one HTML page (see the module docstring).

    Args:
        summary: what `summarize` found.
        trace_hrefs: rank -> the URL of its trace file (already quoted; escaped here).
        merged_href: the URL of the merged trace, if one was written.
        notes: warnings to show above the chart.
        generated: when the page was made, as text.
    """
    hrefs = trace_hrefs or {}
    title = "Capture report"
    if summary.replica:
        title += f": replica {summary.replica}"
    if summary.capture is not None:
        title += f", capture {summary.capture}"
    n = len(summary.ranks)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_ONERROR_JS}</script>",
        "</head><body>",
        '<pre id="js-errors" hidden></pre>',
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta">{n} rank{"s" if n != 1 else ""}'
        + (f" &middot; generated {_esc(generated)}" if generated else "")
        + " &middot; times per step, in milliseconds</p>",
        _verdict_html(summary),
        *(f'<p class="note">note: {_esc(note)}</p>' for note in [*summary_notes(summary), *notes]),
        "<h2>Compute vs collective wait, per rank and step</h2>",
        '<p class="legend"><span class="swatch compute"></span> compute '
        '<span class="swatch wait"></span> collective wait '
        '<span class="hint">(each bar is one step; hover a bar for its numbers)</span></p>',
        '<p id="bar-info" class="info">&nbsp;</p>',
        '<div class="chart">' + _chart_svg(summary) + "</div>",
        "<h2>Ranks</h2>",
        _ranks_table(summary, hrefs),
        _files_html(summary, hrefs, merged_href),
        "<h2>Top ops</h2>",
        *(_ops_html(r) for r in summary.ranks),
        _method_html(summary),
        f"<script>{_PAGE_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _verdict_html(summary: TraceSummary) -> str:
    v = summary.straggler
    reason = v.reason[:1].upper() + v.reason[1:]
    if v.rank is None:
        return f'<div class="verdict none" data-straggler=""><b>No straggler.</b> {_esc(reason)}.</div>'
    host = f" ({_esc(v.host)})" if v.host else ""
    return (f'<div class="verdict found" data-straggler="{v.rank}"><b>Straggler: rank {v.rank}{host}.</b> '
            f"{_esc(reason)}.</div>")


def _tallest_us(ranks: Sequence[RankSummary]) -> float:
    return max((s.duration_us for r in ranks for s in r.steps), default=0.0)


def _chart_svg(summary: TraceSummary, ranks: Sequence[RankSummary] | None = None, tallest_us: float | None = None,
               bars_width: int = CHART_BARS_WIDTH, mark_straggler: bool = True) -> str:
    """The bars of `ranks` (default: every rank of the summary), scaled so `tallest_us` (default: their
    tallest step) is CHART_HEIGHT high: two charts given one `tallest_us` compare by eye. A diff's
    charts leave the straggler unmarked (`mark_straggler`): the page is about what changed."""
    ranks = summary.ranks if ranks is None else ranks
    tallest = tallest_us or _tallest_us(ranks) or 1.0
    num_bars = sum(max(1, len(r.steps)) for r in ranks)
    bar_w = int(min(max(bars_width / max(num_bars, 1) - BAR_GAP, BAR_WIDTHS[0]), BAR_WIDTHS[1]))
    step_labels = bar_w >= STEP_LABEL_MIN_WIDTH
    top = 16
    label_h = 56 if step_labels else 40
    scale = CHART_HEIGHT / tallest
    widths = [max(1, len(r.steps)) * (bar_w + BAR_GAP) - BAR_GAP for r in ranks]
    width = AXIS_WIDTH + sum(widths) + GROUP_GAP * (len(ranks) + 1)
    height = top + CHART_HEIGHT + label_h
    base = top + CHART_HEIGHT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="compute vs collective wait per rank and step">']
    for tick in _ticks(tallest):
        y = base - tick * scale
        out.append(f'<line class="grid" x1="{AXIS_WIDTH}" y1="{y:.1f}" x2="{width}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{AXIS_WIDTH - 6}" y="{y + 4:.1f}">{tick / 1000:g} ms</text>')
    x = AXIS_WIDTH + GROUP_GAP
    straggler = summary.straggler.rank if mark_straggler else None
    for r, group_w in zip(ranks, widths, strict=True):
        is_straggler = r.rank == straggler
        out.append(f'<g class="rank-group{" straggler" if is_straggler else ""}" data-rank="{r.rank}" '
                   f'data-straggler="{"true" if is_straggler else "false"}">')
        for i, s in enumerate(r.steps):
            bx = x + i * (bar_w + BAR_GAP)
            compute_h, wait_h = s.compute_us * scale, s.collective_wait_us * scale
            tip = (f"rank {r.rank}, step #{s.step}: compute {_ms(s.compute_us)} ms + collective wait "
                   f"{_ms(s.collective_wait_us)} ms = {_ms(s.duration_us)} ms")
            out.append(
                f'<g class="step" data-rank="{r.rank}" data-step="{s.step}" data-compute-ms="{_ms(s.compute_us)}" '
                f'data-wait-ms="{_ms(s.collective_wait_us)}" data-step-ms="{_ms(s.duration_us)}">'
                f"<title>{_esc(tip)}</title>"
                f'<rect class="compute" x="{bx}" y="{base - compute_h:.1f}" width="{bar_w}" '
                f'height="{compute_h:.1f}"/>'
                f'<rect class="wait" x="{bx}" y="{base - compute_h - wait_h:.1f}" width="{bar_w}" '
                f'height="{wait_h:.1f}"/>'
                + (f'<text class="step-label" x="{bx + bar_w / 2:.1f}" y="{base + 12}">#{s.step}</text>'
                   if step_labels else "")
                + "</g>"
            )
        if not r.steps:
            out.append(f'<text class="empty" x="{x}" y="{base - 4}">no steps</text>')
        cx, ly = x + group_w / 2, base + (32 if step_labels else 16)
        label = f"rank {r.rank}" + (" (straggler)" if is_straggler else "")
        out.append(f'<text class="rank-label" x="{cx:.1f}" y="{ly}">{_esc(label)}</text>')
        if r.host:
            out.append(f'<text class="host-label" x="{cx:.1f}" y="{ly + 14}">{_esc(r.host)}</text>')
        out.append("</g>")
        x += group_w + GROUP_GAP
    out.append(f'<line class="axis" x1="{AXIS_WIDTH}" y1="{base}" x2="{width}" y2="{base}"/></svg>')
    return "".join(out)


def _ticks(tallest_us: float) -> list[float]:
    """Round tick values (us) from 0 up to the tallest bar, about four of them."""
    raw = tallest_us / 4
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(tallest_us // step) + 1)]


def _ranks_table(summary: TraceSummary, hrefs: Mapping[int, str]) -> str:
    rows = ['<table class="ranks"><thead><tr><th>rank</th><th>host</th><th>steps</th><th>step ms</th>'
            "<th>compute ms</th><th>wait ms</th><th>wait %</th><th>median wait ms</th><th>collective spans</th>"
            "<th>trace</th></tr></thead><tbody>"]
    straggler = summary.straggler.rank
    for r in summary.ranks:
        share = (step_figure(r.mean_wait_us) / r.mean_step_us) if r.steps and r.mean_step_us else None
        steps = ", ".join(f"#{n}" for n in r.step_numbers) or "none"
        link = f'<a href="{_esc(hrefs[r.rank])}">{_esc(Path(r.path).name)}</a>' if r.rank in hrefs else _esc(Path(r.path).name)
        rows.append(
            f'<tr data-rank="{r.rank}"{" class=straggler" if r.rank == straggler else ""}>'
            f"<td>{r.rank}</td><td>{_esc(r.host or '-')}</td><td>{_esc(steps)}</td><td>{_ms(r.mean_step_us)}</td>"
            f"<td>{_ms(r.mean_compute_us)}</td><td>{_ms(r.mean_wait_us)}</td>"
            f"<td>{'-' if share is None else f'{share:.0%}'}</td><td>{_ms(r.median_wait_us)}</td>"
            f"<td>{r.num_collectives}</td><td>{link}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows)


def _files_html(summary: TraceSummary, hrefs: Mapping[int, str], merged_href: str | None) -> str:
    items = []
    if merged_href:
        items.append(f'<li>merged trace, every rank on one clock: <a class="merged" href="{_esc(merged_href)}">'
                     f"{_esc(urllib.parse.unquote(merged_href))}</a></li>")
    for r in summary.ranks:
        target = f'<a class="trace" data-rank="{r.rank}" href="{_esc(hrefs[r.rank])}">' if r.rank in hrefs else "<span>"
        close = "</a>" if r.rank in hrefs else "</span>"
        where = []
        if r.source == "summary":
            where.append("not on this machine: read from the summary it published")
        if r.upload_state:
            where.append(r.upload_state)
        note = f' <span class="hint">({_esc("; ".join(where))})</span>' if where else ""
        items.append(f"<li>rank {r.rank}: {target}<code>{_esc(r.path)}</code>{close}{note}</li>")
    return ("<h2>Trace files</h2><ul class=files>" + "".join(items) + "</ul>"
            '<p class="hint">Open a trace in Perfetto (ui.perfetto.dev, "Open trace file") or chrome://tracing; '
            "links are relative to this page's folder.</p>")


def _ops_html(r: RankSummary) -> str:
    parts = [f'<details class="ops" data-rank="{r.rank}"><summary>rank {r.rank}: top {len(r.top_cpu_ops)} CPU ops'
             + (f", top {len(r.top_kernels)} CUDA kernels" if r.top_kernels else "") + "</summary>",
             _ops_table("CPU ops by self time", r.top_cpu_ops, r.cpu_op_self_us)]
    if r.top_kernels:
        parts.append(_ops_table("CUDA kernels by time", r.top_kernels, r.kernel_us))
    parts.append("</details>")
    return "".join(parts)


def _ops_table(title: str, ops: Sequence[OpStat], all_us: float) -> str:
    rows = [f'<table class="ops"><caption>{_esc(title)}, of {_ms(all_us)} ms in all</caption><thead><tr>'
            "<th>self ms</th><th>total ms</th><th>calls</th><th>self %</th><th>name</th></tr></thead><tbody>"]
    for op in ops:
        share = op.self_us / all_us if all_us > 0 else 0.0
        rows.append(f"<tr><td>{_ms(op.self_us)}</td><td>{_ms(op.total_us)}</td><td>{op.count}</td>"
                    f"<td>{share:.1%}</td><td><code>{_esc(op.name)}</code></td></tr>")
    if not ops:
        rows.append('<tr><td colspan="5">none</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


def _method_html(summary: TraceSummary) -> str:
    return (
        "<h2>How the numbers are made</h2><p class=hint>A step is its host <code>ProfilerStep#N</code> span. "
        "Its collective wait is the union of the trace's collective spans inside that window, on any thread or "
        "device (<code>gloo:*</code>, <code>nccl:*</code>, <code>c10d::*</code>, NCCL kernels); compute is the rest. "
        "In synchronous training every rank's step lasts as long as the slowest rank's, so the straggler is the rank "
        "that waits the least while the others wait: its median wait per step must be below the median of the "
        f"others' by at least {summary.noise_fraction:.0%} of the median step time and at least "
        f"{summary.noise_floor_us / 1000:g} ms, else the spread is noise.</p>"
    )


# --- a diff as a page -------------------------------------------------------------------------


def write_diff_page(diff: CaptureDiff, out_path: str | os.PathLike[str], top_k: int = TOP_K) -> str:
    """Write `build_diff_page(diff)` to `out_path` (temp + rename); its absolute path.

    Raises:
        BadOption: `out_path` is one of the diffed traces; TraceError: it cannot be written.
    """
    out = Path(os.path.abspath(out_path))
    inputs = {os.path.realpath(r.path) for side in (diff.base, diff.new) for r in side.summary.ranks}
    if os.path.realpath(out) in inputs:
        raise BadOption("output", f"{out} (the page) is one of the traces compared; write the page elsewhere")
    page = build_diff_page(diff, top_k, generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    write_output(out, lambda f: f.write(page))
    return str(out)


def build_diff_page(diff: CaptureDiff, top_k: int = TOP_K, generated: str | None = None) -> str:
    """A diff as one HTML page: the two step breakdowns side by side (one scale), the step numbers
    base -> new, the top changes of CPU ops and CUDA kernels, what appeared or vanished, and the ranks."""
    from sidecar.traces.diff import top_changes

    chosen = set(diff.rank_numbers)
    sides = [(key, side, [r for r in side.summary.ranks if r.rank in chosen])
             for key, side in (("base", diff.base), ("new", diff.new))]
    tallest = max(_tallest_us(ranks) for _, _, ranks in sides) or 1.0
    title = f"Capture diff: {diff.base.name} \u2192 {diff.new.name}"
    charts = "".join(
        f'<div class="side" data-side="{key}"><h3>{key}: {_esc(side.name)}</h3>'
        + '<div class="chart">' + _chart_svg(side.summary, ranks, tallest, CHART_BARS_WIDTH // 2, mark_straggler=False) + "</div></div>"
        for key, side, ranks in sides
    )
    n = len(diff.ranks)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}{_DIFF_CSS}</style>",
        f"<script>{_ONERROR_JS}</script>",
        "</head><body>",
        '<pre id="js-errors" hidden></pre>',
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta">{n} rank{"s" if n != 1 else ""} compared'
        + (f" &middot; generated {_esc(generated)}" if generated else "")
        + " &middot; times per step, in milliseconds</p>",
        *(f'<p class="note">note: {_esc(note)}</p>' for note in diff.warnings),
        _diff_totals_html(diff),
        "<h2>Compute vs collective wait, per rank and step: base and new side by side</h2>",
        '<p class="legend"><span class="swatch compute"></span> compute '
        '<span class="swatch wait"></span> collective wait '
        '<span class="hint">(one scale for both; hover a bar for its numbers)</span></p>',
        '<p id="bar-info" class="info">&nbsp;</p>',
        f'<div class="sides">{charts}</div>',
        "<h2>Top changes</h2>",
        _changes_table("ops", "CPU ops whose self time per step changed most", top_changes(diff.ops, top_k)),
        _changes_table("kernels", "CUDA kernels whose time per step changed most", top_changes(diff.kernels, top_k)),
        _appeared_html(diff),
        "<h2>Ranks</h2>",
        _diff_ranks_table(diff),
        f"<script>{_PAGE_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _s_ms(seconds: float | None, sign: bool = False) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:+.3f}" if sign else f"{seconds * 1000:.3f}"


def _diff_totals_html(diff: CaptureDiff) -> str:
    rows = ['<table class="totals"><thead><tr><th></th><th>base ms</th><th>new ms</th><th>delta ms</th></tr>'
            "</thead><tbody>"]
    for key, label, change in (("step", "mean step time", diff.mean_step_s), ("compute", "compute", diff.compute_s),
                               ("wait", "collective wait", diff.collective_wait_s)):
        rows.append(f'<tr data-total="{key}"><td>{label}</td><td>{_s_ms(change.base)}</td><td>{_s_ms(change.new)}'
                    f"</td><td>{_s_ms(change.delta, sign=True)}</td></tr>")
    rows.append("</tbody></table>")
    return "".join(rows)


def _changes_table(kind: str, title: str, changes: Sequence[OpChange]) -> str:
    rows = [f'<table class="changes" data-kind="{kind}"><caption>{_esc(title)}, largest growth first</caption>'
            "<thead><tr><th>base ms</th><th>new ms</th><th>delta ms</th><th>name</th></tr></thead><tbody>"]
    for c in changes:
        grew = "grew" if c.delta_s > 0 else "shrank" if c.delta_s < 0 else "same"
        rows.append(f'<tr class="{grew}" data-name="{_esc(c.name)}"><td>{_s_ms(c.base_s)}</td><td>{_s_ms(c.new_s)}'
                    f"</td><td>{_s_ms(c.delta_s, sign=True)}</td><td><code>{_esc(c.name)}</code></td></tr>")
    if not changes:
        rows.append('<tr><td colspan="4">none in either capture</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


def _appeared_html(diff: CaptureDiff) -> str:
    items = []
    for verb, found in (("appeared", diff.appeared), ("vanished", diff.vanished)):
        for key in ("ops", "kernels"):
            names = found[key]
            if names:
                items.append(f'<li class="{verb}" data-kind="{key}">{verb} ({"CPU ops" if key == "ops" else "kernels"}'
                             "): " + ", ".join(f"<code>{_esc(n)}</code>" for n in names) + "</li>")
    return '<ul class="appeared">' + ("".join(items) or "<li>no op appeared or vanished</li>") + "</ul>"


def _diff_ranks_table(diff: CaptureDiff) -> str:
    rows = ['<table class="ranks"><thead><tr><th>rank</th><th>host</th><th>step base ms</th><th>step new ms</th>'
            "<th>step delta ms</th><th>compute delta ms</th><th>wait delta ms</th><th>stands out</th></tr></thead>"
            "<tbody>"]
    for r in diff.ranks:
        rows.append(
            f'<tr data-rank="{r.rank}"{" class=straggler" if r.stands_out else ""}><td>{r.rank}</td>'
            f"<td>{_esc(r.host or '-')}</td><td>{_s_ms(r.step_s.base)}</td><td>{_s_ms(r.step_s.new)}</td>"
            f"<td>{_s_ms(r.step_s.delta, True)}</td><td>{_s_ms(r.compute_s.delta, True)}</td>"
            f"<td>{_s_ms(r.collective_wait_s.delta, True)}</td><td>{'yes' if r.stands_out else ''}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows) + (f'<p class="hint">A rank stands out when its compute per step changed by more than '
                            f"{diff.noise_s * 1000:.3f} ms beyond what the other ranks' did.</p>")


_DIFF_CSS = """
.sides{display:flex;gap:16px;align-items:flex-start}.side{flex:1 1 0;min-width:0}.side h3{font-size:15px;margin:4px 0}
.side svg{max-width:100%;height:auto}table.totals td:first-child{text-align:left}
tr.grew td{color:#a12d1f}tr.shrank td{color:#1f7a3a}
"""

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2330;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta,.hint{color:#5b6475}.note{color:#8a5a00}
.verdict{padding:10px 14px;border-radius:6px;margin:14px 0}
.verdict.found{background:#fdecec;border:1px solid #e3a0a0}.verdict.none{background:#eaf6ea;border:1px solid #9fcf9f}
.chart{overflow-x:auto;border:1px solid #dde2ea;border-radius:6px;padding:6px;background:#fff}
rect.compute{fill:#4e79a7}rect.wait{fill:#f28e2b}g.step:hover rect{opacity:.75}
.swatch{display:inline-block;width:12px;height:12px;vertical-align:-1px;margin-left:8px}
.swatch.compute{background:#4e79a7}.swatch.wait{background:#f28e2b}
line.grid{stroke:#eceff4}line.axis{stroke:#8a93a3}
text{font:11px system-ui,sans-serif;fill:#3c4454}text.tick{text-anchor:end}
text.rank-label,text.host-label,text.step-label{text-anchor:middle}text.step-label{fill:#8a93a3;font-size:10px}g.straggler text.rank-label{fill:#c0392b;font-weight:bold}
.info{min-height:1.4em;font-variant-numeric:tabular-nums}
table{border-collapse:collapse;margin:6px 0 12px}th,td{padding:3px 10px;border-bottom:1px solid #e6e9ef;text-align:right}
th:last-child,td:last-child{text-align:left}tr.straggler td{background:#fdecec}
caption{text-align:left;color:#5b6475;padding:4px 0}code{font-size:12px;word-break:break-all}
details.ops{margin:4px 0}#js-errors{color:#c0392b}
"""

# First in <head>: any script error on the page lands in the DOM (where a test, or a person, sees it).
_ONERROR_JS = """window.onerror=function(m){var p=document.getElementById("js-errors");if(p){p.hidden=false;
p.textContent+=String(m)+"\\n";}document.documentElement.setAttribute("data-js-error","1");};"""

# Hovering a step's bar shows its numbers; the page is complete without this.
_PAGE_JS = """(function(){var info=document.getElementById("bar-info");
document.querySelectorAll("g.step").forEach(function(g){g.addEventListener("mouseenter",function(){
info.textContent="rank "+g.dataset.rank+", step #"+g.dataset.step+": compute "+g.dataset.computeMs+
" ms + collective wait "+g.dataset.waitMs+" ms = "+g.dataset.stepMs+" ms";});});
document.documentElement.setAttribute("data-js","ready");})();"""
