"""Waiting on a deadline: poll a predicate, fail with what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "",
             describe: Callable[[], str] | None = None) -> Any:
    """Poll `predicate` until it returns something truthy, or fail at the deadline.

    Args:
        describe: what the failure message adds (the state that was seen last), read once at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = ""
            if describe is not None:
                try:
                    seen = f"\n{describe()}"
                except Exception as exc:  # noqa: BLE001 - the failure is the timeout, not this
                    seen = f"\n(could not describe the state: {exc!r})"
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}{seen}")
        time.sleep(interval)
