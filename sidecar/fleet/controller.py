"""A tiny read-only client for a Cosmos-RL controller: GET /api/status and /api/meta.

The controller is only a directory of replicas here; profiling never goes
through it (the trigger is always the control file). Standard library only
(urllib), a short timeout, no proxies (a controller lives on the cluster's
own network), and every failure becomes one `ControllerError` line.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from sidecar.common import storeurl
from sidecar.common.exceptions import ControllerError
from sidecar.common.roster import ControllerAtom, ControllerReplica

STATUS_PATH = "/api/status"
META_PATH = "/api/meta"
REPLICA_LISTS = ("policy_replicas", "rollout_replicas")
DEFAULT_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 16 << 20


def parse_port(port: str | int) -> int:
    """Raises: ControllerError when `port` is not a TCP port number."""
    text = str(port).strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ControllerError(f"controller port must be a number from 1 to 65535, got {str(port)!r}")
    return int(text)


class ControllerClient:
    """GET JSON from one controller. Every method raises only `ControllerError`."""

    def __init__(self, host: str, port: str | int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        host = (host or "").strip()
        if not host or any(c in host for c in "/?#@ "):
            raise ControllerError(f"controller host must be a host name or IP address, got {host!r}")
        self.host = host
        self.port = parse_port(port)
        self.timeout = float(timeout)
        bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.base_url = f"http://{bracketed}:{self.port}"
        # urllib.request (http.client, email) only where a controller is asked:
        # `profile set` without -ch/-cp starts without them.
        import urllib.request

        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get_json(self, path: str) -> Any:
        """GET `path` and decode the JSON answer.

        Raises:
            ControllerError: unreachable, refused, too slow, an HTTP error, or
                an answer that is not JSON; the message names the URL.
        """
        import http.client
        import urllib.error
        import urllib.request

        url = self.base_url + path
        started = time.monotonic()
        try:
            with self._opener.open(urllib.request.Request(url, headers={"Accept": "application/json"}), timeout=self.timeout) as resp:
                body = resp.read(MAX_RESPONSE_BYTES + 1)
                content_type = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the response's socket
            raise ControllerError(f"controller at {self.base_url} answered HTTP {exc.code} {exc.reason} for {path}") from None
        except urllib.error.URLError as exc:
            raise ControllerError(self._describe(exc.reason, started)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ControllerError(self._describe(exc, started)) from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise ControllerError(f"controller at {self.base_url} sent more than {MAX_RESPONSE_BYTES} bytes for {path}")
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            snippet = body[:60].decode("utf-8", "replace").strip()
            raise ControllerError(
                f"controller at {self.base_url} did not answer JSON for {path} "
                f"(Content-Type {content_type or 'none'}: {snippet!r}); is this a Cosmos-RL controller?"
            ) from None

    def _describe(self, reason: object, started: float) -> str:
        import http.client

        where = f"controller at {self.base_url}"
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"{where} did not answer within {self.timeout:g}s"
        if isinstance(reason, ConnectionRefusedError):
            return f"cannot reach the {where}: connection refused (is the controller running on that port?)"
        if isinstance(reason, socket.gaierror):
            return f"cannot resolve controller host {self.host!r}: {reason.strerror or reason}"
        if isinstance(reason, http.client.RemoteDisconnected):
            return f"{where} closed the connection without answering"
        if isinstance(reason, http.client.HTTPException):
            return f"{where} did not speak HTTP ({type(reason).__name__})"
        if isinstance(reason, OSError):
            if time.monotonic() - started >= self.timeout:
                return f"{where} did not answer within {self.timeout:g}s"
            return f"cannot reach the {where}: {reason.strerror or reason}"
        return f"cannot reach the {where}: {reason}"

    def replicas(self) -> list[ControllerReplica]:
        """Policy then rollout replicas from GET /api/status."""
        return parse_status(self.get_json(STATUS_PATH), self.base_url + STATUS_PATH)

    def job_redis_url(self, meta: Any | None = None) -> str | None:
        """The job's own Redis, as its workers reach it: this controller's host and `config.redis`
        (the port the controller's Redis listens on) from GET /api/meta; None where it names none."""
        meta = self.get_json(META_PATH) if meta is None else meta
        return storeurl.job_url(self.host, meta_redis_port(meta))

    def train_output_dir(self) -> str:
        """`config.train.output_dir` from GET /api/meta."""
        return parse_meta_output_dir(self.get_json(META_PATH), self.base_url + META_PATH)


def parse_status(obj: Any, url: str = STATUS_PATH) -> list[ControllerReplica]:
    """Decode Cosmos-RL's status JSON.

    Raises:
        ControllerError: the answer is not in Cosmos-RL's shape.
    """
    if not isinstance(obj, dict) or not any(key in obj for key in REPLICA_LISTS):
        raise ControllerError(f"{url} answered JSON without policy_replicas or rollout_replicas; is this a Cosmos-RL controller?")
    replicas = []
    for key in REPLICA_LISTS:
        entries = obj.get(key) or []
        if isinstance(entries, dict):  # some versions key replicas by name
            entries = list(entries.values())
        if not isinstance(entries, list):
            raise ControllerError(f"{url}: {key} is not a list")
        for entry in entries:
            replicas.append(_replica(entry, key, url))
    return replicas


def _replica(entry: Any, key: str, url: str) -> ControllerReplica:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ControllerError(f"{url}: an entry of {key} has no replica name")
    atoms = []
    for atom in entry.get("atoms") or []:
        if not isinstance(atom, dict):
            raise ControllerError(f"{url}: replica {entry['name']} has an atom that is not an object")
        rank = atom.get("global_rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ControllerError(f"{url}: replica {entry['name']} has an atom with global_rank {rank!r}")
        atoms.append(
            ControllerAtom(
                global_rank=rank,
                host_ip=str(atom.get("host_ip") or ""),
                host_name=str(atom.get("host_name") or ""),
                trace_path=atom.get("trace_path") if isinstance(atom.get("trace_path"), str) else None,
            )
        )
    atoms.sort(key=lambda a: a.global_rank)
    role = entry.get("role") or key.split("_")[0]
    return ControllerReplica(
        name=entry["name"], role=str(role).lower(), arrived=bool(entry.get("arrived", True)), atoms=tuple(atoms)
    )


def parse_meta_output_dir(obj: Any, url: str = META_PATH) -> str:
    """Raises: ControllerError when the meta JSON has no config.train.output_dir."""
    train = obj.get("config", {}).get("train", {}) if isinstance(obj, dict) and isinstance(obj.get("config"), dict) else None
    output_dir = train.get("output_dir") if isinstance(train, dict) else None
    if not isinstance(output_dir, str) or not output_dir:
        raise ControllerError(f"{url} has no config.train.output_dir to find the registry from; pass --registry DIR")
    return output_dir


def meta_redis_port(obj: Any) -> int | None:
    """`config.redis` of a GET /api/meta answer (cosmos-rl keeps the port as a string), or None."""
    config = obj.get("config") if isinstance(obj, dict) else None
    value = config.get("redis") if isinstance(config, dict) else None
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None

