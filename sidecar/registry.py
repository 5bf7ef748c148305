"""The filesystem registry: control files and rank records under one root.

    <root>/control/<replica>.json           the trigger; empty file = defaults
    <root>/replicas/<replica>/rank-<k>.json one record per rank, rewritten atomically

Every function takes the root path; nothing here holds state or imports torch.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import secrets
import stat
import time
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.capture import State
from sidecar.errors import RegistryError, RequestError
from sidecar.identity import is_valid_replica_name

# The registry's paths are layout's (one place knows them); the registry API hands them on.
from sidecar.layout import (  # noqa: F401
    CONTROL_DIR,
    CONTROL_TEMPLATE,
    RECORD_TEMPLATE,
    REPLICAS_DIR,
    control_path,
    record_path,
    replica_dir,
)

TEMP_MARK = ".tmp-"

STATES = tuple(State)
# A record whose heartbeat is older than this many heartbeat intervals is dead.
STALE_HEARTBEATS = 5.0
MIN_STALE_S = 10.0


DIR_MODE = 0o775  # before the umask: group-writable for shared registries, never world-writable


def ensure_dir(path: Path, private: bool = False) -> None:
    """mkdir -p. Directories we create are never world-writable, whatever the
    umask (0775 & ~umask); a `private` one (the per-user default root) is 0700."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700 if private and directory == path else DIR_MODE)
        except FileExistsError:
            continue  # created by another rank meanwhile
        if os.stat(directory).st_mode & 0o002:
            os.chmod(directory, stat.S_IMODE(os.stat(directory).st_mode) & ~0o002)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fspath(path))
    if private:
        st = path.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, 0o700)


def temp_name(path: Path) -> Path:
    """A hidden temp name beside `path`, unique across processes and hosts
    (pids repeat on other machines writing the same shared directory)."""
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def write_temp(path: Path, data: bytes, mode: int = 0o644, fsync: bool = False) -> tuple[Path, int]:
    """Write `data` to a new temp file beside `path`; returns (temp path, its inode).

    The mode is applied explicitly, so a permissive umask never makes a file
    world-writable.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask does not get a say
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp, inode


def atomic_write(path: Path, data: bytes, mode: int = 0o644, fsync: bool = False) -> int:
    """Write `data` to a temp name beside `path`, then rename over it.

    Returns the inode of the file now at `path` (a later writer's rename
    changes it: that is how a rank notices another process writing its record).
    """
    tmp, inode = write_temp(path, data, mode, fsync)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return inode


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- numbered files (traces, stacks, memory snapshots) ---------------------

# link(2) is missing on some FUSE and SMB filesystems: then an O_EXCL create claims the name.
_NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV})
MAX_CLAIM_TRIES = 100_000


def highest_numbered(directory: Path, template: str) -> int:
    """The highest n of the files named `template.format(n=n)` in `directory`; -1 if none."""
    pattern = re.compile(r"(\d+)" + re.escape(template.split("}", 1)[1]))
    highest = -1
    try:
        names = os.listdir(directory)
    except OSError:
        return highest
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            highest = max(highest, int(match.group(1)))
    return highest


def publish_numbered(tmp: Path, directory: Path, template: str, first: int = 0) -> Path:
    """Give the finished file `tmp` the first free name `template.format(n=n)` in
    `directory`, with n past every existing one and at least `first`; return it.

    A name is claimed atomically on disk, so no file is ever replaced, even when
    other processes (another job under the same replica name, on this host or
    on another client of a shared filesystem) number files in the same directory:
    a hard link to the new name fails with EEXIST when that name is taken (then
    the next n is tried); where the filesystem has no hard links, an O_EXCL
    create claims the name and `tmp` is renamed over the claim. `tmp` is gone
    afterwards, unless an error is raised.
    """
    n = max(first, highest_numbered(directory, template) + 1)
    use_link = True
    for _ in range(MAX_CLAIM_TRIES):
        candidate = Path(directory) / template.format(n=n)
        if use_link:
            try:
                os.link(tmp, candidate, follow_symlinks=False)
            except FileExistsError:
                if _same_file(tmp, candidate):  # an NFS LINK retransmitted after it succeeded
                    _unlink_quietly(tmp)
                    return candidate
                n += 1
                continue
            except OSError as exc:
                if exc.errno not in _NO_LINK_ERRNOS:
                    raise
                use_link = False
            else:
                _unlink_quietly(tmp)
                return candidate
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            n += 1
            continue
        try:
            os.replace(tmp, candidate)
        except BaseException:
            _unlink_quietly(candidate)  # our own empty claim
            raise
        return candidate
    raise FileExistsError(errno.EEXIST, f"no free name after {MAX_CLAIM_TRIES} tries", os.fspath(directory))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samestat(os.lstat(a), os.lstat(b))
    except OSError:
        return False


def remove_stale_temps(directory: Path, older_than_s: float = 0.0) -> int:
    """Delete temp files left by a writer killed mid-write. Returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        if entry.name.startswith(".") and TEMP_MARK in entry.name:
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime >= older_than_s:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                pass
    return removed


