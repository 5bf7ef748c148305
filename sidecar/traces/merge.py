"""Merge one capture's traces into one Chrome/Perfetto timeline, a process track per rank.

    merge(capture.paths.values(), "r1.json.gz")   # a MergedTrace: ranks, events, clock shifts

Streams: only a pid map per input is held. `merge_traces` is what `profile
merge` calls: `find_traces`, then `merge`. The writers here (`EventWriter`,
`write_output`) also serve `sidecar.traces.export` and `sidecar.traces.htmlreport`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

from sidecar.common.exceptions import BadOption, TraceError
from sidecar.common.registry import atomic_write
from sidecar.common.roster import ControllerReplica
from sidecar.traces.catalog import find_traces, traces_only
from sidecar.traces.reader import (
    RANKED_SOURCES,
    TraceIdentity,
    TraceReader,
    as_paths,
    check_unique,
    identity_of,
    iter_events,
)

__all__ = ["MergeResult", "MergedTrace", "merge", "merge_traces"]

# Host-side categories: the pid with most of them is the rank's main process track.
_HOST_CATS = frozenset({"cpu_op", "operator", "user_annotation", "python_function", "cpu_instant_event"})
# Phases whose "id" ties events together (flows, async spans). Ids are only
# unique within one trace, so a merge makes them distinct per rank.
_ID_PHASES = frozenset("stfbenSTFp")


@dataclass
class MergedTrace:
    """What `merge` wrote."""

    path: Path
    ranks: list[int]
    num_events: int  # events other than metadata ("M"); the inputs' total
    shifts_us: dict[int, float]  # added to every ts of each rank
    base_time_ns: int | None  # the output's baseTimeNanoseconds


@dataclass
class MergeResult:
    """What `merge_traces` wrote."""

    replica: str | None
    capture: int | None
    path: str
    ranks: list[int]
    num_events: int
    shifts_us: dict[int, float]
    base_time_ns: int | None
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Source:
    path: Path
    ident: TraceIdentity
    rank: int
    base_ns: int | None


def _read_source(path: Path, position: int) -> _Source:
    with TraceReader(path) as reader:
        meta = reader.header()
        ident = identity_of(meta, path)
        if ident.rank_source not in RANKED_SOURCES or "baseTimeNanoseconds" not in meta:
            meta = reader.read_metadata()  # the keys may follow the events
            ident = identity_of(meta, path)
    base = meta.get("baseTimeNanoseconds")
    base_ns = int(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else None
    return _Source(path, ident, ident.rank if ident.rank is not None else position, base_ns)


_COMPACT = json.JSONEncoder(separators=(",", ":"))


class EventWriter:
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
    files = as_paths(paths)
    if not files:
        raise TraceError("no traces to merge")
    sources = [_read_source(path, position) for position, path in enumerate(files)]
    check_unique([(s.rank, s.path) for s in sources])
    sources.sort(key=lambda s: s.rank)
    bases = [s.base_ns for s in sources if s.base_ns is not None]
    base_out = min(bases) if bases else None
    shifts = {s.rank: (s.base_ns - base_out) / 1000.0 if s.base_ns is not None and base_out is not None else 0.0
              for s in sources}

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
        writer = EventWriter(out)
        next_pid = 1
        for slot, source in enumerate(sources):
            written, next_pid = _copy_rank(source, slot, len(sources), shifts[source.rank], writer, next_pid)
            num_events += written
        writer.flush()
        out.write("\n]}\n")

    write_output(out_path, write)
    return MergedTrace(out_path, [s.rank for s in sources], num_events, shifts, base_out)


_SORT_STRIDE = 1000


def _copy_rank(
    source: _Source, slot: int, num_slots: int, shift: float, writer: EventWriter, next_pid: int
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


def write_output(path: Path, write: Callable[[IO[str]], object]) -> None:
    """Call `write(text_file)` into `path` (gzip for .gz) by `registry.atomic_write`: a temp
    file beside it, renamed in; the folder is made if missing, the mode is as `open()` gives.

    Raises:
        TraceError: the folder or the file cannot be written (naming it).
    """

    def encode(raw: BinaryIO) -> None:
        if path.name.endswith(".gz"):
            # mtime=0: the same input gives the same bytes (export_flat compares them)
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                with io.TextIOWrapper(gz, encoding="utf-8") as text:
                    write(text)
        else:
            with io.TextIOWrapper(raw, encoding="utf-8") as text:
                write(text)

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, encode, mode=None)
    except OSError as exc:
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None


def merge_traces(
    target: str,
    out_path: str | os.PathLike[str],
    root: Path | None = None,
    capture: int | None = None,
    controller: list[ControllerReplica] | None = None,
) -> MergeResult:
    """`find_traces`, then `merge` into `out_path` (gzip for `.gz`).

    Raises:
        as `find_traces`; TraceError: a trace cannot be read or the output cannot be written.
    """
    found = traces_only(find_traces(target, root, capture, controller))
    if found.holds(out_path):
        raise BadOption("output", f"{out_path} is one of the traces to merge; write the merge elsewhere")
    merged = merge(found.paths, os.path.abspath(out_path))
    return MergeResult(found.replica, found.capture, str(merged.path), merged.ranks, merged.num_events,
                       merged.shifts_us, merged.base_time_ns, found.warnings)
