"""Rank records: what each rank publishes about itself, and the one safe way to read one.

    <registry>/replicas/<replica>/rank-<k>.json

A record is read with O_NONBLOCK|O_NOFOLLOW, from regular files only, size-capped,
and checked field by field against `RankRecord` (types, ranges): a bad file is a
`RecordError`, never a traceback or a hang. Scans of a replica's records (the rank of
each file name checked too) are `sidecar.common.recordscan`'s.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import stat
import time
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, cast

from sidecar.common import clock
from sidecar.common.layout import record_path
from sidecar.common.registry import atomic_write, ensure_dir


class State(str, Enum):
    """A rank's state, as its record spells it (a `str`: `State.ARMED == "armed"`)."""

    IDLE = "idle"
    ARMED = "armed"
    TRACING = "tracing"
    SAVING = "saving"
    ERROR = "error"
    # Not a capture state: the record says "stalled" while the stall watch (sidecar.rank.stall,
    # `[sidecar] stall_after_s`) sees no training step; the capture state returns with the steps.
    STALLED = "stalled"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# A request is in flight: another one is refused (a cancel is the way out).
BUSY_STATES = (State.ARMED, State.TRACING, State.SAVING)


@dataclass
class RankRecord:
    """What one rank publishes about itself. JSON on disk; unknown keys are kept out."""

    replica: str
    role: str
    rank: int
    local_rank: int = 0
    world_size: int = 1
    host: str = ""
    pid: int = 0
    create_time: float = 0.0
    started_at: float = 0.0
    heartbeat_at: float = 0.0
    heartbeat_interval: float = 2.0
    # The rank refreshes an unchanged record by setting the file's mtime to now (one
    # utime, not a rewrite; the filesystem's clock, not the rank's): see sidecar.common.clock.
    mtime_heartbeat: bool = False
    step: int = 0
    state: str = "idle"
    enabled: bool = True
    watch: str = ""
    poll_interval: float = 1.0
    defaults: dict[str, Any] | None = None  # this rank's request defaults, from its config
    output_dir: str = ""
    request_id: str | None = None
    request: dict[str, Any] | None = None
    selected: bool | None = None
    misaligned: bool = False
    capture_start_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    cancelled: bool = False  # the request in request_id was cancelled (disarmed, or stopped early)
    cancel: dict[str, Any] | None = None  # the last cancel this rank handled: id, request_id, outcome, step, at, trace_path
    recent_steps: list[list[float]] = field(default_factory=list)  # [[time, step], ...]: sidecar.common.startstep samples
    last_step_at: float | None = None  # when the step counter last moved, as the heartbeat saw it (~0.1 s)
    trace_path: str | None = None
    stacks_path: str | None = None
    memory_path: str | None = None
    num_captures: int = 0
    num_requests: int = 0
    num_refused: int = 0
    num_signals: int = 0
    # The signal that asks this rank for a capture, as `kill -s` takes it ("SIGUSR1", "SIGRTMIN+3");
    # None when none does (off, or the job handles it). Records older than this field read as None.
    signal: str | None = None
    num_coalesced: int = 0
    error: str | None = None
    refused: str | None = None
    exited_at: float | None = None
    version: str = ""
    job: str = ""  # what all ranks of one job share (identity.job_identity)
    # Another live process that writes this rank's record too (a second job under
    # this replica name): {"pid", "host", "job", "seen_at"}; None when there is none.
    conflict: dict[str, Any] | None = None
    # How the CLI takes this rank's stacks while a C call holds the GIL (sidecar.rank.faulthandler_stacks arms it, sidecar.fleet.signal_stacks asks):
    # {"signal": int, "path": str, "main": main thread ident, "threads": {ident: name}}; None when off.
    fault_stacks: dict[str, Any] | None = None
    stall_after_s: float = 0.0  # the stall watch (0: off); state is "stalled" while one lasts
    # The current or last stall (sidecar.rank.stall): step, since, at, seconds, stacks_path, flightrec_path,
    # flightrec, gil_held, ended_at (None while it lasts).
    stall: dict[str, Any] | None = None
    # [train.ckpt] upload_s3 (sidecar.rank.upload): where this rank uploads its traces (s3://bucket/prefix/
    # profile_trace/; None: it does not), the object of the last trace uploaded, and why the
    # last upload failed (None once one succeeds). Each outcome is also a history entry
    # {"upload": trace path, "url": ...} or {"upload": trace path, "upload_error": ...}.
    upload_to: str | None = None
    trace_url: str | None = None
    upload_error: str | None = None

    # How this rank counts training steps: "step()" (the training loop calls it), "optimizer"
    # (torch's optimizer step hook), "none" (it cannot: see cannot_trace); "" from an older sidecar.
    counts_steps_by: str = ""
    # Why this rank refuses trace and memory requests (it cannot count steps); None: it takes them.
    cannot_trace: str | None = None
    # The slowdown watch (sidecar.rank.slowdown), current or last: id, state, factor, consecutive, always_on,
    # repeat_left, median_s, steps_seen, num_fired, fired_request_id, message, last_capture_at, note.
    slowdown: dict[str, Any] | None = None

    # Not a field: the mtime of the file this record was read from (`read_record`), on the
    # filesystem's clock, which liveness is judged by (sidecar.common.clock); None when built in memory.
    # Unannotated, so that the dataclass leaves it out of its fields; the cast gives it its type.
    file_mtime = cast("float | None", None)

    def to_json(self) -> bytes:
        # A shallow dict: asdict() would deep-copy the history on every heartbeat.
        return (json.dumps({name: getattr(self, name) for name in _RECORD_FIELDS}, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankRecord:
        """Parse and check a record field by field.

        Raises:
            ValueError: not JSON, not an object, a required field missing, or a
                field of the wrong type or out of range (the message names it).
        """
        try:
            obj = _loads(data)
        except RecursionError:
            raise ValueError("it is nested too deeply to be a rank record") from None
        if not isinstance(obj, dict):
            raise ValueError(f"it holds a JSON {type(obj).__name__}, not an object")
        # The common case, without a call per field (10,000 records for `replica ls`):
        # records of one sidecar share their keys and the types of their values, so
        # what to check is worked out once per such signature (`_Plan`), and then only
        # the ranges of its numbers and the lists and objects are looked at.
        if len(obj) == len(_TEMPLATE):
            # A record that names every field and nothing else (any sidecar's own): its
            # values go into a copy of a dict of all fields (keys in one order, and the
            # field names themselves rather than the parser's 48 new strings per record,
            # so attribute lookups compare pointers), and its signature is their types.
            fields = _TEMPLATE.copy()
            fields.update(obj)
            if len(fields) == len(_TEMPLATE):
                kinds = tuple(map(type, fields.values()))
                plan = _COMPLETE_PLANS.get(kinds)
                if plan is None:
                    plan = _Plan((_FIELD_ORDER, kinds))
                    if len(_COMPLETE_PLANS) < MAX_PLANS:
                        _COMPLETE_PLANS[kinds] = plan
                if not plan.passes(fields):
                    _check_all(obj)  # raises ValueError, naming the first bad field
                record = cls.__new__(cls)
                record.__dict__ = fields
                return record
        signature = (tuple(obj), tuple(map(type, obj.values())))
        plan = _PLANS.get(signature)
        if plan is None:
            plan = _Plan(signature)
            if len(_PLANS) < MAX_PLANS:
                _PLANS[signature] = plan
        if plan.unknown:  # a newer sidecar's record: keep what we know
            obj = {k: v for k, v in obj.items() if k in _RECORD_FIELDS}
        if not plan.passes(obj):
            _check_all(obj)  # raises ValueError, naming the first bad field
        # What the dataclass __init__ does for a checked object, at a seventh of its
        # cost: the defaults (fresh lists for default factories), then the fields read.
        record = cls.__new__(cls)
        fields = record.__dict__
        fields.update(_DEFAULTS)
        for name, factory in _FACTORIES:
            if name not in obj:
                fields[name] = factory()
        fields.update(obj)
        return record

    def is_stale(self, now: float | None = None) -> bool:
        """`clock.is_stale`; `now` on the record file's filesystem's clock (`clock.fs_now`)."""
        return clock.is_stale(self, time.time() if now is None else now)


# json.loads of bytes first guesses their encoding and wraps the scanner in two calls
# and two regex matches, a third of its cost on a record. A record as a sidecar writes
# it (UTF-8, "{" first, nothing after the object but a newline) goes to the scanner
# directly; anything else, and any failure, takes json.loads, for its value or its error.
class _Scanner(Protocol):
    """The scanner JSONDecoder sets on itself (undeclared in typeshed): (value, end) at an index."""

    def scan_once(self, string: str, index: int, /) -> tuple[Any, int]: ...


_scan_json = cast(_Scanner, json.JSONDecoder()).scan_once
_JSON_SPACE = " \t\n\r"  # what json.loads allows after the value


def _loads(data: bytes) -> Any:
    if data[:1] == b"{":
        try:
            text = data.decode("utf-8", "surrogatepass")  # the codec json.loads picks for such bytes
            obj, end = _scan_json(text, 0)
        except (ValueError, StopIteration, RecursionError):
            pass
        else:
            if end == len(text) or not text[end:].strip(_JSON_SPACE):
                return obj
    return json.loads(data)


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(RankRecord))
RECORD_FIELDS = _RECORD_FIELDS  # the names a record file holds
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RankRecord) if f.default is not dataclasses.MISSING}
_FACTORIES = [(f.name, f.default_factory) for f in dataclasses.fields(RankRecord)
              if f.default_factory is not dataclasses.MISSING]
