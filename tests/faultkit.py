"""Helpers for the fault and security suites: rank records, the CLI, a stub controller.

Not a test module; tests/test_faults.py and tests/test_security.py import it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from conftest import PYTHON, base_env, read_json, wait_for
from sidecar.registry import record_path


def record(registry: Path, replica: str = "r1", rank: int = 0) -> dict:
    """The rank record as the CLI would read it, or {} when absent or half-written."""
    return read_json(record_path(registry, replica, rank)) or {}


def wait_record(registry: Path, pred, replica: str = "r1", rank: int = 0, timeout: float = 60.0, what: str = "") -> dict:
    def check():
        rec = record(registry, replica, rank)
        return rec if rec and pred(rec) else None

    return wait_for(check, timeout, what=what or f"a record of {replica} rank {rank} matching {pred}")


def start_rank(spawn, tmp_path: Path, registry: Path, *args: str, name: str = "r1", output: Path | None = None,
               env_extra: dict | None = None, wait_idle: bool = True):
    """Start tests/programs/train.py as replica `name` and wait for its first idle record."""
    env = base_env(registry, **(env_extra or {}))
    out = output if output is not None else tmp_path / "out"
    proc = spawn(name, ["--replica", name, "--output", str(out), *args], env)
    proc.wait_ready()
    if wait_idle:
        rank = int(env.get("RANK", 0))
        wait_record(registry, lambda r: r.get("state") == "idle" and r.get("pid") == proc.pid, name, rank,
                    what="the first idle record")
    return proc


def proc_counts(pid: int) -> tuple[int, int]:
    """(threads, open file descriptors) of a process, measured from outside."""
    p = psutil.Process(pid)
    return p.num_threads(), p.num_fds()


def stable_counts(pid: int, for_s: float = 0.5, timeout: float = 15.0) -> tuple[int, int]:
    """(threads, fds) once they have not changed for `for_s` (a save thread may still be ending)."""
    deadline = time.monotonic() + timeout
    counts, since = proc_counts(pid), time.monotonic()
    while time.monotonic() - since < for_s:
        if time.monotonic() > deadline:
            raise AssertionError(f"thread/fd counts never settled (last {counts})")
        time.sleep(0.05)
        now = proc_counts(pid)
        if now != counts:
            counts, since = now, time.monotonic()
    return counts


def remove_tree(path: Path, timeout: float = 10.0) -> None:
    """rm -rf a directory a running sidecar may be writing into (retry while it races us)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def settled_counts(pid: int, expected: tuple[int, int], timeout: float = 15.0) -> tuple[int, int]:
    """Wait (on a deadline) for the counts to come back to `expected`; return the last counts seen."""
    deadline = time.monotonic() + timeout
    while True:
        counts = proc_counts(pid)
        if counts == expected or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def run_cli(*args: str, timeout: float = 60.0, env: dict | None = None) -> tuple[int, str, str, float]:
    """Run `python -m sidecar ARGS` (the cosmos-profiler CLI). Returns (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or base_env())
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def closed_port() -> int:
    """A 127.0.0.1 port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
