"""What the CLI prints: plain tables, `--json`, and each command's lines, from the library's dataclasses.

Text only: nothing here reads the registry or decides anything. `echo_json`
prints any result (dataclasses, dicts, lists) as sorted, indented JSON; the
field names are the dataclasses' own. The fleet commands' lines and JSON are here,
saved traces' are `render_traces`', a hang's `render_hang`'s, and a refusal's sentence
and what to do next `render_refusal`'s.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from sidecar.cli.errors import CliError
from sidecar.common.request import RankFilter
from sidecar.fleet.replicas import DEFAULT_RANK_FILTER, RankStatus, ReplicaStatus, format_age

if TYPE_CHECKING:  # annotations only: `replica ls` imports no request writer, follower or trace analysis
    from sidecar.fleet.answers import CancelAnswer, RankCancel, RankCapture
    from sidecar.fleet.control import CancelResult, SetResult, StacksResult
    from sidecar.fleet.follow import ProfileStatus, SetFollowed
    from sidecar.fleet.stackgroups import StackGroup

CLI_NAME = "cosmos-profiler"
MAX_HOSTS_SHOWN = 3
MAX_FILES_SHOWN = 8


# --- tables and JSON ----------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns, two spaces apart."""
    # A column at a time (10,000 rows of `replica lsr`): its header, then its cells as text.
    columns = [[str(h), *["-" if c is None or c == "" else str(c) for c in column]]
               for h, column in zip(headers, zip(*rows, strict=True), strict=True)] if rows else [[str(h)] for h in headers]
    widths = [max(map(len, column)) for column in columns]
    line = "  ".join(f"%-{w}s" for w in widths)  # each cell left-justified to its column's width
    return "\n".join([(line % row).rstrip() for row in zip(*columns, strict=True)])


def jsonable(obj: Any) -> Any:
    """`obj` as plain dicts, lists and values (dataclasses by their fields)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Field by field, not through dataclasses.asdict: that deep-copies every value
        # first, a third of `replica ls --json` over 10,000 ranks, for a copy made here anyway.
        names = _FIELD_NAMES.get(type(obj))
        if names is None:
            names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
        return {name: jsonable(getattr(obj, name)) for name in names}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(jsonable(obj), indent=2, sort_keys=True, default=str))


def finish(as_json: bool, data: Any, failure: str | None, code: str = "incomplete") -> None:
    """Print `data` as JSON (one object: with `error` and `code` when `failure`), and exit 1 on `failure`
    (in text mode as `Error: <failure>`; the command printed its own lines)."""
    if as_json:
        echo_json({**jsonable(data), "error": failure, "code": code} if failure else data)
        if failure:
            raise click.exceptions.Exit(1)
    elif failure:
        raise CliError(failure, code)


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


# --- replica ls / lsr -------------------------------------------------------------------


def problem_lines(replicas: Sequence[ReplicaStatus]) -> list[str]:
    """`replica ls`'s warnings: each rank record file of a replica that cannot be used, and why."""
    return [f"replica {r.name}: {problem}" for r in replicas for problem in r.problems]


def no_replicas_line(source: Any) -> str:
    """`replica ls` with nothing to list: where nothing was found."""
    if source.controller is not None:
        return "No replicas registered to the controller."
    return f"No replicas registered under {source.root}."


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
    headers = ["RANK", "HOST", "PID", "SIGNAL", "ALIVE", "STEP", "STATE", "TRACE", "ERROR"]
    rows = [
        [r.rank, r.host, r.pid, r.signal, yes_no(r.alive, r.liveness), r.step, r.state, r.trace_path, r.error]
        for r in ranks
    ]
    if any(r.conflict for r in ranks):
        headers.append("CONFLICT")
        for row, r in zip(rows, ranks, strict=True):
            row.append(conflict_text(r.rank, r.conflict).split(": ", 1)[1] if r.conflict else "")
    if any(r.upload_to for r in ranks):
        # [train.ckpt] upload_s3: where the last trace went; a table of ranks that upload nothing is unchanged.
        headers.append("UPLOAD")
        for row, r in zip(rows, ranks, strict=True):
            row.append(upload_text(r.trace_url, r.upload_error, r.upload_to, r.trace_path))
    return format_table(headers, rows)


def upload_text(url: str | None, error: str | None, upload_to: str | None, trace_path: str | None) -> str:
    """Where a trace went on S3: its URL, the upload's failure, or that it is on its way."""
    if error:
        return f"failed: {error}"
    if url:
        return url
    if upload_to and trace_path:
        return f"uploading to {upload_to}"
    return ""


