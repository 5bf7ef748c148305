"""Compute vs collective wait per step, and the straggler: the rank the others wait for.

In synchronous training (DDP, FSDP, tensor parallelism) every rank's step takes
as long as the slowest rank's: the others spend the difference waiting in a
collective. Step times therefore do not tell the ranks apart; the time each
rank spends in collectives does. The straggler is the rank that waits the
least while the others wait long.

    intervals = CollectiveIntervals()
    intervals.add(ts, dur)                       # every collective span of one trace, any thread, any order
    waits = intervals.wait_per_window(windows)   # [(ts, dur) of each ProfilerStep] -> wait in each
    verdict = find_straggler(summary.ranks)      # a Straggler; .rank is None when there is none

What counts as a collective (`is_collective`): spans named `gloo:*`, `nccl:*` and
`c10d::*`, and any span whose name holds `nccl` in any case (CUDA's NCCL kernels:
`ncclDevKernel_*`, `ncclKernel_*`). On CPU (gloo) the wait shows as `gloo:*`
spans on gloo's worker threads; the main thread's `c10d::allreduce_` is only the
enqueue and is short. On CUDA the wait is the NCCL kernels' time on the GPU
(they spin until the peers arrive). All of them are unioned, so nested or
parallel spans (a `c10d::` span around a `nccl:` one, two worker threads, a CPU
span over its kernel) count once.

How a span is attributed to a step: by time, not by thread. A step's window is
its host `ProfilerStep#N` span (the main thread); every collective interval of
the trace, on whatever thread or device, counts toward the windows it overlaps,
clipped to each window. A span that crosses a step boundary is split between
the two steps; time outside every step window is not counted. On gloo a
worker's span covers the whole collective, including time the main thread
spent computing while an async bucket all-reduce ran (DDP's backward), so the
wait is an upper bound; every rank shares that bias, and the verdict compares
ranks. Compute is the rest of the step: step time minus collective wait.

The verdict (`find_straggler`), on the median of each rank's per-step waits
(one hiccup in one step does not make a straggler): the candidate is the rank
with the least wait; it is the straggler when the median of the other ranks'
waits is above its own by at least the noise bound, max(NOISE_FRACTION x the
median step time, NOISE_FLOOR_US): 10% of a step, and at least 1 ms. Below that
the spread is noise: "no straggler". Where no trace holds a collective (the
ranks do not synchronise), the step times do tell the ranks apart, and the
straggler is the rank whose mean step time is STRAGGLER_THRESHOLD (10%) or more
above the median of the others'.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class StepDuration(Protocol):
    @property
    def duration_us(self) -> float: ...


class RankSummary(Protocol):
    """What the verdict reads of one rank's summary (`sidecar.traces.summary.RankSummary` has it)."""

    @property
    def rank(self) -> int: ...

    @property
    def host(self) -> str | None: ...

    @property
    def steps(self) -> Sequence[StepDuration]: ...

    @property
    def num_collectives(self) -> int: ...

    @property
    def mean_step_us(self) -> float | None: ...

    @property
    def median_wait_us(self) -> float | None: ...

__all__ = [
    "COLLECTIVE_PREFIXES",
    "NOISE_FLOOR_US",
    "NOISE_FRACTION",
    "STRAGGLER_THRESHOLD",
    "CollectiveIntervals",
    "Straggler",
    "find_straggler",
    "is_collective",
    "merge_intervals",
    "step_figure",
]

COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::")
# A wait gap under max(NOISE_FRACTION x the median step time, NOISE_FLOOR_US) is noise.
NOISE_FRACTION = 0.10
NOISE_FLOOR_US = 1000.0
# Without collectives: a rank is the straggler when its mean step time is at
# least this fraction above the median of the other ranks' means.
STRAGGLER_THRESHOLD = 0.10
# Collective intervals held before they are sorted and merged in place (memory stays bounded by
# the number of disjoint intervals, a few per step).
_COMPACT_AT = 1 << 16

BASIS_WAIT = "collective_wait"
BASIS_STEP_TIME = "step_time"
BASIS_NONE = "none"


def is_collective(name: str) -> bool:
    """Is a span of this name a collective (gloo, NCCL, c10d, or an NCCL kernel)?"""
    return name.startswith(COLLECTIVE_PREFIXES) or "nccl" in name.lower()


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) intervals as their union: sorted, disjoint, touching ones joined."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


class CollectiveIntervals:
    """Every collective span of one trace as (start, end), in any order; their union per step window."""

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []
        self.count = 0  # collective spans seen
        self._compact_at = _COMPACT_AT

    def add(self, ts: float, dur: float) -> None:
        self.count += 1
        if dur > 0:
            self._intervals.append((ts, ts + dur))
            if len(self._intervals) >= self._compact_at:
                self._intervals = merge_intervals(self._intervals)
                self._compact_at = max(_COMPACT_AT, 2 * len(self._intervals))  # linear overall

    def wait_per_window(self, windows: Sequence[tuple[float, float]]) -> list[float]:
        """Time covered by at least one collective inside each (ts, dur) window, in its units."""
        merged = self._intervals = merge_intervals(self._intervals)
        ends = [stop for _, stop in merged]
        waits = []
        for ts, dur in windows:
            end, covered = ts + dur, 0.0
            # the first interval that ends after the window starts (windows may come in any order)
            for i in range(bisect.bisect_right(ends, ts), len(merged)):
                start, stop = merged[i]
                if start >= end:
                    break
                covered += min(stop, end) - max(start, ts)
            waits.append(covered)
        return waits


