"""Stacks that work while a C call holds the GIL, the rank side: faulthandler armed on a signal.

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

The CLI side lives in `sidecar.fleet.signal_stacks` (`ask_rank`): for a rank on the CLI's
host whose watcher thread did not answer, it notes the file's size, sends the signal, waits
for the dump to land and stop growing, and reads the bytes it added;
`sidecar.fleet.follow.wait_for_stacks` calls it for every command that collects stacks.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
from pathlib import Path
from typing import Any

from sidecar.common.registry import ensure_dir
from sidecar.common.signames import parse_signal, signal_name
from sidecar.common.stackdump import thread_names
from sidecar.rank.triggers.signal import handler_owner, libc_handler

log = logging.getLogger("sidecar")



def open_append(path: Path) -> int:
    """A descriptor that appends to `path` (created, never a link), for faulthandler to write to."""
    ensure_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o644)


class FaultStacks:
    """faulthandler's all-thread dump on one signal, into the rank's trace dir."""

    def __init__(self, stacks_signal: str, path: Path, rank: int) -> None:
        self.signum = None if stacks_signal.lower() == "off" else parse_signal(stacks_signal)
        self.path = Path(path)
        self.rank = rank
        self._trigger_signum: int | None = None
        self._fd: int | None = None
        self._handler: int | None = None  # faulthandler's, as libc reports it, once installed
        self.installed = False

    @property
    def signums(self) -> frozenset[int]:
        """The signal this dump is configured on (none when off), for the trigger to leave alone."""
        return frozenset() if self.signum is None else frozenset({self.signum})

    def install(self, trigger_signum: int | None = None) -> bool:
        """Register the dump; False (logged once) where the signal is taken (by the job, or by the
        capture trigger, `trigger_signum`) or the file cannot be opened."""
        if self.signum is None:
            return False
        self._trigger_signum = trigger_signum
        name = signal_name(self.signum)
        taken = self._taken_by(self.signum)
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

    def _taken_by(self, signum: int) -> str:
        """Why the signal is not ours to take ("" when it is free: default action or ignored)."""
        if signum == self._trigger_signum:
            return "is also the capture signal (sidecar.signal)"
        owner = handler_owner(signum)
        return f"already has {owner}" if owner else ""

    def check(self) -> bool:
        """At each heartbeat: is our handler still the one installed? When someone replaced it,
        stop advertising the signal (and never take it back). Returns `installed`."""
        signum = self.signum  # set whenever installed
        if self.installed and signum is not None and self._handler is not None and libc_handler(signum) != self._handler:
            self.installed = False
            log.warning("[Profiler] rank %d: another handler replaced the faulthandler stacks dump on %s; the dump "
                        "is off (that handler is left alone)", self.rank, signal_name(signum))
        return self.installed

    def info(self) -> dict[str, Any] | None:
        """The record's `fault_stacks`: what the CLI needs to ask this rank (None when off)."""
        if not self.installed:
            return None
        return {"signal": self.signum, "path": str(self.path), "main": threading.main_thread().ident,
                "threads": {str(ident): name for ident, name in thread_names().items()}}

    def close(self) -> None:
        signum = self.signum  # set whenever installed
        if self.installed and signum is not None and (self._handler is None or libc_handler(signum) == self._handler):
            try:
                faulthandler.unregister(signum)
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
