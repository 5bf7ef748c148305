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


class _Forward(logging.Handler):
    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        if self.target.isEnabledFor(record.levelno):
            record.name = self.target.name  # the line reads as the target's own
            self.target.handle(record)


def forward_to(target: logging.Logger) -> None:
    """Send the `sidecar` logger's records to `target` instead (cosmos-rl's `cosmos`
    logger, so a worker's [Profiler] lines appear where cosmos-rl's own do)."""
    if any(isinstance(h, _Forward) and h.target is target for h in log.handlers):
        return
    for handler in list(log.handlers):
        log.removeHandler(handler)
    log.addHandler(_Forward(target))
    log.propagate = False
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
