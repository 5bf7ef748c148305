"""Rank records: what each rank publishes about itself, and the one safe way to read one.

    <registry>/replicas/<replica>/rank-<k>.json

A record is read with O_NONBLOCK|O_NOFOLLOW, from regular files only, size-capped,
and checked field by field against `RankRecord` (types, ranges; the checker is
`sidecar.common.recordcheck`'s): a bad file is a `RecordError`, never a traceback or a hang. Scans of a replica's records (the rank of
each file name checked too) are `sidecar.common.recordscan`'s.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, cast

from sidecar.common import clock
from sidecar.common.layout import record_path
from sidecar.common.recordcheck import RecordSchema
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
    # Seconds from the host's boot to the process's start (/proc/<pid>/stat): unlike create_time,
    # which is that plus the kernel's boot time read now (`btime`, which moves when the wall clock
    # is stepped or slewed), it never changes, so a pid check by it survives clock updates.
    start_since_boot: float | None = None
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
    # Not a field either: how many steps the rank may be past `step` without its record saying so
    # (a node record's pace anchor stands until the rank runs that far ahead of it: noderecord).
    step_slack = cast("float", 0.0)

    def to_json(self) -> bytes:
        # A shallow dict: asdict() would deep-copy the history on every heartbeat.
        return (json.dumps({name: getattr(self, name) for name in _RECORD_FIELDS}, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankRecord:
        """Parse and check a record field by field (`sidecar.common.recordcheck`).

        Raises:
            ValueError: not JSON, not an object, a required field missing, or a
                field of the wrong type or out of range (the message names it).
        """
        return _SCHEMA.parse(data)

    def is_stale(self, now: float | None = None) -> bool:
        """`clock.is_stale`; `now` on the record file's filesystem's clock (`clock.fs_now`)."""
        return clock.is_stale(self, time.time() if now is None else now)


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(RankRecord))
RECORD_FIELDS = _RECORD_FIELDS  # the names a record file holds
MAX_RECORD_BYTES = 1 << 20
# Bounds on what a record may claim, so that no record can make the CLI build a
# list of a billion ranks or overflow a float: ranks and world sizes up to 2^20,
# other counts within JSON's safe integer range (`recordcheck.MAX_SAFE_INT`).
MAX_RANKS = 1 << 20
_RANK_FIELDS = {"rank": MAX_RANKS - 1, "local_rank": MAX_RANKS - 1, "world_size": MAX_RANKS}
# The keys of `conflict` that readers use, with their types.
CONFLICT_FIELDS: dict[str, Any] = {"pid": int, "host": str, "job": str, "seen_at": float}
_SCHEMA = RecordSchema(RankRecord, int_limits=_RANK_FIELDS, objects={"conflict": CONFLICT_FIELDS})
RECORD_SCHEMA = _SCHEMA  # how a record is checked: a node record's entries are checked in parts (noderecord)


def parse_record_object(obj: dict[str, Any]) -> RankRecord:
    """A record from its JSON object, checked as `RankRecord.from_json` checks one (a node
    record's entry: sidecar.common.noderecord). Raises ValueError naming the bad field."""
    return _SCHEMA.parse_object(obj)


def write_record(root: Path, record: RankRecord) -> Path:
    path = record_path(root, record.replica, record.rank)
    ensure_dir(path.parent)
    atomic_write(path, record.to_json())
    return path


class RecordError(ValueError):
    """A rank record that cannot be used; the message names the file and why."""


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_capped(path: str | os.PathLike[str], kind: str, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a record file (`kind`: "rank record", "node record") and its stat, read without
    following a link, blocking or trusting it: opened with O_NOFOLLOW and O_NONBLOCK (a FIFO cannot
    hang the reader), checked on the open descriptor to be a regular file of at most `limit` bytes.

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
            raise RecordError(f"{kind} {path} is a symlink; refusing to follow it") from None
        raise RecordError(f"cannot open {kind} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"{kind} {path} is not a regular file (a FIFO, socket, device or directory)")
        if st.st_size > limit:
            raise RecordError(f"{kind} {path} is {st.st_size} bytes; the limit is {limit}")
        data = _read_to_end(fd, st.st_size, limit)
        # A network filesystem's client can answer the open's fstat from its attribute cache and stop
        # the read at that size while the file it opened is a newer, longer one (a record another
        # node replaced: seen on sshfs). The read refreshes the attributes: when the size differs,
        # read again, and give the fresh stat (its mtime is the record's age).
        st = os.fstat(fd)
        if st.st_size != len(data) and st.st_size <= limit:
            data = _read_to_end(fd, st.st_size, limit)
    except OSError as exc:
        raise RecordError(f"cannot read {kind} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise RecordError(f"{kind} {path} grew past the limit of {limit} bytes while being read")
    return data, st


def _read_to_end(fd: int, size: int, limit: int) -> bytes:
    """A regular file's bytes from its start to its end: reads of one byte more than `size` (a file
    that grew is seen to have grown) until one comes back short, which for a regular file is its
    end, or past `limit`. One read for each of the 10,000 records of a big job's `replica ls`."""
    want = size + 1
    chunks = [os.pread(fd, want, 0)]
    while len(chunks[-1]) == want and (got := sum(map(len, chunks))) <= limit:
        chunks.append(os.pread(fd, want, got))
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_record(path: str | os.PathLike[str]) -> RankRecord:
    """Read one rank record without following a link, blocking or trusting it.

    Read by `read_capped` (at most MAX_RECORD_BYTES), then parsed and checked field by field.

    Raises:
        FileNotFoundError: it is gone (a record being replaced, a rank that left).
        RecordError: anything else; the message names the file.
    """
    data, st = read_capped(path, "rank record", MAX_RECORD_BYTES)
    try:
        record = RankRecord.from_json(data)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = f"is not JSON ({exc})" if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) else str(exc)
        raise RecordError(f"rank record {path}: {reason}") from None
    record.file_mtime = st.st_mtime  # its age, on one clock (sidecar.common.clock)
    return record


def _proc_stat(pid: int) -> tuple[bytes, float] | None:
    """Process `pid`'s state letter and its start since boot in seconds (fields 3 and 22 of
    /proc/<pid>/stat), from one read; None where there is no such process or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
        # The command name (field 2) may hold spaces and parentheses: the fields after it follow
        # its last ')'; the state is the 1st of them, starttime (in clock ticks) the 20th.
        fields = stat_line[stat_line.rindex(b")") + 2:].split()
        return fields[0], int(fields[19]) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: object, started: object = None) -> bool:
    """Whether process `pid` of this host runs (no zombie) and, where `started` (its start since
    boot, as `start_since_boot` read it when the process was seen) is a number, is that process and
    not another that got its pid since: one read of /proc."""
    if type(pid) is not int or pid <= 0:
        return False
    stat_fields = _proc_stat(pid)
    if stat_fields is None:
        return False
    state, since_boot = stat_fields
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        if abs(since_boot - started) > 0.5 / _CLOCK_TICKS:
            return False  # the pid reused by another process
    return state != b"Z"


def start_since_boot(pid: int) -> float | None:
    """Seconds from boot to the start of process `pid`, or None where there is no such process."""
    stat_fields = _proc_stat(pid)
    return None if stat_fields is None else stat_fields[1]


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The same start since boot after a reboot is a new process: a create time further off than this
# (the old boot's uptime, give or take) says so. Clock steps of a running host stay well inside it.
REBOOT_SHIFT_S = 60.0


def is_alive(record: RankRecord, this_host: str, now: float | None = None) -> bool:
    """Same host: the pid exists, is no zombie, and is the process that wrote the record (its start
    since boot, which clock steps cannot move, from one read of /proc; a record without one, from
    an older sidecar: its create time within 1 s, through psutil). Elsewhere: a record file
    written or ticked lately (`clock.is_stale`; `now` from `clock.fs_now`)."""
    if record.host == this_host and record.pid:
        if record.start_since_boot is not None:
            if not pid_alive(record.pid, record.start_since_boot):
                return False  # gone, a zombie, or the pid reused by another process
            if record.create_time:
                import psutil

                # The kernel's boot time (btime) plus the start: the create time as psutil gives it.
                if abs(psutil.boot_time() + record.start_since_boot - record.create_time) > REBOOT_SHIFT_S:
                    return False  # the same start since boot, but another boot
            return True
        import psutil

        try:
            proc = psutil.Process(record.pid)
            if record.create_time and abs(proc.create_time() - record.create_time) > 1.0:
                return False  # pid reused by another process
            return proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
    return not record.is_stale(now)
