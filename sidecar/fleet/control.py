"""Requests written to a replica's control file: `profile set`, `profile cancel` and `profile stacks`.

    select_live     the ranks a request is for: selected, alive, and why the others are left out
    set_profile     a trace request, its start step planned from each rank's recent pace (sidecar.common.startstep)
    cancel_profile  a cancel: armed ranks disarm, tracing ranks stop and save what they recorded
    request_stacks  a stacks request: every thread's Python stacks, answered from each rank's watcher thread
                    (kind "hang": with the flight recorder, for `sidecar.fleet.hang`)

Each builds one `ControlRequest` (sidecar.common.request) and writes it with
`registry.write_request`, the one way to the wire; a busy replica is refused with a
`ReplicaBusy` that names each request holding it (`busy_error`). A request is always
written to the control file: the controller is never needed to profile. Replicas and ranks are read by `sidecar.fleet`; what the
ranks answer is read by `sidecar.fleet.answers` and followed by `sidecar.fleet.follow`.
Nothing here prints, parses flags or imports torch. (Over 400 lines: `set` is
nearly half of it, its start-step planning kept beside the one request it plans.)
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common import clock, registry, storeurl
from sidecar.common.config import SubProfilerConfig
from sidecar.common.exceptions import BadOption, BusyRequest, NoLiveRank, ReplicaBusy, RequestError
from sidecar.common.identity import host_name
from sidecar.common.log import log
from sidecar.common.records import BUSY_STATES, RankRecord
from sidecar.common.recordscan import read_records
from sidecar.common.replicaname import check_replica
from sidecar.common.request import (
    DEFAULT_CONSECUTIVE,
    ControlRequest,
    RankFilter,
    check_start_ahead,
    defaults_from_config,
    request_from_dict,
)
from sidecar.common.roster import ControllerReplica
from sidecar.common.startstep import plan_start_step, projected_step, standing_still, step_rate
from sidecar.fleet.answers import PENDING, RankStacks
from sidecar.fleet.defaults import DEFAULT_STACKS_RANK_FILTER, DEFAULT_STACKS_TIMEOUT_S
from sidecar.fleet.follow import wait_for_stacks
from sidecar.fleet.replicas import DEFAULT_RANK_FILTER, format_age, liveness, select_ranks

# Not cosmos-rl's "Set replica X to profile mode.": that is its controller's answer, and no controller was told.
SET_MESSAGE = "Requested a profile of replica {name} through its control file."
# What `profile set` records, in the order it prints them. An omitted value is the rank's
# [profiler.sub_profiler_config] (cosmos-cli's `profile set` would send these instead).
SETTING_KEYS = ("wait_steps", "warmup_steps", "active_steps", "record_shape", "profile_memory", "with_stack",
                "with_modules")
COSMOS_CLI_DEFAULTS = {"active_steps": 1, "record_shape": False, "profile_memory": False, "with_stack": False,
                       "with_modules": False}
WATCH_MESSAGE = ("Armed a slowdown watch on replica {name}: {consecutive} steps in a row slower than {factor:g}x "
                 "the median capture the selected ranks; {baseline}.")

MAX_RATE_WAIT_S = 5.0
RATE_POLL_INTERVAL_S = 0.05


# --- the ranks a request is for ---------------------------------------------------


@dataclass
class Selection:
    """The ranks a request is for, and the replica's live ranks."""

    records: dict[int, RankRecord]  # every usable record of the replica, by rank
    rank_filter: RankFilter
    selected: list[int]  # the ranks the filter selects, in order
    live: list[RankRecord]  # every live rank of the replica, selected or not
    targets: list[RankRecord]  # the selected live ranks, in rank order: those that will answer
    skipped: dict[int, str] = field(default_factory=dict)  # selected, but not alive or without a record: why


