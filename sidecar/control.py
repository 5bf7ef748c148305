"""Requests to a replica, written and followed: `profile set|cancel|status`, as functions that return dataclasses.

A profile request is always written to the control file: the controller is
never needed to profile (replicas and ranks are read by `sidecar.fleet`).
Nothing here prints, parses flags or imports torch.

How a request is followed: a rank that sees our request records its id in
`request_id`; it then goes armed -> tracing -> saving -> idle, and the history
entry of the save carries `saved: <path>`. A refusal names the request id in
`refused`; a failure puts the rank in `error`. A cancel is followed through the
record's `cancel` (the last cancel the rank handled, with its outcome) until
the rank is out of the busy states; the request it ended gets `cancelled: true`.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar import pace, registry
from sidecar.capture import BUSY_STATES
from sidecar.config import DEFAULT_MAX_CONTROL_BYTES, SubProfilerConfig
from sidecar.controller import ControllerReplica
from sidecar.errors import BadOption, ReplicaBusy, RequestError
from sidecar.fleet import BAD_RECORD, check_replica, liveness, replica_ranks, select_ranks
from sidecar.identity import host_name
from sidecar.registry import RankRecord
from sidecar.request import (
    RankFilter,
    check_start_ahead,
    defaults_from_config,
    file_request_id,
    parse_rank_filter,
    request_from_dict,
)

CLI_NAME = "cosmos-profiler"
BUSY_MESSAGE = "Replica {name} is busy with {requests}. `" + CLI_NAME + " profile cancel {name}` ends {it}."
SET_MESSAGE = "Set replica {name} to profile mode."
# Cosmos-RL's CLI profiles rank 0 when no rank filter is given.
DEFAULT_RANK_FILTER = "0"

# The lead: how far past the replica's current step the capture starts, so
# that every selected rank has seen the request before the start step comes.
# For each rank: its projected step now plus the steps it runs, at its recent
# pace (sidecar.pace: the fastest pace between the (time, step) samples of its
# record), in LEAD_SECONDS plus the time it may take to see the request (its
# polling interval, or INOTIFY_LATENCY_S); the start is the latest of those,
# and at least MIN_LEAD_STEPS past the highest step. LEAD_SECONDS covers the
# CLI's own time and a pace that jumped since the record was written (a rank
# republishes within about pace.SAMPLE_INTERVAL_S when it runs ahead of its
# record). A rank with no pace in its record yet is read again after its next
# rewrite (at most MAX_RATE_WAIT_S).
MIN_LEAD_STEPS = 3
LEAD_SECONDS = 1.5
INOTIFY_LATENCY_S = 0.1
MIN_RATE_WINDOW_S = 0.5
MAX_RATE_WAIT_S = 5.0
RATE_POLL_INTERVAL_S = 0.05

DEFAULT_WAIT_TIMEOUT_S = 600.0
DEFAULT_CANCEL_TIMEOUT_S = 60.0
WAIT_POLL_INTERVAL_S = 0.1

# Phases of one rank for one request.
PENDING = "pending"
TERMINAL_PHASES = ("saved", "cancelled", "error", "refused", "dead", "not selected", "missing", "timeout")


# --- one rank's progress on one request --------------------------------------


@dataclass
class RankCapture:
    """Where one rank stands with one request (`profile status`, `profile set --wait`)."""

    rank: int
    phase: str  # pending | armed | tracing | saving | saved | error | refused | dead | not selected | missing | timeout
    host: str = ""
    alive: bool = False
    request_id: str | None = None
    step: int | None = None
    capture_start_step: int | None = None
    misaligned: bool = False
    trace_path: str | None = None  # the trace this request saved
    error: str | None = None  # why it did not finish

    @property
    def is_finished(self) -> bool:
        return self.phase == "saved"

    @property
    def is_terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


def capture_of(record: RankRecord | None, request_id: str | None, alive: bool, why: str = "") -> RankCapture:
    """The phase of `record`'s rank for `request_id` (pure; see the module docstring)."""
    if record is None:
        return RankCapture(rank=-1, phase="missing", request_id=request_id, error="no rank record")
    capture = RankCapture(
        rank=record.rank, phase=PENDING, host=record.host, alive=alive, request_id=request_id, step=record.step,
    )
    if request_id is not None and record.request_id == request_id:
        saved = [h["saved"] for h in record.history if isinstance(h.get("saved"), str) and h["saved"]]
        if record.selected is False:
            capture.phase = "not selected"
            return capture
        capture.capture_start_step = record.capture_start_step
        capture.misaligned = record.misaligned
        if record.cancelled and record.state not in BUSY_STATES and record.state != "error":
            capture.phase, capture.trace_path = "cancelled", saved[-1] if saved else None
            cancel = record.cancel or {}
            capture.error = f"cancelled by request {cancel.get('id', '?')} ({_cancel_text(cancel)})"
        elif saved:
            capture.phase, capture.trace_path = "saved", saved[-1]
        elif record.state == "error":
            capture.phase, capture.error = "error", record.error or "failed (no error text recorded)"
        elif record.state in BUSY_STATES:
            capture.phase = record.state
    elif request_id is not None and record.refused and f"request {request_id} " in record.refused:
        capture.phase, capture.error = "refused", record.refused
    if not alive and not capture.is_terminal:
        last = f"last {record.state} at step {record.step}"
        capture.phase, capture.error = "dead", f"{why or 'not alive'} before saving ({last})"
    return capture


