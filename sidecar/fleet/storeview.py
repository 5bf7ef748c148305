"""The CLI's view of a Redis registry: a private local directory in the file registry's layout, kept
in step with the store while the command runs, so every command reads it as it reads files.

    <view>/replicas/<replica>/...      each `<prefix>:file:` key's bytes, its mtime set so that its age is
                                       the store's (server time now less the key's time): liveness is
                                       judged on the store's one clock, as on a filesystem's
    <view>/control/<replica>.json      each replica's stored request

A request written to the view (`registry.write_request`, every writer's one way to the wire) is sent to
the store (`send`): stored under the replica's control key and published to its node agents.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

from sidecar.common import clock, layout, storeurl
from sidecar.common.exceptions import RegistryError
from sidecar.common.redisstore import RedisStore
from sidecar.common.registry import atomic_write, ensure_dir, unlink_quietly

REFRESH_S = 0.25


class StoreView:
    """A local directory mirroring one Redis registry (see the module docstring).

    Raises (constructor):
        ConfigError: a bad URL or password file.
        RegistryError: the store cannot be reached, or refuses the password.
    """

    def __init__(self, url: str) -> None:
        self.url = storeurl.parse(url)
        self.store = RedisStore(self.url, storeurl.password())
        self.root = Path(tempfile.mkdtemp(prefix="cosmos-profiler-view-"))
        atexit.register(self.close)
        _open.append(self)
        self._files: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.refresh()  # raises RegistryError when the store cannot be read
        except BaseException:
            self.close()
            raise
        storeurl.request_senders[os.fspath(self.root)] = self.send
        storeurl.request_places[os.fspath(self.root)] = lambda replica: f"{self.url} {self.store.control_key(replica)}"

    def refresh(self) -> None:
        """Bring the directory in step with the store once.

        Raises:
            RegistryError: the store failed (the directory stays as it was).
        """
        files, now = self.store.read_files(layout.REPLICAS_DIR + "/")
        requests = self.store.read_requests()
        # This directory's clock (what the readers judge ages on: sidecar.common.clock), not this process's.
        local_now = clock.fs_now(self.root)
        # A node record's clock_offset is the store's clock less its node's: here, this directory's less its node's.
        shift = local_now - now
        wanted: dict[str, tuple[bytes, float]] = {
            f.path: (_shift_offset(f.data, shift) if f"/{layout.NODES_DIR}/" in f.path else f.data, f.t)
            for f in files if _safe(f.path)}
        for request in requests:
            rel = f"{layout.CONTROL_DIR}/{layout.CONTROL_TEMPLATE.format(replica=request.replica)}"
            if _safe(rel):
                wanted[rel] = (request.data, request.t)
        with self._lock:
            for rel, (data, t) in wanted.items():
                path = self.root / rel
                if self._files.get(rel) != (data, t):
                    if self._files.get(rel, (None,))[0] != data:
                        try:
                            atomic_write(path, data)
                        except FileNotFoundError:
                            ensure_dir(path.parent)
                            atomic_write(path, data)
                    mtime = local_now - max(0.0, now - t)
                    try:
                        os.utime(path, (mtime, mtime))
                    except OSError:
                        continue
                    self._files[rel] = (data, t)
            for rel in list(self._files):
                if rel not in wanted:  # expired in the store: its writer is gone
                    unlink_quietly(self.root / rel)
                    del self._files[rel]

    def follow(self) -> None:
        """Keep refreshing on a daemon thread until `close()` (for commands that wait)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cosmos-profiler-view", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.refresh()
            except (RegistryError, OSError):
                continue  # the wait's own deadline decides; the view keeps what it had

    def send(self, replica: str, data: bytes) -> None:
        """Store and publish a request. Raises RegistryError: the store failed."""
        stored = self.store.send_request(replica, data)
        with self._lock:
            self._files[f"{layout.CONTROL_DIR}/{layout.CONTROL_TEMPLATE.format(replica=replica)}"] = (data, stored.t)

    def close(self) -> None:
        if self in _open:
            _open.remove(self)
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)  # a refresh under way ends within its calls' timeouts
        storeurl.request_senders.pop(os.fspath(self.root), None)
        storeurl.request_places.pop(os.fspath(self.root), None)
        shutil.rmtree(self.root, ignore_errors=True)
        self.store.close()


_open: list[StoreView] = []


def close_all() -> None:
    """Close every view of this process (the CLI's exit, which skips the interpreter's teardown)."""
    for view in list(_open):
        view.close()


def _shift_offset(data: bytes, shift: float) -> bytes:
    """A node record with its `clock_offset` moved by `shift` seconds (to ~10 ms: a refresh rewrites it only
    when it moved more); every other field as it is. Bytes that are no such record are left as they are."""
    try:
        node = json.loads(data)
    except ValueError:
        return data
    offset = node.get("clock_offset") if isinstance(node, dict) else None
    if not isinstance(offset, (int, float)) or isinstance(offset, bool):
        return data
    node["clock_offset"] = round(offset + shift, 2)
    return json.dumps(node, separators=(",", ":")).encode()


def _safe(rel: str) -> bool:
    """A key's path is used under the view only if it stays there (no `..`, no absolute path)."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)