_REQUIRED_FIELDS = tuple(f.name for f in dataclasses.fields(RankRecord) if f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
MAX_RECORD_BYTES = 1 << 20
# Bounds on what a record may claim, so that no record can make the CLI build a
# list of a billion ranks or overflow a float: ranks and world sizes up to 2^20,
# other counts within JSON's safe integer range.
MAX_RANKS = 1 << 20
MAX_SAFE_INT = (1 << 53) - 1
_RANK_FIELDS = {"rank": MAX_RANKS - 1, "local_rank": MAX_RANKS - 1, "world_size": MAX_RANKS}
# The keys of `conflict` that readers use, with their types.
CONFLICT_FIELDS: dict[str, Any] = {"pid": int, "host": str, "job": str, "seen_at": float}


def _type_name(value: Any) -> str:
    return "null" if value is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__)


FieldCheck = typing.Callable[[Any], "str | None"]


def _checker(hint: Any) -> FieldCheck:
    """A function that says why a value does not fit the type `hint` (one of
    RankRecord's annotations), or returns None. Built once per field."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        check = _checker(inner[0]) if len(inner) == 1 else (lambda value: None)
        if type(None) in typing.get_args(hint):
            return lambda value: None if value is None else check(value)
        return check
    if hint is bool:
        return lambda value: None if value is True or value is False else f"must be true or false, got {_type_name(value)}"
    if hint is int:
        def check_int(value: Any) -> str | None:
            if type(value) is not int:  # bool is an int subclass: refused too
                return f"must be an integer, got {_type_name(value)}"
            return None if 0 <= value <= MAX_SAFE_INT else f"must be between 0 and {MAX_SAFE_INT}, got {value}"
        return check_int
    if hint is float:
        def check_float(value: Any) -> str | None:
            if type(value) is not float and type(value) is not int:
                return f"must be a number, got {_type_name(value)}"
            return None if math.isfinite(value) and abs(value) <= 1e300 else f"must be a finite number, got {value}"
        return check_float
    if hint is str:
        return lambda value: None if type(value) is str else f"must be a string, got {_type_name(value)}"
    if origin is dict:
        return lambda value: None if type(value) is dict else f"must be an object, got {_type_name(value)}"
    if origin is list:
        item_check = _checker(typing.get_args(hint)[0])

        def check_list(value: Any) -> str | None:
            if type(value) is not list:
                return f"must be an array, got {_type_name(value)}"
            for i, item in enumerate(value):
                problem = item_check(item)
                if problem:
                    return f"item {i} {problem}"
            return None
        return check_list
    return lambda value: None  # Any


_FIELD_HINTS = typing.get_type_hints(RankRecord)
_CHECKS: dict[str, FieldCheck] = {name: _checker(hint) for name, hint in _FIELD_HINTS.items()}


def _plain_types(hint: Any) -> frozenset[type]:
    """The types a field's value may have without a closer look (lists and the
    `conflict` object get one; so does an int in a float field, which may overflow)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return frozenset().union(*(_plain_types(arg) for arg in typing.get_args(hint)))
    if hint in (int, float, str, bool, type(None)):
        return frozenset({hint})
    return frozenset({dict}) if typing.get_origin(hint) is dict else frozenset()