# --- profile set ------------------------------------------------------------


@dataclass
class SetResult:
    """What `set_profile` wrote and whom it is for."""

    replica: str
    request_id: str
    request: dict[str, Any]
    control_path: str
    ranks: list[int]  # the live selected ranks that will capture
    skipped: dict[int, str] = field(default_factory=dict)  # selected, but not alive: why
    start_step: int | None = None
    current_step: int = 0  # highest step the replica's live ranks report
    lead_steps: int = 0
    warnings: list[str] = field(default_factory=list)
    message: str = ""


def new_request_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return f"cli-{stamp}-{secrets.token_hex(3)}"


def step_rate(record: RankRecord) -> float | None:
    """`record`'s steps per second for planning (None when it has no pace yet): its
    recent pace, or its lifetime average where that is higher (a rank that stood
    still a while ago and steps again), or only the average (an older sidecar's record)."""
    window = record.heartbeat_at - record.started_at
    average = (record.step / window if record.step > 0 else 0.0) if window >= MIN_RATE_WINDOW_S else None
    recent = pace.recent_rate([(float(t), int(n)) for t, n in record.recent_steps]) if record.recent_steps else None
    if recent is None:
        return average
    return max(recent, average or 0.0)


def projected_step(record: RankRecord, now: float) -> tuple[float, float]:
    """(the step `record`'s rank has probably reached now, its recent steps per second)."""
    rate = step_rate(record) or 0.0
    # The heartbeat runs on its own thread, so a record is at most about one
    # interval old; never project further than a few.
    age = min(max(now - record.heartbeat_at, 0.0), 3.0 * (record.heartbeat_interval or 2.0))
    return record.step + rate * age, rate


def trigger_latency(record: RankRecord) -> float:
    """How long `record`'s rank may take to see a new request."""
    return record.poll_interval if record.watch == "poll" else INOTIFY_LATENCY_S


def _with_step_rates(root: Path, name: str, live: list[RankRecord]) -> list[RankRecord]:
    """Records young enough that no step rate can be measured yet (a rank that
    just started) are read again after their next rewrite, at most a few seconds."""
    young = {r.rank: r.heartbeat_at for r in live if step_rate(r) is None}
    if not young:
        return live
    interval = max(r.heartbeat_interval or 2.0 for r in live)
    deadline = time.monotonic() + min(1.5 * interval, MAX_RATE_WAIT_S)
    while True:
        fresh = {r.rank: r for r in registry.read_records(root, name)}
        if all(k in fresh and fresh[k].heartbeat_at > at for k, at in young.items()) or time.monotonic() >= deadline:
            return [fresh.get(r.rank, r) for r in live]
        time.sleep(RATE_POLL_INTERVAL_S)


def plan_start_step(records: Sequence[RankRecord], now: float, lead_steps: int | None = None) -> tuple[int, int]:
    """(start_step, lead) for a request that all of `records` should see in time (see LEAD_SECONDS)."""
    paces = []
    for r in records:
        step, rate = projected_step(r, now)
        paces.append(pace.RankPace(rank=r.rank, step=step, rate=rate, latency_s=trigger_latency(r)))
    if lead_steps is not None:
        current = math.ceil(max(p.step for p in paces))
        return current + lead_steps, lead_steps
    return pace.plan_start(paces, LEAD_SECONDS, MIN_LEAD_STEPS)


