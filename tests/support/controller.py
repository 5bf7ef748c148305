"""Stand-in Cosmos-RL controllers on 127.0.0.1, and the JSON Cosmos-RL answers (`cosmos_status`).

`FakeController` serves GET routes with the standard library's http.server;
`StubController` answers from a raw socket, so it can also hang, or answer
garbage or no HTTP at all.
"""

from __future__ import annotations

import json
import socket
import threading
import time
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


class FakeController:
    """Routes: path -> (status code, content type, body bytes). `delay` slows every answer."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, str, bytes]] = {}
        self.hits: list[str] = []
        self.delay = 0.0
        self.release = threading.Event()  # ends a delay early at teardown
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.hits.append(self.path)
                if fake.delay:
                    fake.release.wait(fake.delay)
                code, ctype, body = fake.routes.get(self.path, (404, "application/json", b'{"detail":"Not Found"}'))
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = False  # so server_close() joins every handler thread
            block_on_close = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-controller", daemon=True
        )
        self.thread.start()

    def json(self, path: str, obj: Any) -> None:
        self.routes[path] = (200, "application/json", json.dumps(obj).encode())

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class StubController:
    """A fake Cosmos-RL controller on 127.0.0.1, served by one thread.

    `mode` decides each answer and may be changed while it runs:
      ok            HTTP 200 with the JSON in `answers[path]` (or {})
      slow          read the request, answer nothing; hold the connection until the
                    client gives up (or `hold_s`, or close())
      garbage-json  HTTP 200 whose body is HTML, not JSON
      not-http      bytes that are not HTTP at all, then close
    Every connection is appended to `hits`: path, accepted and closed times (monotonic).
    """

    def __init__(self, mode: str = "ok", hold_s: float = 30.0) -> None:
        self.mode = mode
        self.hold_s = hold_s
        self.answers: dict[str, Any] = {}
        self.hits: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="stub-controller", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close()
        assert not self._thread.is_alive(), "stub controller thread did not stop"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    self._handle(conn)
                except OSError:
                    pass

    def _handle(self, conn: socket.socket) -> None:
        hit: dict[str, Any] = {"at": time.monotonic(), "closed_at": None, "path": None}
        self.hits.append(hit)
        conn.settimeout(0.05)
        data = b""
        head_deadline = time.monotonic() + 2.0
        while b"\r\n\r\n" not in data and time.monotonic() < head_deadline and not self._stop.is_set():
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            data += chunk
        first = data.split(b"\r\n", 1)[0].split()
        hit["path"] = first[1].decode() if len(first) > 1 else None
        mode = self.mode
        if mode == "slow":
            hold_until = time.monotonic() + self.hold_s
            while time.monotonic() < hold_until and not self._stop.is_set():
                try:
                    if conn.recv(65536) == b"":
                        hit["closed_at"] = time.monotonic()
                        return
                except TimeoutError:
                    continue
            return
        if mode == "not-http":
            conn.sendall(b"\x00\x01\x02 this is not HTTP at all\r\n\r\n")
        elif mode == "garbage-json":
            body = b"<html><body>502 bad gateway, or a web page</body></html>"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))
        else:
            body = json.dumps(self.answers.get(hit["path"], {})).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))
        hit["closed_at"] = time.monotonic()
