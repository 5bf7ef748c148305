"""A process's thread and file-descriptor counts, measured from outside (leak checks)."""

from __future__ import annotations

import time

import psutil


def proc_counts(pid: int) -> tuple[int, int]:
    """(threads, open file descriptors) of a process, measured from outside."""
    p = psutil.Process(pid)
    return p.num_threads(), p.num_fds()


def stable_counts(pid: int, for_s: float = 0.5, timeout: float = 15.0) -> tuple[int, int]:
    """(threads, fds) once they have not changed for `for_s` (a save thread may still be ending)."""
    deadline = time.monotonic() + timeout
    counts, since = proc_counts(pid), time.monotonic()
    while time.monotonic() - since < for_s:
        if time.monotonic() > deadline:
            raise AssertionError(f"thread/fd counts never settled (last {counts})")
        time.sleep(0.05)
        now = proc_counts(pid)
        if now != counts:
            counts, since = now, time.monotonic()
    return counts


def settled_counts(pid: int, expected: tuple[int, int], timeout: float = 15.0) -> tuple[int, int]:
    """Wait (on a deadline) for the counts to come back to `expected`; return the last counts seen."""
    deadline = time.monotonic() + timeout
    while True:
        counts = proc_counts(pid)
        if counts == expected or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)
