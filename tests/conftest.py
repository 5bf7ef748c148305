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
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tests" / "programs" / "train.py"
DDP = ROOT / "tests" / "programs" / "ddp_train.py"
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(nproc: int, run_id: str, *target: str) -> list[str]:
    """torchrun on this machine: a c10d rendezvous on a free loopback port, run id
    `run_id` (TORCHELASTIC_RUN_ID), running `target` (default: the DDP test job)."""
    return [
        PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", run_id,
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
        self, tmp_path: Path, name: str, args: list[str], env: dict[str, str], program: Path | list[str] = TRAIN
    ):
        self.name = name
        self.stop_file = tmp_path / f"{name}.stop"
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        prefix = list(program) if isinstance(program, list) else [PYTHON, str(program)]
        cmd = [*prefix, *args, "--stop-file", str(self.stop_file)]
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=env, start_new_session=True)

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

    def _spawn(name: str, args: list[str], env: dict[str, str], program: Path | list[str] = TRAIN) -> TrainProc:
        proc = TrainProc(tmp_path, name, args, env, program)
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
