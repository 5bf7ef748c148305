"""Signal names as `kill -s` spells them, both ways: "SIGUSR1", "USR1", "SIGRTMIN+3", "RTMAX-1", "10".

Python's `signal.Signals` knows no real-time signal between SIGRTMIN and SIGRTMAX
(`signal.Signals(37)` raises), so every place that names a signal for a person, a
setting or a rank record goes through here. Pure: no handler is read or set.
"""

from __future__ import annotations

import re
import signal

# No handler can catch these: the kernel acts on them itself.
UNCATCHABLE = frozenset({"SIGKILL", "SIGSTOP"})
# Raised by a fault in the thread that ran into it; a handler that returns would run the
# faulting instruction again, so no request can ride on them.
SYNCHRONOUS = frozenset({"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS"})

_RT = re.compile(r"(?:SIG)?RT(MIN|MAX)(?:([+-])(\d+))?")


def _rt_range() -> tuple[int, int] | None:
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    return (int(low), int(high)) if low is not None and high is not None else None


def parse_signal(text: str) -> int:
    """The number of the signal `text` names, as `kill -s` takes it (case-insensitive).

    Raises:
        ValueError: `text` names no signal of this platform (the message says what does).
    """
    raw = text.strip()
    name = raw.upper()
    if name.isdigit():
        number = int(name)
        if number_is_signal(number):
            return number
        raise ValueError(f"{raw!r} is not a signal number of this system")
    rt = _RT.fullmatch(name)
    if rt is not None:
        bounds = _rt_range()
        if bounds is None:
            raise ValueError(f"{raw!r}: this system has no real-time signals")
        low, high = bounds
        base = low if rt.group(1) == "MIN" else high
        offset = int(rt.group(3) or 0) * (-1 if rt.group(2) == "-" else 1)
        number = base + offset
        if not low <= number <= high:
            raise ValueError(f"{raw!r} is outside SIGRTMIN..SIGRTMAX ({low}..{high}, i.e. SIGRTMIN+0..+{high - low})")
        return number
    if not name.startswith("SIG"):
        name = "SIG" + name
    member = getattr(signal, name, None)
    if isinstance(member, signal.Signals):
        return int(member)
    raise ValueError(f"{raw!r} names no signal (spell it as `kill -s` does: SIGUSR1, USR2, SIGRTMIN+3)")


def signal_name(signum: int) -> str:
    """`signum` as `kill -s` accepts it: "SIGUSR1", "SIGRTMIN+3" (a plain number where it has no name)."""
    bounds = _rt_range()
    if bounds is not None and bounds[0] < signum < bounds[1]:
        return f"SIGRTMIN+{signum - bounds[0]}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def number_is_signal(number: int) -> bool:
    """Whether `number` is a signal of this platform (real-time ones included)."""
    return 1 <= number < getattr(signal, "NSIG", 65)


def catchable_signal(text: str, key: str) -> str:
    """The canonical name of the signal `text` names, for a setting that installs a handler on it.

    Raises:
        ValueError: naming `key`, where `text` names no signal, or one that no handler can
            catch or that only a fault raises.
    """
    try:
        name = signal_name(parse_signal(text))
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    if name in UNCATCHABLE:
        raise ValueError(f"{key} cannot be {name}: no handler can catch it; use e.g. SIGUSR1 or SIGRTMIN+3")
    if name in SYNCHRONOUS:
        raise ValueError(f"{key} cannot be {name}: a fault raises it, not a person; use e.g. SIGUSR1 or SIGRTMIN+3")
    return name
