"""The `sidecar` logger: [Profiler] lines visible on stderr unless logging is configured."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("sidecar")


def ensure_log_handler() -> None:
    """Give the `sidecar` logger a stderr handler at INFO, unless the application
    configured logging itself (then its handlers and levels rule)."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.propagate = False
