"""Who is the node's agent: a lease in the node-local directory, one file per term.

    <node dir>/agent/lease-<epoch>    {"pid", "rank", "host", "start_since_boot"}; its mtime is the agent's beat

A rank becomes the agent by creating the next term's file with O_EXCL (`claim`): of the ranks
that try at once, exactly one gets it, and nothing is ever held across a call that could block
(no lock that a rank holding the GIL for a minute would keep from the others). The agent sets
its lease's mtime at each turn of its loop (`beat`). Another rank claims the next term when the
holder's process is gone (its pid, checked with its start since boot) or its beat is older than
`stale_after` seconds (alive, but not running Python: a C call that holds the GIL, a SIGSTOP).

An agent that comes back after another took over sees a later term (`still_mine` is False) and
steps down before it relays or writes anything.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.common.layout import LEASE_PREFIX
from sidecar.common.records import pid_alive, start_since_boot
from sidecar.common.registry import ensure_dir, unlink_quietly


@dataclass(frozen=True)
class Term:
    epoch: int
    path: Path
    holder: dict[str, Any]
    beat_at: float  # the lease file's mtime (this host's clock: the node dir is local)


def _epochs(directory: Path) -> list[tuple[int, Path]]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith(LEASE_PREFIX) and name[len(LEASE_PREFIX):].isdigit():
            found.append((int(name[len(LEASE_PREFIX):]), directory / name))
    return sorted(found)


def holder_alive(holder: dict[str, Any]) -> bool:
    """Whether the process that wrote a lease is still running (this host: the node dir is local)."""
    return pid_alive(holder.get("pid"), holder.get("start_since_boot"))


class Lease:
    """This rank's view of the node's agent lease in `directory` (see the module docstring)."""

    def __init__(self, directory: Path, rank: int, host: str) -> None:
        self.directory = Path(directory)
        self.me = {"pid": os.getpid(), "rank": rank, "host": host, "start_since_boot": start_since_boot(os.getpid())}
        self.epoch: int | None = None  # the term this rank holds; None: not the agent

    def current(self) -> Term | None:
        """The latest term, or None when there is none (no agent yet, or the dir was removed)."""
        for epoch, path in reversed(_epochs(self.directory)):
            try:
                with open(path, "rb") as f:
                    holder = json.loads(f.read() or b"{}")
                beat_at = os.stat(path).st_mtime
            except (OSError, ValueError):
                continue  # removed meanwhile, or being written (O_EXCL, then the write): the one below
            if isinstance(holder, dict):
                return Term(epoch, path, holder, beat_at)
        return None

    def vacant(self, stale_after: float, now: float | None = None) -> bool:
        """Whether no live agent serves: no term, its holder gone, or its beat older than `stale_after`."""
        term = self.current()
        if term is None:
            return True
        if term.holder.get("pid") == self.me["pid"]:
            return self.epoch != term.epoch  # our own, from before a fork or a step-down
        now = time.time() if now is None else now
        return not holder_alive(term.holder) or now - term.beat_at > stale_after

    def claim(self) -> bool:
        """Take the next term (O_EXCL): True when this rank is now the agent."""
        try:
            ensure_dir(self.directory, private=True)
        except OSError:
            return False
        epochs = _epochs(self.directory)
        epoch = epochs[-1][0] + 1 if epochs else 0
        path = self.directory / f"{LEASE_PREFIX}{epoch}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            return False  # another rank took this term first
        try:
            os.write(fd, json.dumps(self.me).encode())
        finally:
            os.close(fd)
        self.epoch = epoch
        for older, old_path in epochs:
            if older < epoch:
                unlink_quietly(old_path)
        return True

    def still_mine(self) -> bool:
        """This rank holds the latest term (its lease is there, and no later one)."""
        if self.epoch is None:
            return False
        epochs = _epochs(self.directory)
        if not epochs or epochs[-1][0] != self.epoch:
            return False
        try:  # the same number may be a later term of another rank (the files were removed meanwhile)
            with open(epochs[-1][1], "rb") as f:
                return bool(json.loads(f.read() or b"{}").get("pid") == self.me["pid"])
        except (OSError, ValueError, AttributeError):
            return False

    def beat(self) -> bool:
        """Set our lease's mtime to now; False when it is not ours any more (a later term). A lease
        that is gone with no other in its place (the node dir removed under the job) is taken again:
        the agent serves on, its watch of the control file and what it relayed intact."""
        if not self.still_mine():
            if self.epoch is not None and not _epochs(self.directory):
                self.epoch = None
                return self.claim()
            self.epoch = None
            return False
        try:
            os.utime(self.directory / f"{LEASE_PREFIX}{self.epoch}", None, follow_symlinks=False)
        except OSError:
            self.epoch = None
            return False
        return True

    def release(self) -> None:
        """Give the term up (at exit): the next rank to look takes over at once."""
        if self.epoch is not None:
            unlink_quietly(self.directory / f"{LEASE_PREFIX}{self.epoch}")
            self.epoch = None

    def forget(self) -> None:
        """In a forked child: the parent holds the term."""
        self.epoch = None
        self.me = dict(self.me, pid=os.getpid(), start_since_boot=start_since_boot(os.getpid()))
