"""The signal trigger: SIGUSR1 (or the configured signal) asks this rank for a capture.

The handler only records intent: it bumps a counter and calls `on_signal`,
which must itself only set attributes. All real work happens at the next
`Sidecar.step()`.

The signal never kills the process because of us: `stop()` puts back the
handler that was there before, but where that was the default action
(terminate) it leaves the signal ignored instead, since the job has been told
that SIGUSR1 is safe to send. Python sets handlers only from the main thread;
started from another thread, the trigger stays off, says so once, and has libc
ignore the signal when its action is still the default.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from sidecar.triggers.base import Trigger

log = logging.getLogger("sidecar")

# Linux ABIs whose libc `struct sigaction` starts with the handler (MIPS does not).
_HANDLER_FIRST_MACHINES = frozenset({"x86_64", "aarch64", "arm64", "ppc64le", "s390x", "riscv64", "i686", "armv7l"})
_SIGACTION_BYTES = 512  # more than any libc's struct sigaction
_warned_off_main: set[int] = set()


class SignalTrigger(Trigger):
    """Installs a handler for one signal, chaining whatever handler was there."""

    def __init__(self, signum: int, on_signal: Callable[[], None]) -> None:
        self.signum = signum
        self.on_signal = on_signal
        self.num_received = 0
        self._previous: Any = None
        self._installed = False

    @property
    def is_installed(self) -> bool:
        return self._installed

    def start(self) -> bool:
        """Install the handler. Returns False (and logs why, once) when it cannot be."""
        if threading.current_thread() is not threading.main_thread():
            name = signal.Signals(self.signum).name
            ignored = ignore_if_default(self.signum)
            if self.signum not in _warned_off_main:
                _warned_off_main.add(self.signum)
                log.warning(
                    "[Profiler] %s trigger not installed: install() ran in thread %r, and only the main thread "
                    "can set signal handlers; %s. Request captures through the control file (profile set), "
                    "or install the sidecar from the main thread to use %s",
                    name, threading.current_thread().name,
                    f"{name} is ignored in this process so that it cannot kill it" if ignored
                    else f"{name} keeps its current action",
                    name,
                )
            return False
        try:
            self._previous = signal.signal(self.signum, self._handle)
        except (ValueError, OSError) as exc:
            log.warning("[Profiler] cannot install %s handler: %s", signal.Signals(self.signum).name, exc)
            return False
        self._installed = True
        return True

    def stop(self) -> None:
        """Restore the previous handler, if ours is still the one installed; where
        that was the default action (or a handler Python cannot restore), ignore the signal."""
        if not self._installed:
            return
        self._installed = False
        if threading.current_thread() is not threading.main_thread():
            return  # cannot touch handlers here; ours stays but does nothing harmful
        previous = self._previous
        if previous is None or previous == signal.SIG_DFL:
            previous = signal.SIG_IGN
        try:
            if signal.getsignal(self.signum) == self._handle:
                signal.signal(self.signum, previous)
        except (ValueError, OSError):
            pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.num_received += 1
        if self._installed:
            self.on_signal()
        # Chain a Python handler that was there before us; SIG_DFL and SIG_IGN
        # are not callable, and chaining SIG_DFL would kill the job.
        if callable(self._previous):
            self._previous(signum, frame)


def ignore_if_default(signum: int) -> bool:
    """From any thread: ignore `signum` through libc when its action is the default.

    Returns whether the signal is now ignored (False where this ABI is not known,
    or another handler is in place, which is then left alone).
    """
    if not sys.platform.startswith("linux") or platform.machine() not in _HANDLER_FIRST_MACHINES:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        current = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if libc.sigaction(signum, None, current) != 0:
            return False
        handler = ctypes.c_void_p.from_buffer(current).value or 0
        if handler == int(signal.SIG_IGN):
            return True
        if handler != int(signal.SIG_DFL):
            return False
        ignore = ctypes.create_string_buffer(_SIGACTION_BYTES)
        ctypes.c_void_p.from_buffer(ignore).value = int(signal.SIG_IGN)
        return libc.sigaction(signum, ignore, None) == 0
    except (OSError, AttributeError, ValueError):
        return False


def libc_handler(signum: int) -> int | None:
    """The address of the handler the process has for `signum` at the C level (0 is
    SIG_DFL, 1 SIG_IGN), or None where this ABI is not known. Unlike
    `signal.getsignal`, this sees handlers set outside Python's `signal` module
    (faulthandler's, a native library's)."""
    if not sys.platform.startswith("linux") or platform.machine() not in _HANDLER_FIRST_MACHINES:
        return None
    try:
        libc = _libc()
        current = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if libc.sigaction(signum, None, current) != 0:
            return None
        return ctypes.c_void_p.from_buffer(current).value or 0
    except (OSError, AttributeError, ValueError):
        return None


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # asked at every heartbeat (FaultStacks.check)
