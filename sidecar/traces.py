"""Read saved Chrome traces without torch: find, summarize, merge, lay out for HTA.

This runs in the CLI on login nodes, so it imports only the standard library.
Traces can be hundreds of MB, so nothing here `json.load`s one: `TraceReader`
streams the `traceEvents` array one event at a time, and each consumer keeps
only what it needs (open spans per thread and totals per name for a summary,
a pid map for a merge).

    capture = find_captures(output_dir, "r1")        # latest capture: rank -> path
    summary = summarize(capture.paths.values())
    print(render_summary(summary))
    merge(capture.paths.values(), "r1.json.gz")       # one timeline, a process track per rank
    export_flat(capture.paths, "hta/r1-0")            # a folder HolisticTraceAnalysis reads
"""

from __future__ import annotations

import filecmp
import gzip
import io
import json
import math
import os
import re
import secrets
import shutil
import statistics
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from sidecar.errors import TraceError
from sidecar.registry import TEMP_MARK

__all__ = [
    "STRAGGLER_THRESHOLD",
    "Capture",
    "MergedTrace",
    "OpStat",
    "RankSummary",
    "ReplicaSummary",
    "StepTime",
    "Straggler",
    "TraceReader",
    "export_flat",
    "find_captures",
    "iter_events",
    "merge",
    "render_summary",
    "replicas_with_traces",
    "summarize",
    "trace_location",
]

# The layout the sidecar saves (sidecar.core owns it; core imports watchdog,
# which the CLI need not load, so it is repeated here and a test keeps the two equal).
TRACE_DIR = "profile_trace"
RANK_DIR_TEMPLATE = "{replica}_{rank}"
TRACE_TEMPLATE = "{n}_trace.json.gz"
_RANK_DIR_RE = re.compile(r"^(?P<replica>.+)_(?P<rank>\d+)$")
_TRACE_FILE_RE = re.compile(r"^(?P<n>\d+)_trace\.json(?:\.gz)?$")

# A rank is the straggler when its mean step time is at least this fraction
# above the median of the other ranks' means (0.10: 10% slower).
STRAGGLER_THRESHOLD = 0.10
TOP_K = 10

CHUNK_CHARS = 1 << 18
# One JSON value (an event, a metadata key) larger than this is taken for a broken file.
MAX_VALUE_CHARS = 64 << 20
CPU_OP_CATS = frozenset({"cpu_op", "operator"})  # "Operator" in kineto before torch 1.11
KERNEL_CATS = frozenset({"kernel"})
# Host-side categories: the pid with most of them is the rank's main process track.
_HOST_CATS = frozenset({"cpu_op", "operator", "user_annotation", "python_function", "cpu_instant_event"})
_STEP_RE = re.compile(r"ProfilerStep#(\d+)")
_WS = re.compile(r"[ \t\n\r]*")
_GZIP_MAGIC = b"\x1f\x8b"
# Phases whose "id" ties events together (flows, async spans). Ids are only
# unique within one trace, so a merge makes them distinct per rank.
_ID_PHASES = frozenset("stfbenSTFp")
_RANKED_SOURCES = ("distributedInfo", "cosmos_profiler")
_CPU, _KERNEL = 1, 2


# -- streaming reader ---------------------------------------------------------


