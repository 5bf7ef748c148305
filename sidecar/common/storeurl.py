"""A registry in a store the users already run: `redis://[user@]host:port[/db[/prefix]]` and `rediss://` (TLS).

Accepted wherever a registry path is (`--registry`, COSMOS_PROFILER_DIR, `[sidecar] registry`). The
password never travels in the URL (argv and logs show URLs): it comes from COSMOS_PROFILER_REDIS_PASSWORD,
or the file COSMOS_PROFILER_REDIS_PASSWORD_FILE names. The keys are namespaced by `prefix` (default
`cosmos-profiler`, one per registry root) and then by replica (`sidecar.common.redisstore`).

Pure: parsing and naming, no I/O beyond the password file, and no import of the redis client.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from sidecar.common.exceptions import ConfigError

SCHEMES = ("redis", "rediss")
ENV_PASSWORD = "COSMOS_PROFILER_REDIS_PASSWORD"
ENV_PASSWORD_FILE = "COSMOS_PROFILER_REDIS_PASSWORD_FILE"
DEFAULT_PORT = 6379
DEFAULT_PREFIX = "cosmos-profiler"
MAX_DB = 15_999
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_PASSWORD_BYTES = 4096


@dataclass(frozen=True)
class StoreURL:
    """A parsed registry URL (never holding a password)."""

    scheme: str
    host: str
    port: int
    db: int = 0
    prefix: str = DEFAULT_PREFIX
    user: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    def display(self) -> str:
        """The URL as it is shown in logs and messages (it holds no secret)."""
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        tail = "" if self.prefix == DEFAULT_PREFIX else f"/{self.prefix}"
        return f"{self.scheme}://{user}{host}:{self.port}/{self.db}{tail}"

    def __str__(self) -> str:
        return self.display()

    def key(self) -> str:
        """A short stable name of this registry (for local directories)."""
        import hashlib  # here, not at the top: it loads OpenSSL, which every CLI command would pay for at start

        return hashlib.sha256(self.display().encode()).hexdigest()[:12]


def is_store_url(value: object) -> bool:
    """Whether a registry value names a store rather than a directory (`scheme://`)."""
    return isinstance(value, str) and "://" in value


def parse(value: str, what: str = "the registry") -> StoreURL:
    """Parse a registry URL.

    Raises:
        ConfigError: not a redis:// or rediss:// URL, a bad port or db, or a password in it.
    """
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{what} {_redact(value)!r} is not a usable store URL: {why} "
                           "(expected redis://[user@]host:port/db or rediss://...)")

    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise bad(str(exc)) from None
    if parts.scheme not in SCHEMES:
        raise bad(f"the scheme {parts.scheme!r} is not one of {', '.join(SCHEMES)}")
    if parts.password is not None:
        raise bad(f"a password in the URL would show in argv and logs; set {ENV_PASSWORD} "
                  f"(or {ENV_PASSWORD_FILE}) instead")
    if not parts.hostname:
        raise bad("no host")
    if parts.query or parts.fragment:
        raise bad("a query or fragment is not understood")
    segments = [s for s in parts.path.split("/") if s]
    if len(segments) > 2:
        raise bad("the path is /db or /db/prefix")
    db = 0
    if segments:
        if not segments[0].isdigit() or int(segments[0]) > MAX_DB:
            raise bad(f"the database {segments[0]!r} is not a number")
        db = int(segments[0])
    prefix = segments[1] if len(segments) == 2 else DEFAULT_PREFIX
    if not _PREFIX_RE.match(prefix):
        raise bad(f"the prefix {prefix!r} must be 1-64 of A-Z a-z 0-9 . _ -")
    return StoreURL(scheme=parts.scheme, host=parts.hostname, port=port or DEFAULT_PORT, db=db, prefix=prefix,
                    user=unquote(parts.username) if parts.username else None)


def password(env: Mapping[str, str] | None = None) -> str | None:
    """The store's password: COSMOS_PROFILER_REDIS_PASSWORD, else the first line of the file
    COSMOS_PROFILER_REDIS_PASSWORD_FILE names, else None.

    Raises:
        ConfigError: the password file cannot be read (its path is named, never its content).
    """
    env = os.environ if env is None else env
    if env.get(ENV_PASSWORD):
        return env[ENV_PASSWORD]
    path = env.get(ENV_PASSWORD_FILE)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{ENV_PASSWORD_FILE}={path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_PASSWORD_BYTES:
        raise ConfigError(f"{ENV_PASSWORD_FILE}={path} is longer than {MAX_PASSWORD_BYTES} bytes")
    return raw.decode("utf-8", "replace").splitlines()[0] if raw.strip() else None


def _redact(value: str) -> str:
    """`value` with any password in it replaced, for an error message."""
    return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1:***@", value)


def job_url(host: str | None, port: int | None) -> str | None:
    """`redis://host:port/0`: a Cosmos-RL job's own Redis (its controller's host, `Config.redis`) as
    a registry; None without both."""
    if not host or port is None:
        return None
    return f"redis://{f'[{host}]' if ':' in host else host}:{port}/0"


def mirror_dir(base: Path, url: StoreURL) -> Path:
    """The node-local directory a rank uses as its registry root when the registry is `url`: the
    node's ranks and its agent meet there, and the agent carries it to and from the store."""
    return Path(base) / f"store-{url.key()}"


# The CLI's views of stores open in this process (sidecar.fleet.storeview), by their local root: a request
# written there (`registry.write_request`) is sent to the store with `sender(replica, bytes)` (what it returns is not used).
request_senders: dict[str, Callable[[str, bytes], object]] = {}
# ... and where a request sent through it went, in words (for `control_path` in the CLI's answers).
request_places: dict[str, Callable[[str], str]] = {}


def control_place(root: str | os.PathLike[str], replica: str, path: str | os.PathLike[str]) -> str:
    """Where a request for `replica` written under `root` went: `path`, or the store's key where `root`
    is the CLI's view of a store."""
    place = request_places.get(os.fspath(root))
    return place(replica) if place is not None else os.fspath(path)

# A rank's claims across nodes (its slowdown watch's: sidecar.rank.slowdown), by its registry root (the
# node's mirror of a store): `claimer(path relative to the root, owner, ttl seconds)` is True for the first.
claimers: dict[str, Callable[[str, str, int], bool]] = {}


def is_mirror(root: str | os.PathLike[str]) -> bool:
    """Whether `root` stands for a store in this process (a rank's mirror of it, or the CLI's view)."""
    return os.fspath(root) in request_senders


def dump_copy(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """The dump at `path` as the CLI can read it: the copy a store carried (in a view of this process),
    where there is one; else `path` itself."""
    from sidecar.common import layout

    for root in list(request_senders):
        copy = layout.dump_copy_of(Path(root), path)
        if copy is not None and copy.is_file():
            return copy
    return path
