"""Fixtures only: the helpers they use live in tests/support (see its __init__ for the map)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sidecar.registry import record_path, write_request
from support.controller import FakeController
from support.files import read_json
from support.launch import TRAIN, TrainProc, base_env
from support.traces import load_trace
from support.wait import wait_for


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
def controller():
    """A `support.controller.FakeController` on 127.0.0.1, closed at teardown: set its routes
    (`.json(path, obj)`), read what it was asked (`.hits`, `.calls`, `.posted(path)`), or
    make it misbehave (`.mode`)."""
    fake = FakeController()
    yield fake
    fake.close()


@pytest.fixture
def netfs(tmp_path: Path):
    """A started `support.netfs.SshfsServer` (sshfs over a throwaway sshd on 127.0.0.1): call
    `.mount(name)` for each "machine". Skips, saying why, where FUSE or the
    programs are unavailable; unmounts and stops sshd at teardown."""
    from support.netfs import NetFSUnavailable, SshfsServer

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
