"""Counting training steps with no code change: torch's global optimizer step hook.

The rule: one training step is one `step()` of the *lead* optimizer, the first optimizer that
steps after the hook is installed. Other optimizers that step in the same iteration (a GAN's,
say) are not counted. An explicit `Sidecar.step()` takes precedence (`Sidecar.enable_auto_step`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


class OptimizerStepHook:
    """Calls `on_step` after each step of the lead optimizer, once `install`ed, until `remove`d."""

    def __init__(self, on_step: Callable[[], None]) -> None:
        self._on_step = on_step
        self._handle: Any = None  # torch.utils.hooks.RemovableHandle
        self._lead: weakref.ref[Any] | None = None

    @property
    def has_counted(self) -> bool:
        """The lead optimizer has stepped at least once."""
        return self._lead is not None

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    def remove(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        lead = self._lead
        if lead is None:
            self._lead = weakref.ref(optimizer)
        elif lead() is not optimizer:
            return
        self._on_step()
