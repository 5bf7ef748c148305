"""Stacks that work while a C call holds the GIL: faulthandler on a signal, and the CLI that sends it.

The rank side (`FaultStacks`): at install, `faulthandler.register(stacks_signal,
file=<fd>, all_threads=True, chain=False)` on a descriptor opened ahead of time
(`<registry>/replicas/<replica>/rank-<k>.faulthandler.txt`, appended to, beside the
record: a rank that never captures creates no trace dir; removed at close while empty). faulthandler's handler is
async-signal-safe and reads the thread states without the GIL, so a rank whose
main thread sits in a C call that never checks for signals still answers. It is
installed only over the default action (or an ignored signal): a handler that
someone else installed on that signal, in Python or not, is left alone and the
log says so; one installed later over ours is noticed at the next heartbeat,
and the record stops advertising the signal. `chain=False` because there is
nothing to chain to (chaining the default action would kill the process).

The record's `fault_stacks` tells the CLI how to ask: the signal, the file, the
main thread's ident and the names of the threads (faulthandler prints idents only).

The CLI side (`ask_rank`): for a rank on this host whose watcher thread did not
answer, note the file's size, send the signal, wait for the dump to land and
stop growing, and read the bytes it added. `sidecar.follow.wait_for_stacks`
does this for every command that collects stacks.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar import envvars, signames
from sidecar.registry import ensure_dir, open_regular
from sidecar.stacks import fault_thread_name, parse_fault_dump, thread_names
from sidecar.triggers.signal import libc_handler

log = logging.getLogger("sidecar")

# CLI: how long the watcher thread has to answer before the signal is sent.
FALLBACK_ENV = "COSMOS_PROFILER_STACKS_FALLBACK_S"
DEFAULT_FALLBACK_AFTER_S = envvars.BY_NAME[FALLBACK_ENV].default
# CLI: how long a signalled rank has to start writing, and the quiet time that ends its dump.
DUMP_WAIT_S = 5.0
DUMP_QUIET_S = 0.15
MAX_DUMP_BYTES = 16 << 20
SOURCE = "faulthandler"


def open_append(path: Path) -> int:
    """A descriptor that appends to `path` (created, never a link), for faulthandler to write to."""
    ensure_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o644)


class FaultStacks:
    """faulthandler's all-thread dump on one signal, into the rank's trace dir."""

    def __init__(self, signal_name: str, path: Path, rank: int, trigger_signal: str = "off") -> None:
        self.signum = None if signal_name.lower() == "off" else signames.parse_signal(signal_name)
        self.path = Path(path)
        self.rank = rank
        self._trigger_signal = trigger_signal
        self._fd: int | None = None
        self._handler: int | None = None  # faulthandler's, as libc reports it, once installed
        self.installed = False

    def install(self) -> bool:
        """Register the dump; False (logged once) where the signal is taken or the file cannot be opened."""
        if self.signum is None:
            return False
        name = signames.signal_name(self.signum)
        taken = self._taken_by(name)
        if taken:
            log.warning("[Profiler] rank %d: %s %s; the faulthandler stacks dump stays off and that handler is left "
                        "alone (profile stacks cannot reach this rank while a C call holds the GIL). Set "
                        "[sidecar] stacks_signal (COSMOS_PROFILER_STACKS_SIGNAL) to a free signal, or to 'off'",
                        self.rank, name, taken)
            return False
        try:
            self._fd = open_append(self.path)
            faulthandler.register(self.signum, file=self._fd, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("[Profiler] rank %d: the faulthandler stacks dump on %s is off: %s", self.rank, name, exc)
            self._close_fd()
            return False
        self._handler = libc_handler(self.signum)
        self.installed = True
        return True

    def _taken_by(self, name: str) -> str:
        """Why the signal is not ours to take ("" when it is free: default action or ignored)."""
        if name == self._trigger_signal:
            return "is also the capture signal (sidecar.signal)"
        python = signal.getsignal(self.signum)
        if python is None:
            return "has a handler installed outside Python's signal module"
        if python not in (signal.SIG_DFL, signal.SIG_IGN):
            return f"already has a Python handler ({getattr(python, '__qualname__', python)!s})"
        native = libc_handler(self.signum)
        if native not in (None, int(signal.SIG_DFL), int(signal.SIG_IGN)):
            return "already has a handler installed outside Python (faulthandler's or a native library's)"
        return ""

    def check(self) -> bool:
        """At each heartbeat: is our handler still the one installed? When someone replaced it,
        stop advertising the signal (and never take it back). Returns `installed`."""
        if self.installed and self._handler is not None and libc_handler(self.signum) != self._handler:
            self.installed = False
            log.warning("[Profiler] rank %d: another handler replaced the faulthandler stacks dump on %s; the dump "
                        "is off (that handler is left alone)", self.rank, signames.signal_name(self.signum))
        return self.installed

    def info(self) -> dict[str, Any] | None:
        """The record's `fault_stacks`: what the CLI needs to ask this rank (None when off)."""
        if not self.installed:
            return None
        return {"signal": self.signum, "path": str(self.path), "main": threading.main_thread().ident,
                "threads": {str(ident): name for ident, name in thread_names().items()}}

    def close(self) -> None:
        if self.installed and (self._handler is None or libc_handler(self.signum) == self._handler):
            try:
                faulthandler.unregister(self.signum)
            except (ValueError, RuntimeError):
                pass
        self.installed = False
        self._close_fd()

    def remove_if_empty(self) -> None:
        """At close: leave nothing behind where nothing was dumped."""
        try:
            if self.path.stat().st_size == 0:
                self.path.unlink()
        except OSError:
            pass

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


