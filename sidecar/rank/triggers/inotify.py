"""One inotify watch on one directory, read by the thread that waits on it.

The file trigger used watchdog's observer: an emitter thread reads the inotify
descriptor and queues events, a dispatcher thread (which also wakes every
second to look at its queue) calls the handler, and the handler woke the
watcher thread. Each of those hand-offs waits for the GIL, which a busy
training thread holds for up to `sys.getswitchinterval()` (5 ms) at a time.
Here the watcher thread itself waits on the descriptor (`poll`, with the
safety interval as its timeout), so a write reaches the reader in one wakeup,
and an idle rank's watcher wakes only for the safety stat. Why not watchdog 7's
`InotifyFD` (one thread that calls a callback): docs/architecture.md, measured by
`bin/bench --only watchdog_inotify`.

Linux only (inotify_init1 through ctypes); `InotifyWatch` raises OSError where
inotify is missing or its limits are reached (ENOSPC, EMFILE), and the caller
falls back to polling.
"""

from __future__ import annotations

import errno
import os
import select
import struct
from typing import Any

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# What changes a file in the directory, or the directory itself. Not IN_OPEN,
# IN_ACCESS, IN_CLOSE_NOWRITE: our own reads of the control file are no news.
WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
              | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
# The watch is gone (the directory was deleted or moved), or events were lost.
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
AT_REST = IN_CLOSE_WRITE | IN_MOVED_TO | IN_ATTRIB
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
READ_SIZE = 64 * 1024

_libc = None


def _lib() -> Any:
    """libc through ctypes, imported here: the CLI imports this module (through the
    file trigger's mount table) and must not pay for ctypes."""
    global _libc
    if _libc is None:
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        _libc = lib
    return _libc


def _error(what: str, path: str = "") -> OSError:
    import ctypes

    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}", *((path,) if path else ()))


class InotifyWatch:
    """inotify on `directory` (not recursive); `wait` returns the names that changed.

    Raises:
        OSError: inotify cannot start (no inotify, ENOSPC/EMFILE limits, no such directory).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        try:
            lib = _lib()
            init = lib.inotify_init1
            add = lib.inotify_add_watch
        except (OSError, AttributeError) as exc:  # not Linux, or no libc symbols
            raise OSError(errno.ENOSYS, f"inotify is unavailable: {exc}") from None
        fd = init(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise _error("inotify_init1")
        if add(fd, os.fsencode(self.directory), WATCH_MASK) < 0:
            error = _error("inotify_add_watch", self.directory)
            os.close(fd)
            raise error
        self.fd = fd
        self.gone = False  # the directory was deleted or moved away: watch it again

    def fileno(self) -> int:
        return self.fd

    def wait(self, timeout: float, wake_fd: int) -> dict[str, int]:
        """Block until an event, a byte on `wake_fd`, or `timeout` seconds.

        Returns:
            The files that changed, each with the mask of its last event (whether
            its writer closed it: `at_rest`); an event queue overflow gives the
            name "" (anything may have changed).
        """
        # poll, not select: a training process may hold more than FD_SETSIZE (1024) descriptors.
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(wake_fd, select.POLLIN)
        try:
            ready = {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000.0)}
        except InterruptedError:  # pragma: no cover - PEP 475 retries; a signal handler that raised
            return {}
        if wake_fd in ready:
            _drain(wake_fd)
        return self._read() if self.fd in ready else {}

    def _read(self) -> dict[str, int]:
        names: dict[str, int] = {}
        while True:
            try:
                buf = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                return names
            if not buf:
                return names
            offset = 0
            while offset + _EVENT.size <= len(buf):
                _, mask, _, length = _EVENT.unpack_from(buf, offset)
                offset += _EVENT.size
                name = buf[offset:offset + length].rstrip(b"\0")
                offset += length
                if mask & GONE:
                    self.gone = True
                if mask & IN_Q_OVERFLOW:
                    names[""] = mask
                elif name:
                    names[os.fsdecode(name)] = mask

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class WakePipe:
    """A pipe that wakes a thread waiting in `InotifyWatch.wait` (its `fd`): `poke()` from any
    thread; not inherited by children (PEP 446), both ends non-blocking."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        for fd in (self.fd, self._write_fd):
            os.set_blocking(fd, False)

    def poke(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except OSError:
            pass  # full (it is awake anyway) or closed (stopping)

    def close(self) -> None:
        for fd in (self.fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def at_rest(mask: int) -> bool:
    """Whether a file whose last event had `mask` has no writer mid-write: it was
    closed after writing, renamed into place, or had only its times set (`touch`)."""
    return bool(mask & AT_REST) and not mask & IN_MODIFY


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