# --- control files -------------------------------------------------------


@dataclass(frozen=True)
class ControlFile:
    data: bytes
    mtime_ns: int
    size: int
    inode: int
    mode: int
    repeat: bool = False  # set by the file trigger: the same bytes as the version before (a bare `touch`)

    @property
    def signature(self) -> tuple[int, int, int, int]:
        return (self.mtime_ns, self.size, self.inode, self.mode)


def control_signature(path: Path, fresh: bool = False) -> tuple[int, int, int, int] | None:
    """What changes when the control file is touched or rewritten; None if absent.

    With `fresh`, the file is opened (O_NONBLOCK, O_NOFOLLOW) and fstat'ed
    instead of lstat'ed: a network filesystem client answers lstat from its
    attribute cache (NFS for up to acregmax/acdirmax, sshfs for 20 s), so a
    file replaced or touched from another machine looks unchanged that long,
    while an open revalidates (NFS close-to-open; FUSE opens on the server).
    A symlink (which O_NOFOLLOW will not open) is lstat'ed as before.
    """
    if fresh:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError:
            pass  # a symlink, or unreadable: lstat says what it is
        else:
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)


def read_control(
    path: Path,
    max_bytes: int,
    allowed_uids: Iterable[int] = (),
    allowed_gids: Iterable[int] = (),
) -> ControlFile:
    """Open and read a control file safely.

    The checks run on the opened descriptor (O_NOFOLLOW, then fstat), so the
    file cannot be swapped between the check and the read.

    Raises:
        RequestError: symlink, FIFO, directory, too large, or foreign owner.
        FileNotFoundError: the file does not exist.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RequestError(f"control file {path} is a symlink; refusing to follow it") from None
        if exc.errno == errno.ENOENT:
            raise
        raise RequestError(f"cannot open control file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise RequestError(f"control file {path} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"control file {path} is not a regular file (a FIFO, socket or device); refusing it")
        if st.st_size > max_bytes:
            raise RequestError(f"control file {path} is {st.st_size} bytes; the limit is {max_bytes}")
        uid = os.getuid()
        if st.st_uid not in (uid, 0) and st.st_uid not in set(allowed_uids) and st.st_gid not in set(allowed_gids):
            raise RequestError(
                f"control file {path} is owned by uid {st.st_uid}, not by this job's user {uid}; "
                "list that uid in [sidecar] allowed_uids (or its group in allowed_gids) to accept it"
            )
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise RequestError(f"control file {path} grew past the limit of {max_bytes} bytes while being read")
        return ControlFile(data=data, mtime_ns=st.st_mtime_ns, size=st.st_size, inode=st.st_ino, mode=st.st_mode)
    finally:
        os.close(fd)


def write_request(root: Path, replica: str, request: dict[str, Any] | None) -> Path:
    """Write a request for `replica` atomically; None writes an empty file (defaults)."""
    path = control_path(root, replica)
    try:
        ensure_dir(path.parent)
        data = b"" if request is None else (json.dumps(request, sort_keys=True) + "\n").encode()
        atomic_write(path, data)
    except OSError as exc:
        raise RegistryError(f"cannot write control file {path}: {exc.strerror or exc}") from None
    return path


# --- rank records --------------------------------------------------------


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
    recent_steps: list[list[float]] = field(default_factory=list)  # [[time, step], ...]: sidecar.pace samples
    trace_path: str | None = None
    stacks_path: str | None = None
    memory_path: str | None = None
    num_captures: int = 0
    num_requests: int = 0
    num_refused: int = 0
    num_signals: int = 0
    num_coalesced: int = 0
    error: str | None = None
    refused: str | None = None
    exited_at: float | None = None
    version: str = ""
    job: str = ""  # what all ranks of one job share (identity.job_identity)
    # Another live process that writes this rank's record too (a second job under
    # this replica name): {"pid", "host", "job", "seen_at"}; None when there is none.
    conflict: dict[str, Any] | None = None

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
            obj = json.loads(data)
        except RecursionError:
            raise ValueError("it is nested too deeply to be a rank record") from None
        if not isinstance(obj, dict):
            raise ValueError(f"it holds a JSON {type(obj).__name__}, not an object")
        if not obj.keys() <= _RECORD_FIELDS:  # a newer sidecar's record: keep what we know
            obj = {k: v for k, v in obj.items() if k in _RECORD_FIELDS}
        missing = [name for name in _REQUIRED_FIELDS if name not in obj]
        if missing:
            raise ValueError(f"field {missing[0]!r} is missing")
        for name, value in obj.items():
            kind = type(value)
            if kind in _PLAIN_TYPES[name]:  # the common case, without a call (10,000 records for `replica ls`)
                if kind is int:
                    if 0 <= value <= _INT_LIMITS[name]:
                        continue
                elif kind is not float or -1e300 <= value <= 1e300:  # NaN fails this too
                    continue
            problem = _check_field(name, value)
            if problem:
                raise ValueError(f"field {name!r} {problem}")
        return cls(**obj)

    def is_stale(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        limit = max(MIN_STALE_S, STALE_HEARTBEATS * (self.heartbeat_interval or 2.0))
        return abs(now - self.heartbeat_at) > limit


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(RankRecord))
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


Check = typing.Callable[[Any], "str | None"]


def _checker(hint: Any) -> Check:
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
_CHECKS: dict[str, Check] = {name: _checker(hint) for name, hint in _FIELD_HINTS.items()}


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
_CONFLICT_CHECKS: dict[str, Check] = {key: _checker(hint) for key, hint in CONFLICT_FIELDS.items()}


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


def write_record(root: Path, record: RankRecord) -> Path:
    path = record_path(root, record.replica, record.rank)
    ensure_dir(path.parent)
    atomic_write(path, record.to_json())
    return path


class RecordError(ValueError):
    """A rank record that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class RecordProblem:
    """A file under a replica's directory that is not a usable rank record."""

    path: str
    rank: int | None  # from the file name rank-<k>.json, when it has one
    error: str

    def __str__(self) -> str:
        return self.error


