"""Files a rank saves, and the thread that saves them.

`Saver` names every file (`<n>_trace.json.gz`, `<n>_stacks.txt`,
`<n>_memory.pickle`, numbered per kind from 0, continuing after a restart) by
claiming the name on disk, never replacing a file: two processes writing one
directory (a second job under the same replica name and rank) each keep all
their files. It writes finished captures on a thread of its own, so the
training thread only stops the profiler, and tells its listeners what was saved.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.common.layout import MEMORY_TEMPLATE, TRACE_TEMPLATE
from sidecar.common.registry import ensure_dir, publish_numbered, write_temp
from sidecar.common.request import ProfileRequest
from sidecar.rank import compress, forkwriter

log = logging.getLogger("sidecar")

JOIN_TIMEOUT_S = 60.0
KILLED_JOIN_TIMEOUT_S = 5.0


def describe(exc: BaseException) -> str:
    """An error as a person reads it: the OS's words and the file, else the exception."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename or ''})".replace(" ()", "")
    return f"{type(exc).__name__}: {exc}"


class Saver:
    """Saves one rank's captures under `trace_dir`.

    Args:
        on_saved: called on the saver thread with (kind, path, request, steps)
            once a capture is in place.
        on_failed: called on the saver thread with a message when it is not.
    """

    def __init__(
        self,
        trace_dir: Path,
        rank: int,
        on_saved: Callable[[str, Path, ProfileRequest, int], None],
        on_failed: Callable[[str], None],
    ) -> None:
        self.trace_dir = Path(trace_dir)
        self.rank = rank
        self.on_saved = on_saved
        self.on_failed = on_failed
        self._next_index: dict[str, int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def claim(self, tmp: Path, template: str, first: int = 0) -> Path:
        """Give the finished temp file `tmp` the next free name of its kind, numbered `first` or later."""
        path = publish_numbered(tmp, self.trace_dir, template, max(first, self._next_index.get(template, 0)))
        n = int(path.name.split("_", 1)[0])
        with self._lock:
            self._next_index[template] = max(self._next_index.get(template, 0), n + 1)
        return path

    def write_now(self, data: bytes, template: str, first: int = 0) -> Path:
        """Write a small file (stacks, a flight recorder dump) on the calling thread, numbered
        `first` or later (`claim`). Raises OSError."""
        path = self.first_guess(template)
        ensure_dir(path.parent)
        tmp, _ = write_temp(path, data)
        return self.claim(tmp, template, first)

    def save(self, result: tuple[str, Any], request: ProfileRequest, steps: int) -> None:
        """Write the profiler's `result` (from `ProfilerDriver.take()`) on a new thread."""
        self._thread = threading.Thread(
            target=self._save, args=(result, request, steps), name="cosmos-profiler-save", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Wait for the running save; past `timeout`, end its writer processes
        (the save then fails and removes its temp files) and wait briefly for that."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout=timeout)
            if thread.is_alive():
                forkwriter.kill_all()
                compress.kill_all()
                thread.join(timeout=KILLED_JOIN_TIMEOUT_S)

    def first_guess(self, template: str) -> Path:
        """The name the next file of `template`'s kind will most likely get."""
        return self.trace_dir / template.format(n=self._next_index.get(template, 0))

    def _save(self, result: tuple[str, Any], request: ProfileRequest, steps: int) -> None:
        from sidecar.rank import driver as driver_module

        kind = result[0]
        what = "memory snapshot" if kind == "memory" else "trace"
        template = MEMORY_TEMPLATE if kind == "memory" else TRACE_TEMPLATE
        # The number is claimed only once the file is complete.
        path = self.first_guess(template)
        try:
            ensure_dir(path.parent)
            path = driver_module.export(result, path, place=lambda tmp, _: self.claim(tmp, template))
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            log.error("[Profiler] rank %d: saving %s to %s failed: %s", self.rank, what, path, describe(exc))
            self.on_failed(f"saving {what} {path} failed: {describe(exc)}")
            return
        finally:
            del result
        log.info("[Profiler] save %s for rank: %d to file: %s after %d steps.", what, self.rank, path, steps)
        self.on_saved(kind, path, request, steps)