def busy_message(name: str, busy: Sequence[RankRecord]) -> str:
    """"Replica R is busy with request ID (ranks ..., start step N, phase ...). ... ends it." for `busy` ranks."""
    order = {state: i for i, state in enumerate(BUSY_STATES)}
    groups: dict[str, list[RankRecord]] = {}
    for record in busy:
        groups.setdefault(record.request_id or "?", []).append(record)
    parts = []
    for request_id, records in groups.items():
        request = records[0].request if isinstance(records[0].request, dict) else {}
        start = request.get("start_step")
        if start is None:
            start = next((r.capture_start_step for r in records if r.capture_start_step is not None), None)
        phase = max((r.state for r in records), key=lambda s: order.get(s, -1))
        ranks = str(RankFilter(frozenset(r.rank for r in records)))
        parts.append(f"request {request_id} (ranks {ranks}, start step {'next' if start is None else start}, "
                     f"phase {phase})")
    return BUSY_MESSAGE.format(name=name, requests=" and ".join(parts), it="it" if len(parts) == 1 else "them")


def set_profile(
    root: Path,
    name: str,
    *,
    rank_filter: RankFilter | str | None = None,
    active_steps: int | None = None,
    warmup_steps: int | None = None,
    wait_steps: int | None = None,
    start_step: int | None = None,
    record_shape: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    with_modules: bool = False,
    controller: list[ControllerReplica] | None = None,
    lead_steps: int | None = None,
    now: float | None = None,
) -> SetResult:
    """Validate and write a trace request for the live selected ranks of `name`.

    Step counts left as None, and flags left False, are omitted from the
    request so each rank's configured defaults apply. The rank filter defaults
    to rank 0, as in Cosmos-RL. Without `start_step`, the capture starts at
    the replica's highest step plus a lead (see `plan_start_step`), so all
    selected ranks trace the same steps.

    Raises:
        ReplicaNotFound: no records for `name` (or the controller does not know it).
        BadOption: the rank filter names a rank beyond the world size.
        ReplicaBusy: a live selected rank is armed, tracing or saving.
        RequestError: no selected rank is alive.
        RegistryError: the control file cannot be written.
    """
    check_replica(name, controller)
    now = time.time() if now is None else now
    records, filter_, selected, problems = select_ranks(root, name, rank_filter, DEFAULT_RANK_FILTER, controller)

    this_host = host_name()
    targets: list[RankRecord] = []
    skipped: dict[int, str] = {}
    for rank in selected:
        record = records.get(rank)
        if record is None:
            skipped[rank] = problems.get(rank, "no rank record")
            continue
        alive, why = liveness(record, this_host, now)
        if alive:
            targets.append(record)
        else:
            skipped[rank] = why
    if not targets:
        reasons = "; ".join(f"rank {k}: {why}" for k, why in skipped.items())
        raise RequestError(f"no live rank of replica {name} matches rank filter {filter_} ({reasons})")
    busy_ids = {r.request_id for r in targets if r.state in BUSY_STATES}
    if busy_ids:
        # Name every live rank busy with those requests, not only the selected ones.
        busy = [r for r in records.values() if r.state in BUSY_STATES and r.request_id in busy_ids
                and liveness(r, this_host, now)[0]]
        raise ReplicaBusy(busy_message(name, busy))

    warnings = [
        f"rank {r.rank} has the profiler disabled ([profiler] enable_profiler = false) and will refuse the request"
        for r in targets if not r.enabled
    ]
    live = [r for r in records.values() if liveness(r, this_host, now)[0]]
    if start_step is None:
        live = _with_step_rates(root, name, live)
        now = max(now, time.time())
    current = max(r.step for r in live)
    reached = math.floor(max(projected_step(r, now)[0] for r in live))
    rates = [rate for rate in (step_rate(r) for r in live) if rate]
    if start_step is None:
        start_step, lead = plan_start_step(live, now, lead_steps)
        too_far = check_start_ahead(start_step, reached, max(rates, default=None))
        if too_far:
            raise RequestError(f"the planned start step is too far ahead: {too_far} (a rank polls too slowly?)")
    else:
        lead = 0
        too_far = check_start_ahead(start_step, reached, max(rates, default=None))
        if too_far:
            raise BadOption("start_step", f"{too_far} (replica {name}); give a nearer step, or leave it out")
        if start_step <= reached:
            warnings.append(
                f"start step {start_step} has probably passed (replica {name} is near step {reached}); "
                "ranks will start at once and report misaligned"
            )

    request_id = new_request_id(now)
    request: dict[str, Any] = {"id": request_id, "kind": "trace", "rank_filter": str(filter_), "start_step": start_step}
    for key, value in (("active_steps", active_steps), ("warmup_steps", warmup_steps), ("wait_steps", wait_steps)):
        if value is not None:
            request[key] = value
    for key, flag in (
        ("record_shape", record_shape), ("profile_memory", profile_memory),
        ("with_stack", with_stack), ("with_modules", with_modules),
    ):
        if flag:
            request[key] = True
    # The ranks parse with the same code: a request they would refuse is a usage error here.
    try:
        request_from_dict(request, defaults_from_config(SubProfilerConfig()), request_id)
    except RequestError as exc:
        raise BadOption("request", str(exc)) from None
    path = registry.write_request(root, name, request)
    return SetResult(
        replica=name,
        request_id=request_id,
        request=request,
        control_path=str(path),
        ranks=[r.rank for r in targets],
        skipped=skipped,
        start_step=start_step,
        current_step=current,
        lead_steps=lead,
        warnings=warnings,
        message=SET_MESSAGE.format(name=name),
    )