@dataclass
class RecordScan:
    """What a replica's directory holds: the good records, and the bad files."""

    records: list[RankRecord] = field(default_factory=list)
    problems: list[RecordProblem] = field(default_factory=list)


_RECORD_NAME = re.compile(r"rank-(\d{1,9})\.json")


def read_record(path: str | os.PathLike[str]) -> RankRecord:
    """Read one rank record without following a link, blocking or trusting it.

    Opened with O_NOFOLLOW and O_NONBLOCK (a FIFO cannot hang the reader),
    checked on the open descriptor to be a regular file of at most
    MAX_RECORD_BYTES, then parsed and checked field by field.

    Raises:
        FileNotFoundError: it is gone (a record being replaced, a rank that left).
        RecordError: anything else; the message names the file.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
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
        chunks, remaining = [], st.st_size + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            chunks.append(chunk)
            if len(chunk) < remaining:
                break
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise RecordError(f"cannot read rank record {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"rank record {path} grew past the limit of {MAX_RECORD_BYTES} bytes while being read")
    try:
        return RankRecord.from_json(data)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = f"is not JSON ({exc})" if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) else str(exc)
        raise RecordError(f"rank record {path}: {reason}") from None


def scan_records(root: Path, replica: str) -> RecordScan:
    """Every rank record of `replica`, ordered by rank, and every file under its
    directory named like a record that is not a good one (with why).

    A record whose `rank` differs from its file name's is a problem too: it
    would stand for the wrong rank.

    A missing directory is no records (a replica not registered yet).

    Raises:
        RegistryError: the replica's directory cannot be listed.
    """
    directory = replica_dir(root, replica)
    scan = RecordScan()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return scan  # no such replica (callers that report "not found" check the root)
    except OSError as exc:
        check_root(root)  # the registry itself is the problem: name it
        raise RegistryError(f"cannot list {directory}: {exc.strerror or exc}") from None
    for entry in entries:
        match = _RECORD_NAME.fullmatch(entry.name)
        if match is None:
            continue  # temp files, and anything not named like a record
        rank = int(match.group(1))
        try:
            record = read_record(entry.path)
        except FileNotFoundError:
            continue  # replaced or removed while listing
        except RecordError as exc:
            scan.problems.append(RecordProblem(entry.path, rank, str(exc)))
            continue
        if record.rank != rank:
            scan.problems.append(RecordProblem(entry.path, rank, f"rank record {entry.path} holds rank {record.rank}"))
            continue
        scan.records.append(record)
    scan.records.sort(key=lambda r: r.rank)
    scan.problems.sort(key=lambda p: (p.rank is None, p.rank or 0, p.path))
    return scan


def read_records(root: Path, replica: str) -> list[RankRecord]:
    """The good rank records of a replica, ordered by rank (`scan_records` also says what was skipped)."""
    return scan_records(root, replica).records


def check_root(root: Path) -> None:
    """Raise RegistryError naming `root` unless it is a directory this process can list.

    An existing empty registry is fine; a missing one is an error, so that a
    mistyped --registry is not taken for a registry with no replicas.
    """
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise RegistryError(
            f"registry {root} does not exist: no sidecar has registered there "
            "(pass --registry DIR or set COSMOS_PROFILER_DIR to the registry your job uses)"
        ) from None
    except OSError as exc:
        raise RegistryError(f"registry {root} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RegistryError(f"registry {root} is not a directory")
    try:
        with os.scandir(root):
            pass
    except OSError as exc:
        raise RegistryError(f"registry {root} cannot be read: {exc.strerror or exc}") from None


def list_replicas(root: Path) -> list[str]:
    """Replica names that have a record directory or a control file.

    Names that are not valid replica names (no sidecar writes them) are left out.

    Raises:
        RegistryError: the registry (or its replicas/ or control/ directory) cannot be listed.
    """
    check_root(root)
    names: set[str] = set()
    for sub, suffix in ((REPLICAS_DIR, ""), (CONTROL_DIR, ".json")):
        directory = Path(root) / sub
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RegistryError(f"cannot list {directory}: {exc.strerror or exc}") from None
        for entry in entries:
            name = entry.name
            if suffix:
                if not name.endswith(suffix) or not entry.is_file(follow_symlinks=False):
                    continue
                name = name[: -len(suffix)]
            elif not entry.is_dir(follow_symlinks=False):
                continue
            if is_valid_replica_name(name):
                names.add(name)
    return sorted(names)


def is_alive(record: RankRecord, this_host: str, now: float | None = None) -> bool:
    """Same host: the pid exists with the recorded create time. Elsewhere: a fresh heartbeat."""
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