def select_live(
    root: Path,
    name: str,
    rank_filter: RankFilter | str | None,
    default_filter: str,
    controller: list[ControllerReplica] | None = None,
    now: float | None = None,
) -> Selection:
    """The live ranks of `name` that `rank_filter` (else `default_filter`) selects, and why the others are left out.

    Raises:
        BadOption: a bad replica name; the filter does not parse, or names a rank beyond the world size.
        ReplicaNotFound: no records for `name` (or the controller does not know it).
        NoLiveRank: no selected rank is alive.
    """
    check_replica(name, controller)
    now = clock.fs_now(root) if now is None else now
    records, filter_, selected, problems = select_ranks(root, name, rank_filter, default_filter, controller)
    this_host = host_name()
    live: list[RankRecord] = []
    why_not: dict[int, str] = {}
    for record in records.values():
        alive, why = liveness(record, this_host, now)
        if alive:
            live.append(record)
        else:
            why_not[record.rank] = why
    by_rank = {r.rank: r for r in live}
    targets = [by_rank[k] for k in selected if k in by_rank]
    skipped = {k: why_not[k] if k in records else problems.get(k, "no rank record") for k in selected if k not in by_rank}
    if not targets:
        reasons = "; ".join(f"rank {k}: {why}{last_heard(records.get(k), now)}" for k, why in skipped.items())
        raise NoLiveRank(f"no live rank of replica {name} matches rank filter {filter_} ({reasons})")
    return Selection(records, filter_, selected, live, targets, skipped)


def last_heard(record: RankRecord | None, now: float) -> str:
    """" (on HOST, last heartbeat 42s ago at step N)" for a rank that is not alive, else ""."""
    if record is None or not record.heartbeat_at:
        return ""
    return (f" (on {record.host or '?'}, last heartbeat {format_age(clock.record_age(record, now))} ago "
            f"at step {record.step})")


@dataclass
class Written:
    """A request written to a replica's control file."""

    replica: str
    request_id: str
    request: ControlRequest
    control_path: str


def new_request_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return f"cli-{stamp}-{os.urandom(3).hex()}"


def check_request(request: ControlRequest) -> None:
    """The ranks parse with the same code: a request they would refuse is a usage error here.

    Raises:
        BadOption: (option "request") a rank would refuse `request`.
    """
    try:
        request_from_dict(request.to_json(), defaults_from_config(SubProfilerConfig()), request.id or "")
    except RequestError as exc:
        raise BadOption("request", str(exc)) from None


# --- profile set ------------------------------------------------------------------


@dataclass
class SetResult(Written):
    """What `set_profile` wrote and whom it is for."""

    ranks: list[int]  # the live selected ranks that will capture
    skipped: dict[int, str] = field(default_factory=dict)  # selected, but not alive: why
    start_step: int | None = None
    current_step: int = 0  # highest step the replica's live ranks report
    lead_steps: int = 0
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    # What the selected ranks will record (the request's values, else the first rank's config)
    # and which of those came from the rank's [profiler.sub_profiler_config].
    effective: dict[str, Any] = field(default_factory=dict)
    from_config: list[str] = field(default_factory=list)


