"""What the CLI prints: plain tables, `--json`, and each command's lines, from the library's dataclasses.

Text only: nothing here reads the registry or decides anything. `echo_json`
prints any result (dataclasses, dicts, lists) as sorted, indented JSON; the
field names are the dataclasses' own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sidecar.answers import PENDING, RankCancel, RankCapture
from sidecar.control import CancelResult, SetResult, StacksResult
from sidecar.fleet import DEFAULT_RANK_FILTER, RankStatus, ReplicaStatus, format_age
from sidecar.follow import ProfileStatus
from sidecar.request import RankFilter

if TYPE_CHECKING:  # annotations only: `profile set` does not import the trace analysis
    from sidecar.traces.export import ExportResult
    from sidecar.traces.merge import MergeResult
    from sidecar.traces.stacks import StackGroup

MAX_HOSTS_SHOWN = 3
MAX_FILES_SHOWN = 8
T = TypeVar("T")


# --- tables and JSON ----------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns, two spaces apart."""
    cells = [[str(h) for h in headers]] + [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def jsonable(obj: Any) -> Any:
    """`obj` as plain dicts, lists and values (dataclasses by their fields)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(jsonable(obj), indent=2, sort_keys=True, default=str))


def show(result: T, as_json: bool, text: Callable[[T], str]) -> None:
    """`result` as JSON, or as `text` renders it."""
    if as_json:
        echo_json(result)
    else:
        click.echo(text(result))


def warn(warnings: Sequence[str]) -> None:
    """`Warning: ...` lines on stderr."""
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)


# --- small pieces ---------------------------------------------------------------------


def plural(n: int, word: str = "rank") -> str:
    """rank, ranks."""
    return word if n == 1 else word + "s"


def ranks_text(ranks: Sequence[int]) -> str:
    """0,2-3 for [0, 2, 3]; "none" for []."""
    return str(RankFilter(frozenset(ranks))) if ranks else "none"


def ranks_label(ranks: Sequence[int]) -> str:
    """ranks 0,2-3 (3 ranks)."""
    n = len(ranks)
    return f"{plural(n)} {ranks_text(ranks)} ({n} {plural(n)})"


def hosts_text(hosts: Sequence[str]) -> str:
    shown = ",".join(hosts[:MAX_HOSTS_SHOWN])
    return shown + (f",+{len(hosts) - MAX_HOSTS_SHOWN}" if len(hosts) > MAX_HOSTS_SHOWN else "")


def yes_no(alive: bool, why: str = "") -> str:
    return "yes" if alive else f"no ({why})" if why else "no"


def conflict_text(rank: int, conflict: dict[str, Any]) -> str:
    """rank 0: also held by pid 123 on node-b (job pid:node-b:123)"""
    return f"rank {rank}: also held by pid {conflict['pid']} on {conflict['host'] or '?'} (job {conflict['job'] or '?'})"


def capture_name(replica: str | None, capture: int | None, target: str) -> str:
    """capture 2 of replica r1, else what the user named."""
    if replica and capture is not None:
        return f"capture {capture} of replica {replica}"
    return target


# --- replica ls / lsr -------------------------------------------------------------------


def replicas_table(replicas: Sequence[ReplicaStatus], with_controller: bool) -> str:
    headers = ["REPLICA", "ROLE", "RANKS", "HOSTS", "STATE", "HEARTBEAT", "STEP"]
    rows = [
        [r.name, r.role, f"{r.num_alive}/{r.num_ranks}", hosts_text(r.hosts), r.state, format_age(r.heartbeat_age),
         r.step]
        for r in replicas
    ]
    if with_controller:
        headers.append("ARRIVED")
        for row, r in zip(rows, replicas, strict=True):
            row.append(yes_no(bool(r.arrived)))
    if any(r.conflicts for r in replicas):
        # Two live jobs under one replica name overwrite each other's records.
        headers.append("CONFLICT")
        for row, r in zip(rows, replicas, strict=True):
            row.append("; ".join(conflict_text(c["rank"], c) for c in r.conflicts))
    return format_table(headers, rows)


def ranks_table(ranks: Sequence[RankStatus]) -> str:
    headers = ["RANK", "HOST", "PID", "ALIVE", "STEP", "STATE", "TRACE", "ERROR"]
    rows = [
        [r.rank, r.host, r.pid, yes_no(r.alive, r.liveness), r.step, r.state, r.trace_path, r.error]
        for r in ranks
    ]
    if any(r.conflict for r in ranks):
        headers.append("CONFLICT")
        for row, r in zip(rows, ranks, strict=True):
            row.append(conflict_text(r.rank, r.conflict).split(": ", 1)[1] if r.conflict else "")
    return format_table(headers, rows)


# --- profile set / cancel / status -----------------------------------------------------------


def set_lines(result: SetResult) -> list[str]:
    return [
        result.message,
        f"Request {result.request_id} for {plural(len(result.ranks))} {ranks_text(result.ranks)}: "
        f"the schedule starts at step {result.start_step} (replica at step {result.current_step}).",
    ]


def describe_capture(c: RankCapture) -> str:
    """One progress line for a rank."""
    if c.phase == "saved":
        text = f"saved {c.trace_path}"
    elif c.phase == "tracing":
        text = f"tracing from step {c.capture_start_step}"
    elif c.phase == "armed":
        text = f"armed at step {c.step}"
    elif c.error:
        text = f"{c.phase}: {c.error}"
    else:
        text = c.phase
    if c.misaligned:
        text += " (misaligned: it saw the request after the start step had passed)"
    return f"rank {c.rank}: {text}"


def saved_lines(captures: Sequence[RankCapture]) -> list[str]:
    saved = [c for c in captures if c.is_finished]
    return ["Traces:", *(f"  rank {c.rank}: {c.trace_path}" for c in saved)] if saved else []


def unfinished(captures: Sequence[RankCapture]) -> str | None:
    """The error for ranks that did not save, else None."""
    failed = [c for c in captures if not c.is_finished]
    if not failed:
        return None
    ranks = ", ".join(str(c.rank) for c in failed)
    reasons = "; ".join(f"rank {c.rank}: {c.phase}: {c.error}" for c in failed)
    return f"{plural(len(failed))} {ranks} did not finish ({reasons})"


def cancel_line(result: CancelResult) -> str:
    busy = ", ".join(f"rank {k} with request {rid}" for k, rid in result.busy.items()) or "none"
    return (f"Cancel {result.request_id} sent to replica {result.replica}, {plural(len(result.ranks))} "
            f"{ranks_text(result.ranks)} (busy: {busy}).")


def describe_cancel(result: RankCancel) -> str:
    """One line for a rank's answer to a cancel."""
    if result.phase in (PENDING, "done") and result.text:
        text = result.text
    elif result.phase == PENDING:
        text = "waiting for the rank to see the cancel"
    else:
        text = f"{result.phase}: {result.error}"
    return f"rank {result.rank}: {text}"


def unanswered_cancel(answers: Sequence[RankCancel]) -> str | None:
    """The error for ranks that did not answer a cancel, else None."""
    failed = [a for a in answers if a.phase != "done"]
    if not failed:
        return None
    reasons = "; ".join(f"rank {a.rank}: {a.phase}: {a.error}" for a in failed)
    return f"{plural(len(failed))} {ranks_text([a.rank for a in failed])} did not answer the cancel ({reasons})"


def status_text(status: ProfileStatus) -> str:
    if status.request_id:
        req = status.request or {}
        first = (f"Replica {status.replica}, request {status.request_id}: ranks "
                 f"{req.get('rank_filter', DEFAULT_RANK_FILTER)}"
                 + (f", start step {req['start_step']}" if req.get("start_step") is not None else ""))
    else:
        first = f"Replica {status.replica}: no JSON request in {status.control_path}; showing each rank's last request."
    headers = ["RANK", "HOST", "ALIVE", "REQUEST", "PHASE", "STEP", "START", "TRACE", "ERROR"]
    rows = [
        [c.rank, c.host, yes_no(c.alive), c.request_id, c.phase + (" (misaligned)" if c.misaligned else ""),
         c.step, c.capture_start_step, c.trace_path, c.error]
        for c in status.ranks
    ]
    return first + "\n" + format_table(headers, rows)


# --- profile stacks / merge / export ----------------------------------------------------------


def stacks_text(result: StacksResult, groups: Sequence[StackGroup], all_threads: bool = False) -> str:
    """Each group as `ranks 0,2-3 (3 ranks): MainThread, step 20` over its frames, innermost last."""
    answered = result.answered
    lines = [f"Stacks of replica {result.replica} (request {result.request_id}): "
             f"{len(answered)} of {len(result.ranks)} {plural(len(result.ranks))} answered."]
    for group in groups:
        lines.append("")
        steps = f", {plural(len(group.steps), 'step')} {ranks_text(group.steps)}" if group.steps else ""
        if group.is_main:
            lines.append(f"{ranks_label(group.ranks)}: {group.thread}{steps}")
        else:
            lines.append(f"thread {group.thread}: {ranks_label(group.ranks)}:")
        lines.extend(f"  {frame}" for frame in group.frames or ["(no Python frames)"])
        if group.is_main and group.other_threads and not all_threads:
            n = len(group.other_threads)
            lines.append(f"  + {n} other {plural(n, 'thread')}: {', '.join(group.other_threads)} "
                         "(--all-threads shows them)")
    if answered:
        lines.append("")
        lines.append("Stack files:")
        for answer in answered[:MAX_FILES_SHOWN]:
            lines.append(f"  rank {answer.rank}: {answer.path}")
        if len(answered) > MAX_FILES_SHOWN:
            lines.append(f"  ... and {len(answered) - MAX_FILES_SHOWN} more (--json lists them)")
    return "\n".join(lines)


def stacks_json(result: StacksResult, groups: Sequence[StackGroup]) -> dict[str, Any]:
    """The result without the parsed threads (the groups carry the frames)."""
    ranks = [{k: v for k, v in jsonable(r).items() if k not in ("threads", "main_thread")} for r in result.ranks]
    return {**jsonable(result), "ranks": ranks, "groups": [{**jsonable(g), "ranks_text": g.ranks_text} for g in groups]}


def unanswered_stacks(result: StacksResult) -> str | None:
    """The error for ranks that sent no stacks, else None."""
    missing = result.unanswered
    if not missing:
        return None
    reasons = "; ".join(f"rank {r.rank}: {r.phase}: {r.error}" if r.error else f"rank {r.rank}: {r.phase}"
                        for r in missing)
    return f"no stacks from {plural(len(missing))} {ranks_text([r.rank for r in missing])} ({reasons})"


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
