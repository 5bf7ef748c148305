"""Following a request until every rank has answered: the one wait loop, and `profile status`.

    follow             poll the replica's records until each rank's answer is final, or a deadline passes
    wait_for_capture   until each rank saved its trace (or failed, was refused, died)
    follow_set         `profile set --wait`: the capture; for a slowdown watch, its baseline, the watch
                       until it fires, then the slow capture
    wait_for_cancel    `profile cancel --wait`: until each rank answered the cancel and is idle again
    wait_for_stacks    `profile stacks`: until each rank dumped its stacks; then the dumps are read. A rank on
                       this host whose watcher thread has not answered within a couple of seconds is
                       signalled for a faulthandler dump instead (sidecar.fleet.signal_stacks)
    profile_status     `profile status`: each rank against the control file's request

A rank's answer is read off its record by `sidecar.fleet.answers`; requests are
written by `sidecar.fleet.control`. Nothing here writes, prints or imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sidecar.common import clock, layout, registry, storeurl
from sidecar.common.config import DEFAULT_MAX_CONTROL_BYTES
from sidecar.common.exceptions import RequestError
from sidecar.common.identity import host_name
from sidecar.common.records import RankRecord
from sidecar.common.recordscan import RecordReader, read_records, scan_records
from sidecar.common.request import file_request_id, parse_rank_filter
from sidecar.common.roster import ControllerReplica
from sidecar.common.stackdump import read_stacks
from sidecar.fleet.answers import (
    NOT_SELECTED,
    PENDING,
    RankCancel,
    RankCapture,
    RankStacks,
    cancel_of,
    capture_of,
    stacks_answer,
)
from sidecar.fleet.defaults import DEFAULT_CANCEL_TIMEOUT_S, DEFAULT_STACKS_TIMEOUT_S, DEFAULT_WAIT_TIMEOUT_S
from sidecar.fleet.replicas import BAD_RECORD, DEFAULT_RANK_FILTER, liveness, replica_ranks

WAIT_POLL_INTERVAL_S = 0.1
# A heartbeat older than this many intervals while stacks go unanswered: no
# thread of the process runs Python (a C call holding the GIL, or the host is gone).
STUCK_HEARTBEATS = 3.0
FALLBACK_RECHECK_MIN_S = 0.5  # the least time between two looks at the ranks not yet signalled
# Kind "hang": a rank that answered through faulthandler sent stacks but no flight recorder, and its
# watcher answers too once Python runs in it again (a loaded machine, a GIL held for a moment). Its
# record gets this many heartbeats (at least HANG_WATCHER_MIN_S) to show that it runs again; once
# it has, its watcher's answer is awaited until the timeout.
HANG_WATCHER_HEARTBEATS = 2.0
HANG_WATCHER_MIN_S = 4.0


# --- the one loop -----------------------------------------------------------------------


# A rank's answer to one request: each has `rank`, `phase`, `error` and `is_terminal`.
RankAnswer = TypeVar("RankAnswer", RankCapture, RankCancel, RankStacks)
# Sees each waiting rank at each poll: (its answer, its record or None, the time of the poll on the
# registry filesystem's clock, `clock.fs_now`).
Observer = Callable[[Any, "RankRecord | None", float], None]


def follow(
    root: Path,
    name: str,
    answers: Sequence[RankAnswer],
    answer_of: Callable[[RankRecord, bool, str], RankAnswer],
    timed_out: Callable[[RankAnswer, RankRecord | None], str],
    timeout: float,
    on_progress: Callable[[RankAnswer], None] | None = None,
    progress_key: Callable[[RankAnswer], object] = lambda answer: answer.phase,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
    observer: Observer | None = None,
) -> list[RankAnswer]:
    """Follow every rank of `answers` that has not answered for good until it has, or `timeout` seconds pass.

    Each poll reads the replica's records once (a `RecordReader`: only the files
    that changed since the last poll are read again) and takes each waiting rank's
    answer from `answer_of(record, alive, why)`; a rank whose record is gone
    is followed on the last record seen ("missing" when there never was one).
    A rank still waiting at the deadline ends as "timeout", its error from
    `timed_out(answer, last record)`.

    Args:
        answers: one per rank, as the request left them (pending, or already final).
        on_progress: called with a rank's answer each time its `progress_key` changes, and when it times out.
        observer: called each poll with each waiting rank's answer, its record (None before it has one)
            and the time (`Observer`): live progress, steps and stalls (sidecar.cli.progress).

    Returns:
        The answers by rank.
    """
    deadline = time.monotonic() + timeout
    this_host = host_name()
    current = {a.rank: a for a in answers}
    shown = {rank: progress_key(a) for rank, a in current.items()}
    last_records: dict[int, RankRecord] = {}
    waiting = [rank for rank, answer in current.items() if not answer.is_terminal]
    reader = RecordReader(root, name)
    while waiting:
        records = {r.rank: r for r in reader.scan().records}
        now = clock.fs_now(root)
        for rank in waiting:
            record = records.get(rank) or last_records.get(rank)
            if record is None:
                answer = dataclasses.replace(current[rank], phase="missing", error="its rank record disappeared")
            else:
                last_records[rank] = record
                answer = answer_of(record, *liveness(record, this_host, now))
            current[rank] = answer
            if observer is not None:
                observer(answer, record, now)
            if progress_key(answer) != shown[rank]:
                shown[rank] = progress_key(answer)
                if on_progress is not None:
                    on_progress(answer)
        waiting = [rank for rank in waiting if not current[rank].is_terminal]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    for rank in waiting:
        answer = current[rank]
        answer.error = timed_out(answer, last_records.get(rank))
        answer.phase = "timeout"
        if on_progress is not None:
            on_progress(answer)
    return [current[k] for k in sorted(current)]


def wait_for_capture(
    root: Path,
    name: str,
    request_id: str,
    ranks: Sequence[int],
    timeout: float = DEFAULT_WAIT_TIMEOUT_S,
    on_progress: Callable[[RankCapture], None] | None = None,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
    observer: Observer | None = None,
) -> list[RankCapture]:
    """Follow trace request `request_id` on `ranks` until each has saved, failed, been refused or died.

    Args:
        on_progress: called with a rank's capture each time its phase changes.
        timeout: seconds; ranks still going at the deadline end as "timeout".

    Returns:
        One capture per rank, ordered by rank; `is_finished` tells which saved.
    """

    def answer_of(record: RankRecord, alive: bool, why: str) -> RankCapture:
        capture = capture_of(record, request_id, alive, why)
        if capture.phase == "not selected":
            capture.error = NOT_SELECTED
        return capture

    def timed_out(capture: RankCapture, record: RankRecord | None) -> str:
        detail = f"still {capture.phase}" + (f" at step {record.step}" if record else "")
        if capture.phase == PENDING and record is not None and record.refused:
            detail += f"; its last refusal: {record.refused}"
        return f"timed out after {timeout:g}s, {detail}"

    pending = [RankCapture(rank=rank, phase=PENDING, request_id=request_id) for rank in ranks]
    return follow(root, name, pending, answer_of, timed_out, timeout, on_progress, poll_interval=poll_interval,
                  observer=observer)


@dataclass
class WatchWaited:
    """How `wait_for_slowdown` ended."""

    fired: str | None  # the id of the capture the watch asked for; None: it did not fire
    notes: dict[int, str]  # each rank's last note (why a slowdown was not captured, a cancel, an exit)
    ended: bool = False  # on every rank the watch was cancelled or spent, or the rank exited: it will not fire


WATCH_ENDED = ("cancelled", "spent")  # states of a watch (sidecar.rank.slowdown) that fire no more
EXITED_NOTE = "the rank exited before the watch fired"


def wait_for_slowdown(root: Path, name: str, watch_id: str, ranks: Sequence[int], timeout: float,
                      poll_interval: float = WAIT_POLL_INTERVAL_S,
                      on_note: Callable[[int, str], None] | None = None) -> WatchWaited:
    """Wait until slowdown watch `watch_id` fires on one of `ranks` (sidecar.rank.slowdown), or
    until it cannot: cancelled (or spent) on every rank, or the rank exited.

    Args:
        on_note: called with a rank and its watch's `note` the first time the rank has one: why a
            slowdown it saw was not captured (the disk floor, the interval), a cancel, an exit.

    Returns:
        The id of the capture it asked for (follow it with `wait_for_capture`), or None; each
        rank's last note; whether the watch ended without firing (else the deadline came).
    """
    deadline = time.monotonic() + timeout
    wanted = set(ranks)
    notes: dict[int, str] = {}

    def noted(rank: int, note: str) -> None:
        first = rank not in notes
        notes[rank] = note
        if first and on_note is not None:
            on_note(rank, note)

    while True:
        done: set[int] = set()
        for record in read_records(root, name):
            watch = record.slowdown
            if record.rank not in wanted:
                continue
            if isinstance(watch, dict) and watch.get("id") == watch_id:
                fired = watch.get("fired_request_id")
                if isinstance(fired, str):
                    return WatchWaited(fired, notes)
                note = watch.get("note")
                if isinstance(note, str):
                    noted(record.rank, note)
                if watch.get("state") in WATCH_ENDED:
                    done.add(record.rank)
            if record.exited_at is not None:
                done.add(record.rank)
                if record.rank not in notes:
                    noted(record.rank, EXITED_NOTE)
        if done >= wanted:
            return WatchWaited(None, notes, ended=True)
        if time.monotonic() >= deadline:
            return WatchWaited(None, notes)
        time.sleep(poll_interval)


@dataclass
class SetFollowed:
    """How `profile set --wait` ended (`follow_set`)."""

    # Where it stopped: "capture" (the capture was followed to the end, saved or not), "baseline"
    # (a watch's baseline capture did not finish), "watch" (the watch did not fire in time), "ended"
    # (the watch was cancelled, or its ranks exited, before it fired).
    stage: str
    request_id: str  # the request followed last: the capture's, the baseline's, or the watch's (which did not fire)
    captures: list[RankCapture] | None  # each rank's end of that capture; None when the watch did not fire
    timeout: float  # the seconds given for all of it
    notes: dict[int, str] = field(default_factory=dict)  # each rank's watch's last note (why it did not capture)


def follow_set(
    root: Path,
    name: str,
    request_id: str,
    ranks: Sequence[int],
    timeout: float = DEFAULT_WAIT_TIMEOUT_S,
    *,
    watch: bool = False,
    baseline: bool = True,
    on_progress: Callable[[RankCapture], None] | None = None,
    observer: Observer | None = None,
    on_baseline: Callable[[list[RankCapture]], None] | None = None,
    on_fired: Callable[[str], None] | None = None,
    on_note: Callable[[int, str], None] | None = None,
) -> SetFollowed:
    """Follow `profile set`'s request `request_id` on `ranks` until each rank's trace is saved, or `timeout`.

    A slowdown watch (`watch`) is followed in three stages within the one `timeout`: its baseline
    capture (`<id>.baseline`, unless not `baseline`), which must finish; the watch, until it fires;
    then the capture it asked for. A watch cancelled on every rank (or whose ranks exited) ends it at once.

    Args:
        on_progress, observer: as `wait_for_capture`.
        on_baseline: called with each rank's end of the baseline capture once it is followed.
        on_fired: called with the id of the capture a watch asked for, before it is followed.
        on_note: as `wait_for_slowdown`'s.
    """
    deadline = time.monotonic() + timeout
    if watch:
        if baseline:
            captures = wait_for_capture(root, name, f"{request_id}.baseline", ranks, timeout, on_progress,
                                        observer=observer)
            if on_baseline is not None:
                on_baseline(captures)
            if not all(c.is_finished for c in captures):
                return SetFollowed("baseline", f"{request_id}.baseline", captures, timeout)
        waited = wait_for_slowdown(root, name, request_id, ranks, max(0.0, deadline - time.monotonic()),
                                   on_note=on_note)
        if waited.fired is None:
            return SetFollowed("ended" if waited.ended else "watch", request_id, None, timeout, waited.notes)
        if on_fired is not None:
            on_fired(waited.fired)
        request_id = waited.fired
    # A plain capture is followed for `timeout`; a watch's slow capture for what the baseline and the watch left.
    left = max(0.0, deadline - time.monotonic()) if watch else timeout
    captures = wait_for_capture(root, name, request_id, ranks, left, on_progress, observer=observer)
    return SetFollowed("capture", request_id, captures, timeout)


def wait_for_cancel(
    root: Path,
    name: str,
    cancel_id: str,
    ranks: Sequence[int],
    timeout: float = DEFAULT_CANCEL_TIMEOUT_S,
    on_progress: Callable[[RankCancel], None] | None = None,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
    observer: Observer | None = None,
) -> list[RankCancel]:
    """Follow `cancel_id` on `ranks` until each has answered and is idle again (or
    failed, or died); ranks still going at the deadline end as "timeout".
    `on_progress` sees each change of a rank's phase or outcome."""

    def timed_out(result: RankCancel, record: RankRecord | None) -> str:
        detail = f"still {result.state}" + (f", {result.outcome}" if result.outcome else ", has not seen the cancel")
        return f"timed out after {timeout:g}s, {detail}"

    pending = [RankCancel(rank=rank, phase=PENDING) for rank in ranks]
    return follow(root, name, pending, lambda record, alive, why: cancel_of(record, cancel_id, alive, why),
                  timed_out, timeout, on_progress, lambda a: (a.phase, a.outcome), poll_interval, observer)


