"""Shared fixtures: real training subprocesses, deadlines, trace readers."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sidecar.registry import record_path, write_request

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tests" / "programs" / "train.py"
DDP = ROOT / "tests" / "programs" / "ddp_train.py"
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(nproc: int, run_id: str | None, *target: str, nnodes: int = 1, endpoint: str | None = None) -> list[str]:
    """torchrun on this machine: a c10d rendezvous on a free loopback port (or
    `endpoint`), run id `run_id` (TORCHELASTIC_RUN_ID; None: no --rdzv-id, so
    torchrun sets it to "none"), running `target` (default: the DDP test job)."""
    return [
        PYTHON, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint or f"127.0.0.1:{free_port()}",
        *(["--rdzv-id", run_id] if run_id is not None else []),
        "--monitor-interval", "0.5", *(target or (str(DDP),)),
    ]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rb") as f:
        return json.load(f)


def profiler_steps(trace: dict[str, Any]) -> list[int]:
    """The N of every `ProfilerStep#N` span in a Chrome trace, sorted, unique."""
    steps = set()
    for event in trace["traceEvents"]:
        match = re.fullmatch(r"ProfilerStep#(\d+)", str(event.get("name", "")))
        if match and event.get("ph") == "X":
            steps.add(int(match.group(1)))
    return sorted(steps)


def base_env(registry: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSMOS_PROFILER_", "TORCHELASTIC_", "SLURM_"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if registry is not None:
        env["COSMOS_PROFILER_DIR"] = str(registry)
    env.update(extra)
    return env


class TrainProc:
    """One training subprocess; its stdout/stderr go to files under tmp_path."""

    def __init__(
        self, tmp_path: Path, name: str, args: list[str], env: dict[str, str], program: Path | list[str] = TRAIN,
        cwd: Path | None = None,
    ):
        self.name = name
        self.stop_file = tmp_path / f"{name}.stop"
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        prefix = list(program) if isinstance(program, list) else [PYTHON, str(program)]
        cmd = [*prefix, *args, "--stop-file", str(self.stop_file)]
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=env, start_new_session=True, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited early ({self.proc.returncode}):\n{self.stderr()[-3000:]}")
            return "READY" in self.stdout()

        wait_for(ready, timeout, what=f"{self.name} to be ready")

    def signal(self, signum: int = signal.SIGUSR1) -> None:
        os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 60.0) -> int:
        self.stop_file.touch()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop within {timeout}s:\n{self.stderr()[-3000:]}") from None
        self._close_files()
        return code

    def kill(self) -> None:
        """SIGKILL the process and every descendant (torchrun puts its workers in
        sessions of their own, so killing our process group is not enough)."""
        if self.proc.poll() is None:
            import psutil

            try:
                victims = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                victims = []
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for child in victims:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(victims, timeout=10)
            self.proc.wait(timeout=10)
        self._close_files()

    def _close_files(self) -> None:
        for f in (self._out, self._err):
            if not f.closed:
                f.close()


@pytest.fixture
def spawn(tmp_path: Path):
    """Start training subprocesses; every one is killed at teardown."""
    procs: list[TrainProc] = []

    def _spawn(name: str, args: list[str], env: dict[str, str], program: Path | list[str] = TRAIN,
               cwd: Path | None = None) -> TrainProc:
        proc = TrainProc(tmp_path, name, args, env, program, cwd)
        procs.append(proc)
        return proc

    yield _spawn
    for proc in procs:
        proc.kill()


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture(autouse=True)
def keep_sigusr1():
    """Give SIGUSR1 back its disposition after each test (a closed sidecar leaves it ignored)."""
    before = signal.getsignal(signal.SIGUSR1)
    yield
    if before is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, before)


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Fail a test that leaves threads running in this process (watchdog does the same)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"threads leaked: {[t.name for t in leaked]}"


@pytest.fixture
def trace_path_controller():
    """A Cosmos-RL controller stand-in on 127.0.0.1 that records POST /api/set_trace_path: (url, posts)."""
    posts: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/api/set_trace_path":
                posts.append(json.loads(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="test-controller")
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posts
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def netfs(tmp_path: Path):
    """A started `netfs.SshfsServer` (sshfs over a throwaway sshd on 127.0.0.1): call
    `.mount(name)` for each "machine". Skips, saying why, where FUSE or the
    programs are unavailable; unmounts and stops sshd at teardown."""
    from netfs import NetFSUnavailable, SshfsServer

    server = SshfsServer(tmp_path / "netfs")
    try:
        server.start()
    except NetFSUnavailable as exc:
        pytest.skip(f"no network filesystem here: {exc}")

    def mount(name: str) -> Path:
        try:
            return SshfsServer.mount(server, name)
        except NetFSUnavailable as exc:
            server.close()
            pytest.skip(f"no network filesystem here: {exc}")

    server.mount = mount  # type: ignore[method-assign]
    try:
        yield server
    finally:
        server.close()


CAPTURE_STEP_SLEEP = {0: "0.01", 1: "0.05"}  # rank 1 sleeps inside each ProfilerStep span: the straggler


@pytest.fixture(scope="session")
def capture(tmp_path_factory):
    """One real capture: two ranks of tests/programs/train.py profile 3 active steps.

    Shared by the tests/test_traces_*.py modules, which only read it (test_cli_analysis.py has its own).
    """
    tmp = tmp_path_factory.mktemp("capture")
    registry, out = tmp / "registry", tmp / "out"
    procs = []
    try:
        for rank, sleep in CAPTURE_STEP_SLEEP.items():
            env = base_env(registry, RANK=str(rank), WORLD_SIZE="2")
            args = ["--replica", "r1", "--output", str(out), "--step-sleep", sleep]
            procs.append(TrainProc(tmp, f"rank{rank}", args, env))
        for rank, proc in enumerate(procs):
            proc.wait_ready()
            wait_for(lambda r=rank: (read_json(record_path(registry, "r1", r)) or {}).get("state") == "idle",
                     60, what=f"rank {rank} record")
        write_request(registry, "r1", {"rank_filter": "all", "active_steps": 3, "wait_steps": 1, "warmup_steps": 1})

        def saved(rank):
            rec = read_json(record_path(registry, "r1", rank)) or {}
            return rec if rec.get("trace_path") and rec.get("state") == "idle" else None

        records = {rank: wait_for(lambda r=rank: saved(r), 90, what=f"rank {rank} trace") for rank in CAPTURE_STEP_SLEEP}
        for proc in procs:
            assert proc.stop() == 0
    finally:
        for proc in procs:
            proc.kill()
    paths = {rank: Path(rec["trace_path"]) for rank, rec in records.items()}
    return SimpleNamespace(out=out, paths=paths, records=records, docs={r: load_trace(p) for r, p in paths.items()})