# --- the CLI side ---------------------------------------------------------------------


class FallbackUnavailable(Exception):
    """Why a rank's stacks cannot be taken through faulthandler from here (the message says)."""


@dataclass
class FaultDump:
    """A dump a signalled rank wrote: its threads in `sidecar.traces.stacks` terms."""

    path: str
    offset: int  # where this dump starts in `path`
    signal: str
    threads: list[Any]  # ThreadStack, main thread first
    main_thread: int | None


def fallback_after_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds the CLI gives the watcher thread before it signals (COSMOS_PROFILER_STACKS_FALLBACK_S).

    Raises:
        ConfigError: the variable is not a number of seconds in 0..3600 (`sidecar.envvars`).
    """
    value = envvars.convert(FALLBACK_ENV, env)
    return DEFAULT_FALLBACK_AFTER_S if value is None else value


def advertised(record: Any) -> tuple[int, str, dict[str, Any]] | None:
    """(signal, file, info) from a record's `fault_stacks`, or None when it has none that is usable."""
    info = getattr(record, "fault_stacks", None)
    if not isinstance(info, dict):
        return None
    signum, path = info.get("signal"), info.get("path")
    if type(signum) is not int or not 0 < signum < 256 or not isinstance(path, str) or not path:
        return None
    return signum, path, info


def ask_rank(record: Any, this_host: str, wait_s: float = DUMP_WAIT_S) -> FaultDump:
    """Signal `record`'s process for a faulthandler dump and read it back.

    The caller has checked that the rank is alive (pid and create time).

    Raises:
        FallbackUnavailable: off on that rank, another host, cannot signal or read (the message says).
    """
    from sidecar.traces.stacks import ThreadStack

    found = advertised(record)
    if found is None:
        raise FallbackUnavailable("its faulthandler stacks dump is off (sidecar.stacks_signal, or the signal was taken)")
    signum, path, info = found
    name = _signal_name(signum)
    if record.host != this_host:
        raise FallbackUnavailable(f"it runs on host {record.host or '?'}, and its faulthandler dump ({name}) can only "
                                  f"be asked on that host: run this command on {record.host or 'its host'}")
    try:
        offset = os.stat(path).st_size
    except OSError as exc:
        raise FallbackUnavailable(f"cannot read its faulthandler file {path}: {exc.strerror or exc}") from None
    try:
        os.kill(record.pid, signum)
    except OSError as exc:
        raise FallbackUnavailable(f"cannot send {name} to pid {record.pid}: {exc.strerror or exc}") from None
    text = _read_new(path, offset, wait_s)
    if text is None:
        raise FallbackUnavailable(f"sent {name} to pid {record.pid}, but nothing was written to {path} "
                                  f"within {wait_s:g}s")
    names = _names(info)
    main_ident = info.get("main") if type(info.get("main")) is int else None
    threads = parse_fault_dump(text)
    if not threads:
        raise FallbackUnavailable(f"sent {name} to pid {record.pid}, but {path} holds no faulthandler dump")
    threads.sort(key=lambda t: t.ident != main_ident)
    stacks = [ThreadStack(fault_thread_name(t, names), t.frames) for t in threads]
    main = 0 if main_ident is not None and threads[0].ident == main_ident else None
    return FaultDump(path=path, offset=offset, signal=name, threads=stacks, main_thread=main)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _names(info: dict[str, Any]) -> dict[int, str]:
    threads = info.get("threads")
    names: dict[int, str] = {}
    if isinstance(threads, dict):
        for key, value in threads.items():
            if isinstance(key, str) and key.isdigit() and isinstance(value, str):
                names[int(key)] = value
    return names


def _read_new(path: str, offset: int, wait_s: float) -> str | None:
    """The bytes appended to `path` after `offset`, once they stop growing (None when none come)."""
    deadline = time.monotonic() + wait_s
    last, quiet_since = -1, 0.0
    while True:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = -1
        if size < offset:
            offset = 0  # truncated meanwhile (the rank restarted): its new dump is all there is
        now = time.monotonic()
        if size > offset:
            if size != last:
                last, quiet_since = size, now
            elif now - quiet_since >= DUMP_QUIET_S:
                break
        if now >= deadline:
            if size <= offset:
                return None
            break
        time.sleep(0.02)
    with open_regular(path) as f:
        f.seek(offset)
        return f.read(MAX_DUMP_BYTES).decode("utf-8", errors="replace")