_PLAIN_TYPES = {name: _plain_types(hint) - ({dict} if name == "conflict" else set()) for name, hint in _FIELD_HINTS.items()}
_INT_LIMITS = {name: _RANK_FIELDS.get(name, MAX_SAFE_INT) for name in _FIELD_HINTS}
_LIST_FIELDS = frozenset(name for name, hint in _FIELD_HINTS.items() if typing.get_origin(hint) is list)
_CONFLICT_CHECKS: dict[str, FieldCheck] = {key: _checker(hint) for key, hint in CONFLICT_FIELDS.items()}


def _check_field(name: str, value: Any) -> str | None:
    problem = _CHECKS[name](value)
    if problem is None and name in _RANK_FIELDS and value > _RANK_FIELDS[name]:
        problem = f"must be at most {_RANK_FIELDS[name]}, got {value}"
    if problem is None and name == "conflict" and value is not None:
        for key, check in _CONFLICT_CHECKS.items():
            if key not in value:
                return f"has no {key!r}"
            problem = check(value[key])
            if problem:
                return f"key {key!r} {problem}"
    return problem


def _check_all(obj: dict[str, Any]) -> None:
    """Check every field of a record's object, in order.

    Raises:
        ValueError: a required field is missing, or a field is of the wrong type or out of range.
    """
    missing = [name for name in _REQUIRED_FIELDS if name not in obj]
    if missing:
        raise ValueError(f"field {missing[0]!r} is missing")
    for name, value in obj.items():
        kind = type(value)
        if kind in _PLAIN_TYPES[name]:
            if kind is int:
                if 0 <= value <= _INT_LIMITS[name]:
                    continue
            elif kind is not float or -1e300 <= value <= 1e300:  # NaN fails this too
                continue
        problem = _check_field(name, value)
        if problem:
            raise ValueError(f"field {name!r} {problem}")


