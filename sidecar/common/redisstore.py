"""The Redis registry's keys and the few operations on them, for the node agent and the CLI alike.

    <prefix>:file:replicas/<replica>/<path>   a registry file (a node record, a stacks file, a claim) as a hash:
                                              data (its bytes) and t (the server's time at its last write or
                                              tick); expires FILE_TTL_S after its writer last refreshed it
    <prefix>:control:<replica>                the request: data, t, seq; kept REQUEST_KEEP_S
    <prefix>:control:<replica> (channel)      published to at each new request: the agents block on it
    <prefix>:claim:replicas/<replica>/<name>  a slowdown watch's claim (SET NX): the first rank of any node wins

Times are the Redis server's (TIME, inside the scripts): liveness is judged on that one clock, as the
file registry judges it on its filesystem's. Every call has a bounded timeout (`SOCKET_TIMEOUT_S`).
The redis client is an extra (`pip install 'cosmos-profiler-sidecar[redis]'`); it is imported here only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.common import storeurl
from sidecar.common.exceptions import RegistryError
from sidecar.common.storeurl import StoreURL

SOCKET_TIMEOUT_S = 1.0
FILE_TTL_S = 120
REQUEST_KEEP_S = 3600
SCAN_COUNT = 1000

# KEYS[1] file key; ARGV: data, ttl. Stamps the server's time.
_PUT = """
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'data', ARGV[1], 't', t[1] .. '.' .. string.format('%06d', t[2]))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""
# KEYS: file keys; ARGV[1] ttl. A tick: the time and the expiry refreshed; 0 for a key that is gone
# (the server restarted empty): its writer puts it again.
_TOUCH = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', t[2])
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 't', now)
    redis.call('EXPIRE', key, tonumber(ARGV[1]))
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""
# KEYS[1] control key, KEYS[2] its sequence; ARGV: data, keep. Returns {seq, t}.
_SEND = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', t[2])
local seq = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'data', ARGV[1], 't', now, 'seq', seq)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('PUBLISH', KEYS[1], seq)
return {seq, now}
"""


class StoreUnavailable(RegistryError):
    """The store cannot be reached, refused us, or answered nonsense (the message says which)."""


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the registry root: "replicas/<replica>/nodes/00/host.json"
    data: bytes
    t: float  # the server's time at its last write or tick


@dataclass(frozen=True)
class StoredRequest:
    replica: str
    data: bytes
    t: float
    seq: int

    @property
    def signature(self) -> tuple[int, int, int, int]:
        """What a control file's signature is to the file trigger: the same on every node."""
        return (int(round(self.t * 1e9)), len(self.data), self.seq, 0o100644)


def _client_module() -> Any:
    try:
        import redis
    except ImportError:
        raise StoreUnavailable("the registry is a redis:// URL but the redis client is not installed "
                               "(pip install 'cosmos-profiler-sidecar[redis]')") from None
    return redis


def describe(exc: BaseException, url: StoreURL) -> str:
    """One line for a failure of the store: what it is, never the password."""
    redis = _client_module()
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
        return (f"Redis at {url} refused the password ({text}); set {storeurl.ENV_PASSWORD} "
                f"or {storeurl.ENV_PASSWORD_FILE}")
    if isinstance(exc, redis.TimeoutError):
        return f"Redis at {url} did not answer within {SOCKET_TIMEOUT_S:g}s ({text})"
    if isinstance(exc, redis.ConnectionError):
        return f"Redis at {url} cannot be reached ({text})"
    return f"Redis at {url} failed: {name}: {text}"


