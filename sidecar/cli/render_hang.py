"""`profile hang` as text for a person in a hurry, and as JSON (one schema: `replica`, ranks as objects, seconds)."""

from __future__ import annotations

from typing import Any

from sidecar.cli.render import format_table, jsonable, plural, ranks_text
from sidecar.fleet.hang import MAX_FRAMES_SHOWN, GroupVerdict, HangReport

MAX_RANK_ROWS = 64


def hang_text(report: HangReport) -> str:
    lines = [f"Replica {report.replica}: {report.verdict}"]
    if report.fallback:
        lines.append(f"  ({report.fallback}; the verdict comes from stacks and step counters)")
    g = report.collective
    if g is not None:
        waited = f" for {_seconds(g.waited_s)}" if g.waited_s is not None else ""
        source = f" (from the {g.waited_from})" if g.waited_from else ""
        lines.append(f"  {plural(len(g.waiting)).capitalize()} {ranks_text(g.waiting)} {_wait(len(g.waiting))} in {g.op} "
                     f"({g.label}, seq {g.seq}){waited}{source}.")
        lines.append(f"  collective: {g.op}  {g.label}  seq {g.seq}  in {_sizes(g.input_sizes)} "
                     f"out {_sizes(g.output_sizes)}")
    lines.extend(_fr_trace_lines(report))
    waiting = [r for r in report.ranks if r.role == "waiting"]
    if g is None and waiting:
        since = [r.since_last_step_s for r in waiting if r.since_last_step_s is not None]
        last = f", {_seconds(max(since))} since {'its' if len(waiting) == 1 else 'their'} last step" if since else ""
        lines.append(f"  {plural(len(waiting)).capitalize()} {ranks_text([r.rank for r in waiting])} "
                     f"{_wait(len(waiting))} in torch.distributed{last}.")
    by_rank = {r.rank: r for r in report.ranks}
    for rank in report.suspects:
        r = by_rank.get(rank)
        if r is None:
            continue
        lines.append("")
        step = f"step {r.step}" if r.step is not None else "step ?"
        last = f", last step {_seconds(r.since_last_step_s)} before the dump" if r.since_last_step_s is not None else ""
        lines.append(f"Suspect rank {rank}{' on ' + r.host if r.host else ''} ({step}{last}): {r.where}")
        if r.main_stack:
            lines.append("  main thread, innermost last:")
            shown = r.main_stack[-MAX_FRAMES_SHOWN:]
            if len(r.main_stack) > len(shown):
                lines.append(f"    ... {len(r.main_stack) - len(shown)} outer frames")
            lines.extend(f"    {frame}" for frame in shown)
    if report.groups:
        lines.append("")
        lines.append("Process groups with a collective in flight (entered/completed per rank):")
        for group in report.groups:
            lines.append(f"  {group.label} [{group.process_group.partition(':')[0]}] seq {group.seq} {group.op}: "
                         + _positions(group))
    lines.append("")
    rows = [[r.rank, r.host, r.step if r.step is not None else "-",
             _seconds(r.since_last_step_s) if r.since_last_step_s is not None else "-", r.role, r.where]
            for r in report.ranks[:MAX_RANK_ROWS]]
    lines.append(format_table(["RANK", "HOST", "STEP", "SINCE STEP", "ROLE", "WHERE"], rows))
    if len(report.ranks) > MAX_RANK_ROWS:
        lines.append(f"... and {len(report.ranks) - MAX_RANK_ROWS} more ranks (--json lists them)")
    files = [r for r in report.ranks if r.rank in report.suspects and (r.stacks_path or r.flight_recorder_path)]
    if files:
        lines.append("")
        lines.append("Dumps of the suspects:")
        for r in files:
            lines.append(f"  rank {r.rank}: {r.stacks_path or '-'}  {r.flight_recorder_path or '(no flight recorder)'}")
    return "\n".join(lines)


def _fr_trace_lines(report: HangReport) -> list[str]:
    """What torch's fr_trace said, which part of the verdict is its, and its command."""
    theirs = report.fr_trace
    if theirs is None or not report.flight_recorder:
        return []
    lines = []
    if theirs.ran:
        for group in report.groups:
            if group.fr_trace:
                lines.append(f"  torch's fr_trace, {group.label}: {group.fr_trace}.")
        if any(g.suspects_from == "fr_trace" for g in report.groups):
            lines.append("  (the suspects are fr_trace's; the positions, the wait and the stacks are ours)")
        if theirs.reason:
            lines.append(f"  (fr_trace failed on some dumps: {theirs.reason})")
    else:
        lines.append(f"  (torch's fr_trace did not run: {theirs.reason}; the verdict is ours alone)")
    lines.extend(f"  torch's analysis of these dumps: {command}" for command in theirs.commands)
    return lines


def hang_json(report: HangReport) -> dict[str, Any]:
    data = jsonable(report)
    for group in data["groups"]:
        group["positions"] = [{"rank": int(k), "entered": v[0], "completed": v[1]}
                              for k, v in group["positions"].items()]
    if data["collective"] is not None:
        data["collective"]["positions"] = [{"rank": int(k), "entered": v[0], "completed": v[1]}
                                           for k, v in data["collective"]["positions"].items()]
    for rank in data["ranks"]:
        rank["suspect"] = rank["rank"] in report.suspects
    return data


def _positions(group: GroupVerdict) -> str:
    by_position: dict[tuple[int, int], list[int]] = {}
    for rank, position in group.positions.items():
        by_position.setdefault(position, []).append(rank)
    parts = [f"{plural(len(ranks))} {ranks_text(ranks)} {e}/{c}" for (e, c), ranks in sorted(by_position.items(),
                                                                                           reverse=True)]
    if group.unknown:
        parts.append(f"{plural(len(group.unknown))} {ranks_text(group.unknown)} ?")
    return " · ".join(parts)


def _wait(n: int) -> str:
    return "waits" if n == 1 else "wait"


def _sizes(sizes: Any) -> str:
    return "-" if sizes is None else str(sizes).replace(" ", "")


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.1f}s" if value < 120 else f"{value / 60:.1f} min"