class _Plan:
    """How to check a record object of one signature (its keys, and the types of its values)."""

    def __init__(self, signature: tuple[tuple[str, ...], tuple[type, ...]]) -> None:
        names, kinds = signature
        self.unknown = not set(names) <= _RECORD_FIELDS
        self.ok = all(name in names for name in _REQUIRED_FIELDS)  # else `_check_all` says which is missing
        self.ints: list[str] = []  # ints within 0..MAX_SAFE_INT
        self.ranks: list[str] = []  # and within their rank bounds
        self.floats: list[str] = []  # floats within +-1e300 (not NaN)
        self.lists: list[str] = []  # lists in list fields: `_check_field` for their items
        self.others: list[str] = []  # other lists and objects: `_check_field`
        for name, kind in zip(names, kinds, strict=True):
            if name not in _RECORD_FIELDS:
                continue
            if kind is list and name in _LIST_FIELDS:
                self.lists.append(name)
            elif kind not in _PLAIN_TYPES[name]:
                self.others.append(name)
            elif kind is int:
                (self.ranks if name in _RANK_FIELDS else self.ints).append(name)
            elif kind is float:
                self.floats.append(name)

    def passes(self, obj: dict[str, Any]) -> bool:
        if not self.ok:
            return False
        get = obj.__getitem__
        if self.ints:
            values = tuple(map(get, self.ints))
            if min(values) < 0 or max(values) > MAX_SAFE_INT:
                return False
        for name in self.ranks:
            value = obj[name]
            if not 0 <= value <= _RANK_FIELDS[name]:
                return False
        if self.floats:
            values = tuple(map(get, self.floats))
            total = sum(values)  # NaN if any is NaN (the bounds keep a sum of the others finite)
            if total != total or min(values) < -1e300 or max(values) > 1e300:
                return False
        for name in self.lists:
            if obj[name] and _check_field(name, obj[name]):  # an empty history or recent_steps is fine
                return False
        return not any(_check_field(name, obj[name]) for name in self.others)


