"""The signal trigger: one free signal (SIGUSR1 by default) asks this rank for a capture.

One signal, one meaning. A signal the job already handles (cosmos-rl's checkpoint
signal, SLURM's pre-timeout SIGUSR1, Lightning's requeue) stays the job's: the
trigger never takes it and never chains it (`handler_owner` says who has it, seen
from Python and from libc). `choose_signal` picks the trigger's signal: the
configured one where it is free, else, where the user did not name one, the first
free real-time signal from SIGRTMIN+3 upward (the lowest three are the ones thread
libraries and timers most often take). Signals the job will handle but has not
taken yet count as taken: a cosmos-rl worker's (`sidecar.cosmos.checkpoint_signals`)
and, in a SLURM job, SIGUSR1 (`slurm_signals`). A handler the job sets after ours is
noticed at the next heartbeat (`check`): the signal is the job's from then on,
until the job gives it back (the default action, or ignored), when the sidecar
may take it again (`reclaim`, from the main thread).

The handler only records intent: it calls `on_signal`, which must itself only
set attributes, and only while it is the handler the process has (a job handler
that calls the one it replaced never reaches a capture). All real work happens
at the next `Sidecar.step()`.

The signal never kills the process because of us: `stop()` leaves the signal
ignored where its action was the default, since the job has been told the
signal is safe to send. Python sets handlers only from the main thread; started
from another thread, the trigger stays off, says so once, and has libc ignore
the signal when its action is still the default.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.common.signames import signal_name
from sidecar.rank.triggers.base import Trigger

log = logging.getLogger("sidecar")

# Linux ABIs whose libc `struct sigaction` starts with the handler (MIPS does not).
_HANDLER_FIRST_MACHINES = frozenset({"x86_64", "aarch64", "arm64", "ppc64le", "s390x", "riscv64", "i686", "armv7l"})
_SIGACTION_BYTES = 512  # more than any libc's struct sigaction
_warned_off_main: set[int] = set()
# Where the trigger looks for a free signal when the configured one is the job's: SIGRTMIN+3 upward.
FREE_SIGNAL_OFFSET = 3

# What `check` found: the signal is ours, the job's, or free again (`reclaim` takes it back).
OURS, TAKEN, FREE = "ours", "taken", "free"


class SignalTrigger(Trigger):
    """Installs a handler for one free signal; never over, and never chaining, another handler."""

    def __init__(self, signum: int, on_signal: Callable[[], None], rank: int = 0) -> None:
        self.signum = signum
        self.on_signal = on_signal
        self.rank = rank
        self.num_received = 0
        self._handler = self._handle  # one bound method, so `is` tells ours from a job's
        self._native: int | None = None  # Python's handler as libc reports it, once ours is in
        self._previous: Any = signal.SIG_DFL
        self._installed = False
        self._lost = False  # the job took the signal after us
        self._logged: set[str] = set()

    @property
    def is_installed(self) -> bool:
        return self._installed

    @property
    def name(self) -> str:
        return signal_name(self.signum)

    def start(self) -> bool:
        """Install the handler. Returns False (and logs why, once) when it cannot be or must not be."""
        name = self.name
        if threading.current_thread() is not threading.main_thread():
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
        owner = handler_owner(self.signum)
        if owner:
            self._log_once("owned", f"[Profiler] rank {self.rank}: {name} is the job's ({owner}); the sidecar "
                                    f"neither takes nor chains it. Trigger this rank with `cosmos-profiler profile "
                                    f"set` or its control file, or set [sidecar] signal (COSMOS_PROFILER_SIGNAL) to "
                                    f"a free signal")
            return False
        return self._install()

    def _install(self) -> bool:
        try:
            self._previous = signal.signal(self.signum, self._handler)
        except (ValueError, OSError) as exc:
            self._log_once("install", f"[Profiler] rank {self.rank}: cannot install the {self.name} handler: {exc}")
            return False
        self._native = libc_handler(self.signum)
        self._installed = True
        self._lost = False
        return True

    def check(self) -> str:
        """From any thread (the heartbeat): is the handler still ours? OURS, TAKEN (a handler the job set
        after ours: stop claiming the signal, logged once) or FREE (the job gave it back: `reclaim` may
        take it again). Only a trigger that was installed is ever anything but TAKEN here."""
        if self._installed:
            if self._is_ours():
                return OURS
            self._installed = False
            self._lost = True
            self._log_once("taken", f"[Profiler] rank {self.rank}: the job set its own {self.name} handler "
                                    f"({describe_handler(self.signum)}) after the sidecar's; {self.name} is the "
                                    "job's now and no longer triggers a capture on this rank. Trigger it with "
                                    "`cosmos-profiler profile set` or its control file")
            return TAKEN
        if not self._lost:
            return TAKEN
        if self._is_ours():  # the job put ours back (cosmos-rl's DistributedSignalHandler.release())
            self._installed, self._lost = True, False
            self._log_once("back", f"[Profiler] rank {self.rank}: the job put the sidecar's {self.name} handler "
                                   f"back; {self.name} triggers a capture again")
            return OURS
        return FREE if not handler_owner(self.signum) else TAKEN

    def reclaim(self) -> bool:
        """On the main thread, after `check` said FREE: take the signal again if it is still free."""
        if not self._lost or threading.current_thread() is not threading.main_thread() or handler_owner(self.signum):
            return False
        if not self._install():
            return False
        self._log_once("back", f"[Profiler] rank {self.rank}: the job gave {self.name} back; it triggers a capture "
                               "on this rank again")
        return True

    def _is_ours(self) -> bool:
        if signal.getsignal(self.signum) is not self._handler:
            return False
        return self._native is None or libc_handler(self.signum) == self._native

    def stop(self) -> None:
        """Restore the previous action, if ours is still the handler installed; where that was
        the default action, ignore the signal."""
        installed, self._installed, self._lost = self._installed, False, False
        if not installed or threading.current_thread() is not threading.main_thread():
            return  # off the main thread ours stays, but does nothing: `_installed` is False
        previous = signal.SIG_IGN if self._previous in (None, signal.SIG_DFL) else self._previous
        try:
            if self._is_ours():
                signal.signal(self.signum, previous)
        except (ValueError, OSError):
            pass

    def _handle(self, signum: int, frame: Any) -> None:
        # Only as the process's handler: a job handler that calls the one it replaced
        # (Lightning's, say) must not start a capture on the job's signal.
        if self._installed and signal.getsignal(signum) is self._handler:
            self.num_received += 1
            self.on_signal()

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s", message)


def handler_owner(signum: int) -> str:
    """Who handles `signum` ("" when nobody does: the default action, or ignored), from Python and from libc."""
    python = signal.getsignal(signum)
    if python is None:
        return "a handler installed outside Python's signal module"
    if python not in (signal.SIG_DFL, signal.SIG_IGN):
        return f"a Python handler ({describe_handler(signum)})"
    native = libc_handler(signum)
    if native not in (None, int(signal.SIG_DFL), int(signal.SIG_IGN)):
        return "a handler installed outside Python (faulthandler's or a native library's)"
    return ""


def describe_handler(signum: int) -> str:
    """The Python handler of `signum` by its qualified name (or what it is)."""
    handler = signal.getsignal(signum)
    if handler is None:
        return "installed outside Python"
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return signal.Handlers(handler).name
    return str(getattr(handler, "__qualname__", None) or handler)


def slurm_signals(env: Mapping[str, str]) -> dict[int, str]:
    """In a SLURM job: SIGUSR1, by number, with why it is not the trigger's.

    SLURM's `--signal=USR1@T` sends it before the time limit for a checkpoint, and Lightning's
    SLURM requeue installs its handler only where SIGUSR1 has none (any handler, even an ignored
    signal, and it installs nothing): a trigger on SIGUSR1 would disable the requeue unseen."""
    if not env.get("SLURM_JOB_ID"):
        return {}
    return {int(signal.SIGUSR1): "a SLURM job's: --signal=USR1@T checkpoints before the time limit, and "
                                 "Lightning's requeue installs only where SIGUSR1 has no handler"}


def choose_signal(configured: int, explicit: bool, reserved: Mapping[int, str],
                  avoid: frozenset[int] = frozenset()) -> tuple[int | None, str]:
    """The signal the trigger takes, and why the configured one is not it ("" when it is).

    Args:
        configured: `sidecar.signal` as a number.
        explicit: the user named it; it is then never replaced by another, only left off.
        reserved: signals the job will handle though it has not yet installed a handler
            (a cosmos-rl worker's `train.signal_to_handle`), with who owns them.
        avoid: signals the sidecar uses for something else (the stacks signal), never picked
            in place of the configured one (which, named twice, stays the trigger's).

    Returns:
        (signal, why): signal None when there is none to take.
    """
    why = reserved.get(configured) or handler_owner(configured)
    if not why:
        return configured, ""
    if explicit:
        return None, why
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is None or high is None:
        return None, why
    for signum in range(int(low) + FREE_SIGNAL_OFFSET, int(high) + 1):
        if signum not in reserved and signum not in avoid and not handler_owner(signum):
            return signum, why
    return None, why


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
