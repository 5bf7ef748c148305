"""Tell a Cosmos-RL controller where a rank saved its trace (POST /api/set_trace_path).

Best effort and short: the controller is optional, and each report runs on a thread of its
own (`rank.threads.start_once`) so the training thread never waits for it. Standard library only.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from pathlib import Path

from sidecar.rank.threads import start_once

log = logging.getLogger("sidecar")

SET_TRACE_PATH = "/api/set_trace_path"


def report_trace_path(base_url: str, replica: str, trace_path: str, global_rank: int, timeout: float = 3.0) -> None:
    """POST {"replica_name", "trace_path", "global_rank"} to `<base_url>/api/set_trace_path`.

    Raises:
        OSError: (URLError, timeouts, refused connections) on any failure.
        ValueError: the controller answered with an HTTP error status.
    """
    url = base_url.rstrip("/") + SET_TRACE_PATH
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    post_trace_path(url, replica, trace_path, global_rank, timeout)


def post_trace_path(url: str, replica: str, trace_path: str, global_rank: int, timeout: float = 3.0) -> None:
    """POST the trace path to the full `url` (see `report_trace_path` for what it raises)."""
    body = json.dumps({"replica_name": replica, "trace_path": trace_path, "global_rank": global_rank}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - URL from the job's own config
            resp.read(65536)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"controller answered HTTP {exc.code} for {url}") from None


REPORT_TIMEOUT_S = 3.0


class TraceDirReporter:
    """Reports each saved trace directory to the controller at `base_url` (the
    sidecar's `controller_url`; empty: nothing is reported), each on a thread of
    its own, warning once when the controller cannot be reached."""

    def __init__(self, base_url: str, replica: str, rank: int, timeout: float = REPORT_TIMEOUT_S) -> None:
        self.base_url = base_url
        self.replica = replica
        self.rank = rank
        self.timeout = timeout
        self._threads: list[threading.Thread] = []
        self._warned = False

    def report(self, trace_dir: Path) -> None:
        if not self.base_url:
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(start_once("cosmos-profiler-report", self._report, str(Path(trace_dir).resolve())))

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=self.timeout + 1.0)

    def _report(self, trace_dir: str) -> None:
        try:
            report_trace_path(self.base_url, self.replica, trace_dir, self.rank, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - the controller is optional
            if not self._warned:
                self._warned = True
                log.warning("[Profiler] could not report the trace path to %s: %s", self.base_url, exc)
