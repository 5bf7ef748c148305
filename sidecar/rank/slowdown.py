"""The slowdown watch: a capture of the steps of a job that keeps going but gets slower.

    StepTimes      a rank's recent step durations: a fixed ring of WINDOW_STEPS, its median
                   recomputed once per window (a sort of 32 floats every 32 steps: O(1)
                   amortized on the training thread); steps being profiled or saved are left out
    SlowdownWatch  one arming on one rank: watching -> firing (K slow steps in a row) -> fired
                   (the replica's capture is asked for) -> watching again (`repeat`) or spent
    ask_for_capture  the watch's thread: the budget (disk, min interval), no capture while another
                   selected rank records or saves (its steps slow ours), the claim (O_EXCL: the
                   first rank wins, the others add none), the start step by the lead rule
                   (sidecar.common.startstep), and one trace request written to the replica's control file

Every selected rank sees that request through its file trigger, like any `profile set`, and
records the same steps; `reason` in the request says what fired it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.common import clock, layout, registry, startstep, storeurl
from sidecar.common.records import BUSY_STATES
from sidecar.common.recordscan import read_records
from sidecar.common.request import ControlRequest, ProfileRequest

log = logging.getLogger("sidecar")

WINDOW_STEPS = 32  # the median is over this many recent steps
MIN_STEPS = 8  # steps seen before the watch may fire
MEDIAN_EVERY = WINDOW_STEPS  # steps between two computations of the median (the first: at MIN_STEPS)
CLAIM_WAIT_S = 60.0  # a rank that lost the claim waits this long for the winner's request, then watches again
STALE_CLAIM_S = 600.0  # an always-on watch's claim this old is a previous run's (same job name)
STORE_CLAIM_KEEP_S = 86400  # a one-time watch's claim in a store: kept a day (its watch id is its own)


class StepTimes:
    """Recent step durations and their median; `observe` is the whole per-step cost."""

    def __init__(self, factor: float, consecutive: int, window: int = WINDOW_STEPS) -> None:
        self.factor = factor
        self.consecutive = consecutive
        self.ring: deque[float] = deque(maxlen=window)
        self.median: float | None = None
        self.steps_seen = 0
        self.run = 0  # slow steps in a row
        self._threshold = math.inf  # factor x median: a slower step is slow
        self._last: float | None = None
        self._since = MEDIAN_EVERY - MIN_STEPS  # the first median comes once MIN_STEPS steps are seen

    def observe(self, now: float, excluded: bool) -> float | None:
        """One step ended at `now` (seconds, any monotonic clock). Returns the step's duration when it
        completes `consecutive` slow steps in a row (and starts a new run), else None.

        Args:
            excluded: the step was profiled or ran beside a save: not a step of the job's own pace.
        """
        last = self._last
        self._last = now
        if last is None or excluded:
            self.run = 0
            return None
        seconds = now - last
        self.steps_seen += 1
        self.ring.append(seconds)
        since = self._since + 1
        if since >= MEDIAN_EVERY:
            since = 0
            self.set_median()
        self._since = since
        if seconds <= self._threshold:
            if self.run:
                self.run = 0
            return None
        self.run += 1
        if self.run < self.consecutive:
            return None
        self.run = 0
        return seconds

    def set_median(self, median: float | None = None) -> None:
        """The median of the ring (or `median`), and the threshold it sets."""
        if median is None:
            ordered = sorted(self.ring)
            mid = len(ordered) // 2
            median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        self.median = median
        self._threshold = self.factor * median


@dataclass
class Fire:
    """What fired the watch on this rank."""

    step: int
    seconds: float
    median: float


def fired_message(fire: Fire, first: int, last: int) -> str:
    """"step time 3.4x the median (115 ms vs 34 ms) at step 487; capturing 490-491"."""
    return (f"step time {fire.seconds / fire.median:.1f}x the median ({fire.seconds * 1000:.0f} ms vs "
            f"{fire.median * 1000:.0f} ms) at step {fire.step}; capturing {first}-{last}")


def uncaptured(fire: Fire, why: str) -> str:
    """"step time 3.4x the median at step 487: not captured, <why>": the watch's note."""
    return f"step time {fire.seconds / fire.median:.1f}x the median at step {fire.step}: not captured, {why}"