def wait_for_capture(
    root: Path,
    name: str,
    request_id: str,
    ranks: Sequence[int],
    timeout: float = DEFAULT_WAIT_TIMEOUT_S,
    on_progress: Callable[[RankCapture], None] | None = None,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
) -> list[RankCapture]:
    """Follow `request_id` on `ranks` until each has saved, failed, been refused or died.

    Args:
        on_progress: called with a rank's capture each time its phase changes.
        timeout: seconds; ranks still going at the deadline end as "timeout".

    Returns:
        One capture per rank, ordered by rank; `is_finished` tells which saved.
    """
    deadline = time.monotonic() + timeout
    this_host = host_name()
    results: dict[int, RankCapture] = {}
    last_phase = {rank: PENDING for rank in ranks}
    last_records: dict[int, RankRecord] = {}
    while True:
        records = {r.rank: r for r in registry.read_records(root, name)}
        now = time.time()
        for rank in ranks:
            if rank in results and results[rank].is_terminal:
                continue
            record = records.get(rank) or last_records.get(rank)
            if record is None:
                capture = RankCapture(rank=rank, phase="missing", request_id=request_id, error="its rank record disappeared")
            else:
                last_records[rank] = record
                alive, why = liveness(record, this_host, now)
                capture = capture_of(record, request_id, alive, why)
                if capture.phase == "not selected":
                    capture.error = "the rank did not select itself (does its world size differ?)"
            results[rank] = capture
            if capture.phase != last_phase[rank]:
                last_phase[rank] = capture.phase
                if on_progress is not None:
                    on_progress(capture)
        if all(results[k].is_terminal for k in ranks) or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    for rank in ranks:
        capture = results[rank]
        if not capture.is_terminal:
            record = last_records.get(rank)
            detail = f"still {capture.phase}" + (f" at step {record.step}" if record else "")
            if capture.phase == PENDING and record is not None and record.refused:
                detail += f"; its last refusal: {record.refused}"
            capture.phase, capture.error = "timeout", f"timed out after {timeout:g}s, {detail}"
            if on_progress is not None:
                on_progress(capture)
    return [results[k] for k in sorted(ranks)]


# --- profile cancel -----------------------------------------------------------


@dataclass
class CancelResult:
    """What `cancel_profile` wrote and whom it is for."""

    replica: str
    request_id: str
    request: dict[str, Any]
    control_path: str
    ranks: list[int]  # the live selected ranks that will answer
    busy: dict[int, str] = field(default_factory=dict)  # rank -> the request it was busy with
    skipped: dict[int, str] = field(default_factory=dict)  # selected, but not alive: why


@dataclass
class RankCancel:
    """Where one rank stands with one cancel (`profile cancel --wait`)."""

    rank: int
    phase: str  # pending | done | error | dead | missing | timeout
    outcome: str | None = None  # disarmed | stopping | stopped | saving | finished | nothing to cancel
    cancelled_request: str | None = None  # the request it ended
    state: str | None = None  # the rank's state now
    step: int | None = None  # the step at which the rank handled the cancel
    trace_path: str | None = None  # what a stopped capture saved
    text: str = ""  # the rank's answer in words
    error: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.phase != PENDING