def effective_settings(request: dict[str, Any], targets: Sequence[RankRecord]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the settings the ranks will use, the keys taken from their config, warnings where ranks' configs differ)."""
    base = SubProfilerConfig()
    fallback = {key: getattr(base, key) for key in SETTING_KEYS}
    configs = [{**fallback, **{k: v for k, v in (r.defaults or {}).items() if k in fallback}} for r in targets]
    effective: dict[str, Any] = {}
    from_config: list[str] = []
    warnings: list[str] = []
    for key in SETTING_KEYS:
        if key in request:
            effective[key] = request[key]
            continue
        effective[key] = configs[0][key] if configs else fallback[key]
        from_config.append(key)
        others = sorted({r.rank for r, c in zip(targets, configs, strict=True) if c[key] != effective[key]})
        if others:
            warnings.append(f"ranks' configs differ: {key} is {effective[key]} on rank {targets[0].rank} but not on "
                            f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}; pass it explicitly")
    return effective, from_config, warnings


def cannot_trace_message(name: str, ranks: Sequence[RankRecord]) -> str:
    """The refusal for ranks that cannot count steps (their records say why)."""
    reasons = "; ".join(f"rank {r.rank}: {r.cannot_trace}" for r in ranks)
    return (f"replica {name} cannot be traced: {'its ranks count' if len(ranks) > 1 else 'its rank counts'} "
            "no training steps, "
            f"so a request would stay armed forever ({reasons})")


def _with_step_rates(root: Path, name: str, live: list[RankRecord], now: float) -> list[RankRecord]:
    """Records young enough that no step rate can be measured yet (a rank that
    just started and steps) are read again after their next rewrite, at most a few
    seconds. A rank whose counter stood still a while (`standing_still`: it has not
    stepped yet, or stopped) has a known rate, none: it is not waited for, nor, while
    it is waited for, once it has stood still that long (a record that was only
    ticked since it was written is never rewritten while its rank stands still)."""
    young = {r.rank: r.heartbeat_at for r in live if step_rate(r) is None and not standing_still(r, now)}
    if not young:
        return live
    interval = max(r.heartbeat_interval or 2.0 for r in live)
    wait_s = min(1.5 * interval, MAX_RATE_WAIT_S)
    log.debug("[Profiler] profile set %s: waiting up to %.1fs for the pace of rank%s %s (no pace in %s yet)",
              name, wait_s, "s" if len(young) > 1 else "", ",".join(map(str, sorted(young))),
              "their records" if len(young) > 1 else "its record")
    deadline = time.monotonic() + wait_s
    while True:
        fresh = {r.rank: r for r in read_records(root, name)}
        now = clock.fs_now(root)
        if all(k in fresh and (fresh[k].heartbeat_at > at or standing_still(fresh[k], now)) for k, at in young.items()) \
                or time.monotonic() >= deadline:
            return [fresh.get(r.rank, r) for r in live]
        time.sleep(RATE_POLL_INTERVAL_S)


def unpaced_warning(ranks: Sequence[int], start_step: int) -> str:
    """The plan's caveat for ranks that have not stepped since they started: no pace to plan with.
    A rank that begins to step between the plan and reading the request can pass the start step
    first; it then traces from its next step and says so (misaligned)."""
    n = len(ranks)
    who = f"rank {ranks[0]} has" if n == 1 else f"ranks {RankFilter(frozenset(ranks))} ({n}) have"
    return (f"{who} not stepped since starting, so no pace is known: step {start_step} assumes "
            f"{'it reads' if n == 1 else 'they read'} the request before stepping. One that starts stepping first "
            "traces from its next step and reports misaligned; to align with a running job, profile it once it steps")


def busy_error(name: str, busy: Sequence[RankRecord]) -> ReplicaBusy:
    """The refusal for `busy` ranks: each request that holds them, its ranks, start step and furthest phase."""
    order: dict[str, int] = {state: i for i, state in enumerate(BUSY_STATES)}  # a State is its str
    groups: dict[str, list[RankRecord]] = {}
    for record in busy:
        groups.setdefault(record.request_id or "?", []).append(record)
    requests = []
    for request_id, records in groups.items():
        request = records[0].request if isinstance(records[0].request, dict) else {}
        start = request.get("start_step")
        if start is None:
            start = next((r.capture_start_step for r in records if r.capture_start_step is not None), None)
        phase = max((r.state for r in records), key=lambda s: order.get(s, -1))
        requests.append(BusyRequest(request_id, tuple(sorted(r.rank for r in records)), start, str(phase)))
    return ReplicaBusy(name, requests)


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
    on_slowdown: float | None = None,
    consecutive: int | None = None,
    repeat: int | None = None,
    baseline: bool = True,
) -> SetResult:
    """Validate and write a trace request for the live selected ranks of `name`.

    Step counts left as None, and flags left False, are omitted from the
    request so each rank's configured defaults apply. The rank filter defaults
    to rank 0, as in Cosmos-RL. Without `start_step`, the capture starts at
    the replica's highest step plus a lead (see `plan_start_step`), so all
    selected ranks trace the same steps.

    With `on_slowdown` (a factor), the request is a slowdown watch (sidecar.rank.slowdown): each
    selected rank captures the same steps when `consecutive` steps in a row take more than
    `on_slowdown` times its recent median, up to 1 + `repeat` times; unless not `baseline`, a
    baseline capture starts at the planned step at once.

    Raises:
        ReplicaNotFound: no records for `name` (or the controller does not know it).
        BadOption: the rank filter names a rank beyond the world size.
        ReplicaBusy: a live selected rank is armed, tracing or saving.
        RequestError: no selected rank is alive.
        RegistryError: the control file cannot be written.
    """
    now = clock.fs_now(root) if now is None else now
    selection = select_live(root, name, rank_filter, DEFAULT_RANK_FILTER, controller, now)
    targets = selection.targets
    stepless = [r for r in targets if r.cannot_trace]
    if stepless:
        raise RequestError(cannot_trace_message(name, stepless))
    # A watch without a baseline captures nothing now: a busy rank takes it all the same.
    watch_only = on_slowdown is not None and not baseline
    busy_ids = {r.request_id for r in targets if r.state in BUSY_STATES} if not watch_only else set()
    if busy_ids:
        # Name every live rank busy with those requests, not only the selected ones.
        busy = [r for r in selection.live if r.state in BUSY_STATES and r.request_id in busy_ids]
        raise busy_error(name, busy)

    warnings = [
        f"rank {r.rank} has the profiler disabled ([profiler] enable_profiler = false) and will refuse the request; "
        "set [profiler] enable_profiler = true in the job's config and restart it"
        for r in targets if not r.enabled
    ]
    live = selection.live
    if start_step is None:
        live = _with_step_rates(root, name, live, now)
        now = max(now, clock.fs_now(root))
    current = max(r.step for r in live)
    reached = math.floor(max(projected_step(r, now)[0] for r in live))
    paces = [step_rate(r) for r in live]
    rates = [rate for rate in paces if rate]
    if start_step is None:
        start_step, lead = plan_start_step(live, now, lead_steps)
        too_far = check_start_ahead(start_step, reached, max(rates, default=None))
        if too_far:
            raise RequestError(f"the planned start step is too far ahead: {too_far} (a rank polls too slowly?)")
        unpaced = [r.rank for r, rate in zip(live, paces, strict=True) if not rate and r.step == 0]
        if unpaced:
            warnings.append(unpaced_warning(unpaced, start_step))
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
    watch = on_slowdown is not None
    # A flag not given is the rank's config, not false: only the flags turned on are sent.
    request = ControlRequest(
        id=request_id, kind="watch" if watch else "trace", rank_filter=selection.rank_filter, start_step=start_step,
        active_steps=active_steps, warmup_steps=warmup_steps, wait_steps=wait_steps,
        record_shape=record_shape or None, profile_memory=profile_memory or None, with_stack=with_stack or None,
        with_modules=with_modules or None, factor=on_slowdown, consecutive=consecutive if watch else None,
        repeat=repeat if watch else None, baseline=baseline if watch else None,
    )
    check_request(request)
    effective, from_config, differ = effective_settings(request.to_json(), targets)
    warnings.extend(differ)
    path = registry.write_request(root, name, request)
    return SetResult(
        replica=name,
        request_id=request_id,
        request=request,
        control_path=storeurl.control_place(root, name, path),
        ranks=[r.rank for r in targets],
        skipped=selection.skipped,
        start_step=start_step,
        current_step=current,
        lead_steps=lead,
        warnings=warnings,
        message=SET_MESSAGE.format(name=name) if on_slowdown is None else WATCH_MESSAGE.format(
            name=name, factor=on_slowdown, consecutive=consecutive or DEFAULT_CONSECUTIVE,
            baseline=f"a baseline capture starts at step {start_step}" if baseline else "no baseline capture"),
        effective=effective,
        from_config=from_config,
    )