def wait_for_stacks(
    root: Path,
    name: str,
    request_id: str,
    answers: Sequence[RankStacks],
    timeout: float = DEFAULT_STACKS_TIMEOUT_S,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
    observer: Observer | None = None,
    fallback_after: float | None = None,
    await_watchers: bool = False,
) -> list[RankStacks]:
    """Follow the pending ranks of `answers` until each has answered, refused or died,
    or `timeout` seconds pass; then read every dump (`load_dump`).

    The watcher thread of a rank stuck in a C call that holds the GIL never
    answers: a rank still pending after `fallback_after` seconds (default
    COSMOS_PROFILER_STACKS_FALLBACK_S, 2 s) that runs on this host, and whose heartbeat
    has stopped (`signal_stacks.heartbeat_stopped`), is sent its `stacks_signal` and answers through
    faulthandler (`source` "faulthandler"). One whose heartbeat still ticks runs Python and is
    waited for: it is signalled only if its heartbeat stops before the timeout.
    A rank on another host goes on waiting for its watcher; if that times out,
    its error says where to run the command instead. With `await_watchers` (kind "hang": the
    watcher's answer carries the flight recorder), a rank answered through faulthandler is
    followed on for its watcher's answer (`_await_watchers`).

    Raises:
        ConfigError: COSMOS_PROFILER_STACKS_FALLBACK_S is not a number of seconds in range.
    """
    from sidecar.fleet import signal_stacks  # signals and ctypes: not for the CLI's other commands

    fallback_after = signal_stacks.fallback_after_s() if fallback_after is None else fallback_after
    started = time.monotonic()
    why_not: dict[int, str] = {}  # rank -> why it could not be asked through faulthandler

    def answer_of(record: RankRecord, alive: bool, why: str) -> RankStacks:
        answer = stacks_answer(record, request_id, alive, why)
        answer.fallback = why_not.get(answer.rank)
        return answer

    def timed_out(answer: RankStacks, record: RankRecord | None) -> str:
        detail = ""
        if record is not None:
            age = max(0.0, clock.record_age(record, clock.fs_now(root)))
            if age > STUCK_HEARTBEATS * (record.heartbeat_interval or 2.0):
                # no thread of the process runs Python: a C call holding the GIL, or the host is gone
                detail = (f"; its heartbeat stopped {age:.0f}s ago too (at step {record.step}), so the whole process "
                          f"is stuck")
                if not answer.fallback:
                    detail += f"; try py-spy dump --pid {record.pid} on {record.host or 'its host'}"
            else:
                watch = f" (it polls the control file every {record.poll_interval:g}s)" if record.watch == "poll" else ""
                detail = (f"; its heartbeat is fresh (step {record.step}), so its watcher thread did not see the "
                          f"request{watch}")
        if answer.fallback:
            detail += f"; no faulthandler dump: {answer.fallback}"
        return f"the watcher thread did not answer within {timeout:g}s{detail}"

    result = list(answers)
    window = fallback_after
    while window < timeout - (time.monotonic() - started):
        result = follow(root, name, result, answer_of, lambda answer, record: "", window,
                        poll_interval=poll_interval, observer=observer)
        result, recheck = signal_stacks.fall_back_all(root, name, request_id, result, time.monotonic() - started,
                                                      set(why_not))
        why_not.update({a.rank: a.fallback for a in result if a.phase == PENDING and a.fallback})
        if recheck is None:
            break
        window = max(FALLBACK_RECHECK_MIN_S, recheck)
    left = max(0.0, timeout - (time.monotonic() - started))
    result = follow(root, name, result, answer_of, timed_out, left, poll_interval=poll_interval,
                    observer=observer)
    if await_watchers:
        result = _await_watchers(root, name, request_id, result, started + timeout, poll_interval)
    for answer in result:
        if answer.is_finished and answer.source == "watcher":
            load_dump(answer)
    return result


