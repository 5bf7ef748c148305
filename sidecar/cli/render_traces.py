"""What the CLI prints for saved traces: `profile summary|merge|export|report|diff`, as text and `--json`.

Text only, from `sidecar.traces`' dataclasses: nothing here reads a trace. Imported by the
analysis commands only (`profile set` never loads a trace module). The shared pieces (plural,
ranks_text, warn, echo_json) are `sidecar.cli.render`'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.cli.render import plural, rank_objects, ranks_text
from sidecar.traces.straggler import Straggler, step_figure
from sidecar.traces.summary import OpStat, RankSummary, StepTime, TraceSummary, step_range, summary_notes

if TYPE_CHECKING:  # annotations only: a command imports the trace modules it runs, no more
    from sidecar.traces.diff import CaptureDiff, Change, OpChange
    from sidecar.traces.export import ExportResult
    from sidecar.traces.htmlreport import ReportResult
    from sidecar.traces.merge import MergeResult


def capture_name(replica: str | None, capture: int | None, target: str) -> str:
    """capture 2 of replica r1, else what the user named."""
    if replica and capture is not None:
        return f"capture {capture} of replica {replica}"
    return target



# --- profile summary -------------------------------------------------------------------------


def summary_text(summary: TraceSummary) -> str:
    """`profile summary`: each rank's steps, split and top ops, the notes, the split table and the verdict."""
    head = "trace summary"
    if summary.replica:
        head += f": replica {summary.replica}"
    if summary.capture is not None:
        head += f", capture {summary.capture}"
    lines = [f"{head}, {len(summary.ranks)} rank{'s' if len(summary.ranks) != 1 else ''}"]
    for r in summary.ranks:
        lines.append("")
        lines.append(f"rank {r.rank}{f' ({r.host})' if r.host else ''}  {r.path}")
        lines.extend(f"  {line}" for line in source_lines(r))
        lines.append(f"  steps: {_render_steps(r.steps)}")
        lines.append(f"  {_render_split(r)}")
        lines.extend(_render_ops("CPU ops by self time", "CPU ops", r.top_cpu_ops, r.cpu_op_self_us))
        if r.top_kernels:
            lines.extend(_render_ops("CUDA kernels by time", "kernels", r.top_kernels, r.kernel_us))
        else:
            lines.append("  CUDA kernels: none in this trace")
    lines.append("")
    lines.extend(f"note: {note}" for note in summary_notes(summary))
    timed = [r for r in summary.ranks if r.steps]
    if timed:
        lines.append("compute vs collective wait, per step (mean):")
        lines.extend("  " + line for line in _split_table(timed).splitlines())
    lines.append(verdict_text(summary.straggler))
    return "\n".join(lines) + "\n"


def source_lines(r: RankSummary) -> list[str]:
    """Where a rank's numbers come from, when not its trace here, and where its trace went (`upload_s3`)."""
    lines = []
    if r.source == "summary":
        lines.append("from the summary it published (the trace is not on this machine)")
    if r.upload_state:
        lines.append(f"trace {r.upload_state}")
    return lines


def verdict_text(verdict: Straggler) -> str:
    """`straggler: rank 1 (host): the others wait for it: ...`, or `no straggler: why`."""
    if verdict.rank is None:
        return f"no straggler: {verdict.reason}"
    return f"straggler: rank {verdict.rank}{f' ({verdict.host})' if verdict.host else ''}: {verdict.reason}"


def _render_split(r: RankSummary) -> str:
    if not r.steps:
        return "compute vs collective wait: no steps"
    step, wait = step_figure(r.mean_step_us), step_figure(r.mean_wait_us)
    return (f"per step (mean): compute {_ms_of_us(step_figure(r.mean_compute_us))} + collective wait {_ms_of_us(wait)} "
            f"({wait / step if step else 0.0:.0%} of {_ms_of_us(step)}); median wait {_ms_of_us(step_figure(r.median_wait_us))}; "
            f"{r.num_collectives} collective span{'s' if r.num_collectives != 1 else ''}")


