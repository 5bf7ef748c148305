"""The lead rule: the step at which a capture starts, so that every selected rank has seen its
request before it reaches that step. Pure functions over rank records (no I/O, no torch): the
CLI's `profile set` (sidecar.fleet.control) and a rank's slowdown watch (sidecar.rank.slowdown) both plan with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sidecar import clock, pace
from sidecar.records import RankRecord

# The lead: how far past the replica's current step the capture starts, so
# that every selected rank has seen the request before the start step comes.
# For each rank: its projected step now plus the steps it runs, at its recent
# pace (sidecar.pace: the fastest pace between the (time, step) samples of its
# record), in LEAD_SECONDS plus the time it may take to see the request (its
# polling interval, or INOTIFY_LATENCY_S); the start is the latest of those,
# and at least MIN_LEAD_STEPS past the highest step. A polling rank (shared
# storage) may also see the file up to NETFS_CACHE_S late: the kernel's FUSE/NFS
# name cache can serve the replaced file's old entry that long. LEAD_SECONDS covers the
# CLI's own time and a pace that jumped since the record was written (a rank
# republishes within about pace.SAMPLE_INTERVAL_S when it runs ahead of its
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
    recent = pace.recent_rate([(float(t), int(n)) for t, n in record.recent_steps]) if record.recent_steps else None
    if recent is None:
        return average
    return max(recent, average or 0.0)


def projected_step(record: RankRecord, now: float) -> tuple[float, float]:
    """(the step `record`'s rank has probably reached now, its recent steps per second)."""
    rate = step_rate(record) or 0.0
    # The heartbeat runs on its own thread, so a record is at most about one
    # interval old; never project further than a few. Its age on the registry's
    # clock (`now` from clock.fs_now): a tick means no step since its last write.
    age = min(max(clock.record_age(record, now), 0.0), 3.0 * (record.heartbeat_interval or 2.0))
    return record.step + rate * age, rate


def trigger_latency(record: RankRecord) -> float:
    """How long `record`'s rank may take to see a new request."""
    return record.poll_interval + NETFS_CACHE_S if record.watch == "poll" else INOTIFY_LATENCY_S


def plan_start_step(records: Sequence[RankRecord], now: float, lead_steps: int | None = None) -> tuple[int, int]:
    """(start_step, lead) for a request that all of `records` should see in time (see LEAD_SECONDS);
    `now` on the registry filesystem's clock (`clock.fs_now`)."""
    paces = []
    for r in records:
        step, rate = projected_step(r, now)
        paces.append(pace.RankPace(rank=r.rank, step=step, rate=rate, latency_s=trigger_latency(r)))
    if lead_steps is not None:
        current = math.ceil(max(p.step for p in paces))
        return current + lead_steps, lead_steps
    return pace.plan_start(paces, LEAD_SECONDS, MIN_LEAD_STEPS)
