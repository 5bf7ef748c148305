"""A thread parked in a known frame, for tests that read every thread's stack."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


def parked_worker(started: threading.Event, release: threading.Event) -> None:
    """The frame a parked thread stands in: it says it started, then waits to be released."""
    started.set()
    release.wait(60)


@contextmanager
def parked_thread(name: str = "parked") -> Iterator[threading.Thread]:
    """A thread named `name` that stands in `parked_worker` until the block ends."""
    started, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=parked_worker, args=(started, release), name=name)
    thread.start()
    started.wait(60)
    try:
        yield thread
    finally:
        release.set()
        thread.join()