def _split_table(ranks: list[RankSummary]) -> str:
    """The per-step split of ranks that all have captured steps."""
    rows = [("RANK", "STEP ms", "COMPUTE ms", "WAIT ms", "WAIT %", "MEDIAN WAIT ms")]
    for r in ranks:
        step, wait = step_figure(r.mean_step_us), step_figure(r.mean_wait_us)
        compute, median_wait = step_figure(r.mean_compute_us), step_figure(r.median_wait_us)
        rows.append((str(r.rank), f"{step / 1000:.3f}", f"{compute / 1000:.3f}", f"{wait / 1000:.3f}",
                     f"{wait / step if step else 0.0:.0%}", f"{median_wait / 1000:.3f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _ms_of_us(us: float) -> str:
    return f"{us / 1000.0:.3f} ms"


def _render_steps(steps: list[StepTime]) -> str:
    if not steps:
        return "none captured (no ProfilerStep#N spans)"
    durations = [s.duration_us for s in steps]
    if len(steps) <= 8:
        listed = ", ".join(f"#{s.step} {_ms_of_us(s.duration_us)}" for s in steps)
        return f"{listed}  (mean {_ms_of_us(statistics.fmean(durations))})"
    return (
        f"{len(steps)} steps {step_range([s.step for s in steps])}: mean {_ms_of_us(statistics.fmean(durations))}, "
        f"min {_ms_of_us(min(durations))}, median {_ms_of_us(statistics.median(durations))}, max {_ms_of_us(max(durations))}"
    )


def _render_ops(title: str, what: str, ops: list[OpStat], all_self_us: float) -> list[str]:
    if not ops:
        return [f"  {title}: none"]
    lines = [f"  top {len(ops)} {title}, of {_ms_of_us(all_self_us)} in all {what}:", f"    {'self ms':>10} {'total ms':>10} {'calls':>7} {'self %':>7}  name"]
    for op in ops:
        share = op.self_us / all_self_us if all_self_us > 0 else 0.0
        lines.append(
            f"    {op.self_us / 1000:>10.3f} {op.total_us / 1000:>10.3f} {op.count:>7d} {share:>7.1%}  {op.name}"
        )
    return lines



# --- profile diff ----------------------------------------------------------------------------


def _ranks_phrase(ranks: Sequence[int]) -> str:
    """ranks 0-3, rank 1, no ranks."""
    return f"{plural(len(ranks))} {ranks_text(sorted(ranks))}" if ranks else "no ranks"


def _ms(seconds: float | None, sign: bool = False) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:+.3f}" if sign else f"{seconds * 1000:.3f}"


def _change_line(label: str, change: Change) -> str:
    if change.base is None or change.new is None:
        return f"{label}: {_ms(change.base)} -> {_ms(change.new)} ms (a side has no steps)"
    share = f", {change.new / change.base - 1:+.0%}" if change.base else ""
    return f"{label}: {_ms(change.base)} -> {_ms(change.new)} ms ({_ms(change.delta, sign=True)} ms{share})"


def _ops_lines(title: str, changes: Sequence[OpChange], k: int) -> list[str]:
    from sidecar.traces.diff import top_changes  # the one choice of what to show, the page's too

    shown = top_changes(changes, k)
    if not shown:
        return [f"{title}: none in either capture"]
    lines = [f"{title} whose self time per step changed most (largest growth first):",
             f"  {'base ms':>10} {'new ms':>10} {'delta ms':>10}  name"]
    lines += [f"  {_ms(o.base_s):>10} {_ms(o.new_s):>10} {_ms(o.delta_s, sign=True):>10}  {o.name}" for o in shown]
    return lines


def _names(names: Sequence[str], k: int) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def diff_text(diff: CaptureDiff, top_k: int) -> str:
    """`profile diff`: what changed, as text (its `warnings` go to stderr, `render.warn`)."""
    n = len(diff.ranks)
    lines = [f"diff: base {diff.base.name} -> new {diff.new.name}, {_ranks_phrase(diff.rank_numbers)}"
             + (f" ({n} ranks)" if n > 1 else "")]
    lines.append("")
    lines.append(_change_line("mean step time", diff.mean_step_s))
    lines.append(_change_line("  compute per step", diff.compute_s))
    lines.append(_change_line("  collective wait per step", diff.collective_wait_s))
    lines.append("")
    lines += _ops_lines("CPU ops", diff.ops, top_k)
    lines.append("")
    lines += _ops_lines("CUDA kernels", diff.kernels, top_k)
    lines.append("")
    for verb, found in (("appeared", diff.appeared), ("vanished", diff.vanished)):
        parts = [f"{what} {_names(found[key], top_k)}" for key, what in (("ops", "CPU ops:"), ("kernels", "kernels:"))
                 if found[key]]
        lines.append(f"{verb}: " + ("; ".join(parts) if parts else "none"))
    lines.append("")
    lines.append("per rank (mean per step, ms):")
    rows = [("RANK", "STEP base", "STEP new", "DELTA", "COMPUTE delta", "WAIT delta", "")]
    for r in diff.ranks:
        rows.append((str(r.rank), _ms(r.step_s.base), _ms(r.step_s.new), _ms(r.step_s.delta, True),
                     _ms(r.compute_s.delta, True), _ms(r.collective_wait_s.delta, True),
                     "stands out" if r.stands_out else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(_standout_line(diff))
    for side in (diff.base, diff.new):
        carried = [k for k in side.summary.from_summaries if k in diff.rank_numbers]
        if carried:
            lines.append(f"{side.name}: {_ranks_phrase(carried)} from the summar{'ies' if len(carried) > 1 else 'y'} "
                         "they published (the traces are not on this machine)")
        lines.extend(f"{side.name}: rank {r.rank}: {line}" for r in side.summary.ranks if r.rank in diff.rank_numbers
                     for line in source_lines(r) if not line.startswith("from the summary"))
    return "\n".join(lines) + "\n"


def _standout_line(diff: CaptureDiff) -> str:
    noise = f"{diff.noise_s * 1000:.3f} ms"
    if len(diff.ranks) < 2:
        return "ranks that stand out: none (one rank compared)"
    out = diff.standing_out
    if not out:
        return f"ranks that stand out: none (every rank's compute changed alike, within {noise})"
    rest = [r.compute_s.delta for r in diff.ranks if not r.stands_out and r.compute_s.delta is not None]
    others = f"the others {_ms(statistics.median(rest), True)} ms" if rest else "the others alike"
    return ("ranks that stand out: " + ", ".join(f"rank {r.rank} (compute {_ms(r.compute_s.delta, True)} ms)"
                                                 for r in out)
            + f"; {others} (noise bound {noise})")


def diff_written_line(report_path: str) -> str:
    """`profile diff -o`: where the page went."""
    return f"Wrote {report_path}; open it in a browser: {Path(report_path).as_uri()}"


def diff_json(diff: CaptureDiff, report_path: str | None) -> dict[str, Any]:
    """`profile diff`: the diff's own JSON, and the page written (or null)."""
    return {**diff.to_json(), "report_path": report_path}


# --- profile merge / export / report ---------------------------------------------------------


def merged_text(merged: MergeResult, target: str) -> str:
    n = len(merged.ranks)
    return "\n".join([
        f"Merged {capture_name(merged.replica, merged.capture, target)}: "
        f"{n} {plural(n)} ({ranks_text(merged.ranks)}), {merged.num_events} events.",
        f"Wrote {merged.path}; open it in https://ui.perfetto.dev or chrome://tracing.",
    ])


def exported_text(exported: ExportResult, target: str) -> str:
    n = len(exported.files)
    return "\n".join([
        f"Exported {capture_name(exported.replica, exported.capture, target)} ({n} {plural(n)}) "
        f"to {exported.out_dir}:",
        *(f"  rank {rank}: {path}" for rank, path in exported.files.items()),
        f"Read it with HolisticTraceAnalysis: TraceAnalysis(trace_dir={exported.out_dir!r})",
    ])


def report_lines(report: ReportResult, target: str) -> list[str]:
    """`profile report`: the page written, the capture, the straggler, the merged trace and the page's URI."""
    verdict = report.summary.straggler
    n = len(report.summary.ranks)
    lines = [f"Wrote {report.report_path} ({capture_name(report.replica, report.capture, target)}, "
             f"{n} {plural(n)}; straggler: {'none' if verdict.rank is None else f'rank {verdict.rank}'})."]
    if report.merged_trace_path:
        lines.append(f"Merged trace beside it: {report.merged_trace_path}")
    carried = report.summary.from_summaries
    if carried:
        lines.append(f"{_ranks_phrase(carried)}: from the summar{'ies' if len(carried) > 1 else 'y'} their records "
                     "carry (the traces are not on this machine)")
    lines.extend(f"rank {r.rank}: {line}" for r in report.summary.ranks for line in source_lines(r)
                 if r.source == "trace" or not line.startswith("from the summary"))
    lines.append(f"Open it in a browser: {Path(report.report_path).as_uri()}")
    return lines


# --- --json (docs/json.md, sidecar/cli/schema.json) ------------------------------------------


def in_seconds(value: Any) -> Any:
    """`value` with every `*_us` field turned into `*_s` (seconds), at any depth; where
    both exist, the `*_s` one is kept. The CLI's JSON speaks seconds (docs/json.md)."""
    if isinstance(value, list):
        return [in_seconds(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key.endswith("_us") and isinstance(item, (int, float)) and not isinstance(item, bool):
            name = key[: -len("_us")] + "_s"
            if name not in value:
                out[name] = item / 1e6
            continue
        out[key] = in_seconds(item)
    return out


def summary_json(summary_data: dict[str, Any], missing_ranks: Sequence[int], warnings: Sequence[str]) -> dict[str, Any]:
    """`profile summary`: `TraceSummary.to_json()` with each rank's file as `trace_path`, times in seconds."""
    data = in_seconds(summary_data)
    data["ranks"] = [{("trace_path" if k == "path" else k): v for k, v in r.items()} for r in data.get("ranks", [])]
    data["missing_ranks"] = rank_objects(missing_ranks)
    data["warnings"] = list(warnings)
    return data


def merge_json(merged: MergeResult) -> dict[str, Any]:
    """`profile merge`: the merged file as `trace_path`, each rank with its clock shift."""
    return {"replica": merged.replica, "capture": merged.capture, "trace_path": merged.path,
            "ranks": [{"rank": k, "shift_s": merged.shifts_us.get(k, 0.0) / 1e6} for k in merged.ranks],
            "num_events": merged.num_events, "base_time_ns": merged.base_time_ns, "warnings": merged.warnings}


def export_json(exported: ExportResult) -> dict[str, Any]:
    """`profile export`: each rank's file in `out_dir` as `trace_path`."""
    return {"replica": exported.replica, "capture": exported.capture, "out_dir": exported.out_dir,
            "ranks": [{"rank": k, "trace_path": p} for k, p in sorted(exported.files.items())],
            "warnings": exported.warnings}


