"""Python stacks of every thread, taken from a thread other than the one that is stuck.

`format_stacks` runs on the watcher thread, so it works while the training
thread sits in a collective that never completes. The dump is read back by
`sidecar.fleet.stackgroups` (the CLI's grouping of ranks by identical stack). No torch here.

`faulthandler` writes a second format, from a signal handler or its watchdog
thread, which works while a C call holds the GIL: `Thread 0x... (most recent call
first):` (`Current thread` for the one that took the signal), then frames as
`File "x.py", line 3 in f`, innermost first, and no thread names.
`parse_fault_dump` reads it into the frames `format_stacks` writes (innermost
last, `File "x.py", line 3, in f`), so the two kinds of answer group together;
`fault_dump_as_stacks` rewrites one in `format_stacks`'s format.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.common.registry import open_regular

HEADER = "# cosmos-profiler stacks"
THREAD_PREFIX = "--- thread "


def format_stacks(header: dict[str, object], skip_current: bool = True) -> str:
    """Every thread's stack, innermost frame last, with thread names.

    Args:
        header: identity fields written on the first line (replica, rank, ...).
        skip_current: leave out the thread doing the dump (it is always here).
    """
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    lines = [HEADER + " " + " ".join(f"{k}={v}" for k, v in header.items()) + f" at={time.time():.3f}"]
    frames = sys._current_frames()
    # Main thread first: it is the one users ask about.
    order = sorted(frames, key=lambda ident: (ident != threading.main_thread().ident, ident))
    for ident in order:
        if skip_current and ident == me:
            continue
        thread = names.get(ident)
        name = thread.name if thread else "<unknown>"
        flags = []
        if thread is threading.main_thread():
            flags.append("main")
        if thread is not None and thread.daemon:
            flags.append("daemon")
        lines.append(f"{THREAD_PREFIX}{name} (ident {ident}{', ' + ', '.join(flags) if flags else ''})")
        lines.extend(line.rstrip("\n") for line in traceback.format_stack(frames[ident]))
    return "\n".join(lines) + "\n"



_FAULT_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FAULT_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


@dataclass(frozen=True)
class FaultThread:
    """One thread of a faulthandler dump."""

    ident: int
    is_current: bool  # the thread that ran the signal handler
    frames: tuple[str, ...]  # 'File "x.py", line 3, in f', outermost first (as format_stacks)


def parse_fault_dump(text: str) -> list[FaultThread]:
    """The threads of a faulthandler dump (one or several dumps: the threads of each, in order)."""
    threads: list[FaultThread] = []
    ident: int | None = None
    current = False
    frames: list[str] = []
    for line in text.splitlines():
        match = _FAULT_THREAD.match(line)
        if match:
            if ident is not None:
                threads.append(FaultThread(ident, current, tuple(reversed(frames))))
            ident, current, frames = int(match.group(2), 16), match.group(1) == "Current thread", []
            continue
        frame = _FAULT_FRAME.match(line)
        if frame and ident is not None:
            frames.append(f'File "{frame.group(1)}", line {frame.group(2)}, in {frame.group(3)}')
    if ident is not None:
        threads.append(FaultThread(ident, current, tuple(reversed(frames))))
    return threads


def fault_thread_name(thread: FaultThread, names: Mapping[int, str]) -> str:
    """The name the sidecar knew the thread by, else `Thread 0x...` as faulthandler wrote it."""
    return names.get(thread.ident) or f"Thread 0x{thread.ident:016x}"


def fault_dump_as_stacks(text: str, header: dict[str, object], names: Mapping[int, str], main_ident: int | None) -> str:
    """A faulthandler dump rewritten in `format_stacks`'s format (main thread first), with
    thread names from `names` (ident -> name)."""
    threads = parse_fault_dump(text)
    threads.sort(key=lambda t: t.ident != main_ident)
    lines = [HEADER + " " + " ".join(f"{k}={v}" for k, v in header.items()) + f" at={time.time():.3f}"]
    for thread in threads:
        flags = ["main"] if thread.ident == main_ident else []
        if thread.is_current:
            flags.append("signalled")
        lines.append(f"{THREAD_PREFIX}{fault_thread_name(thread, names)} "
                     f"(ident {thread.ident}{', ' + ', '.join(flags) if flags else ''})")
        lines.extend(f"  {frame}" for frame in thread.frames)
    return "\n".join(lines) + "\n"


def thread_names() -> dict[int, str]:
    """Every live Python thread's ident and name (what a faulthandler dump lacks)."""
    return {t.ident: t.name for t in threading.enumerate() if t.ident is not None}


# --- reading a dump back (the CLI; `sidecar.fleet.stackgroups` groups ranks by it) ---------

MAX_STACKS_BYTES = 16 << 20


@dataclass(frozen=True)
class ThreadStack:
    name: str
    frames: tuple[str, ...]  # 'File "x.py", line 3, in f' lines, outermost first


def parse_stacks(text: str) -> list[ThreadStack]:
    """Read a dump written by `sidecar.common.stackdump.format_stacks`."""
    threads: list[ThreadStack] = []
    name: str | None = None
    frames: list[str] = []
    for line in text.splitlines():
        if line.startswith(THREAD_PREFIX):
            if name is not None:
                threads.append(ThreadStack(name, tuple(frames)))
            name, frames = line[len(THREAD_PREFIX):].split(" (ident", 1)[0], []
        elif name is not None and line.lstrip().startswith("File "):
            frames.append(line.strip())
    if name is not None:
        threads.append(ThreadStack(name, tuple(frames)))
    return threads


def read_stacks(path: str | os.PathLike[str]) -> tuple[dict[str, str], list[ThreadStack], int | None]:
    """(header fields, threads, index of the main thread or None) of a dump
    written by `sidecar.common.stackdump.format_stacks`.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a stacks dump.
    """
    with open_regular(path) as f:
        data = f.read(MAX_STACKS_BYTES + 1)
    if len(data) > MAX_STACKS_BYTES:
        raise ValueError(f"it is larger than {MAX_STACKS_BYTES} bytes")
    text = data.decode("utf-8", errors="replace")
    first, _, _ = text.partition("\n")
    if not first.startswith(HEADER):
        raise ValueError(f"it does not start with {HEADER!r}")
    header = dict(token.split("=", 1) for token in first[len(HEADER):].split() if "=" in token)
    main = None
    position = 0
    for line in text.splitlines():
        if line.startswith(THREAD_PREFIX):
            flags = line[len(THREAD_PREFIX):].split(" (ident", 1)[-1].rstrip(")").split(", ")
            if main is None and "main" in flags[1:]:
                main = position
            position += 1
    return header, parse_stacks(text), main
