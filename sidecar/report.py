"""Tell a Cosmos-RL controller where a rank saved its trace (POST /api/set_trace_path).

Best effort and short: the controller is optional, and this runs on its own
thread so the training thread never waits for it. Standard library only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

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