class TraceReader:
    """Stream one Chrome trace (gzip or plain JSON) one event at a time.

    Reads the JSON Object Format (`{"traceEvents": [...], ...}`, what kineto
    writes) and the JSON Array Format (`[...]`). The top-level keys other than
    `traceEvents` land in `metadata`: those before the array once `header()`
    returns, all of them once `events()` is exhausted. Gzip is detected from
    the content, not the name.

        with TraceReader(path) as reader:
            reader.header()["baseTimeNanoseconds"]
            for event in reader.events():
                ...

    Memory is one chunk of text plus the value being decoded, whatever the
    file size: each event is decoded with `json.JSONDecoder.raw_decode` from a
    buffer that is refilled and compacted as it is consumed.

    Raises:
        TraceError: the file is missing, not UTF-8, a truncated or corrupt
            gzip, malformed or truncated JSON, or not a Chrome trace.
    """

    def __init__(self, path: str | os.PathLike[str], chunk_chars: int = CHUNK_CHARS) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self.num_events = 0
        self._chunk = max(1, int(chunk_chars))
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._offset = 0  # characters dropped from the front of _buf so far
        self._eof = False
        self._state = "start"  # start -> events -> done
        self._array_format = False
        self._has_events = False
        self._raw, self._text, self.is_gzip = _open_text(self.path)

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for f in (self._text, self._raw):
            try:
                f.close()
            except (OSError, EOFError, zlib.error):
                pass

    def header(self) -> dict[str, Any]:
        """Read up to the start of `traceEvents`; return the metadata seen so far."""
        if self._state == "start":
            ch = self._peek()
            if ch == "[":
                self._pos += 1
                self._array_format = self._has_events = True
                self._state = "events"
            elif ch == "{":
                self._pos += 1
                self._read_members(first=True)
            elif ch == "":
                raise TraceError(f"{self.path} is empty, not a Chrome trace")
            else:
                raise TraceError(
                    f"{self.path} is not a Chrome trace: it starts with {ch!r}, not a JSON object or array"
                )
        return self.metadata

    def events(self) -> Iterator[dict[str, Any]]:
        """Yield every event of `traceEvents` in file order, then read the trailing keys."""
        self.header()
        if self._state != "events":
            return
        first = True
        while True:
            ch = self._peek()
            if ch == "]":
                self._pos += 1
                break
            if not first:
                if ch != ",":
                    raise self._unexpected(ch, "',' or ']' between events", "the traceEvents array")
                self._pos += 1
                ch = self._peek()
            if ch == "":
                raise self._unexpected(ch, "an event", "the traceEvents array")
            event = self._value("an event in traceEvents")
            if not isinstance(event, dict):
                raise TraceError(
                    f"{self.path} is not a Chrome trace: event {self.num_events} of traceEvents is "
                    f"a JSON {_json_type(event)}, not an object"
                )
            first = False
            self.num_events += 1
            yield event
        self._state = "after"
        if self._array_format:
            self._finish()
        else:
            self._read_members(first=False)

    def read_metadata(self) -> dict[str, Any]:
        """All top-level keys, reading (and dropping) the events if they come first."""
        for _ in self.events():
            pass
        return self.metadata

    # -- the JSON structure around the events --------------------------------

    def _read_members(self, first: bool) -> None:
        """Read `"key": value` pairs of the top-level object until traceEvents or the closing brace."""
        expect_comma = not first
        while True:
            ch = self._peek()
            if ch == "}":
                self._pos += 1
                self._finish()
                return
            if expect_comma:
                if ch != ",":
                    raise self._unexpected(ch, "',' or '}' between top-level keys", "the top-level object")
                self._pos += 1
                ch = self._peek()
            if ch != '"':
                raise self._unexpected(ch, "a top-level key", "the top-level object")
            key = self._value("a top-level key")
            if self._peek() != ":":
                raise self._unexpected(self._peek(), f"':' after the key {key!r}", "the top-level object")
            self._pos += 1
            if key == "traceEvents":
                if self._has_events:
                    raise TraceError(f"{self.path} is not a valid Chrome trace: it has two traceEvents arrays")
                ch = self._peek()
                if ch != "[":
                    raise TraceError(f"{self.path} is not a Chrome trace: traceEvents is not an array")
                self._pos += 1
                self._has_events = True
                self._state = "events"
                return
            self.metadata[key] = self._value(f"the value of the top-level key {key!r}")
            expect_comma = True

    def _finish(self) -> None:
        self._state = "done"
        if self._peek() != "":
            raise TraceError(
                f"{self.path} is not a valid Chrome trace: extra data after the end of the trace "
                f"at character {self._offset + self._pos}"
            )
        if not self._has_events:
            raise TraceError(f"{self.path} is not a Chrome trace: it has no traceEvents array")

    # -- the buffer -------------------------------------------------------------

    def _read_more(self, at_least: int = 0) -> bool:
        if self._eof:
            return False
        try:
            data = self._text.read(max(self._chunk, at_least))
        except EOFError:
            raise TraceError(
                f"{self.path}: truncated gzip file: the compressed data ends early "
                "(was it copied or written only in part?)"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise TraceError(f"{self.path}: corrupt gzip data ({exc})") from None
        except UnicodeDecodeError as exc:
            what = "its gzip content is" if self.is_gzip else "it is"
            raise TraceError(
                f"{self.path} is not a Chrome trace: {what} not UTF-8 text (byte {exc.start} of a chunk)"
            ) from None
        except OSError as exc:
            raise TraceError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if not data:
            self._eof = True
            return False
        if self._pos:
            self._offset += self._pos
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
        else:
            self._buf += data
        return True

    def _peek(self) -> str:
        """Skip whitespace; the next character, or '' at the end of the file."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._read_more():
                return ""

    def _value(self, what: str) -> Any:
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except RecursionError:
                raise TraceError(
                    f"{self.path} is not a Chrome trace: {what} at character {self._offset + self._pos} nests too deep"
                ) from None
            except json.JSONDecodeError as exc:
                if not _may_continue(self._buf, exc):
                    raise self._malformed(what, exc) from None
                pending = len(self._buf) - self._pos
                if pending > MAX_VALUE_CHARS:
                    raise TraceError(
                        f"{self.path}: {what} at character {self._offset + self._pos} is malformed "
                        f"or larger than {MAX_VALUE_CHARS} characters ({exc.msg})"
                    ) from None
                if not self._read_more(pending):  # grow geometrically: one big value stays linear
                    raise TraceError(f"{self.path} is truncated: it ends in the middle of {what}") from None
                continue
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and _NUMBER_PART.fullmatch(self._buf, end)
                and self._read_more()
            ):
                continue  # a top-level number may go on in the next chunk ("0" then ".5")
            self._pos = end
            return value

    def _malformed(self, what: str, exc: json.JSONDecodeError) -> TraceError:
        return TraceError(
            f"{self.path} is not a valid Chrome trace: malformed JSON in {what} "
            f"at character {self._offset + exc.pos}: {exc.msg}"
        )

    def _unexpected(self, ch: str, expected: str, where: str) -> TraceError:
        if ch == "":
            return TraceError(f"{self.path} is truncated: it ends inside {where}")
        return TraceError(
            f"{self.path} is not a valid Chrome trace: expected {expected} at character "
            f"{self._offset + self._pos}, found {ch!r}"
        )


_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_PART = re.compile(r"[-+.eE0-9]*")


def _may_continue(buf: str, exc: json.JSONDecodeError) -> bool:
    """Could more text after `buf` make this failed decode succeed (the value is cut, not wrong)?"""
    if exc.msg.startswith("Unterminated"):
        return True  # a string or array without its end yet
    rest = buf[exc.pos :]
    # The scanner fails at most a literal's length before the end of a cut value.
    if len(rest) > 16:
        return False
    return (
        not rest
        or exc.msg.startswith("Invalid \\u")  # a \uXXXX escape cut short
        or any(lit.startswith(rest) for lit in _LITERALS)
        or bool(_NUMBER_PART.fullmatch(rest))
    )


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every event of one trace file, streamed (see `TraceReader`)."""
    with TraceReader(path) as reader:
        yield from reader.events()


def _open_text(path: Path) -> tuple[IO[bytes], IO[str], bool]:
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path} is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        is_gzip = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    binary: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw
    # utf-8-sig: json.load accepts a leading BOM in bytes, so do we.
    return raw, io.TextIOWrapper(binary, encoding="utf-8-sig"), is_gzip


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


