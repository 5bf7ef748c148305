"""The node agent's side of a Redis registry: its node's registry files carried to the store.

With a `redis://` registry the ranks of a node use a node-local directory as their registry root
(`storeurl.mirror_dir`): the node agent writes its node record there, the ranks their stacks files and
slowdown claims, as they would in a shared registry. `StoreSync` (a thread of the agent) carries every
file under `replicas/<replica>/` to the store: a file whose bytes changed is put, one that is only
ticked (the node record's mtime, set once per heartbeat) has its time and expiry refreshed, so keys
expire FILE_TTL_S after their writer is gone. A key found gone (the server restarted empty) is put
again at once. Each outage is one warning line (`Outage`), and the retries back off up to MAX_BACKOFF_S;
nothing here ever waits on the training thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from pathlib import Path

from sidecar.common import layout
from sidecar.common.redisstore import FILE_TTL_S, RedisStore, StoreUnavailable
from sidecar.common.registry import TEMP_MARK
from sidecar.rank.threads import Worker

log = logging.getLogger("sidecar")

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
MAX_FILE_BYTES = 4 * 1024 * 1024
OFFSET_EVERY_S = 600.0


class Outage:
    """One warning line when the store first fails, one info line when it is back: shared by the node
    agent's watch and its sync, so an outage is one warning whichever of them meets it first."""

    def __init__(self, url: str, who: str = "the node agent") -> None:
        self.url = url
        self.who = who
        self.down_since: float | None = None
        self.num_outages = 0
        self._failing: set[str] = set()  # the parts that failed and have not succeeded since
        self._lock = threading.Lock()

    def failed(self, part: str, why: str) -> None:
        with self._lock:
            self._failing.add(part)
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
            self.num_outages += 1
        log.warning("[Profiler] %s: %s; retrying with backoff (training goes on)", self.who, why)

    def ok(self, part: str) -> bool:
        """Record a success of `part`; True when it ends an outage (no part fails any more)."""
        with self._lock:
            self._failing.discard(part)
            if self.down_since is None or self._failing:
                return False
            down, self.down_since = time.monotonic() - self.down_since, None
        log.info("[Profiler] %s: Redis at %s answers again after %.1fs", self.who, self.url, down)
        return True


def next_backoff(delay: float) -> float:
    """The wait before the next try after a failure that followed a wait of `delay`."""
    return min(MAX_BACKOFF_S, max(MIN_BACKOFF_S, 2 * delay))


class StoreSync:
    """Carries `<mirror>/replicas/<replica>/` to the store (see the module docstring)."""

    def __init__(self, store: RedisStore, mirror: Path, replica: str, heartbeat: float, outage: Outage,
                 ttl: int = FILE_TTL_S) -> None:
        self.store = store
        self.mirror = Path(mirror)
        self.replica = replica
        self.heartbeat = heartbeat
        self.ttl = max(int(ttl), int(6 * heartbeat) + 10)
        self.outage = outage
        # relative path -> (mtime_ns, size, sha256 of the bytes put)
        self._put: dict[str, tuple[int, int, bytes]] = {}
        self._touched_at = 0.0
        self._worker = Worker("cosmos-profiler-store-sync", self._run)
        self.num_puts = 0
        self.num_touches = 0
        # The store's clock less this node's (TIME against time.time(), measured at the first turn and every
        # OFFSET_EVERY_S): the node record's clock_offset, so readers place this node's times on the store's clock.
        self.clock_offset: float | None = None
        self._offset_due = 0.0

    def start(self) -> None:
        self._worker.start()

    def wake(self) -> None:
        self._worker.wake()

    def stop(self, flush: bool = True) -> None:
        """Stop the thread; with `flush`, carry what changed one last time, unless the store is down
        (the caller may be the training thread at exit: it never waits out a dead store's timeouts)."""
        self._worker.stop()
        if flush and self.outage.down_since is None:
            try:
                self.sync_once()
            except StoreUnavailable:
                pass  # said already, or the store is gone for good: the keys expire

    def _run(self, worker: Worker) -> None:
        delay = 0.0
        while not worker.stopping:
            if delay and worker.sleep(delay):
                return
            try:
                self.sync_once()
            except StoreUnavailable as exc:
                self._put.clear()  # all again once the store is back (it may come back empty)
                self._offset_due = 0.0  # and the clock measured again (another server, perhaps)
                self.outage.failed("sync", str(exc))
                delay = next_backoff(delay)
                continue
            except Exception:  # noqa: BLE001 - the sync must outlive any one bad turn
                log.debug("[Profiler] store sync failed", exc_info=True)
            self.outage.ok("sync")
            delay = 0.0
            worker.wait(self.heartbeat / 2)

    def _scan(self) -> dict[str, tuple[int, int, Path]]:
        top = layout.replica_dir(self.mirror, self.replica)
        found: dict[str, tuple[int, int, Path]] = {}
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith(".") and TEMP_MARK in name:
                    continue
                path = Path(dirpath) / name
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                found[path.relative_to(self.mirror).as_posix()] = (st.st_mtime_ns, st.st_size, path)
        return found

    def sync_once(self) -> None:
        """One turn: put what changed, tick what was ticked, refresh the rest once per heartbeat.

        Raises:
            StoreUnavailable: the store failed (nothing is taken as put).
        """
        if time.monotonic() >= self._offset_due:
            before = time.time()
            server = self.store.now()
            after = time.time()
            self.clock_offset = round(server - (before + after) / 2, 3)
            self._offset_due = time.monotonic() + OFFSET_EVERY_S
        files = self._scan()
        puts: dict[str, bytes] = {}
        digests: dict[str, tuple[int, int, bytes]] = {}
        ticked: list[str] = []
        for rel, (mtime_ns, size, path) in files.items():
            last = self._put.get(rel)
            if last is not None and last[:2] == (mtime_ns, size):
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read(MAX_FILE_BYTES)
            except OSError:
                continue
            digest = hashlib.sha256(data).digest()
            digests[rel] = (mtime_ns, size, digest)
            if last is not None and last[2] == digest:
                ticked.append(rel)
            else:
                puts[rel] = data
        now = time.monotonic()
        if now - self._touched_at >= self.heartbeat:
            ticked = sorted(set(ticked) | {rel for rel in self._put if rel in files})
        if puts:
            self.store.put_files(puts, self.ttl)
            self.num_puts += len(puts)
        if ticked:
            self._touched_at = now
            gone = self.store.touch_files([rel for rel in ticked if rel not in puts], self.ttl)
            self.num_touches += len(ticked)
            if gone:  # restarted empty: put them again now
                again = {}
                for rel in gone:
                    try:
                        with open(files[rel][2], "rb") as f:
                            again[rel] = f.read(MAX_FILE_BYTES)
                    except OSError:
                        continue
                self.store.put_files(again, self.ttl)
        for rel in list(self._put):
            if rel not in files:
                del self._put[rel]  # removed here: its key expires
        self._put.update(digests)
