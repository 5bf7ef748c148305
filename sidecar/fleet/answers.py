"""How one rank answered one request, read off its rank record: pure functions, no I/O.

    capture_of      a trace request: pending, armed, tracing, saving, saved, cancelled, refused, error, dead
    cancel_of       a cancel: pending, done (with what it ended), error, dead
    stacks_answer   a stacks request: pending, saved (the dump's path), refused, error, dead

How a rank answers: a rank that sees a trace request records its id in
`request_id`; it then goes armed -> tracing -> saving -> idle, and the history
entry of the save carries `saved: <path>`. A refusal names the request id in
`refused`; a failure puts the rank in `error`. A cancel is answered in the
record's `cancel` (the last cancel the rank handled, with its outcome), and is
done once the rank is out of the busy states; the request it ended gets
`cancelled: true`. A stacks request is answered at once from the rank's
watcher thread: a history entry `{"stacks": path, "request_id": id}`.
A hang request is answered the same way; its entry also names the flight recorder
dump (`flight_recorder`) or why there is none (`flight_recorder_error`).
`sidecar.fleet.follow` polls the records and applies these until every rank has answered.
What a rank did with a cancel is a `CancelAnswer`; its words, like every line the CLI
prints, are `sidecar.cli.render`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sidecar.common.records import BUSY_STATES, RankRecord
from sidecar.common.stackdump import ThreadStack

# The phase of a rank that has not answered yet, for every kind of request.
PENDING = "pending"
# The phases a rank's answer ends in (a cancel ends in any phase but PENDING).
CAPTURE_TERMINAL = ("saved", "cancelled", "error", "refused", "dead", "not selected", "missing", "timeout")
STACKS_TERMINAL = ("saved", "refused", "error", "dead", "missing", "not selected", "unreadable", "timeout")
NOT_SELECTED = "the rank did not select itself (does its world size differ?)"


# --- what a rank did with a cancel ------------------------------------------------------


@dataclass
class CancelAnswer:
    """What a rank did with a cancel, from its record's `cancel` (values as the record holds them)."""

    id: Any = "?"  # the cancel's id
    outcome: Any = None  # disarmed | stopping | stopped | saving | finished | nothing to cancel
    request_id: Any = None  # the request it ended
    step: Any = None  # the step at which the rank handled the cancel
    trace_path: Any = None  # what a stopped or finished capture saved
    detail: Any = None  # why a stopped capture saved nothing
    state: Any = None  # the rank's state when it took a cancel with nothing to end

    @classmethod
    def of(cls, cancel: dict[str, Any]) -> CancelAnswer:
        return cls(id=cancel.get("id", "?"), outcome=cancel.get("outcome"), request_id=cancel.get("request_id"),
                   step=cancel.get("step"), trace_path=cancel.get("trace_path"), detail=cancel.get("detail"),
                   state=cancel.get("state"))


# --- one rank's answer to a trace request -------------------------------------------


@dataclass
class RankCapture:
    """Where one rank stands with one trace request (`profile status`, `profile set --wait`)."""

    rank: int
    phase: str  # pending | armed | tracing | saving | saved | error | refused | dead | not selected | missing | timeout
    host: str = ""
    alive: bool = False
    request_id: str | None = None
    step: int | None = None
    capture_start_step: int | None = None
    misaligned: bool = False
    trace_path: str | None = None  # the trace this request saved
    error: str | None = None  # why it did not finish (for a cancelled capture: see `cancelled_by`)
    # [train.ckpt] upload_s3: where the trace was uploaded, or why not (`upload_of`); both None
    # while it uploads, and on ranks that upload nothing (then absent from --json).
    trace_url: str | None = None
    upload_error: str | None = None
    # Phase "cancelled": the cancel that ended it, and what the rank did (its words: `sidecar.cli.render`).
    cancelled_by: CancelAnswer | None = None

    @property
    def is_finished(self) -> bool:
        return self.phase == "saved"

    @property
    def is_terminal(self) -> bool:
        return self.phase in CAPTURE_TERMINAL


def capture_of(record: RankRecord | None, request_id: str | None, alive: bool, why: str = "") -> RankCapture:
    """The phase of `record`'s rank for `request_id` (pure; see the module docstring)."""
    if record is None:
        return RankCapture(rank=-1, phase="missing", request_id=request_id, error="no rank record")
    capture = RankCapture(
        rank=record.rank, phase=PENDING, host=record.host, alive=alive, request_id=request_id, step=record.step,
    )
    if request_id is not None and record.request_id == request_id:
        saved = saved_for(record, request_id)
        if record.selected is False:
            capture.phase = "not selected"
            return capture
        capture.capture_start_step = record.capture_start_step
        capture.misaligned = record.misaligned
        if record.cancelled and record.state not in BUSY_STATES and record.state != "error":
            capture.phase, capture.trace_path = "cancelled", saved
            capture.cancelled_by = CancelAnswer.of(record.cancel or {})
        elif saved is not None:
            capture.phase, capture.trace_path = "saved", saved
        elif record.state == "error":
            capture.phase, capture.error = "error", record.error or "failed (no error text recorded)"
        elif record.state in BUSY_STATES:
            capture.phase = record.state
    elif request_id is not None and (earlier := saved_for(record, request_id)) is not None:
        # The rank has moved on to a newer request (a slowdown watch's capture right after its
        # baseline): what it saved for this one is in its history.
        capture.phase, capture.trace_path = "saved", earlier
    elif request_id is not None and record.refused and f"request {request_id} " in record.refused:
        capture.phase, capture.error = "refused", record.refused
    if capture.trace_path is not None and record.upload_to is not None:
        capture.trace_url, capture.upload_error = upload_of(record, capture.trace_path)
    if not alive and not capture.is_terminal:
        last = f"last {record.state} at step {record.step}"
        capture.phase, capture.error = "dead", f"{why or 'not alive'} before saving ({last})"
    return capture