def cancel_profile(
    root: Path,
    name: str,
    *,
    rank_filter: RankFilter | str | None = None,
    controller: list[ControllerReplica] | None = None,
    now: float | None = None,
) -> CancelResult:
    """Write a cancel for the selected ranks of `name` (default: all).

    An armed rank disarms; a tracing rank stops at its next step boundary and
    saves what it recorded; a rank that is saving finishes its save; an idle
    rank answers that there was nothing to cancel. The cancel replaces the
    control file's request, so a request no rank has read yet is gone too.

    Raises:
        ReplicaNotFound, BadOption: as `set_profile`.
        RequestError: no selected rank is alive.
        RegistryError: the control file cannot be written.
    """
    check_replica(name, controller)
    now = time.time() if now is None else now
    records, filter_, selected, problems = select_ranks(root, name, rank_filter, RankFilter.ALL_TEXT, controller)
    this_host = host_name()
    ranks: list[int] = []
    busy: dict[int, str] = {}
    skipped: dict[int, str] = {}
    for rank in selected:
        record = records.get(rank)
        if record is None:
            skipped[rank] = problems.get(rank, "no rank record")
            continue
        alive, why = liveness(record, this_host, now)
        if not alive:
            skipped[rank] = why
            continue
        ranks.append(rank)
        if record.state in BUSY_STATES:
            busy[rank] = record.request_id or "?"
    if not ranks:
        reasons = "; ".join(f"rank {k}: {why}" for k, why in skipped.items())
        raise RequestError(f"no live rank of replica {name} matches rank filter {filter_} ({reasons})")
    request_id = new_request_id(now)
    request = {"id": request_id, "kind": "cancel", "rank_filter": str(filter_)}
    path = registry.write_request(root, name, request)
    return CancelResult(replica=name, request_id=request_id, request=request, control_path=str(path), ranks=ranks,
                        busy=busy, skipped=skipped)


def cancel_of(record: RankRecord | None, cancel_id: str, alive: bool, why: str = "") -> RankCancel:
    """Where `record`'s rank stands with the cancel `cancel_id` (pure)."""
    if record is None:
        return RankCancel(rank=-1, phase="missing", error="no rank record")
    result = RankCancel(rank=record.rank, phase=PENDING, state=record.state)
    cancel = record.cancel if isinstance(record.cancel, dict) else None
    if cancel is not None and cancel.get("id") == cancel_id:
        result.outcome = cancel.get("outcome")
        result.cancelled_request = cancel.get("request_id")
        result.step = cancel.get("step")
        result.trace_path = cancel.get("trace_path")
        result.text = _cancel_text(cancel)
        if record.state == "error":
            result.phase, result.error = "error", record.error or "failed (no error text recorded)"
        elif record.state not in BUSY_STATES:
            result.phase = "done"
    elif record.refused and f"request {cancel_id} " in record.refused:
        result.phase, result.error = "error", record.refused
    if not alive and not result.is_terminal:
        result.phase, result.error = "dead", f"{why or 'not alive'} before it answered (last {record.state})"
    return result


def wait_for_cancel(
    root: Path,
    name: str,
    cancel_id: str,
    ranks: Sequence[int],
    timeout: float = DEFAULT_CANCEL_TIMEOUT_S,
    on_progress: Callable[[RankCancel], None] | None = None,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
) -> list[RankCancel]:
    """Follow `cancel_id` on `ranks` until each has answered and is idle again (or
    failed, or died); ranks still going at the deadline end as "timeout"."""
    deadline = time.monotonic() + timeout
    this_host = host_name()
    results: dict[int, RankCancel] = {}
    last_seen: dict[int, tuple[str, str | None]] = {rank: (PENDING, None) for rank in ranks}
    while True:
        records = {r.rank: r for r in registry.read_records(root, name)}
        now = time.time()
        for rank in ranks:
            if rank in results and results[rank].is_terminal:
                continue
            record = records.get(rank)
            if record is None:
                result = RankCancel(rank=rank, phase="missing", error="its rank record disappeared")
            else:
                result = cancel_of(record, cancel_id, *liveness(record, this_host, now))
            results[rank] = result
            seen = (result.phase, result.outcome)
            if seen != last_seen.get(rank):
                last_seen[rank] = seen
                if on_progress is not None:
                    on_progress(result)
        if all(results[k].is_terminal for k in ranks) or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    for rank in ranks:
        result = results[rank]
        if not result.is_terminal:
            detail = f"still {result.state}" + (f", {result.outcome}" if result.outcome else ", has not seen the cancel")
            result.phase, result.error = "timeout", f"timed out after {timeout:g}s, {detail}"
            if on_progress is not None:
                on_progress(result)
    return [results[k] for k in sorted(ranks)]