@dataclass
class Straggler:
    """The verdict on one capture: the rank the others wait for, or none, and why.

    `basis` says which figure decided: "collective_wait" (the traces hold
    collectives: each rank's median collective wait per step), "step_time"
    (no collectives anywhere: each rank's mean step time) or "none" (fewer than
    two ranks with captured steps). `candidate` is the rank that came closest
    (the least wait, or the slowest steps); it is `rank` when the gap beat the
    noise bound, and `rank` is None otherwise. Times in microseconds.
    """

    rank: int | None
    basis: str
    reason: str
    host: str | None = None
    candidate: int | None = None
    candidate_us: float | None = None  # the candidate's figure (its wait, or its mean step)
    others_us: float | None = None  # the median of the other ranks' figures
    gap_us: float | None = None  # how far the candidate stands from the others
    noise_us: float | None = None  # a gap below this is noise
    also_low: list[int] | None = None  # other ranks whose wait is within the noise of the straggler's

    def to_json(self) -> dict[str, object]:
        """The verdict with times in seconds."""

        def s(us: float | None) -> float | None:
            return None if us is None else us / 1e6

        return {
            "rank": self.rank, "host": self.host, "basis": self.basis, "reason": self.reason,
            "candidate": self.candidate, "candidate_s": s(self.candidate_us), "others_s": s(self.others_us),
            "gap_s": s(self.gap_us), "noise_s": s(self.noise_us), "also_low": list(self.also_low or []),
        }


def find_straggler(
    ranks: Iterable[RankSummary],
    noise_fraction: float = NOISE_FRACTION,
    noise_floor_us: float = NOISE_FLOOR_US,
    threshold: float = STRAGGLER_THRESHOLD,
) -> Straggler:
    """The rank the others wait for, or none (see the module docstring for the rule)."""
    timed = [r for r in ranks if r.steps]
    if len(timed) < 2:
        return Straggler(None, BASIS_NONE, "it takes two ranks with captured steps")
    if not any(r.num_collectives for r in timed):
        return _by_step_time(timed, threshold)
    waits = {r.rank: step_figure(r.median_wait_us) for r in timed}
    best = min(timed, key=lambda r: (waits[r.rank], r.rank))
    others = statistics.median(waits[r.rank] for r in timed if r is not best)
    step = statistics.median(statistics.median(s.duration_us for s in r.steps) for r in timed)
    noise = max(noise_fraction * step, noise_floor_us)
    gap = others - waits[best.rank]
    head = (f"rank {best.rank} waits {_ms(waits[best.rank])} per step in collectives, the other "
            f"{'rank' if len(timed) == 2 else 'ranks'} {_ms(others)} (median per step)")
    bound = f"the noise bound {_ms(noise)} ({noise_fraction:.0%} of the {_ms(step)} step, at least {_ms(noise_floor_us)})"
    verdict = Straggler(None, BASIS_WAIT, "", best.host, best.rank, waits[best.rank], others, gap, noise)
    if gap < noise:
        verdict.reason = f"{head}: {_ms(max(gap, 0.0))} apart, within {bound}"
        return verdict
    verdict.rank = best.rank
    verdict.also_low = [r.rank for r in timed if r is not best and waits[r.rank] - waits[best.rank] < noise]
    verdict.reason = f"the others wait for it: {head}, {_ms(gap)} more, above {bound}"
    if verdict.also_low:
        low = ", ".join(map(str, verdict.also_low))
        verdict.reason += (f"; rank {low} also waits little and may be slow too" if len(verdict.also_low) == 1
                           else f"; ranks {low} also wait little and may be slow too")
    if not best.num_collectives:
        verdict.reason += "; its trace holds no collective ops at all: was it captured like the others?"
    return verdict


def _by_step_time(timed: Sequence[RankSummary], threshold: float) -> Straggler:
    """No collectives: the ranks do not wait for each other, so the slowest steps are the straggler's."""
    means = {r.rank: step_figure(r.mean_step_us) for r in timed}
    verdict = Straggler(None, BASIS_STEP_TIME, "")
    slowdown = -float("inf")
    slowest: tuple[RankSummary, float] | None = None  # the rank the most above the others, and their median
    for rank in timed:
        median = statistics.median(means[o.rank] for o in timed if o is not rank)
        if median <= 0:
            continue
        if means[rank.rank] / median - 1.0 > slowdown:  # as a ratio
            slowdown = means[rank.rank] / median - 1.0
            slowest = rank, median
    if slowest is None:
        verdict.reason = "no rank has a step time to compare"
        return verdict
    rank, others = slowest
    verdict.host, verdict.candidate = rank.host, rank.rank
    verdict.candidate_us, verdict.others_us = means[rank.rank], others
    verdict.gap_us, verdict.noise_us = means[rank.rank] - others, threshold * others
    head = (f"no collectives in the traces, so step times decide: rank {rank.rank}'s mean step is "
            f"{_ms(means[rank.rank])}, the median of the others' {_ms(others)}")
    if slowdown >= threshold:
        verdict.rank = verdict.candidate
        verdict.reason = f"{head}: {slowdown:.0%} slower, at or above the threshold {threshold:.0%}"
    else:
        verdict.reason = f"{head}: {max(slowdown, 0.0):.0%} slower, under the threshold {threshold:.0%}"
    return verdict


def step_figure(value: float | None) -> float:
    """A per-step figure (mean step, median wait) of a rank with captured steps: None only without steps."""
    assert value is not None, "a rank with captured steps has its per-step figures"
    return value


def _ms(us: float) -> str:
    return f"{us / 1000.0:.3f} ms"
