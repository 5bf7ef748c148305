"""Step pace: how fast a rank has been stepping lately, and where to start a capture.

Pure functions over (time, step) samples; no I/O, no torch. A rank's
heartbeat thread samples its step counter every `SAMPLE_INTERVAL_S` (only at
its heartbeats once the counter stood still for `STILL_AFTER_S`), publishes
a few recent samples in its record (`recent_steps`, at least
`PUBLISHED_SPACING_S` apart, over the last `WINDOW_S`), and publishes early
when the steps run ahead of what the record says (`ran_ahead`). The CLI turns
the records into a start step (`plan_start`) that every selected rank reaches
only after it has seen the request.

Why samples and not an average: the lifetime average (steps / seconds since
start) lags behind a job that speeds up (a slow first phase, then 5x faster),
so the lead came out too short and ranks armed after the start step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