# --- profile set / cancel / status -----------------------------------------------------------


def set_warnings(result: SetResult) -> list[str]:
    """`profile set`'s warnings: the request's, and each selected rank that will not be profiled."""
    return result.warnings + [f"rank {k} will not be profiled: {why}" for k, why in result.skipped.items()]


def set_lines(result: SetResult) -> list[str]:
    lines = [
        result.message,
        f"Request {result.request_id} for {plural(len(result.ranks))} {ranks_text(result.ranks)}: "
        f"the schedule starts at step {result.start_step} (replica at step {result.current_step}).",
    ]
    if result.effective:
        # Before the capture starts: an omitted flag means the rank's config here, not cosmos-cli's default.
        taken = (f" ({', '.join(result.from_config)} from the rank's [profiler.sub_profiler_config]; cosmos-cli "
                 "would send active_steps=1 and false for flags not given)" if result.from_config else "")
        lines.append("It records: " + " ".join(f"{k}={json_value(v)}" for k, v in result.effective.items())
                     + taken + ".")
    return lines


def json_value(value: Any) -> str:
    """true/false for booleans (as TOML and JSON spell them), else str()."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def describe_capture(c: RankCapture) -> str:
    """One progress line for a rank."""
    if c.phase == "saved":
        text = f"saved {c.trace_path}" + (f" (uploaded to {c.trace_url})" if c.trace_url else "")
    elif c.phase == "tracing":
        text = f"tracing from step {c.capture_start_step}"
    elif c.phase == "armed":
        text = f"armed at step {c.step}"
    elif capture_error(c):
        text = f"{c.phase}: {capture_error(c)}"
    else:
        text = c.phase
    if c.misaligned:
        text += " (misaligned: it saw the request after the start step had passed)"
    return f"rank {c.rank}: {text}"


def saved_lines(captures: Sequence[RankCapture]) -> list[str]:
    saved = [c for c in captures if c.is_finished]
    return ["Traces:", *(f"  rank {c.rank}: {c.trace_path}" + (f" ({c.trace_url})" if c.trace_url else "")
                         for c in saved)] if saved else []


def baseline_lines(baseline: Sequence[RankCapture]) -> list[str]:
    """A slowdown watch's baseline capture, as `profile set --wait` prints it when it is done."""
    return ["Baseline:", *saved_lines(baseline)]


def fired_line(request_id: str) -> str:
    """The capture a slowdown watch asked for, before `profile set --wait` follows it."""
    return f"Slowdown: capture {request_id}:"


NOTES_SHOWN = 4  # `profile set --wait` on a watch: the ranks whose note (why a slowdown was not captured) it prints


def note_lines(rank: int, note: str, num_noted: int, name: str) -> list[str]:
    """While a watch is followed: the `num_noted`th rank's first note (why a slowdown was not captured)."""
    if num_noted <= NOTES_SHOWN:
        return [f"rank {rank}: {note}"]
    if num_noted == NOTES_SHOWN + 1:
        return [f"(more ranks left a slowdown uncaptured: `{CLI_NAME} profile status {name}` shows each)"]
    return []


def set_failure(followed: SetFollowed, name: str) -> str | None:
    """Why `profile set --wait` ends in error: the watch never fired, or ranks that did not save; else None."""
    if followed.stage in ("watch", "ended"):
        notes = "".join(f"; rank {rank}: {note}" for rank, note in sorted(followed.notes.items())[:NOTES_SHOWN])
        if len(followed.notes) > NOTES_SHOWN:
            more = len(followed.notes) - NOTES_SHOWN
            notes += f"; {more} more {plural(more)} with a note (`{CLI_NAME} profile status {name}`)"
        if followed.stage == "ended":
            return f"the slowdown watch {followed.request_id} ended before it fired{notes}"
        return (f"timed out after {followed.timeout:g}s: the slowdown watch {followed.request_id} has not fired (it "
                f"stays armed; `{CLI_NAME} profile cancel {name}` disarms it){notes}")
    return unfinished(followed.captures or [])


def unfinished(captures: Sequence[RankCapture]) -> str | None:
    """The error for ranks that did not save, else None."""
    failed = [c for c in captures if not c.is_finished]
    if not failed:
        return None
    ranks = ", ".join(str(c.rank) for c in failed)
    reasons = "; ".join(f"rank {c.rank}: {c.phase}: {capture_error(c)}" for c in failed)
    return f"{plural(len(failed))} {ranks} did not finish ({reasons})"


