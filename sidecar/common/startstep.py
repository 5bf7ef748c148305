"""The start-step rule: the step at which a capture starts, so that every selected rank has seen
its request before it reaches that step.

Two halves, pure functions, no I/O and no torch:
- Pace. A rank's heartbeat thread samples its step counter every `SAMPLE_INTERVAL_S` (only at
  its heartbeats once the counter stood still for `STILL_AFTER_S`), publishes a few recent
  samples in its record (`recent_steps`, at least `PUBLISHED_SPACING_S` apart, over the last
  `WINDOW_S`), and publishes early when the steps run ahead of what the record says
  (`ran_ahead`).
- Lead. The CLI's `profile set` (sidecar.fleet.control) and a rank's slowdown watch
  (sidecar.rank.slowdown) turn records into a start step (`plan_start_step`, over `plan_start`)
  that every selected rank reaches only after it has seen the request.

Why samples and not an average: the lifetime average (steps / seconds since
start) lags behind a job that speeds up (a slow first phase, then 5x faster),
so the lead came out too short and ranks armed after the start step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.common import clock
from sidecar.common.records import RankRecord

Sample = tuple[float, int]  # (wall-clock time in seconds, step)

SAMPLE_INTERVAL_S = 0.1
STILL_AFTER_S = 2.0  # a step counter that did not move for this long is sampled at heartbeats only
PUBLISHED_SPACING_S = 0.25
WINDOW_S = 3.0
# A record is republished before its heartbeat is due when the rank ran this
# much further than the record's pace predicts (factor, and steps on top).
AHEAD_FACTOR = 1.5
AHEAD_MIN_STEPS = 3


def thin(samples: Sequence[Sample], spacing: float = PUBLISHED_SPACING_S, window: float = WINDOW_S) -> list[Sample]:
    """The newest sample, and older ones at least `spacing` apart within `window` of it, oldest first."""
    if not samples:
        return []
    newest_t = samples[-1][0]
    kept = [samples[-1]]
    for t, step in reversed(samples[:-1]):
        if newest_t - t > window:
            break
        if kept[-1][0] - t >= spacing:
            kept.append((t, step))
    kept.reverse()
    return kept


def recent_rate(samples: Sequence[Sample]) -> float | None:
    """Steps per second: the fastest pace between consecutive samples (a job that
    alternates fast and slow phases is planned for its fast one). None with fewer than two."""
    best: float | None = None
    for (t0, s0), (t1, s1) in zip(samples, samples[1:], strict=False):
        if t1 > t0:
            rate = max(0.0, (s1 - s0) / (t1 - t0))
            best = rate if best is None else max(best, rate)
    return best


def ran_ahead(published: Sequence[Sample], now: Sample) -> bool:
    """Whether the rank stepped clearly faster since `published` than their pace predicts."""
    rate = recent_rate(published)
    if rate is None:
        return False
    t0, s0 = published[-1]
    expected = rate * max(0.0, now[0] - t0)
    return now[1] - s0 > AHEAD_FACTOR * expected + AHEAD_MIN_STEPS


@dataclass(frozen=True)
class RankPace:
    """What the plan needs to know of one rank."""

    rank: int
    step: float  # the step it has probably reached now
    rate: float  # steps per second, lately
    latency_s: float  # how long it may take to see a request (its polling interval, or inotify's delay)


def plan_start(paces: Sequence[RankPace], lead_seconds: float, min_lead_steps: int) -> tuple[int, int]:
    """(start_step, lead in steps past the highest projected step).

    Each rank must see the request before it reaches the start step, so the
    start is the latest of `step + rate * (lead_seconds + latency_s)` over the
    ranks, and at least `min_lead_steps` past the highest step.
    """
    current = math.ceil(max(p.step for p in paces))
    needed = max(math.ceil(p.step + p.rate * (lead_seconds + p.latency_s)) for p in paces)
    start = max(current + min_lead_steps, needed)
    return start, start - current

# The lead: how far past the replica's current step the capture starts, so
# that every selected rank has seen the request before the start step comes.
# For each rank: its projected step now plus the steps it runs, at its recent
# pace (`recent_rate`: the fastest pace between the (time, step) samples of its
# record), in LEAD_SECONDS plus the time it may take to see the request (its
# polling interval, or INOTIFY_LATENCY_S); the start is the latest of those,
# and at least MIN_LEAD_STEPS past the highest step. A polling rank (shared
# storage) may also see the file up to NETFS_CACHE_S late: the kernel's FUSE/NFS
# name cache can serve the replaced file's old entry that long. LEAD_SECONDS covers the
# CLI's own time and a pace that jumped since the record was written (a rank
# republishes within about SAMPLE_INTERVAL_S when it runs ahead of its
# record). (`profile set` reads a rank with no pace in its record yet again after
# its next rewrite: sidecar.fleet.control.MAX_RATE_WAIT_S.)
MIN_LEAD_STEPS = 3
LEAD_SECONDS = 1.5
INOTIFY_LATENCY_S = 0.1
NETFS_CACHE_S = 1.0
MIN_RATE_WINDOW_S = 0.5


def step_rate(record: RankRecord) -> float | None:
    """`record`'s steps per second for planning (None when it has no pace yet): its
    recent pace, or its lifetime average where that is higher (a rank that stood
    still a while ago and steps again), or only the average (an older sidecar's record)."""
    window = record.heartbeat_at - record.started_at
    average = (record.step / window if record.step > 0 else 0.0) if window >= MIN_RATE_WINDOW_S else None
    recent = recent_rate([(float(t), int(n)) for t, n in record.recent_steps]) if record.recent_steps else None
    if recent is None:
        return average
    return max(recent, average or 0.0)


def standing_still(record: RankRecord, now: float) -> bool:
    """Whether `record`'s rank has not stepped for a while: no sample of its counter shows another
    step, and its last step (or, never having stepped, its start) is `STILL_AFTER_S` or more ago,
    by the record's age on the registry's clock (`now`: `clock.fs_now`). Its pace is known: none,
    so a plan need not wait for one (sidecar.fleet.control)."""
    if any(int(n) != record.step for _, n in record.recent_steps):
        return False
    stepped = record.last_step_at if record.last_step_at is not None else record.started_at
    return clock.step_age(record, now, stepped_at=max(stepped, record.started_at)) >= STILL_AFTER_S


def projected_step(record: RankRecord, now: float) -> tuple[float, float]:
    """(the step `record`'s rank may have reached now, its recent steps per second): its step, and
    the steps it may be past that without its record saying so (`step_slack`: a node record's
    pace anchor), run forward at its pace over the record's age."""
    rate = step_rate(record) or 0.0
    # The heartbeat runs on its own thread, so a record is at most about one
    # interval old; never project further than a few. Its age on the registry's
    # clock (`now` from clock.fs_now): a tick means no step since its last write.
    age = min(max(clock.record_age(record, now), 0.0), 3.0 * (record.heartbeat_interval or 2.0))
    return record.step + record.step_slack + rate * age, rate


def trigger_latency(record: RankRecord) -> float:
    """How long `record`'s rank may take to see a new request."""
    return record.poll_interval + NETFS_CACHE_S if record.watch == "poll" else INOTIFY_LATENCY_S


def plan_start_step(records: Sequence[RankRecord], now: float, lead_steps: int | None = None) -> tuple[int, int]:
    """(start_step, lead) for a request that all of `records` should see in time (see LEAD_SECONDS);
    `now` on the registry filesystem's clock (`clock.fs_now`)."""
    paces = []
    for r in records:
        step, rate = projected_step(r, now)
        paces.append(RankPace(rank=r.rank, step=step, rate=rate, latency_s=trigger_latency(r)))
    if lead_steps is not None:
        current = math.ceil(max(p.step for p in paces))
        return current + lead_steps, lead_steps
    return plan_start(paces, LEAD_SECONDS, MIN_LEAD_STEPS)
