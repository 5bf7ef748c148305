"""Summarize one capture: step times, compute vs collective wait, top ops and kernels per rank, and the straggler.

    result = summarize(capture.paths.values())    # a TraceSummary, ranks in rank order
    print(sidecar.cli.render_traces.summary_text(result))   # the CLI's text
    result.to_json()                              # what `profile summary --json` prints

`summarize_traces` is what `profile summary` calls: `find_traces`, then `summarize_found` (the
traces, and the summaries the ranks published for traces out of reach: `rank_of_summary`).

Each trace is streamed once: `_RankScan` nests each thread's spans as they come
and totals self time per name, and gathers the collective spans that
`traces.straggler` splits each step by (compute vs collective wait) and judges
the straggler from. The text the CLI shows is `sidecar.cli.render_traces`'; the
notes on what makes ranks hard to compare (`summary_notes`) are data both the CLI
and the HTML page show.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common.capturesummary import SUMMARY_FORMAT, check, is_cut
from sidecar.common.exceptions import TraceError
from sidecar.common.request import RankFilter
from sidecar.common.roster import ControllerReplica
from sidecar.traces.catalog import FoundCapture, find_traces
from sidecar.traces.reader import TraceReader, as_paths, capture_index, check_unique, identity_of, iter_events
from sidecar.traces.straggler import (
    NOISE_FLOOR_US,
    NOISE_FRACTION,
    STRAGGLER_THRESHOLD,
    CollectiveIntervals,
    Straggler,
    find_straggler,
    is_collective,
)

__all__ = [
    "NOISE_FLOOR_US",
    "NOISE_FRACTION",
    "STRAGGLER_THRESHOLD",
    "TOP_K",
    "OpStat",
    "RankSummary",
    "StepTime",
    "Straggler",
    "TraceSummary",
    "find_straggler",
    "step_range",
    "rank_of_summary",
    "summarize",
    "summarize_found",
    "summary_notes",
    "summary_object",
    "summarize_traces",
]

TOP_K = 10

CPU_OP_CATS = frozenset({"cpu_op", "operator"})  # "Operator" in kineto before torch 1.11
KERNEL_CATS = frozenset({"kernel"})
_STEP_RE = re.compile(r"ProfilerStep#(\d+)")
_CPU, _KERNEL = 1, 2


@dataclass
class StepTime:
    """One captured `ProfilerStep#N` span, and how much of it the rank spent in collectives."""

    step: int
    duration_us: float
    collective_wait_us: float = 0.0  # the union of the collective spans inside the step's window

    @property
    def compute_us(self) -> float:
        return max(0.0, self.duration_us - self.collective_wait_us)


@dataclass
class OpStat:
    """One operator or kernel name, totalled over a trace. Times in microseconds."""

    name: str
    count: int
    self_us: float  # duration minus direct children on the same pid/tid
    total_us: float  # inclusive duration


@dataclass
class RankSummary:
    """What one rank's trace says: its steps and where their time went."""

    rank: int
    path: str
    rank_source: str  # where `rank` came from: distributedInfo | cosmos_profiler | directory | position
    host: str | None = None
    replica: str | None = None
    role: str | None = None
    world_size: int | None = None
    request_id: str | None = None
    capture: int | None = None  # n of `<n>_trace.json.gz`
    num_events: int = 0
    steps: list[StepTime] = field(default_factory=list)
    top_cpu_ops: list[OpStat] = field(default_factory=list)
    top_kernels: list[OpStat] = field(default_factory=list)
    cpu_op_self_us: float = 0.0  # self time of every CPU op (for shares)
    kernel_us: float = 0.0  # time of every CUDA kernel
    num_collectives: int = 0  # collective spans in the trace (gloo:*, nccl:*, c10d::*, NCCL kernels)
    # "trace": read from the trace file; "summary": from the summary in the rank's record (its trace is
    # out of reach: another machine's disk). Where `upload_s3` sends the trace, and whether it got there.
    source: str = "trace"
    upload_url: str | None = None
    trace_url: str | None = None
    upload_error: str | None = None

    @property
    def upload_state(self) -> str | None:
        """Where `upload_s3` took its trace, as the text report and the HTML page say it: "uploaded
        to URL", "not uploaded: why", "being uploaded to URL"; None where nothing uploads it."""
        if self.trace_url:
            return f"uploaded to {self.trace_url}"
        if self.upload_error:
            return f"not uploaded: {self.upload_error}"
        if self.upload_url:
            return f"being uploaded to {self.upload_url}"
        return None

    @property
    def mean_step_us(self) -> float | None:
        return statistics.fmean(s.duration_us for s in self.steps) if self.steps else None

    @property
    def mean_wait_us(self) -> float | None:
        """Mean collective wait per step."""
        return statistics.fmean(s.collective_wait_us for s in self.steps) if self.steps else None

    @property
    def median_wait_us(self) -> float | None:
        """Median collective wait per step (what the straggler verdict compares)."""
        return statistics.median(s.collective_wait_us for s in self.steps) if self.steps else None

    @property
    def mean_compute_us(self) -> float | None:
        """Mean compute per step: step time minus collective wait."""
        return statistics.fmean(s.compute_us for s in self.steps) if self.steps else None

    @property
    def step_numbers(self) -> list[int]:
        return [s.step for s in self.steps]