def _cancel_text(cancel: dict[str, Any]) -> str:
    """One rank's answer to a cancel, from the record's `cancel`."""
    outcome = cancel.get("outcome")
    request, step = cancel.get("request_id"), cancel.get("step")
    if outcome == "disarmed":
        return f"disarmed request {request} at step {step}"
    if outcome == "stopped":
        saved = cancel.get("trace_path")
        detail = f"saved the steps recorded so far to {saved}" if saved else cancel.get("detail") or "nothing saved"
        return f"stopped request {request} after step {step}; {detail}"
    if outcome == "stopping":
        return f"stopping request {request} at the next step boundary"
    if outcome == "saving":
        return f"request {request} had finished its steps; saving its trace"
    if outcome == "finished":
        return f"request {request} had finished its steps; its trace was saved to {cancel.get('trace_path')}"
    return f"nothing to cancel ({cancel.get('state') or 'idle'})"


def describe_cancel(result: RankCancel) -> str:
    """One line for a rank's answer to a cancel."""
    if result.phase in (PENDING, "done") and result.text:
        text = result.text
    elif result.phase == PENDING:
        text = "waiting for the rank to see the cancel"
    else:
        text = f"{result.phase}: {result.error}"
    return f"rank {result.rank}: {text}"


# --- profile status -----------------------------------------------------------


@dataclass
class ProfileStatus:
    """The current or last request of a replica, rank by rank."""

    replica: str
    request_id: str | None  # the id in the control file, when it has one
    request: dict[str, Any] | None
    control_path: str
    ranks: list[RankCapture]


def read_control_request(root: Path, name: str) -> tuple[dict[str, Any] | None, float | None, str | None]:
    """The JSON request in `name`'s control file (None when absent, empty or unreadable), its mtime,
    and the id a rank gives this version when it names none or is re-issued (`file_request_id`)."""
    path = registry.control_path(root, name)
    try:
        control = registry.read_control(path, DEFAULT_MAX_CONTROL_BYTES)
    except (OSError, RequestError):
        return None, None, None
    try:
        obj = json.loads(control.data) if control.data.strip() else None
    except (ValueError, RecursionError):
        obj = None
    return (obj if isinstance(obj, dict) else None), control.mtime_ns / 1e9, file_request_id(control.mtime_ns, control.data)


def profile_status(
    root: Path, name: str, controller: list[ControllerReplica] | None = None, now: float | None = None
) -> ProfileStatus:
    """Per-rank phase of the control file's request; a rank that never saw it
    (not selected while busy, or started after it) shows its own last request.

    Raises:
        ReplicaNotFound: as `fleet.replica_ranks`.
    """
    now = time.time() if now is None else now
    statuses = replica_ranks(root, name, controller, now=now)
    request, mtime, file_id = read_control_request(root, name)
    if request and request.get("kind") in ("stacks", "cancel"):
        # Stacks and cancel requests are answered at once and never become a
        # rank's current request: show each rank's own last capture instead.
        request, mtime, file_id = None, None, None
    control_id = request.get("id") if request and isinstance(request.get("id"), str) else None
    try:
        control_filter = parse_rank_filter(request.get("rank_filter", DEFAULT_RANK_FILTER)) if request else None
    except RequestError:
        control_filter = None
    records = {r.rank: r for r in registry.read_records(root, name)}
    if request and file_id and any(
        r.request_id == file_id or f"request {file_id} " in (r.refused or "") for r in records.values()
    ):
        control_id = file_id  # a touched file: the ranks took this version as a new request under its own id
    this_host = host_name()
    captures = []
    for status in statuses:
        record = records.get(status.rank)
        if record is None:
            why = status.error if status.liveness == BAD_RECORD else status.liveness
            captures.append(RankCapture(rank=status.rank, phase="missing", host=status.host, error=why,
                                        trace_path=status.trace_path))
            continue
        target = record.request_id
        if control_id is not None:
            seen = record.request_id == control_id or f"request {control_id} " in (record.refused or "")
            waiting = (
                control_filter is not None and status.rank in control_filter and status.alive
                and (mtime is None or record.started_at <= mtime)
            )
            if seen or waiting:
                target = control_id
        alive, why = liveness(record, this_host, now)
        if target is None:
            captures.append(RankCapture(rank=record.rank, phase="no request", host=record.host, alive=alive,
                                        step=record.step, error=record.error))
            continue
        captures.append(capture_of(record, target, alive, why))
    return ProfileStatus(
        replica=name, request_id=control_id, request=request,
        control_path=str(registry.control_path(root, name)), ranks=captures,
    )