def cancel_warnings(result: CancelResult) -> list[str]:
    """`profile cancel`'s warnings: each selected rank that will not answer."""
    return [f"rank {k} will not answer: {why}" for k, why in result.skipped.items()]


def cancel_line(result: CancelResult) -> str:
    busy = ", ".join(f"rank {k} with request {rid}" for k, rid in result.busy.items()) or "none"
    return (f"Cancel {result.request_id} sent to replica {result.replica}, {plural(len(result.ranks))} "
            f"{ranks_text(result.ranks)} (busy: {busy}).")


def cancel_text(answer: CancelAnswer) -> str:
    """What a rank did with a cancel, in words."""
    request, step = answer.request_id, answer.step
    if answer.outcome == "disarmed":
        return f"disarmed request {request} at step {step}"
    if answer.outcome == "stopped":
        # No path and no detail: the rank is still writing what it recorded.
        detail = (f"saved the steps recorded so far to {answer.trace_path}" if answer.trace_path
                  else answer.detail or "saving the steps recorded so far")
        return f"stopped request {request} after step {step}; {detail}"
    if answer.outcome == "stopping":
        return f"stopping request {request} at the next step boundary"
    if answer.outcome == "saving":
        return f"request {request} had finished its steps; saving its trace"
    if answer.outcome == "finished":
        return f"request {request} had finished its steps; its trace was saved to {answer.trace_path}"
    return f"nothing to cancel ({answer.state or 'idle'})"


def capture_error(c: RankCapture) -> str | None:
    """Why a rank's capture did not finish; for a cancelled one, the cancel and what the rank did."""
    if c.cancelled_by is not None:
        return f"cancelled by request {c.cancelled_by.id} ({cancel_text(c.cancelled_by)})"
    return c.error


def describe_cancel(result: RankCancel) -> str:
    """One line for a rank's answer to a cancel."""
    from sidecar.fleet.answers import PENDING  # loaded already: a cancel's answers come from `follow`

    if result.phase in (PENDING, "done") and result.answer is not None:
        text = cancel_text(result.answer)
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


def control_text(status: ProfileStatus) -> str:
    """What the control file holds when it is no trace request to follow."""
    path, kind, rid = status.control_path, status.control_kind, status.control_request_id
    if kind == "absent":
        return f"no request in {path} yet"
    if kind == "empty":
        return f"{path} is empty (a touch: each rank takes its own defaults under its own request id)"
    if kind == "invalid":
        return f"{path} holds no valid JSON request"
    what = f"a {kind} request" + (f" {rid}" if rid else "")
    if kind in ("stacks", "cancel"):
        return f"{path} holds {what}, which ranks answer at once and which is no capture"
    if kind == "watch":
        return f"{path} holds {what} (the slowdown watch, below)"
    return f"{path} holds {what} that no rank has taken"


def start_text(status: ProfileStatus) -> str:
    """`, start step N` from the ranks that took the request: a touched file re-issues an
    old request from each rank's step, so its own start step is history."""
    asked = (status.request or {}).get("start_step")
    started = sorted({c.capture_start_step for c in status.ranks
                      if c.request_id == status.request_id and c.capture_start_step is not None})
    if not started or asked in started:
        return f", start step {asked}" if asked is not None else ""
    if asked is None:
        return f", started at step {ranks_text(started)}"
    return f", start step {asked} (the ranks started at {ranks_text(started)})"


def status_text(status: ProfileStatus) -> str:
    if status.request_id:
        req = status.request or {}
        first = (f"Replica {status.replica}, request {status.request_id}: ranks "
                 f"{req.get('rank_filter', DEFAULT_RANK_FILTER)}" + start_text(status))
    else:
        first = f"Replica {status.replica}: {control_text(status)}; showing each rank's last request."
    headers = ["RANK", "HOST", "ALIVE", "REQUEST", "PHASE", "STEP", "START", "TRACE", "ERROR"]
    rows = [
        [c.rank, c.host, yes_no(c.alive), c.request_id, c.phase + (" (misaligned)" if c.misaligned else ""),
         c.step, c.capture_start_step, c.trace_path, capture_error(c)]
        for c in status.ranks
    ]
    uploads = [f"  rank {c.rank}: {c.trace_url or 'failed: ' + str(c.upload_error)}"
               for c in status.ranks if c.trace_url or c.upload_error]
    # [train.ckpt] upload_s3: where each trace went, below the table (which stays as it is).
    uploaded = "\nUploaded:\n" + "\n".join(uploads) if uploads else ""
    return first + "\n" + format_table(headers, rows) + uploaded + slowdown_text(status.slowdown)


