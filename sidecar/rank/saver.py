"""Files a rank saves, the thread that saves a capture, and what follows a save.

`Saver` names every file (`<n>_trace.json.gz`, `<n>_stacks.txt`, `<n>_memory.pickle`, numbered
per kind from 0, continuing after a restart) by claiming the name on disk, never replacing a
file: two processes writing one directory (a second job under the same replica name and rank)
each keep all their files. It writes a finished capture on a thread of its own
(`rank.exporter` writes the file), so the training thread only stops the profiler; then it tells
the capture owner (`CaptureOwner.saved`, or `fail`), reports the directory to a controller
(`rank.controller_post`), queues the S3 copy (`rank.upload`, whose thread answers
`_on_uploaded`) and the trace's summary (`rank.summarizer`: `<n>_summary.json` beside it, written
by a child process; its thread answers `_on_summarized`), and calls the `on_saved` listeners.
The rank publishes the summaries of the last few traces beside its record (`summaries`, through
the Publisher), with where each went;
a rank started again over a directory that holds some takes them up at once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.common import layout, storeurl
from sidecar.common.capturesummary import MAX_SUMMARIES, check, compact
from sidecar.common.layout import MEMORY_TEMPLATE, SUMMARY_FILE_RE, TRACE_TEMPLATE
from sidecar.common.registry import atomic_write, ensure_dir, publish_numbered, write_temp
from sidecar.common.request import ProfileRequest
from sidecar.rank import compress, exporter, forkwriter
from sidecar.rank.context import RankContext
from sidecar.rank.controller_post import TraceDirReporter
from sidecar.rank.summarizer import MAX_SUMMARY_FILE_BYTES, TraceSummarizer
from sidecar.rank.threads import start_once
from sidecar.rank.upload import TraceUploader

log = logging.getLogger("sidecar")

JOIN_TIMEOUT_S = 60.0
KILLED_JOIN_TIMEOUT_S = 5.0

OnSaved = Callable[[str, Path, ProfileRequest], None]


def describe(exc: BaseException) -> str:
    """An error as a person reads it: the OS's words and the file, else the exception."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename or ''})".replace(" ()", "")
    return f"{type(exc).__name__}: {exc}"


