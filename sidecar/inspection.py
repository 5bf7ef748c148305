"""Look into a replica: every rank's Python stacks on demand.

What `profile stacks` does, as functions over the registry that return
dataclasses. Nothing here prints, parses flags or imports torch. (Its saved
traces: `sidecar.traces`.)

Stacks: `dump_stacks` writes a `kind: "stacks"` request to the control file and
waits for every selected live rank to answer. A rank answers from its watcher
thread, so a rank whose training thread is stuck in a collective answers too:
it writes `<output>/profile_trace/<replica>_<rank>/<n>_stacks.txt`, sets
`stacks_path` and adds a history entry `{"stacks": path, "request_id": id}` to
its record. `group_stacks` then puts ranks whose main threads stand in the
same frames together, so the rank that hangs stands apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar import registry
from sidecar.config import SubProfilerConfig
from sidecar.control import new_request_id
from sidecar.controller import ControllerReplica
from sidecar.errors import BadOption, RequestError
from sidecar.fleet import check_replica, liveness, select_ranks
from sidecar.identity import host_name
from sidecar.registry import RankRecord
from sidecar.request import RankFilter, defaults_from_config, request_from_dict
from sidecar.stacks import HEADER, THREAD_PREFIX, ThreadStack, parse_stacks

# Every rank: the point is to find the one that differs.
DEFAULT_STACKS_RANK_FILTER = "all"
# A rank answers from its watcher thread at once (inotify), or within one poll
# interval on shared storage; its record follows at once.
DEFAULT_STACKS_TIMEOUT_S = 30.0
WAIT_POLL_INTERVAL_S = 0.1
MAX_STACKS_BYTES = 16 << 20

# Phases of one rank for one stacks request.
PENDING = "pending"
# A heartbeat older than this many intervals: the process runs no Python at all.
STALE_HEARTBEATS = 3.0
STACKS_TERMINAL = ("saved", "refused", "error", "dead", "missing", "not selected", "unreadable", "timeout")


# --- stacks ---------------------------------------------------------------------


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

    @property
    def is_finished(self) -> bool:
        return self.phase == "saved"

    @property
    def is_terminal(self) -> bool:
        return self.phase in STACKS_TERMINAL

    @property
    def main(self) -> ThreadStack | None:
        return self.threads[self.main_thread] if self.main_thread is not None else None


@dataclass
class StacksResult:
    """What `dump_stacks` asked for and what came back."""

    replica: str
    request_id: str
    request: dict[str, Any]
    control_path: str
    ranks: list[RankStacks]  # every selected rank, in rank order; `is_finished` tells which answered

    @property
    def answered(self) -> list[RankStacks]:
        return [r for r in self.ranks if r.is_finished]

    @property
    def unanswered(self) -> list[RankStacks]:
        return [r for r in self.ranks if not r.is_finished]


@dataclass
class StackGroup:
    """Ranks whose thread `thread` stands in the same frames."""

    ranks: list[int]
    thread: str
    frames: list[str]  # 'File "x.py", line 3, in f' lines, innermost last
    is_main: bool = True
    steps: list[int] = field(default_factory=list)  # the distinct steps the ranks were at
    other_threads: list[str] = field(default_factory=list)  # (main groups) the ranks' other thread names

    @property
    def ranks_text(self) -> str:
        return str(RankFilter(frozenset(self.ranks)))


def request_stacks(
    root: Path,
    name: str,
    rank_filter: RankFilter | str | None = None,
    controller: list[ControllerReplica] | None = None,
    now: float | None = None,
) -> StacksResult:
    """Write a stacks request for `name`; the result has every selected rank
    pending, or dead/missing when it cannot answer.

    Raises:
        ReplicaNotFound: no records for `name` (or the controller does not know it).
        BadOption: the rank filter names a rank beyond the world size.
        RequestError: no selected rank is alive.
        RegistryError: the control file cannot be written.
    """
    check_replica(name, controller)
    now = time.time() if now is None else now
    records, filter_, selected, problems = select_ranks(root, name, rank_filter, DEFAULT_STACKS_RANK_FILTER, controller)
    this_host = host_name()
    ranks: list[RankStacks] = []
    for rank in selected:
        record = records.get(rank)
        if record is None:
            ranks.append(RankStacks(rank, "missing", error=problems.get(rank, "no rank record")))
            continue
        alive, why = liveness(record, this_host, now)
        if alive:
            ranks.append(RankStacks(rank, PENDING, host=record.host, step=record.step, state=record.state))
        else:
            ranks.append(RankStacks(rank, "dead", host=record.host, step=record.step, state=record.state, error=why))
    if not any(r.phase == PENDING for r in ranks):
        reasons = "; ".join(f"rank {r.rank}: {r.error}" for r in ranks)
        raise RequestError(f"no live rank of replica {name} matches rank filter {filter_} ({reasons})")
    request_id = new_request_id(now)
    request: dict[str, Any] = {"id": request_id, "kind": "stacks", "rank_filter": str(filter_)}
    # The ranks parse with the same code: a request they would refuse is a usage error here.
    try:
        request_from_dict(request, defaults_from_config(SubProfilerConfig()), request_id)
    except RequestError as exc:
        raise BadOption("request", str(exc)) from None
    path = registry.write_request(root, name, request)
    return StacksResult(name, request_id, request, str(path), ranks)


def stacks_answer(record: RankRecord, request_id: str, alive: bool, why: str = "") -> RankStacks:
    """Where `record`'s rank stands with stacks request `request_id` (reads no dump)."""
    answer = RankStacks(record.rank, PENDING, host=record.host, step=record.step, state=record.state)
    path = _stacks_path_for(record, request_id)
    if path is not None:
        answer.phase, answer.path = "saved", path
    elif record.refused and f"request {request_id} " in record.refused:
        answer.phase, answer.error = "refused", record.refused
    elif record.error and record.error.startswith(f"request {request_id}:"):
        answer.phase, answer.error = "error", record.error
    elif record.request_id == request_id and record.selected is False:
        answer.phase, answer.error = "not selected", "the rank did not select itself (does its world size differ?)"
    elif not alive:
        answer.phase, answer.error = "dead", f"{why or 'not alive'} before answering"
    return answer


