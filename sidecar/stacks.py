"""Python stacks of every thread, taken from a thread other than the one that is stuck.

`format_stacks` runs on the watcher thread, so it works while the training
thread sits in a collective that never completes. The dump is read back by
`sidecar.traces.stacks` (the CLI's grouping of ranks by identical stack). No torch here.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

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

