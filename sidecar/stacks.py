"""Python stacks of every thread, taken from a thread other than the one that is stuck.

`format_stacks` runs on the watcher thread, so it works while the training
thread sits in a collective that never completes. `parse_stacks` reads a dump
back (for the CLI's grouping of ranks by identical stack). No torch here.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ThreadStack:
    name: str
    frames: tuple[str, ...]  # 'File "x.py", line 3, in f' lines, outermost first


def parse_stacks(text: str) -> list[ThreadStack]:
    """Read a dump written by `format_stacks`."""
    threads: list[ThreadStack] = []
    name, frames = None, []
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
