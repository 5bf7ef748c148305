"""Each saved trace summarized beside it, in a child process: `<n>_summary.json`, and its record copy.

Once a trace is saved (`Saver`), `TraceSummarizer.summarize(path)` queues it; a thread of its own
starts a child interpreter (`python -I -S -c CHILD`, at nice 19) that reads the trace with the
CLI's own analysis (`sidecar.traces.summaryfile`: every op kept) and writes `<n>_summary.json`
beside it, temp and rename. The training process never parses the trace: the child holds no lock
of ours and takes only CPU that training leaves idle. The thread then reads the small summary
back and hands its record copy (`capturesummary.compact`, bounded) to `on_done`. Where the save
writer is `thread` (COSMOS_PROFILER_SAVE_WRITER: no child processes) nothing is summarized (said
once): the analysis is the CLI's (`sidecar.traces`), which the rank side never imports.

A child that fails, is killed or outlives `timeout` costs that summary only (one warning per
process; `on_done` gets the reason), never the trace, never a step. `close()` waits a little for
the one running, then kills it and removes the temp file it may have been writing (a rank killed
outright leaves it to the next start's cleanup).
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.common.capturesummary import compact
from sidecar.common.layout import summary_path_for
from sidecar.common.registry import TEMP_MARK, unlink_quietly
from sidecar.rank import compress
from sidecar.rank.threads import PathQueue

log = logging.getLogger("sidecar")

CHILD_NICE = 19
TIMEOUT_S = 600.0
CLOSE_WAIT_S = 10.0
MAX_SUMMARY_FILE_BYTES = 64 << 20
CHILD_MARK = "# cosmos-profiler summary writer"

# Run with `python -I -S -c CHILD PACKAGE_ROOT TRACE`: the package root first on sys.path (-I drops
# PYTHONPATH and the script's folder; -S the site packages, which the analysis does not need).
CHILD = CHILD_MARK + """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle; it ends us
try:
    os.nice(NICE)
except OSError:
    pass
sys.path.insert(0, sys.argv[1])
from sidecar.traces.summaryfile import main
sys.exit(main(sys.argv[2:]))
""".replace("NICE", str(CHILD_NICE))

# (trace path, the record's copy of its summary or None, why not or None)
OnSummarized = Callable[[Path, "dict[str, Any] | None", "str | None"], None]


def package_root() -> str:
    """The folder that holds the `sidecar` package (what the child puts on its path): sidecar/rank/ is here."""
    return str(Path(__file__).resolve().parents[2])


class TraceSummarizer:
    """Summarizes one rank's saved traces, in order, one child at a time (see the module docstring).

    Args:
        rank: for the log lines.
        on_done: called on the summarizer's thread with (trace, summary, error).
        log_once: the sidecar's `(key, level, message)` logger that logs a key once.
    """

    def __init__(self, rank: int, on_done: OnSummarized, log_once: Callable[[str, int, str], None],
                 timeout: float = TIMEOUT_S) -> None:
        self.rank = rank
        self.on_done = on_done
        self.log_once = log_once
        self.timeout = timeout
        self._paths = PathQueue("cosmos-profiler-summary", self._summarize_one)
        self._lock = threading.Lock()
        self._closing = False
        self._child: subprocess.Popen | None = None

    def summarize(self, trace: Path) -> None:
        """Queue a saved trace; returns at once."""
        if compress.default_writer() == "thread":
            self.log_once("summary-thread", logging.INFO, f"[Profiler] rank {self.rank}: no trace summaries: "
                          "COSMOS_PROFILER_SAVE_WRITER=thread starts no child process, and summaries are written by one")
            return
        self._paths.put(trace)

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` for every queued summary; whether all are done."""
        return self._paths.wait_idle(timeout)

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Wait up to `timeout` for the queued summaries, then kill the child still running and stop."""
        finished = self._paths.wait_idle(timeout)
        with self._lock:
            self._closing = True
            child = self._child
        if child is not None:
            with contextlib.suppress(OSError):
                child.kill()
        self._paths.close(0.0)
        return finished

    def _summarize_one(self, path: Path) -> None:
        summary, error = None, None
        try:
            summary = self._summarize(path)
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            error = f"summarizing {path} failed: {exc}"
            self.log_once("summary", logging.WARNING, f"[Profiler] rank {self.rank}: {error} (the trace is "
                          "saved; later failures of this process are only in the rank record)")
        try:
            self.on_done(path, summary, error)
        except Exception:  # noqa: BLE001 - the listener's failure is not the summary's
            log.exception("[Profiler] rank %d: recording a trace summary failed", self.rank)

    def _summarize(self, trace: Path) -> dict[str, Any]:
        """Summarize `trace` beside it in a child process; the summary, read back and cut for the record.

        Raises:
            RuntimeError: the child could not start, failed, was killed or ran too long.
            OSError, ValueError: its summary cannot be read back.
        """
        self._summarize_in_child(trace)
        path = summary_path_for(trace)
        assert path is not None  # the saver's traces are named <n>_trace.json.gz
        with open(path, "rb") as f:
            data = f.read(MAX_SUMMARY_FILE_BYTES + 1)
        if len(data) > MAX_SUMMARY_FILE_BYTES:
            raise ValueError(f"{path} is over {MAX_SUMMARY_FILE_BYTES} bytes")
        summary = compact(json.loads(data))
        summary["summary_path"] = str(path)
        return summary

    def _summarize_in_child(self, trace: Path) -> None:
        args = [sys.executable, "-I", "-S", "-c", CHILD, package_root(), str(trace)]
        with self._lock:
            if self._closing:
                raise RuntimeError("the sidecar is closing")
            try:
                # No preexec_fn: CPython then uses vfork, so starting the child costs the same in a 100 GB process.
                child = self._child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE, close_fds=True)
            except OSError as exc:
                raise RuntimeError(f"the summary writer process could not start ({exc.strerror or exc})") from None
        try:
            try:
                out, err = child.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                raise RuntimeError(f"the summary writer process (pid {child.pid}) did not finish in "
                                   f"{self.timeout:g} s; it was killed") from None
        finally:
            with self._lock:
                self._child = None
        if child.returncode < 0:  # killed mid-write: its temp file is this process's to remove
            path = summary_path_for(trace)
            if path is not None:
                with contextlib.suppress(OSError):
                    for temp in path.parent.glob(f".{path.name}{TEMP_MARK}{child.pid}-*"):
                        unlink_quietly(temp)
        if child.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            how = f"was killed by signal {-child.returncode}" if child.returncode < 0 else \
                f"exited with status {child.returncode}"
            raise RuntimeError(f"the summary writer process (pid {child.pid}) {how}" + (f": {text[-1]}" if text else ""))
