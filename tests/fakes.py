"""Fakes for CLI tests: rank records written by hand, and a stand-in Cosmos-RL controller.

A record made by `alive_record` points at this test process (pid and create
time), so `is_alive` holds; `dead_record` points at a pid whose create time
does not match; `remote_record` lives on another host with a chosen heartbeat age.
`FakeController` serves GET routes on 127.0.0.1 with the standard library's
http.server, in Cosmos-RL's JSON shapes (`cosmos_status`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from sidecar.identity import host_name
from sidecar.registry import RankRecord, write_record

_CREATE_TIME = psutil.Process().create_time()


def alive_record(registry: Path, replica: str, rank: int, **fields: Any) -> RankRecord:
    now = time.time()
    values: dict[str, Any] = {
        "replica": replica, "role": "policy", "rank": rank, "world_size": 2, "host": host_name(),
        "pid": os.getpid(), "create_time": _CREATE_TIME, "started_at": now - 10.0, "heartbeat_at": now,
        "step": 1000, "watch": "inotify",
    }
    values.update(fields)
    record = RankRecord(**values)
    write_record(registry, record)
    return record


def dead_record(registry: Path, replica: str, rank: int, **fields: Any) -> RankRecord:
    """Same host, a pid that exists but with another create time: a reused pid, so dead."""
    return alive_record(registry, replica, rank, create_time=_CREATE_TIME - 1000.0, **fields)


def remote_record(registry: Path, replica: str, rank: int, heartbeat_age: float, **fields: Any) -> RankRecord:
    return alive_record(
        registry, replica, rank, host="node-elsewhere", pid=4242, heartbeat_at=time.time() - heartbeat_age, **fields
    )


def update_record(registry: Path, record: RankRecord, **fields: Any) -> RankRecord:
    record = dataclasses.replace(record, heartbeat_at=time.time(), **fields)
    write_record(registry, record)
    return record


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
