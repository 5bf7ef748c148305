"""The signal trigger: SIGUSR1 (or the configured signal) asks this rank for a capture.

The handler only records intent: it bumps a counter and calls `on_signal`,
which must itself only set attributes. All real work happens at the next
`Sidecar.step()`.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sidecar")


class SignalTrigger:
    """Installs a handler for one signal, chaining whatever handler was there."""

    def __init__(self, signum: int, on_signal: Callable[[], None]) -> None:
        self.signum = signum
        self.on_signal = on_signal
        self.num_received = 0
        self._previous: Any = None
        self._installed = False

    @property
    def is_installed(self) -> bool:
        return self._installed

    def start(self) -> bool:
        """Install the handler. Returns False (and logs why) when it cannot be."""
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "[Profiler] %s trigger not installed: install the sidecar from the main thread to use it",
                signal.Signals(self.signum).name,
            )
            return False
        try:
            self._previous = signal.signal(self.signum, self._handle)
        except (ValueError, OSError) as exc:
            log.warning("[Profiler] cannot install %s handler: %s", signal.Signals(self.signum).name, exc)
            return False
        self._installed = True
        return True

    def stop(self) -> None:
        """Restore the previous handler, if ours is still the one installed."""
        if not self._installed:
            return
        self._installed = False
        if threading.current_thread() is not threading.main_thread():
            return  # cannot touch handlers here; ours stays but does nothing harmful
        try:
            if signal.getsignal(self.signum) == self._handle:
                signal.signal(self.signum, self._previous if self._previous is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.num_received += 1
        if self._installed:
            self.on_signal()
        # Chain a Python handler that was there before us; SIG_DFL and SIG_IGN
        # are not callable, and chaining SIG_DFL would kill the job.
        if callable(self._previous):
            self._previous(signum, frame)