def slowdown_text(watches: Sequence[dict[str, Any]]) -> str:
    """`profile status`'s slowdown watch table (sidecar.rank.slowdown), after the capture table; "" when none.
    LAST is the watch's note (a slowdown left uncaptured, a cancel: a capture clears it), else what fired it."""
    if not watches:
        return ""
    headers = ["RANK", "WATCH", "STATE", "FACTOR", "MEDIAN", "STEPS SEEN", "FIRED", "LAST"]
    rows = []
    for w in watches:
        median = w.get("median_s")
        repeats = "always on" if w.get("always_on") else f"{w.get('repeat_left')} repeats left"
        rows.append([w.get("rank"), w.get("id"), w.get("state"), f"{w.get('factor'):g}x, {w.get('consecutive')} in a row",
                     f"{median * 1000:.1f} ms" if isinstance(median, (int, float)) else "-", w.get("steps_seen"),
                     f"{w.get('num_fired')} ({repeats})", w.get("note") or w.get("message") or ""])
    return "\nSlowdown watch:\n" + format_table(headers, rows)


# --- profile stacks / merge / export ----------------------------------------------------------


def stacks_text(result: StacksResult, groups: Sequence[StackGroup], all_threads: bool = False) -> str:
    """Each group as `ranks 0,2-3 (3 ranks): MainThread, step 20` over its frames, innermost last."""
    answered = result.answered
    lines = [f"Stacks of replica {result.replica} (request {result.request_id}): "
             f"{len(answered)} of {len(result.ranks)} {plural(len(result.ranks))} answered."]
    faulted = [a.rank for a in answered if a.source != "watcher"]
    if faulted:
        lines.append(f"{ranks_label(faulted)}: from the faulthandler fallback (the watcher thread did not answer "
                     "in time: a C call holding the GIL?); its step and thread names are the ones it last published.")
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
            via = f" ({answer.fallback})" if answer.source != "watcher" else ""
            lines.append(f"  rank {answer.rank}: {answer.path}{via}")
        if len(answered) > MAX_FILES_SHOWN:
            lines.append(f"  ... and {len(answered) - MAX_FILES_SHOWN} more (--json lists them)")
    return "\n".join(lines)


def unanswered_stacks(result: StacksResult) -> str | None:
    """The error for ranks that sent no stacks, else None."""
    missing = result.unanswered
    if not missing:
        return None
    reasons = "; ".join(f"rank {r.rank}: {r.phase}: {r.error}" if r.error else f"rank {r.rank}: {r.phase}"
                        for r in missing)
    return f"no stacks from {plural(len(missing))} {ranks_text([r.rank for r in missing])} ({reasons})"


# --- one JSON schema (docs/json.md, sidecar/cli/schema.json) --------------------------------
# Every command prints one JSON object. The replica is `replica`; `ranks` is always a
# list of objects with an integer `rank`; trace files are `trace_path`; times are
# seconds (`*_s`) unless the name says otherwise (`*_us`, `*_ns`).


def rank_objects(ranks: Sequence[int], **fields: Any) -> list[dict[str, Any]]:
    return [{"rank": rank, **fields} for rank in ranks]


def _reasons(reasons: dict[int, str]) -> list[dict[str, Any]]:
    """{rank: why} as [{"rank", "error"}]."""
    return [{"rank": rank, "error": why} for rank, why in sorted(reasons.items())]


# Keys of a rank object that appear only on ranks that upload traces ([train.ckpt] upload_s3).
UPLOAD_KEYS = ("upload_to", "trace_url", "upload_error")


def without_absent_uploads(data: dict[str, Any]) -> dict[str, Any]:
    """A rank object less its upload keys that are null: a rank that uploads nothing shows none."""
    for key in UPLOAD_KEYS:
        if key in data and data[key] is None:
            del data[key]
    return data


def rank_json(status: RankStatus) -> dict[str, Any]:
    """One rank of `replica lsr` and `replica ls`."""
    data = without_absent_uploads(jsonable(status))
    data["heartbeat_age_s"] = data.pop("heartbeat_age")
    return data