# --- profile cancel -----------------------------------------------------------------


@dataclass
class CancelResult(Written):
    """What `cancel_profile` wrote and whom it is for."""

    ranks: list[int]  # the live selected ranks that will answer
    busy: dict[int, str] = field(default_factory=dict)  # rank -> the request it was busy with
    skipped: dict[int, str] = field(default_factory=dict)  # selected, but not alive: why


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
        ReplicaNotFound, BadOption, RequestError: as `select_live`.
        RegistryError: the control file cannot be written.
    """
    now = clock.fs_now(root) if now is None else now
    selection = select_live(root, name, rank_filter, RankFilter.ALL_TEXT, controller, now)
    request_id = new_request_id(now)
    request = ControlRequest(id=request_id, kind="cancel", rank_filter=selection.rank_filter)
    path = registry.write_request(root, name, request)
    busy = {r.rank: r.request_id or "?" for r in selection.targets if r.state in BUSY_STATES}
    return CancelResult(replica=name, request_id=request_id, request=request, control_path=storeurl.control_place(root, name, path),
                        ranks=[r.rank for r in selection.targets], busy=busy, skipped=selection.skipped)


# --- profile stacks -----------------------------------------------------------------


@dataclass
class StacksResult(Written):
    """What `dump_stacks` asked for and what came back."""

    ranks: list[RankStacks]  # every selected rank, in rank order; `is_finished` tells which answered

    @property
    def answered(self) -> list[RankStacks]:
        return [r for r in self.ranks if r.is_finished]

    @property
    def unanswered(self) -> list[RankStacks]:
        return [r for r in self.ranks if not r.is_finished]


def request_stacks(
    root: Path,
    name: str,
    rank_filter: RankFilter | str | None = None,
    controller: list[ControllerReplica] | None = None,
    now: float | None = None,
    kind: str = "stacks",
) -> StacksResult:
    """Write a stacks request for `name`; the result has every selected rank
    pending, or dead/missing when it cannot answer. Kind "hang" (`profile hang`)
    asks for the flight recorder too, and is answered the same way.

    Raises:
        ReplicaNotFound, BadOption, RequestError: as `select_live`.
        RegistryError: the control file cannot be written.
    """
    now = clock.fs_now(root) if now is None else now
    selection = select_live(root, name, rank_filter, DEFAULT_STACKS_RANK_FILTER, controller, now)
    live = {r.rank for r in selection.targets}
    ranks: list[RankStacks] = []
    for rank in selection.selected:
        record = selection.records.get(rank)
        if record is None:
            ranks.append(RankStacks(rank, "missing", error=selection.skipped[rank]))
        elif rank in live:
            ranks.append(RankStacks(rank, PENDING, host=record.host, step=record.step, state=record.state))
        else:
            ranks.append(RankStacks(rank, "dead", host=record.host, step=record.step, state=record.state,
                                    error=selection.skipped[rank]))
    request_id = new_request_id(now)
    request = ControlRequest(id=request_id, kind=kind, rank_filter=selection.rank_filter)
    check_request(request)
    path = registry.write_request(root, name, request)
    return StacksResult(name, request_id, request, storeurl.control_place(root, name, path), ranks)


def dump_stacks(
    root: Path,
    name: str,
    rank_filter: RankFilter | str | None = None,
    controller: list[ControllerReplica] | None = None,
    timeout: float = DEFAULT_STACKS_TIMEOUT_S,
    observer: Any = None,
    kind: str = "stacks",
) -> StacksResult:
    """Ask every selected live rank of `name` for its threads' stacks and wait for them.

    Args:
        rank_filter: default "all".
        timeout: seconds; ranks that have not answered by then end as "timeout".
        observer: sees each waiting rank at each poll (`follow.Observer`).
        kind: "stacks", or "hang" for the stacks and the flight recorder (`sidecar.fleet.hang`).

    Returns:
        One `RankStacks` per selected rank, with its parsed dump when it answered.

    Raises:
        as `request_stacks`.
    """
    result = request_stacks(root, name, rank_filter, controller, kind=kind)
    result.ranks = wait_for_stacks(root, name, result.request_id, result.ranks, timeout, observer=observer,
                                   await_watchers=kind == "hang")
    return result