def _stacks_path_for(record: RankRecord, request_id: str) -> str | None:
    for entry in reversed(record.history):
        if isinstance(entry, dict) and entry.get("request_id") == request_id and isinstance(entry.get("stacks"), str):
            return entry["stacks"]
    return None


def wait_for_stacks(
    root: Path,
    result: StacksResult,
    timeout: float = DEFAULT_STACKS_TIMEOUT_S,
    poll_interval: float = WAIT_POLL_INTERVAL_S,
) -> StacksResult:
    """Follow `result`'s pending ranks until each has answered, refused or died,
    or `timeout` seconds pass; then read every dump. Updates `result` in place.
    """
    deadline = time.monotonic() + timeout
    this_host = host_name()
    answers = {r.rank: r for r in result.ranks}
    waiting = [r.rank for r in result.ranks if r.phase == PENDING]
    last_records: dict[int, RankRecord] = {}
    while waiting:
        records = {r.rank: r for r in registry.read_records(root, result.replica)}
        now = time.time()
        for rank in waiting:
            record = records.get(rank) or last_records.get(rank)
            if record is None:
                answers[rank] = RankStacks(rank, "missing", error="its rank record disappeared")
                continue
            last_records[rank] = record
            alive, why = liveness(record, this_host, now)
            answers[rank] = stacks_answer(record, result.request_id, alive, why)
        waiting = [rank for rank in waiting if not answers[rank].is_terminal]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    for rank in waiting:
        record = last_records.get(rank)
        detail = ""
        if record is not None:
            age = max(0.0, time.time() - record.heartbeat_at)
            if age > STALE_HEARTBEATS * (record.heartbeat_interval or 2.0):
                # no thread of the process runs Python: a C call holding the GIL, or the host is gone
                detail = (f"; its heartbeat stopped {age:.0f}s ago too (at step {record.step}), so the whole process "
                          f"is stuck; try py-spy dump --pid {record.pid} on {record.host or 'its host'}")
            else:
                watch = f" (it polls the control file every {record.poll_interval:g}s)" if record.watch == "poll" else ""
                detail = (f"; its heartbeat is fresh (step {record.step}), so its watcher thread did not see the "
                          f"request{watch}")
        answers[rank].phase, answers[rank].error = "timeout", f"no answer within {timeout:g}s{detail}"
    result.ranks = [answers[k] for k in sorted(answers)]
    for answer in result.ranks:
        if answer.is_finished:
            _load_dump(answer)
    return result