def replica_json(replica: ReplicaStatus, ranks: Sequence[RankStatus]) -> dict[str, Any]:
    """One replica of `replica ls`, with its ranks."""
    data = jsonable(replica)
    data["replica"] = data.pop("name")
    data["heartbeat_age_s"] = data.pop("heartbeat_age")
    data["ranks"] = [rank_json(r) for r in ranks]
    return data


def source_json(source: Any) -> dict[str, Any]:
    """Where replicas came from: `registry`, `registry_from` and `controller` (a URL, or null)."""
    return {"registry": getattr(source, "store_url", None) or str(source.root), "registry_from": source.origin,
            "controller": source.controller_url}


def ls_json(source: Any, replicas: Sequence[tuple[ReplicaStatus, Sequence[RankStatus]]]) -> dict[str, Any]:
    return {**source_json(source), "replicas": [replica_json(r, ranks) for r, ranks in replicas]}


def lsr_json(source: Any, name: str, ranks: Sequence[RankStatus]) -> dict[str, Any]:
    return {**source_json(source), "replica": name, "ranks": [rank_json(r) for r in ranks]}


def _written_json(result: Any) -> dict[str, Any]:
    return {"replica": result.replica, "request_id": result.request_id, "request": result.request.to_json(),
            "control_path": result.control_path}


def set_json(result: SetResult, captures: Sequence[RankCapture] | None = None) -> dict[str, Any]:
    """`profile set`: each selected live rank, pending (or, with --wait, how it ended)."""
    from sidecar.fleet.answers import PENDING  # loaded already, by `control`

    ranks = ([capture_json(c) for c in captures] if captures is not None
             else rank_objects(result.ranks, phase=PENDING, request_id=result.request_id))
    return {**_written_json(result), "ranks": ranks, "skipped": _reasons(result.skipped),
            "start_step": result.start_step, "current_step": result.current_step, "lead_steps": result.lead_steps,
            "warnings": result.warnings, "message": result.message, "effective": result.effective,
            "from_config": result.from_config}


def cancel_json(result: CancelResult, answers: Sequence[RankCancel] | None = None) -> dict[str, Any]:
    """`profile cancel`: each selected live rank, pending with the request it ends (or, with --wait, its answer)."""
    from sidecar.fleet.answers import PENDING  # loaded already, by `control`

    ranks = ([cancel_answer_json(a) for a in answers] if answers is not None
             else [{"rank": k, "phase": PENDING, "cancelled_request": result.busy.get(k)} for k in result.ranks])
    return {**_written_json(result), "ranks": ranks, "skipped": _reasons(result.skipped)}


def capture_json(capture: RankCapture) -> dict[str, Any]:
    """One rank's capture: its `error` in words (a cancelled one's too), no upload keys on a rank that uploads nothing."""
    data = without_absent_uploads(jsonable(capture))
    del data["cancelled_by"]
    data["error"] = capture_error(capture)
    return data


def cancel_answer_json(answer: RankCancel) -> dict[str, Any]:
    """One rank's answer to a cancel: what it did as `text` ("" before it has seen the cancel)."""
    data = jsonable(answer)
    del data["answer"]
    data["text"] = cancel_text(answer.answer) if answer.answer is not None else ""
    return data


def status_json(status: ProfileStatus) -> dict[str, Any]:
    data = jsonable(status)
    data["ranks"] = [capture_json(c) for c in status.ranks]
    if not status.slowdown:
        del data["slowdown"]  # present only where a rank has a slowdown watch
    return data


# Parsed threads go out as groups; the flight recorder is `profile hang`'s, never a stacks request's.
STACKS_JSON_HIDDEN = ("threads", "main_thread", "flight_recorder", "flight_recorder_error")


def stacks_json(result: StacksResult, groups: Sequence[StackGroup]) -> dict[str, Any]:
    """`profile stacks`: each rank's answer (without the parsed threads), and the groups of ranks by stack."""
    ranks = [{k: v for k, v in jsonable(r).items() if k not in STACKS_JSON_HIDDEN} for r in result.ranks]
    for rank in ranks:
        rank["stacks_path"] = rank.pop("path")
    out_groups = []
    for group in groups:
        data = jsonable(group)
        data["ranks"] = rank_objects(group.ranks)
        data["ranks_text"] = group.ranks_text
        out_groups.append(data)
    return {**_written_json(result), "ranks": ranks, "groups": out_groups}
