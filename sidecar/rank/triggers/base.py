"""What every trigger is: something that `start()`s, `stop()`s, and in between
delivers what it saw to the callbacks it was given."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Trigger(ABC):
    """A source of requests for one rank (the control file, a signal)."""

    @abstractmethod
    def start(self) -> bool | None:
        """Begin delivering. Never raises: a trigger that cannot start logs why
        (and returns False where the caller may care)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop delivering and release what `start` took. Idempotent."""