def saved_for(record: RankRecord, request_id: str) -> str | None:
    """The last trace `record`'s rank saved for `request_id`, from its history: the current
    request's, or the one before it (a rank keeps the entry of its last saved trace when it arms
    the next request); None when there is none. An entry that names no request is the current one's."""
    for entry in reversed(record.history):
        saved = entry.get("saved")
        if isinstance(saved, str) and saved and entry.get("request_id", record.request_id) == request_id:
            return saved
    return None


def upload_of(record: RankRecord, trace_path: str) -> tuple[str | None, str | None]:
    """(url, error) of the upload of `trace_path`, from the record's history; (None, None)
    while it uploads, or once the entry has left the history."""
    for entry in reversed(record.history):
        if entry.get("upload") == trace_path:
            url, error = entry.get("url"), entry.get("upload_error")
            return (url if isinstance(url, str) else None), (error if isinstance(error, str) else None)
    return None, None


# --- one rank's answer to a cancel ---------------------------------------------------


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
    answer: CancelAnswer | None = None  # what the rank did, once it has seen the cancel
    error: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.phase != PENDING


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
        result.answer = CancelAnswer.of(cancel)
        if record.state == "error":
            result.phase, result.error = "error", record.error or "failed (no error text recorded)"
        elif record.state not in BUSY_STATES:
            result.phase = "done"
    elif record.refused and f"request {cancel_id} " in record.refused:
        result.phase, result.error = "error", record.refused
    if not alive and not result.is_terminal:
        result.phase, result.error = "dead", f"{why or 'not alive'} before it answered (last {record.state})"
    return result


# --- one rank's answer to a stacks request ---------------------------------------------


@dataclass
class RankStacks:
    """One rank's answer to one stacks request."""

    rank: int
    phase: str  # pending | saved | refused | error | dead | missing | not selected | unreadable | timeout
    host: str = ""
    path: str | None = None  # the dump this request wrote
    error: str | None = None  # why there are no stacks
    step: int | None = None  # the rank's step when it dumped (else its last known step)
    state: str | None = None  # the rank's state when it dumped
    threads: list[ThreadStack] = field(default_factory=list)  # main thread first
    main_thread: int | None = None  # index in `threads` of the main thread, if the dump has one
    dumped_at: float | None = None  # when the rank wrote its dump (epoch seconds)
    last_step_at: float | None = None  # when the rank last stepped, as its dump says
    # kind "hang" only: the rank's flight recorder dump, or why it has none
    flight_recorder: str | None = None
    flight_recorder_error: str | None = None
    # "watcher": the rank's watcher thread wrote `path`; "faulthandler": its watcher did not answer
    # in time and the CLI signalled it (sidecar.fleet.signal_stacks): `path` is its faulthandler file.
    source: str = "watcher"
    fallback: str | None = None  # why the fallback was used, or why it could not be

    @property
    def is_finished(self) -> bool:
        return self.phase == "saved"

    @property
    def is_terminal(self) -> bool:
        return self.phase in STACKS_TERMINAL

    @property
    def main(self) -> ThreadStack | None:
        return self.threads[self.main_thread] if self.main_thread is not None else None


def stacks_answer(record: RankRecord, request_id: str, alive: bool, why: str = "") -> RankStacks:
    """Where `record`'s rank stands with stacks request `request_id` (reads no dump)."""
    answer = RankStacks(record.rank, PENDING, host=record.host, step=record.step, state=record.state)
    entry = _stacks_entry_for(record, request_id)
    if entry is not None:
        answer.phase, answer.path = "saved", entry["stacks"]
        if isinstance(entry.get("flight_recorder"), str):
            answer.flight_recorder = entry["flight_recorder"]
        if isinstance(entry.get("flight_recorder_error"), str):
            answer.flight_recorder_error = entry["flight_recorder_error"]
    elif record.refused and f"request {request_id} " in record.refused:
        answer.phase, answer.error = "refused", record.refused
    elif record.error and record.error.startswith(f"request {request_id}:"):
        answer.phase, answer.error = "error", record.error
    elif record.request_id == request_id and record.selected is False:
        answer.phase, answer.error = "not selected", NOT_SELECTED
    elif not alive:
        answer.phase, answer.error = "dead", f"{why or 'not alive'} before answering"
    return answer


def _stacks_entry_for(record: RankRecord, request_id: str) -> dict[str, Any] | None:
    """The history entry of the stacks (or hang) dump for `request_id`."""
    for entry in reversed(record.history):
        if isinstance(entry, dict) and entry.get("request_id") == request_id and isinstance(entry.get("stacks"), str):
            return entry
    return None

