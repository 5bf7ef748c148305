"""One way to run a background thread of the sidecar: `Worker` for a loop that waits, is woken and
stops; `PathQueue` for files handled in order on a Worker of their own (saved traces: summarized,
uploaded); `start_once` for one job that runs to its end (a save, a report to a controller). Every
thread the rank side starts is started here."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOIN_TIMEOUT_S = 5.0


def start_once(name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
    """Run `target(*args)` once, on a new daemon thread named `name` (the target catches what it
    raises: nothing of the sidecar raises into the job); returns the thread, to join."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


class Worker:
    """A daemon thread running `loop(worker)`, which waits with `wait()` and returns
    once `stopping` is set. `stop()` sets it, wakes the loop and joins the thread."""

    def __init__(self, name: str, loop: Callable[[Worker], None], on_wake: Callable[[], None] | None = None) -> None:
        self.name = name
        self._loop = loop
        self._on_wake = on_wake  # also wakes a loop that waits on something else (a poll on descriptors)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def woken(self) -> bool:
        """A `wake()` (or `stop()`) the loop has not yet taken with `wait()`."""
        return self._wake.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, args=(self,), name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Make the loop's current or next `wait()` return at once."""
        self._wake.set()
        if self._on_wake is not None:
            self._on_wake()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds; True when woken (by `wake()` or `stop()`)."""
        woken = self._wake.wait(max(0.0, timeout))
        self._wake.clear()
        return woken

    def sleep(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking only to stop; True when stopping."""
        return self._stopping.wait(max(0.0, timeout))

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stop the loop and wait for it (not when called from the loop itself)."""
        self._stopping.set()
        self.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)
        self._thread = None


class PathQueue:
    """Paths handled in order, one at a time, by `handle(path)` on a Worker named `name`, started
    at the first `put`. `handle` catches what it raises (nothing of the sidecar raises into the job)."""

    def __init__(self, name: str, handle: Callable[[Path], None]) -> None:
        self.name = name
        self._handle = handle
        self._paths: deque[Path] = deque()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._worker: Worker | None = None

    def put(self, path: Path) -> None:
        """Queue `path`; returns at once."""
        with self._lock:
            self._paths.append(Path(path))
            self._idle.clear()
            if self._worker is None:
                self._worker = Worker(self.name, self._run)
                self._worker.start()
            worker = self._worker
        worker.wake()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` for every queued path to be handled; whether all were."""
        return self._idle.wait(timeout)

    def close(self, timeout: float, join_unfinished_s: float = JOIN_TIMEOUT_S) -> bool:
        """Wait up to `timeout` for the queued paths, drop those left and stop the thread: wait for it
        `join_unfinished_s` when one is still being handled (else up to JOIN_TIMEOUT_S). Returns
        whether every path was handled."""
        finished = self._idle.wait(timeout)
        with self._lock:
            worker, self._worker = self._worker, None
            self._paths.clear()
        if worker is not None:
            worker.stop(timeout=JOIN_TIMEOUT_S if finished else join_unfinished_s)
        return finished

    def _run(self, worker: Worker) -> None:
        while not worker.stopping:
            with self._lock:
                path = self._paths.popleft() if self._paths else None
                if path is None:
                    self._idle.set()
            if path is None:
                worker.wait(3600.0)
                continue
            self._handle(path)