# -- identity -------------------------------------------------------------------


@dataclass(frozen=True)
class _Identity:
    rank: int | None
    rank_source: str  # distributedInfo | cosmos_profiler | directory | position
    host: str | None
    replica: str | None
    role: str | None
    world_size: int | None
    request_id: str | None


def _identity(meta: Mapping[str, Any], path: Path) -> _Identity:
    """Who wrote a trace: distributedInfo, then the sidecar's metadata, then the `<replica>_<rank>` directory."""
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    ours = meta.get("cosmos_profiler")
    ours = ours if isinstance(ours, dict) else {}
    dir_match = _RANK_DIR_RE.match(path.parent.name)
    rank, source = _as_int(dist.get("rank")), "distributedInfo"
    if rank is None:
        rank, source = _as_int(ours.get("rank")), "cosmos_profiler"
    if rank is None and dir_match:
        rank, source = int(dir_match["rank"]), "directory"
    if rank is None:
        source = "position"
    host = ours.get("host") if isinstance(ours.get("host"), str) else None
    if host is None and isinstance(meta.get("host_name"), str):  # kineto writes host_name
        host = meta["host_name"]
    replica = ours.get("replica") if isinstance(ours.get("replica"), str) else None
    if replica is None and dir_match:
        replica = dir_match["replica"]
    world_size = _as_int(dist.get("world_size"))
    if world_size is None:
        world_size = _as_int(ours.get("world_size"))
    role = ours.get("role") if isinstance(ours.get("role"), str) else None
    request_id = ours.get("request_id") if isinstance(ours.get("request_id"), str) else None
    return _Identity(rank, source, host, replica, role, world_size, request_id)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _capture_index(path: Path) -> int | None:
    match = _TRACE_FILE_RE.match(path.name)
    return int(match["n"]) if match else None


