"""The filesystem registry: control files and rank records under one root.

    <root>/control/<replica>.json           the trigger; empty file = defaults
    <root>/replicas/<replica>/rank-<k>.json one record per rank, rewritten atomically

Every function takes the root path; nothing here holds state or imports torch.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.errors import RegistryError, RequestError

CONTROL_DIR = "control"
REPLICAS_DIR = "replicas"
CONTROL_TEMPLATE = "{replica}.json"
RECORD_TEMPLATE = "rank-{rank}.json"
TEMP_MARK = ".tmp-"

STATES = ("idle", "armed", "tracing", "saving", "error")
# A rank in one of these refuses new requests: one capture at a time.
BUSY_STATES = ("armed", "tracing", "saving")
# A record whose heartbeat is older than this many heartbeat intervals is dead.
STALE_HEARTBEATS = 5.0
MIN_STALE_S = 10.0


def control_path(root: Path, replica: str) -> Path:
    return Path(root) / CONTROL_DIR / CONTROL_TEMPLATE.format(replica=replica)


def replica_dir(root: Path, replica: str) -> Path:
    return Path(root) / REPLICAS_DIR / replica


def record_path(root: Path, replica: str, rank: int) -> Path:
    return replica_dir(root, replica) / RECORD_TEMPLATE.format(rank=rank)


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


def atomic_write(path: Path, data: bytes, mode: int = 0o644, fsync: bool = False) -> None:
    """Write `data` to a temp name beside `path`, then rename over it.

    The mode is applied explicitly, so a permissive umask never makes a file
    world-writable.
    """
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask does not get a say
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


def control_signature(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when the control file is touched or rewritten; None if absent."""
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

    def to_json(self) -> bytes:
        # A shallow dict: asdict() would deep-copy the history on every heartbeat.
        return (json.dumps({name: getattr(self, name) for name in _RECORD_FIELDS}, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankRecord:
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("rank record is not a JSON object")
        if not obj.keys() <= _RECORD_FIELDS:  # a newer sidecar's record: keep what we know
            obj = {k: v for k, v in obj.items() if k in _RECORD_FIELDS}
        return cls(**obj)

    def is_stale(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        limit = max(MIN_STALE_S, STALE_HEARTBEATS * (self.heartbeat_interval or 2.0))
        return abs(now - self.heartbeat_at) > limit


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(RankRecord))
MAX_RECORD_BYTES = 1 << 20


def write_record(root: Path, record: RankRecord) -> Path:
    path = record_path(root, record.replica, record.rank)
    ensure_dir(path.parent)
    atomic_write(path, record.to_json())
    return path


def read_records(root: Path, replica: str) -> list[RankRecord]:
    """All parsable rank records of a replica, ordered by rank."""
    directory = replica_dir(root, replica)
    records = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RegistryError(f"cannot list {directory}: {exc.strerror}") from None
    for entry in entries:
        if not (entry.name.startswith("rank-") and entry.name.endswith(".json")):
            continue
        try:
            records.append(RankRecord.from_json(_read_small(entry.path)))
        except (OSError, ValueError, TypeError):
            continue  # half-deleted, oversized or foreign file: not a rank we can show
    records.sort(key=lambda r: r.rank)
    return records


def _read_small(path: str) -> bytes:
    """Read a whole file of at most MAX_RECORD_BYTES with three syscalls (this
    runs 10,000 times for `replica ls` on a big job)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if size > MAX_RECORD_BYTES:
            raise ValueError(f"{path} is {size} bytes, too large for a rank record")
        return os.read(fd, size)
    finally:
        os.close(fd)


def list_replicas(root: Path) -> list[str]:
    """Replica names that have a record directory or a control file."""
    names: set[str] = set()
    for sub, suffix in ((REPLICAS_DIR, ""), (CONTROL_DIR, ".json")):
        try:
            for entry in os.scandir(Path(root) / sub):
                name = entry.name
                if name.startswith("."):
                    continue
                if suffix:
                    if name.endswith(suffix):
                        names.add(name[: -len(suffix)])
                elif entry.is_dir(follow_symlinks=False):
                    names.add(name)
        except OSError:
            continue
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