class Saver:
    """Saves one rank's captures under its trace directory (see the module docstring)."""

    def __init__(self, ctx: RankContext) -> None:
        self._ctx = ctx
        self.trace_dir = ctx.trace_dir
        self.rank = ctx.identity.rank
        self._next_index: dict[str, int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.trace_paths: list[str] = []  # every file saved, in order
        # Called on the saver thread after each file is saved: (kind, path, request).
        self.on_saved: list[OnSaved] = []
        job = ctx.job
        self._reporter = TraceDirReporter(job.sidecar.controller_url, ctx.identity.replica, self.rank)
        # [train.ckpt] upload_s3: each saved trace, copied to S3 on a thread of its own (sidecar.rank.upload).
        self.uploader = TraceUploader(job.s3, self.rank, self._on_uploaded, ctx.log.once) if job.s3 else None
        self.trace_url: str | None = None
        self.upload_error: str | None = None
        # Each saved trace summarized beside it by a child process (sidecar.rank.summarizer); the record
        # carries the last MAX_SUMMARIES of them, and what became of each trace's upload (by trace path).
        self.summarizer = TraceSummarizer(self.rank, self._on_summarized, ctx.log.once)
        self._summaries: deque[dict[str, Any]] = deque(maxlen=MAX_SUMMARIES)
        self._uploads: dict[str, dict[str, Any]] = {}
        self._load_summaries()

    # -- names --------------------------------------------------------------------

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
        path = self.claim(tmp, template, first)
        root = self._ctx.registry_root
        if storeurl.is_mirror(root):  # a redis:// registry: a copy travels with the node's records
            copy = layout.dump_copy_path(root, self._ctx.identity.replica, self.rank, path.name)
            try:
                ensure_dir(copy.parent)
                atomic_write(copy, data)
            except OSError as exc:
                log.warning("[Profiler] rank %d: no copy of %s for the store: %s", self.rank, path, exc)
        return path

    def first_guess(self, template: str) -> Path:
        """The name the next file of `template`'s kind will most likely get."""
        return self.trace_dir / template.format(n=self._next_index.get(template, 0))

    # -- a capture's save -----------------------------------------------------------

    def check_upload(self) -> None:
        """At start: whether uploads can run (boto3 missing: said once, now)."""
        if self.uploader is not None:
            self.upload_error = self.uploader.check()

    def save(self, result: tuple[str, Any], request: ProfileRequest, steps: int) -> None:
        """Write the profiler's `result` (from `ProfilerDriver.take()`) on a new thread."""
        self._thread = start_once("cosmos-profiler-save", self._save, result, request, steps)

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

    def close(self) -> None:
        """At close: wait for the running save, the reports to a controller and the uploads."""
        self.join()
        self._reporter.join()
        self.summarizer.close()
        if self.uploader is not None:
            self.uploader.close()

    def upload_fields(self) -> dict[str, Any]:
        """The record's `upload_to`, `trace_url` and `upload_error`, read together."""
        with self._lock:
            return {"upload_to": self.uploader.target.location if self.uploader is not None else None,
                    "trace_url": self.trace_url, "upload_error": self.upload_error}

    def _load_summaries(self) -> None:
        """The summaries beside the last traces already in this rank's directory (a job started again
        under its replica name), so that it publishes them from its first record: a diff of its
        next capture against its last one reads both. A summary that cannot be read is left out."""
        try:
            found = sorted((int(m["n"]), entry.name) for entry in os.scandir(self.trace_dir)
                           if (m := SUMMARY_FILE_RE.match(entry.name)))
        except OSError:
            return  # no directory yet: no trace either
        for _, name in found[-MAX_SUMMARIES:]:
            path = self.trace_dir / name
            try:
                with open(path, "rb") as f:
                    data = f.read(MAX_SUMMARY_FILE_BYTES + 1)
                if len(data) > MAX_SUMMARY_FILE_BYTES:
                    raise ValueError(f"over {MAX_SUMMARY_FILE_BYTES} bytes")
                summary = compact(check(json.loads(data)))
            except (OSError, ValueError, RecursionError) as exc:
                log.debug("[Profiler] rank %d: the summary %s cannot be read: %s", self.rank, path, exc)
                continue
            summary["summary_path"] = str(path)
            self._summaries.append(summary)

    def summaries(self) -> list[dict[str, Any]]:
        """What the rank publishes beside its record: the last traces' summaries, oldest first, each with
        its upload's outcome."""
        with self._lock:
            out = []
            for summary in self._summaries:
                upload = self._uploads.get(summary["trace_path"])
                out.append({**summary, **upload} if upload else summary)
            return out

    def _save(self, result: tuple[str, Any], request: ProfileRequest, steps: int) -> None:
        kind = result[0]
        what = "memory snapshot" if kind == "memory" else "trace"
        template = MEMORY_TEMPLATE if kind == "memory" else TRACE_TEMPLATE
        # The number is claimed only once the file is complete.
        path = self.first_guess(template)
        try:
            ensure_dir(path.parent)
            path = exporter.export(result, path, place=lambda tmp, _: self.claim(tmp, template))
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            log.error("[Profiler] rank %d: saving %s to %s failed: %s", self.rank, what, path, describe(exc))
            self._ctx.capture.fail(f"saving {what} {path} failed: {describe(exc)}", self._ctx.steps())
            self._ctx.wake()
            return
        finally:
            del result
        log.info("[Profiler] save %s for rank: %d to file: %s after %d steps.", what, self.rank, path, steps)
        self._on_saved(kind, path, request)

    def _on_saved(self, kind: str, path: Path, request: ProfileRequest) -> None:
        ctx = self._ctx
        self.trace_paths.append(str(path))
        ctx.capture.saved(kind, str(path), request, ctx.steps())
        ctx.wake()
        if kind == "trace":
            self._reporter.report(path.parent)
            if self.uploader is not None:
                with self._lock:
                    self._uploads[str(path)] = {"upload_url": self.uploader.target.url(path)}
                self.uploader.upload(path)
            self.summarizer.summarize(path)
        for callback in self.on_saved:
            try:
                callback(kind, path, request)
            except Exception:  # noqa: BLE001 - a listener's failure is not the save's
                log.exception("[Profiler] rank %d: a listener of saved files failed", self.rank)

    def _on_uploaded(self, path: Path, url: str | None, error: str | None) -> None:
        """The upload thread: `path` is at `url`, or not (`error`)."""
        with self._lock:
            if url is not None:
                self.trace_url = url
            self.upload_error = error
            self._uploads.setdefault(str(path), {}).update(trace_url=url, upload_error=error)
        # The history ties the outcome to its trace, for `profile status` (answers.capture_of).
        if url is not None:
            self._ctx.capture.note(self._ctx.steps(), upload=str(path), url=url)
        else:
            self._ctx.capture.note(self._ctx.steps(), upload=str(path), upload_error=error)
        self._ctx.wake()

    def _on_summarized(self, path: Path, summary: dict[str, Any] | None, error: str | None) -> None:
        """The summarizer's thread: `path`'s summary is beside it (`summary`: the published copy), or not."""
        if summary is None:
            return  # said once in the log; the trace itself is saved
        with self._lock:
            self._summaries.append(summary)
            while len(self._uploads) > 2 * MAX_SUMMARIES:  # the oldest traces' (a dict keeps its order)
                del self._uploads[next(iter(self._uploads))]
        self._ctx.wake()