def captured_steps(request: ProfileRequest, start: int) -> tuple[int, int]:
    """The steps a trace request starting at `start` records (its active steps)."""
    first = start + request.wait_steps + request.warmup_steps
    return first, first + request.active_steps - 1


class SlowdownWatch:
    """One arming of the slowdown watch on one rank.

    States: "watching"; "firing" (this rank saw K slow steps, its thread asks for the capture);
    "waiting" (another rank claimed this capture: its request is on the way); "fired" (the
    capture's request came; watching again after its steps, while repeats are left); "spent";
    "cancelled". `always_on` (`[sidecar] slowdown_factor`) repeats without end, at most once per
    `min_interval_s`.

    Three threads move it: the training thread (`on_step`: watching -> firing), the watch's thread
    (`take_fire`, then waiting or watching) and the watcher thread (`on_request`: -> fired, from any
    state). The capture this rank asked for and the one another rank asked for are the same capture
    when both ranks slow down together, so each move is made under `_lock` from the state it
    expects: a capture that arrived first wins, and nobody asks for a second one.
    """

    def __init__(self, request: ProfileRequest, always_on: bool = False, min_interval_s: float = 0.0,
                 last_capture_at: float | None = None, times: StepTimes | None = None) -> None:
        assert request.factor is not None
        self.request = request
        self.id = request.id
        self.always_on = always_on
        self.min_interval_s = min_interval_s
        self.times = StepTimes(request.factor, request.consecutive)
        if times is not None:  # a new arming keeps what the last one learned of the pace
            self.times.ring.extend(times.ring)
            if times.median is not None:
                self.times.set_median(times.median)
        self.state = "watching"
        self.repeat_left = request.repeat
        self.num_fired = 0
        self.fire: Fire | None = None
        self.message: str | None = None  # what fired the last capture
        self.fired_request_id: str | None = None
        self.last_capture_at = last_capture_at
        self.note: str | None = None  # why a slowdown was not captured (budget), or the cancel
        self.under_floor = False  # the last fire found the disk under the floor (logged once, until it is not)
        self._resume_after: int | None = None
        self._waiting_until = 0.0
        # The claim the next fire takes: past every capture seen, and past a claim whose request never came
        # (a rank that died after its claim; an always-on watch's claim left by a previous run of the job).
        self.next_claim = 1
        self._lock = threading.Lock()

    @property
    def is_done(self) -> bool:
        return self.state in ("spent", "cancelled")

    def on_step(self, step: int, now: float, excluded: bool) -> bool:
        """The training thread, once a step. True: ask for a capture (wake the watch's thread)."""
        slow = self.times.observe(now, excluded)
        state = self.state
        if slow is None and state == "watching":
            return False
        if state != "watching":
            if state == "fired" and self._resume_after is not None and step > self._resume_after:
                self._resume()
            elif state == "waiting" and now > self._waiting_until:
                self.state = "watching"
                self.next_claim += 1
            return False
        if slow is None:
            return False
        fire = Fire(step, slow, self.times.median or slow)
        if self.always_on and self.last_capture_at is not None:
            ago = time.time() - self.last_capture_at
            if ago < self.min_interval_s:
                self.note = (f"{fired_message(fire, 0, 0).split(';')[0]}: not captured, the last capture was "
                             f"{ago:.0f}s ago (slowdown_min_interval_s = {self.min_interval_s:g})")
                return False
        with self._lock:  # rare: once per run of slow steps
            if self.state != "watching":  # the replica's capture arrived meanwhile (on_request)
                return False
            self.fire, self.state = fire, "firing"
        return True

    def _resume(self) -> None:
        if self.always_on:
            self.state = "watching"
        elif self.repeat_left > 0:
            self.repeat_left -= 1
            self.state = "watching"
        else:
            self.state = "spent"
        self.times.run = 0

    def take_fire(self) -> tuple[Fire, int] | None:
        """The watch's thread: what fired and the claim to take for it; None when no fire is pending
        (the replica's capture arrived first)."""
        with self._lock:
            if self.state != "firing" or self.fire is None:
                return None
            return self.fire, self.next_claim

    def await_request(self, now: float) -> None:
        """This capture is asked for (by this rank or another that claimed it first): its request is on the way.
        A no-op where it has arrived already."""
        with self._lock:
            if self.state == "firing":
                self.state, self._waiting_until = "waiting", now + CLAIM_WAIT_S

    def not_captured(self, why: str) -> None:
        """The budget said no, or the request could not be written: watch on (the next run of slow steps tries
        again). A no-op where the replica's capture has arrived."""
        with self._lock:
            if self.state in ("firing", "waiting"):
                self.note, self.fire, self.state = why, None, "watching"

    def is_ours(self, request: ProfileRequest) -> bool:
        return request.kind == "trace" and request.id.startswith(f"{self.id}.slow-")

    def on_request(self, request: ProfileRequest, step: int) -> None:
        """The capture this watch asked for (this rank's or another's) reached this rank."""
        try:
            n = int(request.id.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            n = self.num_fired + 1
        self.num_fired = max(self.num_fired, n)
        self.next_claim = max(self.next_claim, n + 1)
        start = request.start_step if request.start_step is not None else step
        with self._lock:
            # A slowdown left uncaptured before (`note`) is older news than this capture: `profile status`
            # shows the newer of the two.
            self.fired_request_id, self.message, self.fire, self.note = request.id, request.reason, None, None
            self.last_capture_at = time.time()
            self._resume_after = max(start, step) + request.num_steps
            self.state = "fired"

    def cancel(self, cancel_id: str) -> None:
        self.state, self.note = "cancelled", f"cancelled by request {cancel_id}"

    def to_json(self) -> dict[str, Any]:
        median = self.times.median
        return {
            "id": self.id, "state": self.state, "factor": self.times.factor, "consecutive": self.times.consecutive,
            "always_on": self.always_on, "repeat_left": None if self.always_on else self.repeat_left,
            "median_s": round(median, 6) if median is not None else None, "steps_seen": self.times.steps_seen,
            "num_fired": self.num_fired, "fired_request_id": self.fired_request_id, "message": self.message,
            "last_capture_at": self.last_capture_at, "note": self.note,
            "min_interval_s": self.min_interval_s if self.always_on else None,
        }


@dataclass
class WatchPlace:
    """Where a rank's watch writes and measures."""

    root: Path
    replica: str
    rank: int
    trace_dir: Path
    min_free_pct: float
    current_step: Callable[[], int]


def free_pct(path: Path) -> float:
    """Percent free on the filesystem of `path` (or of its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return 100.0 * usage.free / usage.total if usage.total else 100.0


def ask_for_capture(watch: SlowdownWatch, place: WatchPlace) -> str | None:
    """The watch's thread, after a fire: the budget, the claim, the start step, the request.

    Returns:
        The id of the request written, or None (the budget said no, another rank won, a write failed).
    """
    taken = watch.take_fire()
    if taken is None:
        return None
    fire, n = taken
    free = free_pct(place.trace_dir)
    if free < place.min_free_pct:
        watch.not_captured(uncaptured(fire, f"{free:.1f}% free under {place.trace_dir} (slowdown_min_free_pct = "
                                            f"{place.min_free_pct:g})"))
        # Once while the disk stays under the floor: a job that slows down every few steps would
        # otherwise get a line each time. The note (record, `profile status`) has the latest.
        if watch.under_floor:
            log.debug("[Profiler] rank %d: slowdown watch %s: %s", place.rank, watch.id, watch.note)
        else:
            watch.under_floor = True
            log.warning("[Profiler] rank %d: slowdown watch %s: %s; said once until the disk has room again",
                        place.rank, watch.id, watch.note)
        return None
    if watch.under_floor:
        watch.under_floor = False
        log.info("[Profiler] rank %d: slowdown watch %s: %.1f%% free under %s again; it captures", place.rank,
                 watch.id, free, place.trace_dir)
    request = watch.request
    records = [r for r in read_records(place.root, place.replica)
               if r.rank in request.rank_filter and r.exited_at is None]
    busy = next((r for r in records if r.rank != place.rank and r.state in BUSY_STATES
                 and not (r.request_id or "").startswith(f"{watch.id}.slow-")), None)
    if busy is not None:
        # Another rank records or saves (this watch's baseline, say): in synchronous training it
        # slows every rank, so these slow steps are the profiler's, not the job's.
        watch.not_captured(uncaptured(fire, f"rank {busy.rank} is {busy.state} for request {busy.request_id} "
                                            f"(a capture slows the other ranks too)"))
        log.debug("[Profiler] rank %d: slowdown watch %s: %s", place.rank, watch.id, watch.note)
        return None
    claim = layout.slowdown_claim_path(place.root, place.replica, watch.id, n)
    stale_s = STALE_CLAIM_S if watch.always_on else None
    if not _claim(claim, place.rank, stale_s) or not _store_claim(place.root, claim, place.rank, stale_s):
        watch.await_request(time.perf_counter())
        log.info("[Profiler] rank %d: slowdown watch %s: another rank asked for capture %d first",
                 place.rank, watch.id, n)
        return None
    now = clock.fs_now(place.root)
    step = max([place.current_step(), *(r.step for r in records)])
    start = startstep.plan_start_step(records, now)[0] if records else step + startstep.MIN_LEAD_STEPS
    start = max(start, step + startstep.MIN_LEAD_STEPS)
    first, last = captured_steps(request, start)
    request_id = f"{watch.id}.slow-{n}"
    body = ControlRequest.same_capture(request, id=request_id, kind="trace", start_step=start,
                                       reason=fired_message(fire, first, last))
    # Waiting before the write: this rank's own watcher may take the request (`on_request`) before
    # write_request returns, and what it sets must stand. A capture that arrived while this thread
    # claimed is the replica's one capture: asking for another would be refused on every rank.
    watch.await_request(time.perf_counter())
    if watch.state != "waiting":
        registry.unlink_quietly(claim)
        return None
    try:
        registry.write_request(place.root, place.replica, body)
    except Exception as exc:  # noqa: BLE001 - the watch's thread never dies of it
        watch.not_captured(f"could not write the capture request {request_id}: {exc}")
        log.error("[Profiler] rank %d: slowdown watch %s: %s", place.rank, watch.id, watch.note)
        registry.unlink_quietly(claim)
        return None
    log.info("[Profiler] rank %d: slowdown watch %s asks for capture %s: %s",
             place.rank, watch.id, request_id, body.reason)
    return request_id


def _claim(path: Path, rank: int, stale_s: float | None) -> bool:
    """Create `path` with O_EXCL: True for the first rank. A claim older than `stale_s` is taken over."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            if stale_s is None:
                return False
            try:
                if time.time() - os.lstat(path).st_mtime < stale_s:
                    return False
            except FileNotFoundError:
                continue
            registry.unlink_quietly(path)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{rank}\n")
        return True
    return False


def _store_claim(root: Path, claim: Path, rank: int, stale_s: float | None) -> bool:
    """Where the registry is a store (`storeurl.claimers`: a node's mirror of it), the claim taken there
    too, across nodes: True for the first rank of any node; also True where the store cannot answer
    (this node's claim stands: at worst two nodes ask for the same capture)."""
    claimer = storeurl.claimers.get(os.fspath(root))
    if claimer is None:
        return True
    try:
        return claimer(claim.relative_to(root).as_posix(), str(rank), int(stale_s or STORE_CLAIM_KEEP_S))
    except Exception:  # noqa: BLE001 - the watch's thread never dies of it
        log.debug("[Profiler] the store's claim failed; this node's stands", exc_info=True)
        return True


def always_on_request(factor: float, job: str, defaults: dict[str, Any]) -> ProfileRequest:
    """The watch `[sidecar] slowdown_factor` keeps armed: every rank, this rank's configured step
    counts, no baseline; its id is the same on every rank of one job (the claims are per job)."""
    import hashlib

    from sidecar.common.request import RankFilter

    digest = hashlib.sha256(job.encode()).hexdigest()[:10]
    values = dict(defaults, kind="watch", factor=factor, baseline=False, rank_filter=RankFilter(None))
    return ProfileRequest(id=f"auto-{digest}", **values)


def baseline_request(watch_request: ProfileRequest) -> ProfileRequest:
    """The capture an arming takes at once, for the slow one to be compared with."""
    return dataclasses.replace(watch_request, id=f"{watch_request.id}.baseline", kind="trace", factor=None)