def _await_watchers(root: Path, name: str, request_id: str, answers: list[RankStacks], deadline: float,
                    poll_interval: float) -> list[RankStacks]:
    """The ranks of `answers` that answered through faulthandler, followed on for their watcher's
    answer, which replaces the faulthandler one. A rank whose record shows no life (not written or
    ticked since) within HANG_WATCHER_HEARTBEATS of its heartbeats keeps its faulthandler answer (its
    Python is stuck: a GIL held for good); one that shows life is awaited until `deadline`
    (`time.monotonic`), as is one that answers, refuses or dies meanwhile."""
    late = {a.rank for a in answers if a.is_finished and a.source == "faulthandler"}
    if not late:
        return answers
    current = {a.rank: a for a in answers}
    this_host = host_name()
    reader = RecordReader(root, name)
    started = time.monotonic()
    seen: dict[int, float] = {}  # rank -> its record's heartbeat when the wait began
    until: dict[int, float] = {}  # rank -> when to stop waiting for it
    while late:
        records = {r.rank: r for r in reader.scan().records}
        now = clock.fs_now(root)
        for rank in sorted(late):
            record = records.get(rank)
            if record is None:
                late.discard(rank)
                continue
            if rank not in seen:
                seen[rank] = clock.written_at(record)
                window = max(HANG_WATCHER_MIN_S, HANG_WATCHER_HEARTBEATS * (record.heartbeat_interval or 2.0))
                until[rank] = min(deadline, started + window)
            elif clock.written_at(record) > seen[rank]:
                until[rank] = deadline  # Python runs in it again: its watcher answers
            answer = stacks_answer(record, request_id, *liveness(record, this_host, now))
            if answer.is_finished:
                current[rank] = answer
            if answer.is_terminal or time.monotonic() >= until[rank]:
                late.discard(rank)
        if late:
            time.sleep(poll_interval)
    return [current[a.rank] for a in answers]