# Signatures seen, and their plans; bounded, so that odd records cannot grow it without end.
_PLANS: dict[tuple[tuple[str, ...], tuple[type, ...]], _Plan] = {}
# Every field, for a record that names them all: a value each (overwritten), in one order;
# and the plans of such records, by the types of their values in that order.
_TEMPLATE: dict[str, Any] = dict.fromkeys(f.name for f in dataclasses.fields(RankRecord))
_FIELD_ORDER = tuple(_TEMPLATE)
_COMPLETE_PLANS: dict[tuple[type, ...], _Plan] = {}
MAX_PLANS = 256


def write_record(root: Path, record: RankRecord) -> Path:
    path = record_path(root, record.replica, record.rank)
    ensure_dir(path.parent)
    atomic_write(path, record.to_json())
    return path


class RecordError(ValueError):
    """A rank record that cannot be used; the message names the file and why."""


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_record(path: str | os.PathLike[str]) -> RankRecord:
    """Read one rank record without following a link, blocking or trusting it.

    Opened with O_NOFOLLOW and O_NONBLOCK (a FIFO cannot hang the reader),
    checked on the open descriptor to be a regular file of at most
    MAX_RECORD_BYTES, then parsed and checked field by field.

    Raises:
        FileNotFoundError: it is gone (a record being replaced, a rank that left).
        RecordError: anything else; the message names the file.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RecordError(f"rank record {path} is a symlink; refusing to follow it") from None
        raise RecordError(f"cannot open rank record {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"rank record {path} is not a regular file (a FIFO, socket, device or directory)")
        if st.st_size > MAX_RECORD_BYTES:
            raise RecordError(f"rank record {path} is {st.st_size} bytes; the limit is {MAX_RECORD_BYTES}")
        # One read of one byte more than fstat said (a file that grew is seen to
        # have grown); a short read of a regular file is its end: open, fstat,
        # read, close, for each of the 10,000 records of a big job's `replica ls`.
        data = os.read(fd, st.st_size + 1)
    except OSError as exc:
        raise RecordError(f"cannot read rank record {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"rank record {path} grew past the limit of {MAX_RECORD_BYTES} bytes while being read")
    try:
        record = RankRecord.from_json(data)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = f"is not JSON ({exc})" if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) else str(exc)
        raise RecordError(f"rank record {path}: {reason}") from None
    record.file_mtime = st.st_mtime  # its age, on one clock (sidecar.common.clock)
    return record


def is_alive(record: RankRecord, this_host: str, now: float | None = None) -> bool:
    """Same host: the pid exists with the recorded create time. Elsewhere: a record file
    written or ticked lately (`clock.is_stale`; `now` from `clock.fs_now`)."""
    if record.host == this_host and record.pid:
        import psutil

        try:
            proc = psutil.Process(record.pid)
            if record.create_time and abs(proc.create_time() - record.create_time) > 1.0:
                return False  # pid reused by another process
            return proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
    return not record.is_stale(now)
