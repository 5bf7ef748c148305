"""The store trigger: a replica's requests from a Redis registry, pushed (pub/sub), never polled.

The node agent's watch of the shared control file where the registry is a `redis://` URL. The CLI
stores a request under the replica's control key and publishes its sequence number; this trigger
holds a subscription and reads the key when told (and once every SAFETY_S, should a message have
been missed). What the key holds at start is the baseline and is not delivered, as with a file.

A request stored while this node was cut off from the store is delivered once it is back, if it
is at most REQUEST_VALID_S old by the server's clock; an older one is delivered as an error
(`on_error`: the ranks' records say the request expired, and the log says so once). A server
restarted empty holds no request: nothing is delivered until a new one comes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from sidecar.common.exceptions import RequestError
from sidecar.common.redisstore import RedisStore, StoredRequest, StoreUnavailable, describe
from sidecar.common.registry import ControlFile
from sidecar.rank.storesync import Outage, next_backoff
from sidecar.rank.threads import Worker
from sidecar.rank.triggers.base import Trigger

log = logging.getLogger("sidecar")

SAFETY_S = 30.0
REQUEST_VALID_S = 120.0
LISTEN_SLICE_S = 1.0  # how long one blocking read waits before it looks whether to stop


class StoreTrigger(Trigger):
    """Calls `on_file(ControlFile)` for each new request of `replica` in the store, or
    `on_error(RequestError)` for one that expired before this node could take it."""

    def __init__(self, store: RedisStore, replica: str, on_file: Callable[[ControlFile], None],
                 on_error: Callable[[RequestError], None], *, max_bytes: int = 64 * 1024,
                 baseline: tuple[tuple[int, int, int, int] | None, bytes | None] | None = None,
                 valid_s: float = REQUEST_VALID_S, thread_name: str = "cosmos-profiler-store-watch",
                 outage: Outage | None = None) -> None:
        self.store = store
        self.replica = replica
        self.on_file = on_file
        self.on_error = on_error
        self.max_bytes = max_bytes
        self.valid_s = valid_s
        self.mode = "redis"
        self.mode_reason = f"the registry is {store.url}"
        self._baseline = baseline
        self._last: tuple[int, int, int, int] | None = None
        self._last_digest: bytes | None = None
        self._started = False
        self.outage = outage or Outage(store.url.display())
        self._worker = Worker(thread_name, self._run)
        self._pubsub: Any = None
        self.num_deliveries = 0
        self.num_reads = 0

    @property
    def seen(self) -> tuple[tuple[int, int, int, int] | None, bytes | None]:
        return self._last, self._last_digest

    def start(self) -> bool:
        if self._baseline is not None:
            self._last, self._last_digest = self._baseline
            self._started = True
        # else the thread takes the baseline when it first reaches the store: start() may run on the
        # training thread (sidecar.install), which never waits on the store
        log.info("[Profiler] watching the requests of %s in %s (pushed)", self.replica, self.store.url)
        self._worker.start()
        return True

    def stop(self) -> None:
        self._worker.stop()
        self._close_pubsub()

    def _take_baseline(self) -> None:
        current = self.store.read_request(self.replica)
        if current is not None:
            self._last, self._last_digest = current.signature, hashlib.sha256(current.data).digest()
        self._started = True

    def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def _run(self, worker: Worker) -> None:
        delay = 0.0
        while not worker.stopping:
            if delay and worker.sleep(delay):
                return
            try:
                if self._pubsub is None:
                    self._pubsub = self.store.subscribe(self.replica)
                    if not self._started:
                        self._take_baseline()
                    self._check()  # what came while there was no subscription
                    if self.outage.ok("watch"):
                        log.info("[Profiler] the requests of %s are pushed again", self.replica)
                self._listen(worker)
                delay = 0.0
            except StoreUnavailable as exc:
                self._close_pubsub()
                self.outage.failed("watch", str(exc))
                delay = next_backoff(delay)
            except self.store.errors as exc:
                self._close_pubsub()
                self.outage.failed("watch", describe(exc, self.store.url))
                delay = next_backoff(delay)
            except Exception:  # noqa: BLE001 - the watch must outlive any one bad turn
                log.debug("[Profiler] store trigger failure", exc_info=True)
                self._close_pubsub()
                delay = 1.0

    def _listen(self, worker: Worker) -> None:
        """Block on the subscription (LISTEN_SLICE_S at a time) until a message, or SAFETY_S."""
        waited = 0.0
        while not worker.stopping and waited < SAFETY_S:
            message = self._pubsub.get_message(timeout=LISTEN_SLICE_S)
            if message is not None and message.get("type") == "message":
                self._check()
                return
            waited += LISTEN_SLICE_S
        if not worker.stopping:
            self._check()

    def _check(self) -> None:
        self.num_reads += 1
        current = self.store.read_request(self.replica)
        if current is None or current.signature == self._last:
            return
        now = self.store.now()
        self._deliver(current, now - current.t)

    def _deliver(self, request: StoredRequest, age: float) -> None:
        digest = hashlib.sha256(request.data).digest()
        repeat = digest == self._last_digest
        self._last, self._last_digest = request.signature, digest
        self.num_deliveries += 1
        if len(request.data) > self.max_bytes:
            self.on_error(RequestError(f"the request in {self.store.url} is {len(request.data)} bytes; "
                                       f"the limit is {self.max_bytes}"))
            return
        if age > self.valid_s:
            text = (f"a request sent {age:.0f}s ago, while this node could not reach {self.store.url}, "
                    f"expired (valid for {self.valid_s:g}s); send it again")
            log.warning("[Profiler] %s", text)
            self.on_error(RequestError(text))
            return
        mtime_ns, size, inode, mode = request.signature
        self.on_file(ControlFile(data=request.data, mtime_ns=mtime_ns, size=size, inode=inode, mode=mode,
                                 repeat=repeat))