def load_dump(answer: RankStacks) -> None:
    """Read the dump of a rank that answered into `answer` (its threads, step and state);
    a dump this machine cannot read makes it "unreadable"."""
    assert answer.path is not None
    try:
        header, threads, main = read_stacks(storeurl.dump_copy(answer.path))
    except OSError as exc:
        answer.phase = "unreadable"
        answer.error = f"cannot read {answer.path} from this machine: {exc.strerror or exc}"
        return
    except ValueError as exc:
        answer.phase, answer.error = "unreadable", f"{answer.path} is not a stacks dump: {exc}"
        return
    answer.threads, answer.main_thread = threads, main
    if header.get("step", "").isdigit():
        answer.step = int(header["step"])
    answer.dumped_at = _header_time(header, "at")
    answer.last_step_at = _header_time(header, "last_step_at")
    answer.state = header.get("state", answer.state)


def _header_time(header: dict[str, str], key: str) -> float | None:
    try:
        return float(header[key])
    except (KeyError, ValueError):
        return None


# --- profile status ------------------------------------------------------------------


@dataclass
class ProfileStatus:
    """The current or last request of a replica, rank by rank."""

    replica: str
    request_id: str | None  # the id in the control file, when it has one
    request: dict[str, Any] | None
    control_path: str
    ranks: list[RankCapture]
    # What the control file holds: "absent", "empty" (a touch: each rank's defaults), "invalid"
    # (not a JSON object), or the request's kind ("trace", "stacks", "cancel", ...); and its id, if any.
    control_kind: str = "absent"
    control_request_id: str | None = None
    # Each rank's slowdown watch (sidecar.rank.slowdown), current or last: {"rank": k, **its record's `slowdown`}.
    slowdown: list[dict[str, Any]] = field(default_factory=list)