class RedisStore:
    """One registry's keys in one Redis (a connection pool: its methods may be called from any thread).

    Every method raises StoreUnavailable (a RegistryError) when the store fails; nothing else.
    """

    def __init__(self, url: StoreURL, password: str | None = None, timeout: float = SOCKET_TIMEOUT_S) -> None:
        redis = _client_module()
        self.url = url
        self.ns = url.prefix
        kwargs: dict[str, Any] = {
            "host": url.host, "port": url.port, "db": url.db, "username": url.user, "password": password,
            "socket_timeout": timeout, "socket_connect_timeout": timeout, "retry_on_timeout": False,
            "health_check_interval": 0,
        }
        try:  # our callers back off themselves: one try per call, bounded by the timeouts
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            kwargs["retry"] = Retry(NoBackoff(), 0)
        except ImportError:
            pass
        if url.tls:
            kwargs["ssl"] = True
        self._redis = redis.Redis(**kwargs)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._put = self._redis.register_script(_PUT)
        self._touch = self._redis.register_script(_TOUCH)
        self._send = self._redis.register_script(_SEND)

    @classmethod
    def open(cls, url: StoreURL | str, timeout: float = SOCKET_TIMEOUT_S) -> RedisStore:
        """Raises ConfigError (a bad URL or password file) or StoreUnavailable (no client)."""
        parsed = storeurl.parse(url) if isinstance(url, str) else url
        return cls(parsed, storeurl.password(), timeout)

    # -- names ------------------------------------------------------------

    def file_key(self, path: str) -> str:
        return f"{self.ns}:file:{path}"

    def control_key(self, replica: str) -> str:
        return f"{self.ns}:control:{replica}"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise StoreUnavailable(describe(exc, self.url)) from None

    # -- files --------------------------------------------------------------

    def ping(self) -> None:
        self._call(self._redis.ping)

    def now(self) -> float:
        sec, usec = self._call(self._redis.time)
        return float(sec) + float(usec) / 1e6

    def put_files(self, files: dict[str, bytes], ttl: int = FILE_TTL_S) -> None:
        """Write each file (relative path: bytes) with the server's time, expiring after `ttl` s."""
        if not files:
            return

        def run() -> None:
            pipe = self._redis.pipeline(transaction=False)
            for path, data in files.items():
                self._put(keys=[self.file_key(path)], args=[data, ttl], client=pipe)
            pipe.execute()

        self._call(run)

    def touch_files(self, paths: list[str], ttl: int = FILE_TTL_S) -> list[str]:
        """Refresh each file's time and expiry; returns the paths whose key was gone."""
        if not paths:
            return []
        found = self._call(self._touch, keys=[self.file_key(p) for p in paths], args=[ttl])
        return [p for p, ok in zip(paths, found, strict=True) if not int(ok)]

    def delete_files(self, paths: list[str]) -> None:
        if paths:
            self._call(self._redis.delete, *[self.file_key(p) for p in paths])

    def read_files(self, under: str = "") -> tuple[list[StoredFile], float]:
        """Every file whose path starts with `under`, and the server's time now."""
        def run() -> tuple[list[StoredFile], float]:
            keys = list(self._redis.scan_iter(match=self._glob(self.file_key(under)) + "*", count=SCAN_COUNT))
            pipe = self._redis.pipeline(transaction=False)
            pipe.time()
            for key in keys:
                pipe.hmget(key, "data", "t")
            answers = pipe.execute()
            sec, usec = answers[0]
            files = []
            cut = len(self.file_key(""))
            for key, (data, t) in zip(keys, answers[1:], strict=True):
                if data is None or t is None:
                    continue  # expired between the scan and the read
                name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
                files.append(StoredFile(name[cut:], data, float(t)))
            return files, float(sec) + float(usec) / 1e6

        return self._call(run)

    def claim(self, path: str, owner: str, ttl: int) -> bool:
        """Take the claim named `path` (SET NX, expiring after `ttl` s): True for the first taker."""
        return bool(self._call(self._redis.set, f"{self.ns}:claim:{path}", owner, nx=True, ex=max(1, int(ttl))))

    # -- requests -----------------------------------------------------------

    def send_request(self, replica: str, data: bytes, keep: int = REQUEST_KEEP_S) -> StoredRequest:
        """Store the request and publish it to the replica's agents."""
        key = self.control_key(replica)
        seq, t = self._call(self._send, keys=[key, key + ":seq"], args=[data, keep])
        return StoredRequest(replica, data, float(t), int(seq))

    def read_request(self, replica: str) -> StoredRequest | None:
        got = self._call(self._redis.hmget, self.control_key(replica), "data", "t", "seq")
        data, t, seq = got
        if data is None or t is None or seq is None:
            return None
        return StoredRequest(replica, data, float(t), int(seq))

    def read_requests(self) -> list[StoredRequest]:
        """The stored request of every replica that has one."""
        def run() -> list[StoredRequest]:
            head = self.control_key("")
            keys = [k for k in self._redis.scan_iter(match=self._glob(head) + "*", count=SCAN_COUNT)
                    if not (k.decode() if isinstance(k, bytes) else k).endswith(":seq")]
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, "data", "t", "seq")
            out = []
            for key, (data, t, seq) in zip(keys, pipe.execute(), strict=True):
                if data is None or t is None or seq is None:
                    continue
                name = (key.decode() if isinstance(key, bytes) else key)[len(head):]
                out.append(StoredRequest(name, data, float(t), int(seq)))
            return out

        return self._call(run)

    def subscribe(self, replica: str) -> Any:
        """A pub/sub connection subscribed to the replica's requests (`get_message(timeout=...)`)."""
        def run() -> Any:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(self.control_key(replica))
            return pubsub

        return self._call(run)

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """What the client raises when the store fails (for a caller that talks to a pub/sub itself)."""
        return self._errors

    def close(self) -> None:
        try:
            self._redis.close()
        except self._errors:
            pass

    @staticmethod
    def _glob(text: str) -> str:
        """`text` with glob characters escaped, for SCAN MATCH."""
        return "".join("\\" + c if c in "*?[]\\" else c for c in text)
