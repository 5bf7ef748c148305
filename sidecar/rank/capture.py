"""The capture state of one rank: its state machine, and the one object that owns it.

    idle ──admit──> armed ──start step──> tracing ──schedule ends──> saving ──saved──> idle
      ^               │ cancel: disarm      │ cancel: stop at the next step,  │
      └───────────────┘                     │ save what was recorded ─────────┘
    a failure anywhere ──> error (the next admitted request leaves it)

`CaptureState` is plain data; the functions here read and change it and return what happened,
with no I/O, no threads and no torch. `CaptureOwner` holds the one `CaptureState` of a rank and
the lock that guards it: every change goes through one of its methods, which locks inside
itself, applies a function below and returns the outcome. The rooms that call it (`rank.intake`,
`rank.runner`, `rank.saver`, `rank.signalowner`, `rank.publisher`) do the rest: the profiler,
files, logs and records. No other module touches the lock. The owner also keeps the hot-path
flag `HotPath._boundary_work` in step with the state, under the same lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sidecar.common.records import BUSY_STATES, State
from sidecar.common.request import ProfileRequest, check_start_ahead
from sidecar.rank.hotpath import HotPath

MAX_HISTORY = 16
CANCEL_HINT = "`cosmos-profiler profile cancel {replica}` ends it."


@dataclass
class CaptureState:
    """Where one rank stands with its requests; the rank record shows all of it."""

    state: State = State.IDLE
    request: ProfileRequest | None = None  # the current (or last) request, as the record shows it
    selected: bool | None = None  # whether `request` selected this rank
    pending: ProfileRequest | None = None  # armed, waiting for its start step
    active: ProfileRequest | None = None  # being traced
    capture_start: int | None = None
    misaligned: bool = False  # the rank saw the request after its start step
    cancelled: bool = False  # the current request was cancelled
    cancel: dict[str, Any] | None = None  # the last cancel handled and its outcome
    stop_requested: ProfileRequest | None = None  # a cancel waiting for the next step boundary
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    refused: str | None = None
    num_requests: int = 0  # requests that reached this rank, admitted or not
    num_refused: int = 0
    num_finished: int = 0  # schedules ended (handed to a saver)
    num_captures: int = 0  # files saved
    finished_id: str | None = None  # the request whose schedule ended last
    trace_path: str | None = None
    stacks_path: str | None = None
    memory_path: str | None = None


@dataclass(frozen=True)
class Admission:
    """What `admit` decided. `action` is one of:

    - "invalid": the request cannot apply to this job (`reason`); refuse it as a bad request
    - "not selected": the rank filter leaves this rank out
    - "cancel": a cancel, for `cancel_request`
    - "stacks": dump the stacks now (nothing else changes)
    - "hang": dump the stacks and the flight recorder now (nothing else changes)
    - "refused": refused, counted and recorded (`reason`)
    - "armed": armed
    """

    action: str
    reason: str = ""


def transition(cs: CaptureState, state: State, step: int, **extra: Any) -> None:
    """Enter `state`, with a history entry for the current request."""
    cs.state = state
    note(cs, step, **extra)


def note(cs: CaptureState, step: int, **extra: Any) -> None:
    """Append a history entry (the newest MAX_HISTORY are kept)."""
    entry = {"state": cs.state.value, "step": step, "at": round(time.time(), 6),
             "request_id": cs.request.id if cs.request else None}
    entry.update(extra)
    cs.history.append(entry)
    del cs.history[:-MAX_HISTORY]


def refuse_invalid(cs: CaptureState, message: str) -> None:
    """A request that could not be read or cannot apply: counted as refused, shown as the error."""
    cs.num_requests += 1
    cs.num_refused += 1
    cs.refused = cs.error = message


def admit(
    cs: CaptureState,
    request: ProfileRequest,
    *,
    rank: int,
    world_size: int,
    replica: str,
    step: int,
    enabled: bool,
    recent_rate: float | None = None,
    cuda_available: bool = False,
    cannot_trace: str | None = None,
) -> Admission:
    """Decide on `request` at `step`, and arm it when this rank takes it.

    One capture at a time: a busy rank refuses, naming the request that keeps it
    busy and how to cancel it. A signal's request is this rank's own. A rank
    that cannot count steps (`cannot_trace`, why) refuses what needs steps
    (traces, memory) instead of staying armed forever.
    """
    if request.source != "signal":
        top = request.rank_filter.highest()
        if top is not None and top >= world_size:
            return Admission("invalid", f"rank_filter {request.rank_filter} names rank {top}, but world size is {world_size}")
        if rank not in request.rank_filter:
            if cs.state in (State.IDLE, State.ERROR) and request.kind != "cancel":
                cs.request, cs.selected = request, False
            return Admission("not selected")
    if request.kind == "cancel":
        return Admission("cancel")
    refusal = None
    ahead = None
    if request.start_step is not None and request.source != "signal":
        ahead = check_start_ahead(request.start_step, step, recent_rate)
    if not enabled:
        refusal = (f"request {request.id} refused: profiler is disabled for this job "
                   "([profiler] enable_profiler = false); the profile request takes no effect; "
                   "set [profiler] enable_profiler = true in the job's config and restart it")
    elif cannot_trace and request.kind in ("trace", "memory"):
        refusal = f"request {request.id} refused: {cannot_trace}"
    elif ahead is not None:
        refusal = f"request {request.id} refused: {ahead}; nothing was armed"
    elif request.kind in ("stacks", "hang"):
        return Admission(request.kind)  # taken at once: the training thread may be the one stuck
    elif request.kind == "memory" and not cuda_available:
        refusal = (f"request {request.id} refused: kind 'memory' needs CUDA, "
                   "and torch.cuda.is_available() is False on this rank")
    if refusal is None and cs.state in BUSY_STATES:
        refusal = f"request {request.id} refused: {busy_text(cs, rank, replica)}"
    cs.num_requests += 1
    if refusal is not None:
        cs.num_refused += 1
        cs.refused = refusal
        if cs.state not in BUSY_STATES:
            cs.error = refusal
        return Admission("refused", refusal)
    cs.pending, cs.request, cs.selected = request, request, True
    cs.error = cs.refused = None
    cs.misaligned = cs.cancelled = False
    cs.stop_requested = None
    cs.capture_start = None
    # The history is the new request's, but for the entry of the last trace saved: a `--wait` that
    # follows the last request still finds what this rank saved for it after the rank moved on (a
    # slowdown watch's capture right after its baseline).
    cs.history = [entry for entry in cs.history if entry.get("saved")][-1:]
    transition(cs, State.ARMED, step)
    return Admission("armed")


def busy_text(cs: CaptureState, rank: int, replica: str) -> str:
    """Which request keeps this rank busy, and how to end it."""
    current = cs.pending or cs.active or cs.request
    start = current.start_step if current is not None else None
    if start is None:
        start = cs.capture_start
    return (f"rank {rank} is busy with request {current.id if current else '?'} "
            f"(start step {'next' if start is None else start}, phase {cs.state.value}). "
            + CANCEL_HINT.format(replica=replica))


def cancel(cs: CaptureState, cancel_request: ProfileRequest, step: int) -> tuple[str, ProfileRequest | None]:
    """Apply a cancel: an armed rank disarms at once; a tracing one is asked to stop
    at its next step boundary (`stop_requested`); a save is never cut short.

    Returns:
        (outcome, the request it cancels): outcome is "disarmed", "stopping",
        "saving" or "nothing to cancel".
    """
    cs.num_requests += 1
    state, current = cs.state, cs.request
    outcome = "nothing to cancel"
    if state == State.ARMED and cs.pending is not None:
        cs.pending = None
        cs.cancelled = True
        outcome = "disarmed"
    elif state in (State.ARMED, State.TRACING) and cs.active is not None:
        cs.stop_requested = cancel_request
        outcome = "stopping"
    elif state == State.SAVING:
        outcome = "saving"
    busy = outcome != "nothing to cancel"
    cs.cancel = {
        "id": cancel_request.id, "request_id": current.id if busy and current else None, "outcome": outcome,
        "state": state.value, "step": step, "at": round(time.time(), 6), "trace_path": None,
    }
    if outcome == "disarmed":
        transition(cs, State.IDLE, step, cancelled=cancel_request.id)
    return outcome, current if busy else None


def claim(cs: CaptureState, request: ProfileRequest) -> bool:
    """The training thread takes the armed `request` to start it; False when a cancel came first.
    From here on, a cancel stops the capture instead of disarming it."""
    if cs.pending is not request:
        return False
    cs.pending, cs.active = None, request
    return True


def begin(cs: CaptureState, step: int, misaligned: bool, **extra: Any) -> None:
    """The claimed request's schedule began at `step` (`extra`: the history entry's, the path that captures)."""
    cs.misaligned = misaligned
    cs.capture_start = step
    transition(cs, State.TRACING, step, **extra)


def stopped_empty(cs: CaptureState, step: int) -> None:
    """A cancel stopped the capture before any step was recorded: nothing to save."""
    cancel_request = cs.stop_requested
    cs.active = cs.stop_requested = None
    cs.cancelled = True
    if cs.cancel is not None:
        cs.cancel.update(outcome="stopped", detail="no step had been recorded yet; nothing saved")
    transition(cs, State.IDLE, step, cancelled=cancel_request.id if cancel_request else None)


def finish(cs: CaptureState, step: int, cancelled_by: ProfileRequest | None = None) -> ProfileRequest | None:
    """The schedule ended, or a cancel stopped it: saving. Returns the request that was traced."""
    request = cs.active
    cs.active = None
    cs.num_finished += 1
    cs.finished_id = request.id if request is not None else None
    if cancelled_by is not None:
        cs.cancelled = True
        if cs.cancel is not None:
            cs.cancel["outcome"] = "stopped"
    elif cs.cancel is not None and cs.stop_requested is not None:
        cs.cancel["outcome"] = "saving"  # the schedule finished before the cancel could stop it
    cs.stop_requested = None
    if cancelled_by is not None:
        transition(cs, State.SAVING, step, cancelled=cancelled_by.id)
    else:
        transition(cs, State.SAVING, step)
    return request


def saved(cs: CaptureState, kind: str, path: str, request: ProfileRequest, step: int) -> None:
    """A saver put the capture of `request` at `path`: idle again."""
    if kind == "memory":
        cs.memory_path = path
    else:
        cs.trace_path = path
    cs.num_captures += 1
    last = cs.cancel
    if last is not None and last["request_id"] == request.id and last["outcome"] in ("stopped", "saving"):
        last["trace_path"] = path
        if last["outcome"] == "saving":
            last["outcome"] = "finished"
    if cs.cancelled:
        transition(cs, State.IDLE, step, saved=path, cancelled=last["id"] if last else True)
    else:
        transition(cs, State.IDLE, step, saved=path)


def fail(cs: CaptureState, message: str, step: int) -> None:
    """Anything went wrong: error, with the message in the record."""
    cs.active = cs.stop_requested = None
    cs.error = message
    transition(cs, State.ERROR, step, error=message)


def reissue(request: ProfileRequest, fresh_id: str, step: int) -> ProfileRequest:
    """A touched control file, or one naming an id already handled, is a new request:
    the fresh id of that file version, and a start_step that has passed becomes
    "the next step" (never a replay of the old request)."""
    changes: dict[str, Any] = {"id": fresh_id}
    if request.start_step is not None and request.start_step <= step:
        changes["start_step"] = None
    return dataclasses.replace(request, **changes)


def record_fields(cs: CaptureState) -> dict[str, Any]:
    """The rank record's part that `cs` holds: the current (or last) request, its capture, the
    history, the counts and the last error (the record's `state` is the publisher's, which may
    say `stalled`)."""
    request = cs.request
    return {
        "request_id": request.id if request else None,
        "request": request.to_json() if request else None,
        "selected": cs.selected,
        "misaligned": cs.misaligned,
        "capture_start_step": cs.capture_start,
        "history": list(cs.history),
        "cancelled": cs.cancelled,
        "cancel": dict(cs.cancel) if cs.cancel is not None else None,
        "trace_path": cs.trace_path,
        "stacks_path": cs.stacks_path,
        "memory_path": cs.memory_path,
        "num_captures": cs.num_captures,
        "num_requests": cs.num_requests,
        "num_refused": cs.num_refused,
        "error": cs.error,
        "refused": cs.refused,
    }


class CancelOutcome(NamedTuple):
    """What `CaptureOwner.cancel` did: `outcome` as `cancel` returns it, the request it cancels
    (None: nothing to cancel), and the state the rank was in."""

    outcome: str
    cancelled: ProfileRequest | None
    state: State


class Finished(NamedTuple):
    """A schedule that ended (`CaptureOwner.finish`): the request traced and the steps it ran."""

    request: ProfileRequest
    num_steps: int


class CaptureOwner:
    """The one owner of a rank's `CaptureState` and of the lock that guards it.

    Every method that changes the state takes the lock (re-entrant: a caller's outcome may lead
    it to call again), applies one transition of this module and returns what happened; the
    properties read one attribute each, without the lock, for the training thread's hot reads.
    The hot-path flag `hot._boundary_work` is set and settled here under the same lock, so a
    request armed on the watcher thread is never lost to a step boundary settling at once.
    """

    def __init__(self, hot: HotPath) -> None:
        self._lock = threading.RLock()
        self._cs = CaptureState()
        self._hot = hot

    # -- reads (no lock: one attribute each) ---------------------------------------

    @property
    def state(self) -> State:
        return self._cs.state

    @property
    def pending(self) -> ProfileRequest | None:
        """The request armed, waiting for its start step."""
        return self._cs.pending

    @property
    def active(self) -> ProfileRequest | None:
        """The request being traced."""
        return self._cs.active

    @property
    def stop_requested(self) -> ProfileRequest | None:
        """A cancel waiting for the next step boundary to stop the capture."""
        return self._cs.stop_requested

    @property
    def num_captures(self) -> int:
        return self._cs.num_captures

    @property
    def num_finished(self) -> int:
        return self._cs.num_finished

    @property
    def finished_id(self) -> str | None:
        return self._cs.finished_id

    def is_capturing(self) -> bool:
        """A capture runs or saves now (its steps are not the pace a slowdown watch learns)."""
        cs = self._cs
        return cs.active is not None or cs.state is State.SAVING

    def record_fields(self) -> dict[str, Any]:
        """The record's part held here (`record_fields`), and `state`, read together."""
        with self._lock:
            return dict(record_fields(self._cs), state=self._cs.state.value)

    # -- requests (the watcher thread, or the training thread's own) ------------------

    def admit(self, request: ProfileRequest, **context: Any) -> Admission:
        """`admit` (its keyword arguments as there); an armed request gives the next step boundary work."""
        with self._lock:
            decision = admit(self._cs, request, **context)
            if decision.action == "armed":
                self._hot.set_boundary_work(True)
            return decision

    def refuse_invalid(self, message: str) -> None:
        """A request that could not be read or cannot apply (`refuse_invalid`)."""
        with self._lock:
            refuse_invalid(self._cs, message)

    def cancel(self, cancel_request: ProfileRequest, step: int) -> CancelOutcome:
        """Apply a cancel (`cancel`); a capture asked to stop gives the next step boundary work."""
        with self._lock:
            state = self._cs.state
            outcome, current = cancel(self._cs, cancel_request, step)
            if outcome == "stopping":
                self._hot.set_boundary_work(True)
            return CancelOutcome(outcome, current, state)

    def warn(self, message: str, step: int) -> None:
        """Something the record must show while the capture goes on (an on-demand window waiting for
        its steps, steps other than the ones asked for): the error, and a history entry."""
        with self._lock:
            self._cs.error = message
            note(self._cs, step, warning=message)

    def clear_error(self, message: str) -> None:
        """The condition `warn` showed is over: the error goes, unless another replaced it."""
        with self._lock:
            if self._cs.error == message:
                self._cs.error = None

    def stacks_failed(self, message: str) -> None:
        """A dump's stacks could not be written: the record's error says why."""
        with self._lock:
            self._cs.error = message

    def stacks_saved(self, path: str, step: int, request_id: str, **extra: Any) -> None:
        """A dump's stacks are at `path` (`extra`: what the history adds, the flight recorder's file)."""
        with self._lock:
            self._cs.stacks_path = path
            note(self._cs, step, request_id=request_id, stacks=path, **extra)

    # -- a capture's run (the training thread) ---------------------------------------

    def claim(self, request: ProfileRequest) -> bool:
        """`claim`: False when a cancel took the armed `request` first."""
        with self._lock:
            return claim(self._cs, request)

    def refuse_claimed(self, message: str, step: int) -> None:
        """A claimed request that cannot start: failed, and counted as refused like any other
        refusal, so that num_requests = captures + refused holds."""
        with self._lock:
            fail(self._cs, message, step)
            self._cs.num_refused += 1
            self._cs.refused = self._cs.error

    def begin(self, step: int, misaligned: bool, **extra: Any) -> None:
        with self._lock:
            begin(self._cs, step, misaligned, **extra)

    def finish(self, step: int, cancelled_by: ProfileRequest | None = None) -> Finished:
        """The schedule ended, or a cancel stopped it (`finish`): what to save."""
        with self._lock:
            start = self._cs.capture_start
            request = finish(self._cs, step, cancelled_by)
        assert request is not None  # finish follows a claim: a capture is active
        return Finished(request, step - (start if start is not None else step))

    def stopped_empty(self, step: int) -> None:
        with self._lock:
            stopped_empty(self._cs, step)

    def fail(self, message: str, step: int, settle: bool = False) -> None:
        """Anything went wrong (`fail`); with `settle`, the next step boundary has no work either."""
        with self._lock:
            fail(self._cs, message, step)
            if settle:
                self._hot.set_boundary_work(False)

    def close(self, step: int, message: str | None = None) -> None:
        """At close: fail the running capture with `message` (when there is one to give), and disarm."""
        with self._lock:
            if message is not None:
                fail(self._cs, message, step)
            self._cs.pending = None

    # -- the hot-path flag ------------------------------------------------------------

    def mark_boundary_work(self) -> None:
        """The next step boundary has work that is not a capture's (the trigger's signal to take back)."""
        with self._lock:
            self._hot.set_boundary_work(True)

    def settle_boundary(self, also: Callable[[], bool] | None = None) -> bool:
        """After a step boundary: the next one has work while a request is armed or a capture
        runs, or `also()` says so (read under the lock, as every mark is made). Returns it."""
        with self._lock:
            cs = self._cs
            work = cs.pending is not None or cs.active is not None or (also is not None and also())
            self._hot.set_boundary_work(work)
            return work

    # -- after a capture (the saver and upload threads) -----------------------------------

    def saved(self, kind: str, path: str, request: ProfileRequest, step: int) -> None:
        with self._lock:
            saved(self._cs, kind, path, request, step)

    def note(self, step: int, **extra: Any) -> None:
        """A history entry for the current request (an upload's outcome)."""
        with self._lock:
            note(self._cs, step, **extra)
