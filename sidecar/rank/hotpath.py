"""What the training thread's `step()` reads: the step counter and two flags, and who may set them.

`step()` is the hot path (tens of nanoseconds idle): it reads these as attributes of the object
it is called on, so the `Sidecar` inherits `HotPath` and the rooms hold it as `RankContext.hot`,
typed as this class: they see the three attributes below and nothing else of the Sidecar.

- `_step`: training steps so far; only `step()` adds to it, anyone reads it (`steps()`).
- `_boundary_work`: the next step boundary has work (a request armed, a capture running or to
  stop, a signal to turn into a request, the trigger's signal to take back). The capture owner
  (`capture.CaptureOwner`) sets and settles it under its lock; the signal handler only sets it
  (`on_signal`), taking no lock; `close()` clears it.
- `_watch`: the slowdown watch `step()` feeds, or None (`watches.Watches` sets it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.rank.slowdown import SlowdownWatch


class HotPath:
    """The attributes `step()` reads (see the module docstring)."""

    def __init__(self) -> None:
        self._step = 0
        self._boundary_work = False
        self._watch: SlowdownWatch | None = None

    def steps(self) -> int:
        """The training step now running (the number of `step()` calls so far)."""
        return self._step

    def set_boundary_work(self, value: bool) -> None:
        """Whether the next step boundary has work (the capture owner, under its lock)."""
        self._boundary_work = value

    def on_signal(self) -> None:
        """Inside a signal handler: the next step boundary turns the signal into a request."""
        self._boundary_work = True

    def set_watch(self, watch: SlowdownWatch | None) -> None:
        """The slowdown watch each `step()` feeds from now on (None: none)."""
        self._watch = watch