def read_control_request(root: Path, name: str) -> tuple[dict[str, Any] | None, float | None, str | None]:
    """The JSON request in `name`'s control file (None when absent, empty or unreadable), its mtime,
    and the id a rank gives this version when it names none or is re-issued (`file_request_id`)."""
    path = layout.control_path(root, name)
    try:
        control = registry.read_control(path, DEFAULT_MAX_CONTROL_BYTES)
    except (OSError, RequestError):
        return None, None, None
    try:
        obj = json.loads(control.data) if control.data.strip() else None
    except (ValueError, RecursionError):
        obj = None
    return (obj if isinstance(obj, dict) else None), control.mtime_ns / 1e9, file_request_id(control.mtime_ns, control.data)


def control_kind(root: Path, name: str) -> tuple[str, str | None]:
    """What `name`'s control file holds (see `ProfileStatus.control_kind`), and the id it names."""
    path = layout.control_path(root, name)
    try:
        control = registry.read_control(path, DEFAULT_MAX_CONTROL_BYTES)
    except FileNotFoundError:
        return "absent", None
    except (OSError, RequestError):
        return "invalid", None
    if not control.data.strip():
        return "empty", None
    try:
        obj = json.loads(control.data)
    except (ValueError, RecursionError):
        return "invalid", None
    if not isinstance(obj, dict):
        return "invalid", None
    kind = obj.get("kind", "trace")
    return (kind if isinstance(kind, str) else "invalid"), (obj["id"] if isinstance(obj.get("id"), str) else None)