@dataclass
class TraceSummary:
    """One capture across ranks, and the straggler verdict (`straggler.rank` is None when there is none)."""

    ranks: list[RankSummary]
    straggler: Straggler
    threshold: float = STRAGGLER_THRESHOLD
    top_k: int | None = TOP_K
    noise_fraction: float = NOISE_FRACTION
    noise_floor_us: float = NOISE_FLOOR_US

    @property
    def from_summaries(self) -> list[int]:
        """The ranks read from the summaries in their records, not from their traces."""
        return [r.rank for r in self.ranks if r.source == "summary"]

    @property
    def replica(self) -> str | None:
        names = {r.replica for r in self.ranks}
        return names.pop() if len(names) == 1 else None

    @property
    def capture(self) -> int | None:
        indexes = {r.capture for r in self.ranks}
        return indexes.pop() if len(indexes) == 1 else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the fields (times in microseconds, `*_us`), and the split of each step
        into compute and collective wait and the verdict in seconds (`*_s`)."""
        data = asdict(self)
        data["replica"], data["capture"] = self.replica, self.capture
        data["from_summaries"] = self.from_summaries
        data["straggler"] = self.straggler.to_json()
        data["noise_floor_s"] = data.pop("noise_floor_us") / 1e6
        for rank, out in zip(self.ranks, data["ranks"], strict=True):
            out["mean_step_us"] = rank.mean_step_us
            out["step_s"] = _seconds(rank.mean_step_us)
            out["compute_s"] = _seconds(rank.mean_compute_us)
            out["collective_wait_s"] = _seconds(rank.mean_wait_us)
            out["collective_wait_median_s"] = _seconds(rank.median_wait_us)
            for step, step_out in zip(rank.steps, out["steps"], strict=True):
                step_out.update(duration_s=step.duration_us / 1e6, compute_s=step.compute_us / 1e6,
                                collective_wait_s=step.collective_wait_us / 1e6)
        return data


def _seconds(us: float | None) -> float | None:
    return None if us is None else us / 1e6


class _Thread:
    """Open spans of one pid/tid, and per-name totals of the closed ones.

    Spans must arrive in (ts, -dur) order, so a parent comes before its
    children; each closed span's self time is its duration minus its direct
    children's.
    """

    __slots__ = ("stack", "last", "stats", "is_ordered")

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [end, code, name, dur, children_dur]
        self.last = (-math.inf, -math.inf)
        self.stats: dict[int, dict[str, list[Any]]] = {_CPU: {}, _KERNEL: {}}
        self.is_ordered = True

    def push(self, ts: float, dur: float, code: int, name: str) -> None:
        stack = self.stack
        while stack and stack[-1][0] <= ts:
            self._close(stack.pop())
        if stack:
            stack[-1][4] += dur
        stack.append([ts + dur, code, name, dur, 0.0])

    def finish(self) -> None:
        while self.stack:
            self._close(self.stack.pop())

    def _close(self, frame: list[Any]) -> None:
        _, code, name, dur, children = frame
        if not code:
            return
        self_us = max(0.0, dur - children)
        totals = self.stats[code].get(name)
        if totals is None:
            self.stats[code][name] = [1, self_us, dur]
        else:
            totals[0] += 1
            totals[1] += self_us
            totals[2] += dur


def _span(event: Mapping[str, Any]) -> tuple[float, float, str, int, Any] | None:
    """(ts, dur, name, category code, thread key) of a complete ("X") event, else None."""
    if event.get("ph") != "X":
        return None
    ts, dur = event.get("ts"), event.get("dur")
    if not (isinstance(ts, (int, float)) and isinstance(dur, (int, float))) or isinstance(ts, bool):
        return None
    if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
        return None
    name = event.get("name")
    name = name if isinstance(name, str) else str(name)
    cat = event.get("cat")
    cat = cat.lower() if isinstance(cat, str) else ""
    code = _CPU if cat in CPU_OP_CATS else _KERNEL if cat in KERNEL_CATS else 0
    key: Any = (event.get("pid"), event.get("tid"))  # hashable, or its repr
    try:
        hash(key)
    except TypeError:
        key = repr(key)
    return float(ts), float(dur), name, code, key


class _RankScan:
    """Everything a summary needs from one trace, gathered one event at a time."""

    def __init__(self) -> None:
        self.steps: dict[int, tuple[float, float]] = {}  # step -> (ts, dur) of its host span
        self.threads: dict[Any, _Thread] = {}
        self.names: dict[str, str] = {}
        self.collectives = CollectiveIntervals()

    def add(self, event: Mapping[str, Any]) -> None:
        span = _span(event)
        if span is None:
            return
        ts, dur, name, code, key = span
        if name.startswith("ProfilerStep#"):
            match = _STEP_RE.fullmatch(name)
            cat = event.get("cat")
            # the GPU side mirrors each step as gpu_user_annotation; the host span is the step
            if match and not (isinstance(cat, str) and cat.startswith("gpu_")):
                step = int(match[1])
                if dur >= self.steps.get(step, (0.0, 0.0))[1]:
                    self.steps[step] = (ts, dur)
        elif is_collective(name):
            self.collectives.add(ts, dur)
        thread = self.threads.get(key)
        if thread is None:
            thread = self.threads[key] = _Thread()
        if not thread.is_ordered:
            return
        order = (ts, -dur)
        if order < thread.last:
            # Out of order: this thread is redone from a sorted second read.
            thread.is_ordered = False
            thread.stack.clear()
            return
        thread.last = order
        thread.push(ts, dur, code, self.names.setdefault(name, name))

    def finish(self, path: Path) -> None:
        unordered = {key for key, thread in self.threads.items() if not thread.is_ordered}
        for thread in self.threads.values():
            if thread.is_ordered:
                thread.finish()
        if unordered:
            self._redo_sorted(path, unordered)

    def _redo_sorted(self, path: Path, keys: set[Any]) -> None:
        """Second read for threads whose spans were not in order: buffer just their spans, sort, nest."""
        spans: dict[Any, list[tuple[float, float, int, str]]] = {key: [] for key in keys}
        for event in iter_events(path):
            span = _span(event)
            if span is not None and span[4] in spans:
                ts, dur, name, code, key = span
                spans[key].append((ts, -dur, code, self.names.setdefault(name, name)))
        for key, items in spans.items():
            items.sort(key=lambda item: (item[0], item[1]))
            thread = _Thread()
            for ts, neg_dur, code, name in items:
                thread.push(ts, -neg_dur, code, name)
            thread.finish()
            self.threads[key] = thread

    def top(self, code: int, k: int | None) -> tuple[list[OpStat], float]:
        totals: dict[str, list[Any]] = {}
        for thread in self.threads.values():
            for name, (count, self_us, total_us) in thread.stats[code].items():
                acc = totals.get(name)
                if acc is None:
                    totals[name] = [count, self_us, total_us]
                else:
                    acc[0] += count
                    acc[1] += self_us
                    acc[2] += total_us
        ranked = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))
        top = [OpStat(name, count, self_us, total_us) for name, (count, self_us, total_us) in ranked[:k]]
        return top, sum(acc[1] for acc in totals.values())


def _summarize_one(path: Path, position: int, top_k: int | None) -> RankSummary:
    scan = _RankScan()
    with TraceReader(path) as reader:
        for event in reader.events():
            scan.add(event)
        meta, num_events = reader.metadata, reader.num_events
    scan.finish(path)
    ident = identity_of(meta, path)
    windows = sorted(scan.steps.items())
    waits = scan.collectives.wait_per_window([window for _, window in windows])
    top_cpu, cpu_self = scan.top(_CPU, top_k)
    top_kernels, kernel_us = scan.top(_KERNEL, top_k)
    return RankSummary(
        rank=ident.rank if ident.rank is not None else position,
        path=str(path),
        rank_source=ident.rank_source,
        host=ident.host,
        replica=ident.replica,
        role=ident.role,
        world_size=ident.world_size,
        request_id=ident.request_id,
        capture=capture_index(path),
        num_events=num_events,
        steps=[StepTime(step, dur, wait) for (step, (_, dur)), wait in zip(windows, waits, strict=True)],
        top_cpu_ops=top_cpu,
        top_kernels=top_kernels,
        cpu_op_self_us=cpu_self,
        kernel_us=kernel_us,
        num_collectives=scan.collectives.count,
    )


def summarize(
    paths: Iterable[str | os.PathLike[str]] | Mapping[Any, str | os.PathLike[str]],
    top_k: int | None = TOP_K,
    threshold: float = STRAGGLER_THRESHOLD,
    carried: Sequence[RankSummary] = (),
) -> TraceSummary:
    """Summarize one capture: step times, compute vs collective wait and top operators per rank, and the straggler.

    Each trace is streamed once (twice when some thread's spans are out of
    time order; only that thread's spans are then held and sorted). Per rank: the host-side
    `ProfilerStep#N` spans ("X" events; `dur` in microseconds), and the top-k
    CPU ops (cat `cpu_op`) and CUDA kernels (cat `kernel`) by self time, where
    self time is a span's duration minus its direct children on the same
    pid/tid. A rank's identity comes from `distributedInfo.rank`, else the
    sidecar's `cosmos_profiler` metadata, else its `<replica>_<rank>`
    directory, else its position in `paths`.

    Each step is split into collective wait (the union of the trace's
    collective spans inside the step's window, on any thread or device) and
    compute (the rest); the straggler is the rank the others wait for: the
    least collective wait while the others wait long (`traces.straggler` has
    the rules, the noise bound and the fallback to step times when the traces
    hold no collectives, with `threshold`).

    Args:
        paths: trace files, one per rank (a mapping: its values).
        top_k: how many operators and kernels to keep per rank; None: every one (what `traces.diff` compares).
        threshold: without collectives, the step-time straggler threshold, as a fraction.
        carried: ranks already summarized, whose traces are out of reach (`rank_of_summary` of the
            summaries they published): judged with the others.

    Returns:
        A TraceSummary, ranks in rank order.

    Raises:
        TraceError: no paths, an unreadable or malformed trace, or two traces for one rank.
    """
    files = as_paths(paths)
    if not files and not carried:
        raise TraceError("no traces to summarize")
    ranks = [_summarize_one(path, position, top_k) for position, path in enumerate(files)] + list(carried)
    check_unique([(r.rank, Path(r.path)) for r in ranks])
    ranks.sort(key=lambda r: r.rank)
    return TraceSummary(ranks=ranks, straggler=find_straggler(ranks, threshold=threshold), threshold=threshold,
                        top_k=top_k)


def summary_notes(summary: TraceSummary) -> list[str]:
    """What makes the ranks hard to compare: different steps, different requests."""
    notes = []
    step_sets = {tuple(r.step_numbers) for r in summary.ranks if r.steps}
    if len(step_sets) > 1:
        notes.append(
            "the ranks captured different steps ("
            + ", ".join(f"rank {r.rank}: {step_range(r.step_numbers)}" for r in summary.ranks)
            + "); a request with start_step captures the same steps everywhere"
        )
    requests = {r.request_id for r in summary.ranks}
    if len(requests) > 1:
        notes.append(
            "the traces come from different requests ("
            + ", ".join(f"rank {r.rank}: {r.request_id or '?'}" for r in summary.ranks)
            + ")"
        )
    return notes


def step_range(steps: list[int]) -> str:
    """#3 for one step, #3-#7 for several, "none" for none."""
    if not steps:
        return "none"
    return f"#{steps[0]}" if len(steps) == 1 else f"#{steps[0]}-#{steps[-1]}"


def summarize_traces(
    target: str,
    root: Path | None = None,
    capture: int | None = None,
    top_k: int = TOP_K,
    controller: list[ControllerReplica] | None = None,
) -> tuple[FoundCapture, TraceSummary]:
    """`find_traces`, then `summarize` of what it found.

    Raises:
        as `find_traces`; TraceError: a trace cannot be read.
    """
    found = find_traces(target, root, capture, controller)
    return found, summarize_found(found, top_k=top_k)


def summarize_found(found: FoundCapture, top_k: int | None = TOP_K) -> TraceSummary:
    """`summarize` of what `find_traces` found: its trace files, and the summaries its ranks' records
    carry for the ranks whose traces are out of reach; each rank's upload (`upload_s3`) as its record
    tells it. Where a carried summary holds fewer ops than `top_k` asks for, `found.warnings` says so.

    Raises:
        TraceError: a trace cannot be read, or a carried summary is no summary.
    """
    carried = []
    if found.summaries:
        ranks = sorted(found.summaries)
        many = len(ranks) > 1
        found.warnings.append(f"rank{'s' if many else ''} {RankFilter(frozenset(ranks))}: "
                              f"{'their traces are' if many else 'its trace is'} not on this machine; read from the "
                              f"summar{'ies' if many else 'y'} {'they published' if many else 'it published'}")
    for rank, summary in sorted(found.summaries.items()):
        try:
            carried.append(rank_of_summary(summary, top_k))
        except ValueError as exc:
            raise TraceError(f"rank {rank} published a summary of capture {found.capture} that cannot be "
                             f"read: {exc}") from None
        cut = [what for what, key in (("CPU ops", "top_cpu_ops"), ("CUDA kernels", "top_kernels"))
               if is_cut(summary, key) and (top_k is None or len(summary[key]) < top_k)]
        if cut:
            found.warnings.append(f"rank {rank}'s summary keeps its top {len(summary['top_cpu_ops'])} CPU ops and "
                                  f"top {len(summary['top_kernels'])} CUDA kernels (of {summary['num_cpu_ops']} and "
                                  f"{summary['num_kernels']}): its {' and '.join(cut)} beyond those are not known here")
        if is_cut(summary, "steps"):
            found.warnings.append(f"rank {rank}'s summary keeps {len(summary['steps'])} of its "
                                  f"{summary['num_steps']} steps: its means are theirs")
    result = summarize(found.paths, top_k=top_k, carried=carried)
    for r in result.ranks:
        upload = found.uploads.get(r.rank)
        if upload is not None and r.source == "trace":
            r.upload_url, r.trace_url, r.upload_error = (
                upload.get("upload_url"), upload.get("trace_url"), upload.get("upload_error"))
    return result


def summary_object(rank: RankSummary) -> dict[str, Any]:
    """One rank's summary as `sidecar.common.capturesummary` shapes it (a summary file's object),
    from a RankSummary of every op (`summarize(..., top_k=None)`)."""
    return {
        "summary_format": SUMMARY_FORMAT, "rank": rank.rank, "rank_source": rank.rank_source, "host": rank.host,
        "replica": rank.replica, "role": rank.role, "world_size": rank.world_size, "request_id": rank.request_id,
        "capture": rank.capture, "trace_path": rank.path, "num_events": rank.num_events,
        "steps": [[s.step, s.duration_us, s.collective_wait_us] for s in rank.steps], "num_steps": len(rank.steps),
        "top_cpu_ops": _op_rows(rank.top_cpu_ops), "num_cpu_ops": len(rank.top_cpu_ops),
        "top_kernels": _op_rows(rank.top_kernels), "num_kernels": len(rank.top_kernels),
        "cpu_op_self_us": rank.cpu_op_self_us, "kernel_us": rank.kernel_us,
        "num_collectives": rank.num_collectives, "compact": False,
    }


def _op_rows(ops: Sequence[OpStat]) -> list[list[Any]]:
    return [[op.name, op.count, op.self_us, op.total_us] for op in ops]


def rank_of_summary(summary: Any, top_k: int | None = None) -> RankSummary:
    """A RankSummary again from a summary's object (a file's, or a record's: checked here), with its
    `top_k` ops and kernels (None: all it holds); its `source` is "summary".

    Raises:
        ValueError: not a summary (says why).
    """
    s = check(summary)
    return RankSummary(
        rank=s["rank"], path=s["trace_path"], rank_source=s["rank_source"], host=s.get("host"),
        replica=s.get("replica"), role=s.get("role"), world_size=s.get("world_size"),
        request_id=s.get("request_id"), capture=s.get("capture"), num_events=s["num_events"],
        steps=[StepTime(step, float(dur), float(wait)) for step, dur, wait in s["steps"]],
        top_cpu_ops=[OpStat(n, c, float(a), float(b)) for n, c, a, b in s["top_cpu_ops"][:top_k]],
        top_kernels=[OpStat(n, c, float(a), float(b)) for n, c, a, b in s["top_kernels"][:top_k]],
        cpu_op_self_us=float(s["cpu_op_self_us"]), kernel_us=float(s["kernel_us"]),
        num_collectives=s["num_collectives"], source="summary", upload_url=s.get("upload_url"),
        trace_url=s.get("trace_url"), upload_error=s.get("upload_error"),
    )
