"""Leaving the CLI process as soon as its command is done.

`python -m sidecar profile set ...` writes its request a few milliseconds before
it ends; the interpreter's teardown after that (module and object clean-up of
click, json and the sidecar modules: about 15 ms of CPU) runs on a core that the
rank reading the request wants, right when it wants it. The console entry point
(`app.main`) therefore flushes stdout and stderr and ends with `os._exit`.

Nothing the CLI runs needs the teardown: it registers no `atexit` handler, keeps
no temporary file for the end (but the local copy of a redis:// registry, removed here),
and joins its thread pools before it returns.
Click's in-process invocations (`CliRunner`, the `cosmos` group) never come here.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_status(code: object) -> int:
    """The status `sys.exit(code)` would give: None is 0, an int is itself, anything
    else (a message, which the caller prints) is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def exit_now(code: object) -> NoReturn:
    """End the process as `sys.exit(code)` would, without the interpreter's teardown.

    stdout and stderr are flushed first. A stream whose reader went away (a pipe
    closed early: `| head`) loses what was left, as in click, with status 1 and
    no traceback.
    """
    status = exit_status(code)
    if code is not None and not isinstance(code, int):
        _write(sys.stderr, f"{code}\n")
    for stream in (sys.stdout, sys.stderr):
        if not _flush(stream) and status == 0:
            status = 1
    views = sys.modules.get("sidecar.fleet.storeview")  # loaded only for a redis:// registry
    if views is not None:
        views.close_all()  # its local copy of the store goes: no teardown would remove it
    os._exit(status & 0xFF)


def _write(stream: object, text: str) -> None:
    try:
        stream.write(text)  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):
        pass


def _flush(stream: object) -> bool:
    """Flush `stream`; False when it could not take what was left (a closed pipe, a full disk)."""
    if stream is None:
        return True
    try:
        stream.flush()  # type: ignore[attr-defined]
    except (OSError, ValueError):  # EPIPE, ENOSPC; ValueError: closed already
        return False
    return True
