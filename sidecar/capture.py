"""The capture state machine of one rank: states, and (pure) transitions and admission.

    idle ──request──> armed ──start step──> tracing ──schedule ends──> saving ──saved──> idle
      ^                 │ cancel              │ cancel: stop, save what was recorded
      └─────────────────┘                     └──> saving
    any failure ──> error (the next accepted request leaves it)

No I/O, no threads, no torch: `sidecar.core.Sidecar` drives it.
"""

from __future__ import annotations

from enum import Enum


class State(str, Enum):
    """A rank's state, as its record spells it (a `str`: `State.ARMED == "armed"`)."""

    IDLE = "idle"
    ARMED = "armed"
    TRACING = "tracing"
    SAVING = "saving"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# A request is in flight: another one is refused (a cancel is the way out).
BUSY_STATES = (State.ARMED, State.TRACING, State.SAVING)
