"""The filesystem registry: directories, atomic writes, numbered files and control files.

    <root>/control/<replica>.json           the trigger; empty file = defaults
    <root>/replicas/<replica>/rank-<k>.json one record per rank (sidecar.common.records)

Every function takes the root path; nothing here holds state or imports torch.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sidecar.common import layout, storeurl
from sidecar.common.exceptions import RegistryError, RequestError
from sidecar.common.identity import is_valid_replica_name
from sidecar.common.request import ControlRequest

TEMP_MARK = ".tmp-"
# Writes a file's content to the binary file it is given (`atomic_write` streams output through one).
WriteContent = Callable[[BinaryIO], object]



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
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}")


def write_temp(path: Path, data: bytes | WriteContent, mode: int | None = 0o644,
               fsync: bool = False) -> tuple[Path, int]:
    """Write `data` to a new temp file beside `path`; returns (temp path, its inode).

    `data` is the bytes, or a function that writes them to the binary file it is
    given (for output streamed as it is made). The mode is applied explicitly, so a
    permissive umask never makes a file world-writable; None: the mode `open()` gives
    (0o666 less the umask), for files a user asked for in a folder of their own.
    """
    tmp = temp_name(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666 if mode is None else mode)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # the umask does not get a say
            if callable(data):
                with open(fd, "wb", closefd=False) as f:
                    data(f)
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp, inode


def atomic_write(path: Path, data: bytes | WriteContent, mode: int | None = 0o644, fsync: bool = False) -> int:
    """Write `data` to a temp name beside `path`, then rename over it (`write_temp` says
    what `data` and `mode` may be); on any failure the temp file is removed.

    Returns the inode of the file now at `path` (a later writer's rename
    changes it: that is how a rank notices another process writing its record).
    """
    tmp, inode = write_temp(path, data, mode, fsync)
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return inode


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open `path` for reading only if it is a regular file. A path comes from a record or
    a user, and a FIFO there would block a plain open() forever: O_NONBLOCK, then fstat.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (EINVAL, saying what it is).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)", str(path))
        return os.fdopen(fd, "rb")  # O_NONBLOCK means nothing to a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def unlink_quietly(*paths: str | os.PathLike[str]) -> None:
    """Remove each of `paths`; one that is gone already, or cannot be removed, is no error
    (temp files after a failure or a rename, claims and markers given up)."""
    for path in paths:
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
                    unlink_quietly(tmp)
                    return candidate
                n += 1
                continue
            except OSError as exc:
                if exc.errno not in _NO_LINK_ERRNOS:
                    raise
                use_link = False
            else:
                unlink_quietly(tmp)
                return candidate
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            n += 1
            continue
        try:
            os.replace(tmp, candidate)
        except BaseException:
            unlink_quietly(candidate)  # our own empty claim
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


def write_request(root: Path, replica: str, request: ControlRequest | Mapping[str, Any] | None) -> Path:
    """Write a request for `replica` atomically (temp file, then rename): every writer's one way to
    the control file. None writes an empty file (each rank's defaults); a JSON object (a request
    written by hand) is read into a `ControlRequest` first, so it reaches the wire the same way.

    Raises:
        RequestError: a JSON object with a field that is no request field.
        RegistryError: the control file cannot be written.
    """
    if isinstance(request, Mapping):
        request = ControlRequest.from_json(request)
    path = layout.control_path(root, replica)
    data = b"" if request is None else request.to_wire()
    sender = storeurl.request_senders.get(os.fspath(root))
    if sender is not None:  # the CLI's view of a redis:// registry: the store is where it goes
        sender(replica, data)
    try:
        ensure_dir(path.parent)
        atomic_write(path, data)
    except OSError as exc:
        raise RegistryError(f"cannot write control file {path}: {exc.strerror or exc}") from None
    return path


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
    for sub, suffix in ((layout.REPLICAS_DIR, ""), (layout.CONTROL_DIR, ".json")):
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


# --- which filesystem holds the registry (inotify misses writes made on other machines) ---

NETWORK_FS_TYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph",
        "cephfs", "glusterfs", "panfs", "afs", "ocfs2", "gfs2", "wekafs", "9p", "virtiofs",
    }
)
MOUNTS_FILE = "/proc/self/mounts"


def filesystem_type(path: Path, mounts_file: str = MOUNTS_FILE) -> str | None:
    """The filesystem type of the mount holding `path` (longest mount prefix)."""
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    # Resolve symlinks in the part that exists; the rest (not created yet)
    # lives on the same mount as its nearest existing ancestor.
    probe, rest = Path(os.path.abspath(path)), []
    while not probe.exists() and probe != probe.parent:
        rest.append(probe.name)
        probe = probe.parent
    target = os.path.join(os.path.realpath(probe), *reversed(rest))
    best, best_type = "", None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].encode().decode("unicode_escape")  # mounts escape spaces as \040
        if (target == mount or target.startswith(mount.rstrip("/") + "/") or mount == "/") and len(mount) >= len(best):
            best, best_type = mount, parts[2]
    return best_type


def is_network_fs(fstype: str | None) -> bool:
    """Whether inotify misses writes made on other machines on filesystems of this type (fuse: all)."""
    return fstype is not None and (fstype in NETWORK_FS_TYPES or fstype.startswith("fuse"))
