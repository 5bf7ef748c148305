"""The stand-in Cosmos-RL controller of the tests, on 127.0.0.1, and the JSON Cosmos-RL answers (`cosmos_status`).

One class, `FakeController`, for every test that needs a controller: it serves GET
routes, records POSTs (the trace-path reports of the ranks), and misbehaves on demand
(`mode`) for the fault tests. conftest's `controller` fixture yields one and closes it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def cosmos_status(policy: list[str], rollout: list[str], ranks: int = 2) -> dict[str, Any]:
    """GET /api/status as Cosmos-RL serializes it."""

    def replica(name: str, role: str) -> dict[str, Any]:
        return {
            "name": name, "role": role, "arrived": True, "weight_step": 0, "pending_rollouts": 0,
            "atoms": [
                {"global_rank": k, "host_ip": "10.0.0.7", "host_name": "gpu-node-7", "trace_path": None}
                for k in range(ranks)
            ],
        }

    return {
        "mesh_names": ["dp_shard", "tp"],
        "policy_replicas": [replica(n, "POLICY") for n in policy],
        "rollout_replicas": [replica(n, "ROLLOUT") for n in rollout],
    }


@dataclass
class Call:
    """One request the controller received: when its connection was accepted and (when it
    is over: answered, or given up by the client) closed, in time.monotonic() seconds."""

    method: str
    path: str
    at: float
    closed_at: float | None = None
    body: bytes = b""


class FakeController:
    """A Cosmos-RL controller stand-in on 127.0.0.1 (http.server, one thread per connection).

    `mode` decides each answer and may be changed while it runs:
      ok            GET: the route set for the path (`routes`, `json()`), else 404 JSON as
                    Cosmos-RL's FastAPI answers; POST: the route, else 200 `{}`
      slow          read the request, answer nothing; hold the connection until the client
                    gives up (or `hold_s`, or close())
      garbage-json  HTTP 200 whose body is HTML, not JSON
      not-http      bytes that are not HTTP at all, then close
    Every request is recorded in `calls` (`hits`: their paths; `posted(path)`: the JSON
    bodies POSTed to a path).
    """

    def __init__(self, mode: str = "ok", hold_s: float = 30.0) -> None:
        self.mode = mode
        self.hold_s = hold_s
        self.routes: dict[str, tuple[int, str, bytes]] = {}
        self.calls: list[Call] = []
        self._closing = threading.Event()  # ends a held connection at close()
        self._closed = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10.0  # a client that stalls mid-request cannot hold close() for long

            def setup(self) -> None:
                self.accepted_at = time.monotonic()
                super().setup()

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake._serve(self)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                fake._serve(self)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = False  # so server_close() joins every handler thread
            block_on_close = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-controller", daemon=True
        )
        self.thread.start()

    @property
    def hits(self) -> list[str]:
        """The path of every request, in order."""
        return [call.path for call in self.calls]

    def posted(self, path: str) -> list[Any]:
        """The JSON bodies POSTed to `path`, in order."""
        return [json.loads(call.body) for call in self.calls if call.method == "POST" and call.path == path]

    def json(self, path: str, obj: Any) -> None:
        self.routes[path] = (200, "application/json", json.dumps(obj).encode())

    def close(self) -> None:
        """Stop serving: the port refuses connections from now on. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "fake controller thread did not stop"

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        call = Call(handler.command, handler.path, handler.accepted_at)
        self.calls.append(call)
        try:
            if handler.command == "POST":
                call.body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
            mode = self.mode
            if mode == "slow":
                self._hold(handler, call)
                return
            if mode == "not-http":
                handler.wfile.write(b"\x00\x01\x02 this is not HTTP at all\r\n\r\n")
            elif mode == "garbage-json":
                self._answer(handler, (200, "text/html", b"<html><body>502 bad gateway, or a web page</body></html>"))
            else:
                default = (404, "application/json", b'{"detail":"Not Found"}') if handler.command == "GET" else (
                    200, "application/json", b"{}")
                self._answer(handler, self.routes.get(handler.path, default))
            handler.wfile.flush()
        except OSError:
            pass  # the client gave up
        call.closed_at = time.monotonic()

    def _hold(self, handler: BaseHTTPRequestHandler, call: Call) -> None:
        conn = handler.connection
        conn.settimeout(0.05)
        hold_until = time.monotonic() + self.hold_s
        while time.monotonic() < hold_until and not self._closing.is_set():
            try:
                if conn.recv(65536) == b"":
                    call.closed_at = time.monotonic()
                    return
            except TimeoutError:
                continue

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, route: tuple[int, str, bytes]) -> None:
        code, ctype, body = route
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