def profile_status(
    root: Path, name: str, controller: list[ControllerReplica] | None = None, now: float | None = None
) -> ProfileStatus:
    """Per-rank phase of the control file's request; a rank that never saw it
    (not selected while busy, or started after it) shows its own last request.

    Raises:
        ReplicaNotFound: as `fleet.replicas.replica_ranks`.
    """
    now = clock.fs_now(root) if now is None else now
    scan = scan_records(root, name)  # read once, for the statuses and the captures
    statuses = replica_ranks(root, name, controller, now=now, scan=scan)
    request, mtime, file_id = read_control_request(root, name)
    if request and request.get("kind") in ("stacks", "hang", "cancel", "watch"):
        # Stacks and cancel requests are answered at once and never become a
        # rank's current request: show each rank's own last capture instead (for a
        # watch: its baseline capture; the watch itself is `slowdown`).
        request, mtime, file_id = None, None, None
    control_id = request.get("id") if request and isinstance(request.get("id"), str) else None
    if request and "id" not in request:
        control_id = file_id  # a request that names no id: the ranks take it under this one
    try:
        control_filter = parse_rank_filter(request.get("rank_filter", DEFAULT_RANK_FILTER)) if request else None
    except RequestError:
        control_filter = None
    records = {r.rank: r for r in scan.records}
    if request and file_id and any(
        r.request_id == file_id or f"request {file_id} " in (r.refused or "") for r in records.values()
    ):
        control_id = file_id  # a touched file: the ranks took this version as a new request under its own id
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
            # A rank that took the file's request and moved on (a SIGUSR1 since, say) waits for nothing.
            moved_on = any(isinstance(h, dict) and h.get("request_id") == control_id for h in record.history)
            waiting = (
                control_filter is not None and status.rank in control_filter and status.alive
                and (mtime is None or clock.to_fs_clock(record, record.started_at) <= mtime) and not moved_on
            )
            if seen or waiting:
                target = control_id
        alive, why = status.alive, status.liveness  # `liveness` of this record, at `now`
        if target is None:
            captures.append(RankCapture(rank=record.rank, phase="no request", host=record.host, alive=alive,
                                        step=record.step, error=record.error))
            continue
        captures.append(capture_of(record, target, alive, why))
    kind, kind_id = control_kind(root, name)
    return ProfileStatus(
        replica=name, request_id=control_id, request=request,
        control_path=str(layout.control_path(root, name)), ranks=captures,
        control_kind=kind, control_request_id=kind_id,
        slowdown=[{"rank": r.rank, **r.slowdown} for r in sorted(records.values(), key=lambda r: r.rank)
                  if isinstance(r.slowdown, dict)],
    )