def _as_paths(paths: Iterable[str | os.PathLike[str]] | Mapping[Any, str | os.PathLike[str]]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif isinstance(paths, Mapping):
        paths = list(paths.values())
    return [Path(p) for p in paths]


def _check_unique(ranks: list[tuple[int, Path]]) -> None:
    seen: dict[int, Path] = {}
    for rank, path in ranks:
        if rank in seen:
            raise TraceError(
                f"two traces are for rank {rank}: {seen[rank]} and {path}; "
                "pass one capture at a time (find_captures groups them)"
            )
        seen[rank] = path


# -- summary --------------------------------------------------------------------


@dataclass
class StepTime:
    """One captured `ProfilerStep#N` span."""

    step: int
    duration_us: float


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

    @property
    def mean_step_us(self) -> float | None:
        return statistics.fmean(s.duration_us for s in self.steps) if self.steps else None

    @property
    def step_numbers(self) -> list[int]:
        return [s.step for s in self.steps]


@dataclass
class Straggler:
    """The rank whose mean step time stands out from the others."""

    rank: int
    host: str | None
    mean_step_us: float
    others_median_us: float  # median of the other ranks' mean step times
    slowdown: float  # mean_step_us / others_median_us - 1 (0.25: 25% slower)


@dataclass
class ReplicaSummary:
    """One capture across ranks, and its straggler if any."""

    ranks: list[RankSummary]
    straggler: Straggler | None
    threshold: float = STRAGGLER_THRESHOLD
    top_k: int = TOP_K

    @property
    def replica(self) -> str | None:
        names = {r.replica for r in self.ranks}
        return names.pop() if len(names) == 1 else None

    @property
    def capture(self) -> int | None:
        indexes = {r.capture for r in self.ranks}
        return indexes.pop() if len(indexes) == 1 else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in microseconds)."""
        data = asdict(self)
        data["replica"], data["capture"] = self.replica, self.capture
        for rank, out in zip(self.ranks, data["ranks"], strict=True):
            out["mean_step_us"] = rank.mean_step_us
        return data


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
    key = (event.get("pid"), event.get("tid"))
    try:
        hash(key)
    except TypeError:
        key = repr(key)
    return float(ts), float(dur), name, code, key


class _RankScan:
    """Everything a summary needs from one trace, gathered one event at a time."""

    def __init__(self) -> None:
        self.steps: dict[int, float] = {}
        self.threads: dict[Any, _Thread] = {}
        self.names: dict[str, str] = {}

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
                self.steps[step] = max(dur, self.steps.get(step, 0.0))
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

    def top(self, code: int, k: int) -> tuple[list[OpStat], float]:
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


def _summarize_one(path: Path, position: int, top_k: int) -> RankSummary:
    scan = _RankScan()
    with TraceReader(path) as reader:
        for event in reader.events():
            scan.add(event)
        meta, num_events = reader.metadata, reader.num_events
    scan.finish(path)
    ident = _identity(meta, path)
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
        capture=_capture_index(path),
        num_events=num_events,
        steps=[StepTime(step, dur) for step, dur in sorted(scan.steps.items())],
        top_cpu_ops=top_cpu,
        top_kernels=top_kernels,
        cpu_op_self_us=cpu_self,
        kernel_us=kernel_us,
    )


def summarize(
    paths: Iterable[str | os.PathLike[str]] | Mapping[Any, str | os.PathLike[str]],
    top_k: int = TOP_K,
    threshold: float = STRAGGLER_THRESHOLD,
) -> ReplicaSummary:
    """Summarize one capture: step times and top operators per rank, and the straggler.

    Each trace is streamed once (twice when some thread's spans are out of
    time order; only that thread's spans are then held and sorted). Per rank: the host-side
    `ProfilerStep#N` spans ("X" events; `dur` in microseconds), and the top-k
    CPU ops (cat `cpu_op`) and CUDA kernels (cat `kernel`) by self time, where
    self time is a span's duration minus its direct children on the same
    pid/tid. A rank's identity comes from `distributedInfo.rank`, else the
    sidecar's `cosmos_profiler` metadata, else its `<replica>_<rank>`
    directory, else its position in `paths`.

    The straggler is the rank whose mean step time is the most above the
    median of the other ranks' means, if that is at least `threshold`
    (default 10%) above; with fewer than two ranks with steps there is none.

    Args:
        paths: trace files, one per rank (a mapping: its values).
        top_k: how many operators and kernels to keep per rank.
        threshold: the straggler threshold, as a fraction.

    Returns:
        A ReplicaSummary, ranks in rank order.

    Raises:
        TraceError: no paths, an unreadable or malformed trace, or two traces for one rank.
    """
    files = _as_paths(paths)
    if not files:
        raise TraceError("no traces to summarize")
    ranks = [_summarize_one(path, position, top_k) for position, path in enumerate(files)]
    _check_unique([(r.rank, Path(r.path)) for r in ranks])
    ranks.sort(key=lambda r: r.rank)
    return ReplicaSummary(ranks=ranks, straggler=find_straggler(ranks, threshold), threshold=threshold, top_k=top_k)


def find_straggler(ranks: Iterable[RankSummary], threshold: float = STRAGGLER_THRESHOLD) -> Straggler | None:
    """The rank whose mean step time is >= `threshold` above the median of the others', or None."""
    timed = [(r, r.mean_step_us) for r in ranks if r.steps]
    if len(timed) < 2:
        return None
    best: Straggler | None = None
    for rank, mean in timed:
        median = statistics.median(m for other, m in timed if other is not rank)
        if median <= 0:
            continue
        slowdown = mean / median - 1.0
        if slowdown >= threshold and (best is None or slowdown > best.slowdown):
            best = Straggler(rank.rank, rank.host, mean, median, slowdown)
    return best


def render_summary(summary: ReplicaSummary) -> str:
    """The summary as text for a terminal."""
    head = "trace summary"
    if summary.replica:
        head += f": replica {summary.replica}"
    if summary.capture is not None:
        head += f", capture {summary.capture}"
    lines = [f"{head}, {len(summary.ranks)} rank{'s' if len(summary.ranks) != 1 else ''}"]
    for r in summary.ranks:
        lines.append("")
        lines.append(f"rank {r.rank}{f' ({r.host})' if r.host else ''}  {r.path}")
        lines.append(f"  steps: {_render_steps(r.steps)}")
        lines.extend(_render_ops("CPU ops by self time", "CPU ops", r.top_cpu_ops, r.cpu_op_self_us))
        if r.top_kernels:
            lines.extend(_render_ops("CUDA kernels by time", "kernels", r.top_kernels, r.kernel_us))
        else:
            lines.append("  CUDA kernels: none in this trace")
    lines.append("")
    step_sets = {tuple(r.step_numbers) for r in summary.ranks if r.steps}
    if len(step_sets) > 1:
        lines.append(
            "note: the ranks captured different steps ("
            + ", ".join(f"rank {r.rank}: {_step_range(r.step_numbers)}" for r in summary.ranks)
            + "); a request with start_step captures the same steps everywhere"
        )
    requests = {r.request_id for r in summary.ranks}
    if len(requests) > 1:
        lines.append(
            "note: the traces come from different requests ("
            + ", ".join(f"rank {r.rank}: {r.request_id or '?'}" for r in summary.ranks)
            + ")"
        )
    pct = f"{summary.threshold:.0%}"
    s = summary.straggler
    if s is not None:
        lines.append(
            f"straggler: rank {s.rank}{f' ({s.host})' if s.host else ''}: mean step {_ms(s.mean_step_us)}, "
            f"{s.slowdown:.0%} slower than the median of the other ranks ({_ms(s.others_median_us)}); "
            f"threshold {pct}"
        )
    elif sum(1 for r in summary.ranks if r.steps) < 2:
        lines.append("straggler: none (it takes two ranks with captured steps)")
    else:
        lines.append(f"straggler: none (no rank's mean step time is {pct} or more above the median of the others)")
    return "\n".join(lines) + "\n"


def _ms(us: float) -> str:
    return f"{us / 1000.0:.3f} ms"


def _step_range(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"#{steps[0]}" if len(steps) == 1 else f"#{steps[0]}-#{steps[-1]}"


def _render_steps(steps: list[StepTime]) -> str:
    if not steps:
        return "none captured (no ProfilerStep#N spans)"
    durations = [s.duration_us for s in steps]
    if len(steps) <= 8:
        listed = ", ".join(f"#{s.step} {_ms(s.duration_us)}" for s in steps)
        return f"{listed}  (mean {_ms(statistics.fmean(durations))})"
    return (
        f"{len(steps)} steps {_step_range([s.step for s in steps])}: mean {_ms(statistics.fmean(durations))}, "
        f"min {_ms(min(durations))}, median {_ms(statistics.median(durations))}, max {_ms(max(durations))}"
    )


def _render_ops(title: str, what: str, ops: list[OpStat], all_self_us: float) -> list[str]:
    if not ops:
        return [f"  {title}: none"]
    lines = [f"  top {len(ops)} {title}, of {_ms(all_self_us)} in all {what}:", f"    {'self ms':>10} {'total ms':>10} {'calls':>7} {'self %':>7}  name"]
    for op in ops:
        share = op.self_us / all_self_us if all_self_us > 0 else 0.0
        lines.append(
            f"    {op.self_us / 1000:>10.3f} {op.total_us / 1000:>10.3f} {op.count:>7d} {share:>7.1%}  {op.name}"
        )
    return lines


# -- merge ------------------------------------------------------------------------


@dataclass
class MergedTrace:
    """What `merge` wrote."""

    path: Path
    ranks: list[int]
    num_events: int  # events other than metadata ("M"); the inputs' total
    shifts_us: dict[int, float]  # added to every ts of each rank
    base_time_ns: int | None  # the output's baseTimeNanoseconds


@dataclass
class _Source:
    path: Path
    ident: _Identity
    rank: int
    base_ns: int | None


def _read_source(path: Path, position: int) -> _Source:
    with TraceReader(path) as reader:
        meta = reader.header()
        ident = _identity(meta, path)
        if ident.rank_source not in _RANKED_SOURCES or "baseTimeNanoseconds" not in meta:
            meta = reader.read_metadata()  # the keys may follow the events
            ident = _identity(meta, path)
    base = meta.get("baseTimeNanoseconds")
    base_ns = int(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else None
    return _Source(path, ident, ident.rank if ident.rank is not None else position, base_ns)


_COMPACT = json.JSONEncoder(separators=(",", ":"))


class _EventWriter:
    """Writes events as the items of a JSON array, in batches (one write call per event is slow)."""

    BATCH = 512

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.first = True
        self.pending: list[str] = []

    def write(self, event: Mapping[str, Any]) -> None:
        self.pending.append(_COMPACT.encode(event))
        if len(self.pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.out.write(("" if self.first else ",\n") + ",\n".join(self.pending))
            self.first = False
            self.pending.clear()


def merge(
    paths: Iterable[str | os.PathLike[str]] | Mapping[Any, str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
) -> MergedTrace:
    """Merge one capture's traces into one Chrome/Perfetto trace, a process track per rank.

    Every input pid gets a new pid of its own, so ranks never share a track;
    the rank's main (host) process is named `rank N (host)` and its other
    processes (GPU devices, kineto's "Spans") `rank N (host) <their name>`,
    sorted by rank (`process_name` / `process_sort_index` metadata events
    replace the inputs' own). Flow and async ids are made distinct per rank
    so arrows never join two ranks. Every other event is kept as it is.

    Timestamps: kineto writes `ts` in microseconds relative to the trace's
    `baseTimeNanoseconds`; the absolute time of an event is
    `baseTimeNanoseconds + ts * 1000` ns. Two processes can have different
    bases, so the output takes the earliest base and adds
    `(base_i - base_out) / 1000` microseconds to every `ts` of input i: events
    that happened at the same instant line up, to the accuracy of the hosts'
    clock sync. An input without a base is not shifted.

    Streaming: each input's header is read first (the whole file when the
    header lacks its rank or `baseTimeNanoseconds`), then its events are
    written as they are read; only a pid map per input is held. Written as gzip when
    `out_path` ends in `.gz`, to a temp name renamed into place.

    Raises:
        TraceError: no paths, an unreadable or malformed trace, or two traces for one rank.
    """
    files = _as_paths(paths)
    if not files:
        raise TraceError("no traces to merge")
    sources = [_read_source(path, position) for position, path in enumerate(files)]
    _check_unique([(s.rank, s.path) for s in sources])
    sources.sort(key=lambda s: s.rank)
    bases = [s.base_ns for s in sources if s.base_ns is not None]
    base_out = min(bases) if bases else None
    shifts = {s.rank: (s.base_ns - base_out) / 1000.0 if s.base_ns is not None else 0.0 for s in sources}

    out_path = Path(out_path)
    header: dict[str, Any] = {"schemaVersion": 1, "displayTimeUnit": "ms"}
    if base_out is not None:
        header["baseTimeNanoseconds"] = base_out
    header["cosmos_profiler_merge"] = [
        {"rank": s.rank, "host": s.ident.host, "source": str(s.path), "shift_us": shifts[s.rank]} for s in sources
    ]
    num_events = 0

    def write(out: IO[str]) -> None:
        nonlocal num_events
        out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        writer = _EventWriter(out)
        next_pid = 1
        for slot, source in enumerate(sources):
            written, next_pid = _copy_rank(source, slot, len(sources), shifts[source.rank], writer, next_pid)
            num_events += written
        writer.flush()
        out.write("\n]}\n")

    _write_atomic(out_path, write)
    return MergedTrace(out_path, [s.rank for s in sources], num_events, shifts, base_out)


_SORT_STRIDE = 1000


def _copy_rank(
    source: _Source, slot: int, num_slots: int, shift: float, writer: _EventWriter, next_pid: int
) -> tuple[int, int]:
    """Stream one rank's events into `writer` with new pids; returns (events written, next free pid)."""
    pids: dict[Any, int] = {}
    names: dict[Any, str] = {}
    host_events: dict[Any, int] = {}
    first_ts: float | None = None
    written = 0
    for event in iter_events(source.path):
        ph = event.get("ph")
        pid = event.get("pid")
        key = pid if _hashable(pid) else repr(pid)
        if ph == "M" and event.get("name") in ("process_name", "process_sort_index"):
            args = event.get("args")
            if event.get("name") == "process_name" and isinstance(args, dict) and isinstance(args.get("name"), str):
                names[key] = args["name"]
            continue
        if "pid" in event:
            new = pids.get(key)
            if new is None:
                new = pids[key] = next_pid
                next_pid += 1
            event["pid"] = new
        ts = event.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            if shift:
                ts = event["ts"] = ts + shift
            if first_ts is None or ts < first_ts:
                first_ts = ts
        if isinstance(ph, str) and ph in _ID_PHASES and "id" in event:
            event["id"] = _remap_id(event["id"], slot, num_slots, source.rank)
        if ph != "M":
            written += 1
            cat = event.get("cat")
            if "pid" in event and isinstance(cat, str) and cat.lower() in _HOST_CATS:
                host_events[key] = host_events.get(key, 0) + 1
        writer.write(event)
    main = max(host_events, key=host_events.__getitem__) if host_events else next(iter(pids), None)
    label = f"rank {source.rank}" + (f" ({source.ident.host})" if source.ident.host else "")
    ts_meta = first_ts if first_ts is not None else 0
    for local, (key, new) in enumerate(pids.items(), start=1):
        what = names.get(key) or (str(key) if str(key).strip() else "global events")
        name = label if key == main else f"{label} {what}"
        order = slot * _SORT_STRIDE + (0 if key == main else min(local, _SORT_STRIDE - 1))
        writer.write({"ph": "M", "name": "process_name", "pid": new, "tid": 0, "ts": ts_meta, "args": {"name": name}})
        writer.write(
            {"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0, "ts": ts_meta, "args": {"sort_index": order}}
        )
    return written, next_pid


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _remap_id(value: Any, slot: int, num_slots: int, rank: int) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value * num_slots + slot
    if isinstance(value, str):
        return f"{value}.rank{rank}"
    return value


def _write_atomic(path: Path, write: Any) -> None:
    """Call `write(text_file)` on a temp file beside `path` (gzip for .gz), then rename it in."""
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as raw:
            if path.name.endswith(".gz"):
                # mtime=0: the same input gives the same bytes (export_flat compares them)
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                    with io.TextIOWrapper(gz, encoding="utf-8") as text:
                        write(text)
            else:
                with io.TextIOWrapper(raw, encoding="utf-8") as text:
                    write(text)
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- captures on disk and a flat folder for HTA --------------------------------------


@dataclass
class Capture:
    """One capture of one replica: its trace file per rank."""

    replica: str
    index: int  # n of `<n>_trace.json.gz`
    trace_root: Path  # the profile_trace directory
    paths: dict[int, Path]  # rank -> trace file
    available: list[int]  # every capture index found for the replica
    missing_ranks: list[int] = field(default_factory=list)  # ranks with traces, but none for this index


def find_captures(root: str | os.PathLike[str], replica: str, capture: int | None = None) -> Capture:
    """Find `<root>/profile_trace/<replica>_<rank>/<n>_trace.json.gz`, grouped by capture index n.

    Args:
        root: the job's output directory, its `profile_trace` directory, or one
            `<replica>_<rank>` directory in it.
        replica: the replica name.
        capture: the index n; None for the latest (the highest n on any rank).

    Note that n counts captures per rank: a request that selected only some
    ranks advances only their n. `RankSummary.request_id` tells which request
    each trace answered, and `render_summary` points out a mix.

    Raises:
        TraceError: no trace directory, no traces for the replica, or no such capture.
    """
    root = Path(root)
    if (root / TRACE_DIR).is_dir():
        trace_root = root / TRACE_DIR
    elif root.is_dir() and root.name != TRACE_DIR and _RANK_DIR_RE.match(root.name) and any(
        _TRACE_FILE_RE.match(p.name) for p in _listdir(root)
    ):
        trace_root = root.parent
    elif root.is_dir():
        trace_root = root
    else:
        raise TraceError(f"no traces under {root}: it is not a directory")
    by_rank: dict[int, dict[int, Path]] = {}
    replicas: set[str] = set()
    for rank_dir in _listdir(trace_root):
        match = _RANK_DIR_RE.match(rank_dir.name)
        if not match or not rank_dir.is_dir():
            continue
        replicas.add(match["replica"])
        if match["replica"] != replica:
            continue
        files = {}
        for f in _listdir(rank_dir):
            found = _TRACE_FILE_RE.match(f.name)
            if found and f.is_file():
                n = int(found["n"])
                # a plain .json beside a .json.gz of the same n: the sidecar writes .json.gz
                if n not in files or f.name.endswith(".gz"):
                    files[n] = f
        by_rank[int(match["rank"])] = files
    available = sorted({n for files in by_rank.values() for n in files})
    if not available:
        others = sorted(replicas - {replica})
        hint = f" (traces found for: {', '.join(others)})" if others else ""
        where = f"{trace_root}/{RANK_DIR_TEMPLATE.format(replica=replica, rank='<rank>')}"
        raise TraceError(f"no traces found for replica {replica!r} under {where}{hint}")
    index = available[-1] if capture is None else capture
    if index not in available:
        raise TraceError(
            f"replica {replica!r} has no capture {index}; captures: {', '.join(map(str, available))}"
        )
    paths = {rank: files[index] for rank, files in sorted(by_rank.items()) if index in files}
    missing = sorted(rank for rank, files in by_rank.items() if index not in files)
    return Capture(replica, index, trace_root, paths, available, missing)


def trace_location(path: str | os.PathLike[str]) -> tuple[str, int, int] | None:
    """(replica, rank, n) of a trace saved in the sidecar's layout,
    `.../<replica>_<rank>/<n>_trace.json.gz`; None for a file named otherwise."""
    path = Path(path)
    dir_match, file_match = _RANK_DIR_RE.match(path.parent.name), _TRACE_FILE_RE.match(path.name)
    if not (dir_match and file_match):
        return None
    return dir_match["replica"], int(dir_match["rank"]), int(file_match["n"])


def replicas_with_traces(root: str | os.PathLike[str]) -> list[str]:
    """The replicas with at least one trace under `root` (an output directory,
    or its `profile_trace` directory), sorted; [] when there are none.

    Raises:
        TraceError: `root` cannot be listed.
    """
    root = Path(root)
    trace_root = root / TRACE_DIR if (root / TRACE_DIR).is_dir() else root
    names = set()
    for rank_dir in _listdir(trace_root):
        match = _RANK_DIR_RE.match(rank_dir.name)
        if match and rank_dir.is_dir() and any(_TRACE_FILE_RE.match(f.name) and f.is_file() for f in _listdir(rank_dir)):
            names.add(match["replica"])
    return sorted(names)


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError as exc:
        raise TraceError(f"cannot list {path}: {exc.strerror or exc}") from None


def _is_hta_input(name: str) -> bool:
    # HolisticTraceAnalysis reads every file of a folder whose name ends so
    return name.endswith(".gz") or name.endswith(".json")


def export_flat(trace_paths_by_rank: Mapping[int, str | os.PathLike[str]], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Lay one capture out flat in `out_dir` for HolisticTraceAnalysis or Perfetto.

    One file per rank, `rank<k>.<n>_trace.json.gz` (the source name after the
    rank), as a hard link where the filesystem allows, else a symlink, else a
    copy. HTA (`TraceAnalysis(trace_dir=out_dir)`) reads every *.json / *.gz
    file in a folder and takes each one's rank from the first `"rank": N` in
    it, which kineto's `distributedInfo` or the sidecar's `cosmos_profiler`
    metadata provides. A trace that names no rank of its own is written as a
    streamed copy with `distributedInfo.rank` added, since a link cannot say it.
    Running it again with the same capture is a no-op.

    Args:
        trace_paths_by_rank: rank -> trace file (`Capture.paths`).
        out_dir: the folder; created if missing. One folder per capture.

    Returns:
        The files in `out_dir`, in rank order.

    Raises:
        TraceError: no traces; a source missing or not a trace; a trace that
            names another rank than its key; `out_dir` holding a different file
            under one of the names, or other trace files (HTA would read them
            as more ranks).
    """
    if not trace_paths_by_rank:
        raise TraceError("no traces to export")
    out_dir = Path(out_dir)
    plan: list[tuple[int, Path, Path, bool]] = []  # rank, source, target, needs a copy with distributedInfo
    for rank, src in sorted(trace_paths_by_rank.items()):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise TraceError(f"rank {rank!r} is not a rank number")
        src = Path(src)
        with TraceReader(src) as reader:
            ident = _identity(reader.header(), src)
            is_gzip = reader.is_gzip
        if ident.rank_source in _RANKED_SOURCES and ident.rank != rank:
            raise TraceError(f"{src} is the trace of rank {ident.rank} ({ident.rank_source}), not rank {rank}")
        stem = re.sub(r"(\.json)?(\.gz)?$", "", src.name) or "trace"
        target = out_dir / f"rank{rank}.{stem}.json{'.gz' if is_gzip else ''}"
        plan.append((rank, src, target, ident.rank_source not in _RANKED_SOURCES))
    targets = {target.name for _, _, target, _ in plan}
    if out_dir.exists():
        strays = sorted(p.name for p in _listdir(out_dir) if _is_hta_input(p.name) and p.name not in targets)
        if strays:
            raise TraceError(
                f"{out_dir} already holds other traces ({', '.join(strays)}); HTA reads every trace "
                "in a folder as one more rank, so export each capture to a folder of its own"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    for rank, src, target, needs_rank in plan:
        if needs_rank:
            _place_ranked_copy(src, target, rank)
        else:
            _place(src, target)
    return [target for _, _, target, _ in plan]


def _place(src: Path, target: Path) -> None:
    """Hard link, else symlink, else copy `src` at `target`; an identical file already there is fine."""
    if os.path.lexists(target):
        _check_same(src, target)
        return
    for make in (os.link, _symlink):
        try:
            make(src, target)
            return
        except FileExistsError:
            _check_same(src, target)
            return
        except OSError:
            continue  # another filesystem, or links not allowed: try the next way
    tmp = target.with_name(f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, target)
    except OSError as exc:
        _unlink(tmp)
        raise TraceError(f"cannot copy {src} to {target}: {exc.strerror or exc}") from None


def _symlink(src: Path, target: Path) -> None:
    os.symlink(os.path.abspath(src), target)


def _check_same(src: Path, target: Path) -> None:
    try:
        if os.path.samefile(src, target) or filecmp.cmp(src, target, shallow=False):
            return
    except OSError:
        pass
    raise TraceError(f"{target} already exists and is not {src}; not overwriting it")


def _place_ranked_copy(src: Path, target: Path, rank: int) -> None:
    """Stream `src` into `target` with `distributedInfo.rank` first in its header."""

    def write(out: IO[str]) -> None:
        with TraceReader(src) as reader:
            header = {"distributedInfo": {"rank": rank}}
            header.update((k, v) for k, v in reader.header().items() if k != "distributedInfo")
            out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
            writer = _EventWriter(out)
            for event in reader.events():
                writer.write(event)
            writer.flush()
            out.write("\n]")
            leading = set(header)
            for key, value in reader.metadata.items():
                if key not in leading:
                    out.write(f", {json.dumps(key)}: {json.dumps(value)}")
            out.write("}\n")

    if not os.path.lexists(target):
        _write_atomic(target, write)
        return
    fresh = target.with_name(f".new-{os.getpid()}-{target.name}")  # same suffix: same compression
    try:
        _write_atomic(fresh, write)
        _check_same(fresh, target)
    finally:
        _unlink(fresh)
