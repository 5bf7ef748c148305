"""Training in this process, for the tests that drive a Sidecar or a ProfilerDriver themselves
(torch is imported where these run, never at this module's import)."""

from __future__ import annotations

from typing import Any

from .wait import wait_for

STEP_S = 0.002  # each step's duration: the input of the test, not a wait


def train_until(sc: Any, predicate: Any, timeout: float = 30.0, what: str = "") -> Any:
    """Step a small model and `sc` (an installed Sidecar) until `predicate()` is truthy; return it."""
    import torch

    model = torch.nn.Linear(16, 16)

    def stepped() -> Any:
        value = predicate()
        if not value:
            model(torch.randn(4, 16)).sum().backward()
            sc.step()
        return value

    return wait_for(stepped, timeout, interval=STEP_S, what=what or f"training until {predicate}")


def driver_capture(request_id: str = "fork", start: int = 5, steps: int = 2, **fields: Any) -> Any:
    """One capture of `steps` active steps from `start` by a ProfilerDriver (no wait, no warmup):
    what `driver.take()` hands to the saver, (kind, profile)."""
    import torch

    from sidecar.common.request import ProfileRequest
    from sidecar.rank.driver import ProfilerDriver

    driver = ProfilerDriver()
    driver.start(ProfileRequest(id=request_id, active_steps=steps, warmup_steps=0, wait_steps=0, **fields), step=start)
    model = torch.nn.Linear(8, 8)
    while not driver.step():
        model(torch.randn(4, 8)).sum().backward()
    return driver.take()