def dump_stacks(
    root: Path,
    name: str,
    rank_filter: RankFilter | str | None = None,
    controller: list[ControllerReplica] | None = None,
    timeout: float = DEFAULT_STACKS_TIMEOUT_S,
) -> StacksResult:
    """Ask every selected live rank of `name` for its threads' stacks and wait for them.

    Args:
        rank_filter: default "all".
        timeout: seconds; ranks that have not answered by then end as "timeout".

    Returns:
        One `RankStacks` per selected rank, with its parsed dump when it answered.

    Raises:
        as `request_stacks`.
    """
    result = request_stacks(root, name, rank_filter, controller)
    return wait_for_stacks(root, result, timeout)


def read_stacks(path: str | os.PathLike[str]) -> tuple[dict[str, str], list[ThreadStack], int | None]:
    """(header fields, threads, index of the main thread or None) of a dump
    written by `sidecar.stacks.format_stacks`.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a stacks dump.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_STACKS_BYTES + 1)
    if len(data) > MAX_STACKS_BYTES:
        raise ValueError(f"it is larger than {MAX_STACKS_BYTES} bytes")
    text = data.decode("utf-8", errors="replace")
    first, _, _ = text.partition("\n")
    if not first.startswith(HEADER):
        raise ValueError(f"it does not start with {HEADER!r}")
    header = dict(token.split("=", 1) for token in first[len(HEADER):].split() if "=" in token)
    main = None
    position = 0
    for line in text.splitlines():
        if line.startswith(THREAD_PREFIX):
            flags = line[len(THREAD_PREFIX):].split(" (ident", 1)[-1].rstrip(")").split(", ")
            if main is None and "main" in flags[1:]:
                main = position
            position += 1
    return header, parse_stacks(text), main


def _load_dump(answer: RankStacks) -> None:
    assert answer.path is not None
    try:
        header, threads, main = read_stacks(answer.path)
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
    answer.state = header.get("state", answer.state)


def group_stacks(answers: Sequence[RankStacks], by_stack: bool = True, all_threads: bool = False) -> list[StackGroup]:
    """Groups of ranks by the frames of their main thread (each rank alone when
    not `by_stack`); the biggest group first, so the odd ranks out come last.

    With `all_threads`, the main-thread groups are followed by groups of every
    other thread, by thread name then frames.
    """
    dumped = [a for a in answers if a.is_finished]
    groups: dict[Any, StackGroup] = {}
    for answer in dumped:
        main = answer.main
        frames = list(main.frames) if main is not None else []
        key = tuple(frames) if by_stack else answer.rank
        group = groups.get(key)
        if group is None:
            group = groups[key] = StackGroup([], main.name if main is not None else "(no main thread)", frames)
        group.ranks.append(answer.rank)
        if answer.step is not None and answer.step not in group.steps:
            group.steps.append(answer.step)
        for index, thread in enumerate(answer.threads):
            if index != answer.main_thread and thread.name not in group.other_threads:
                group.other_threads.append(thread.name)
    ordered = _by_size(groups.values())
    if not all_threads:
        return ordered
    others: dict[Any, StackGroup] = {}
    for answer in dumped:
        for index, thread in enumerate(answer.threads):
            if index == answer.main_thread:
                continue
            key = (thread.name, thread.frames if by_stack else answer.rank)
            group = others.get(key)
            if group is None:
                group = others[key] = StackGroup([], thread.name, list(thread.frames), is_main=False)
            if answer.rank not in group.ranks:
                group.ranks.append(answer.rank)
    names = list(dict.fromkeys(g.thread for g in others.values()))
    for name in names:
        ordered.extend(_by_size(g for g in others.values() if g.thread == name))
    return ordered


def _by_size(groups: Any) -> list[StackGroup]:
    result = list(groups)
    for group in result:
        group.ranks.sort()
        group.steps.sort()
    return sorted(result, key=lambda g: (-len(g.ranks), g.ranks[0]))
