"""The relay of requests from the node agent to its node's ranks: one envelope file, node-local.

    <node dir>/control.json   {"envelope": 1, "source": [mtime_ns, size, inode, mode] | null,
                               "digest": sha256 of the bytes, "data": the bytes (base64),
                               "repeat": bool, "error": str | null, "baseline": bool, "agent": {...}}

The agent (sidecar.rank.nodeagent) writes it, temp + rename, for each new version of the
shared control file it sees: the control file's bytes as they are, its signature (which the
ranks take the request's fallback id from, so every rank on every node derives the same one),
whether it is a bare `touch` of the same bytes (`repeat`), or why it could not be read
(`error`: a symlink, a FIFO, too large, a foreign owner). A `baseline` envelope only says what
the shared file held when an agent started, and is delivered to no one.

Each rank watches the envelope with inotify (it is on a local filesystem) through its own file
trigger, and hands what it unwraps to its intake as the control file itself would have been
(`RankRelay`). An envelope with the signature and digest of the last one a rank took is the
same request relayed twice (an agent that resumed after another took over); it is dropped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.common.exceptions import RequestError
from sidecar.common.registry import ControlFile, atomic_write, ensure_dir, read_control

log = logging.getLogger("sidecar")

ENVELOPE_FORMAT = 1
Signature = tuple[int, int, int, int]


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(*, source: Signature | None, data: bytes, repeat: bool = False, error: str | None = None,
           baseline: bool = False, agent: dict[str, Any] | None = None) -> bytes:
    envelope = {
        "envelope": ENVELOPE_FORMAT,
        "source": list(source) if source is not None else None,
        "digest": digest_of(data),
        "data": base64.b64encode(data).decode("ascii"),
        "repeat": repeat,
        "error": error,
        "baseline": baseline,
        "agent": agent or {},
    }
    return (json.dumps(envelope, sort_keys=True) + "\n").encode()


def decode(raw: bytes) -> dict[str, Any]:
    """The envelope's object, its data as bytes and its source as a tuple.

    Raises:
        ValueError: not an envelope of this format.
    """
    envelope = json.loads(raw)
    if not isinstance(envelope, dict) or envelope.get("envelope") != ENVELOPE_FORMAT:
        raise ValueError("not a relay envelope")
    source = envelope.get("source")
    envelope["source"] = tuple(int(v) for v in source) if isinstance(source, list) and len(source) == 4 else None
    envelope["data"] = base64.b64decode(envelope.get("data") or "", validate=True)
    if envelope.get("digest") != digest_of(envelope["data"]):
        raise ValueError("the envelope's digest does not match its data")
    return envelope


def write(path: Path, raw: bytes) -> None:
    """Raises OSError."""
    try:
        atomic_write(path, raw, mode=0o600)
    except FileNotFoundError:  # the node dir was removed under the job: again
        ensure_dir(path.parent, private=True)
        atomic_write(path, raw, mode=0o600)


def read(path: Path, max_bytes: int) -> dict[str, Any] | None:
    """The envelope at `path`; None when there is none, or it is no good (the agent writes a new one)."""
    try:
        return decode(read_control(path, max_bytes).data)
    except (OSError, RequestError, ValueError):
        return None


def envelope_limit(max_control_bytes: int) -> int:
    """The size an envelope of a control file of at most `max_control_bytes` can reach."""
    return max_control_bytes * 4 // 3 + 4096


class RankRelay:
    """A rank's side of the relay: unwraps each new envelope its file trigger delivers, and
    hands it on as the shared control file (`on_file`) or its error (`on_error`)."""

    def __init__(self, on_file: Callable[[ControlFile], None], on_error: Callable[[RequestError], None]) -> None:
        self._on_file = on_file
        self._on_error = on_error
        self._last: tuple[Signature | None, str] | None = None  # (source, digest) of the last envelope taken
        self.num_duplicates = 0

    def baseline(self, path: Path, max_bytes: int) -> None:
        """What the envelope says when the rank starts is not delivered, as a control file's first version."""
        envelope = read(path, max_bytes)
        if envelope is not None:
            self._last = (envelope["source"], envelope["digest"])

    def on_envelope(self, control: ControlFile) -> None:
        try:
            envelope = decode(control.data)
        except ValueError as exc:
            log.warning("[Profiler] the node's relay file is not an envelope (%s); waiting for the next", exc)
            return
        key = (envelope["source"], envelope["digest"])
        if key == self._last:
            self.num_duplicates += 1
            return
        self._last = key
        if envelope.get("baseline"):
            return
        error = envelope.get("error")
        if isinstance(error, str) and error:
            self._on_error(RequestError(error))
            return
        source = envelope["source"] or (control.mtime_ns, control.size, control.inode, control.mode)
        self._on_file(ControlFile(data=envelope["data"], mtime_ns=source[0], size=source[1], inode=source[2],
                                  mode=source[3], repeat=bool(envelope.get("repeat"))))

    def on_envelope_error(self, exc: RequestError) -> None:
        """The envelope itself could not be read (it is ours: a node dir tampered with)."""
        log.warning("[Profiler] cannot read the node's relay file: %s", exc)
