"""Waiting on a deadline: poll a predicate, fail with what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)
