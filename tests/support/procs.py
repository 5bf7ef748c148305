"""A process's thread and file-descriptor counts, measured from outside (leak checks)."""

from __future__ import annotations

import time

import psutil

from .wait import wait_for


def proc_counts(pid: int) -> tuple[int, int]:
    """(threads, open file descriptors) of a process, measured from outside."""
    p = psutil.Process(pid)
    return p.num_threads(), p.num_fds()


def stable_counts(pid: int, for_s: float = 0.5, timeout: float = 15.0) -> tuple[int, int]:
    """(threads, fds) once they have not changed for `for_s` (a save thread may still be ending)."""
    seen = {"counts": proc_counts(pid), "since": time.monotonic()}

    def held_still() -> bool:
        now = proc_counts(pid)
        if now != seen["counts"]:
            seen.update(counts=now, since=time.monotonic())
        return time.monotonic() - seen["since"] >= for_s

    wait_for(held_still, timeout, interval=0.05, what=f"thread/fd counts to hold still for {for_s}s",
             describe=lambda: f"last {seen['counts']}")
    return seen["counts"]


def settled_counts(pid: int, expected: tuple[int, int], timeout: float = 15.0) -> tuple[int, int]:
    """Wait (on a deadline) for the counts to come back to `expected`; fail naming the last counts seen."""
    wait_for(lambda: proc_counts(pid) == expected, timeout, interval=0.05, what=f"thread/fd counts back to {expected}",
             describe=lambda: f"last {proc_counts(pid)}")
    return expected
