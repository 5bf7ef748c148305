"""Fixtures every test may use, and the layout's rule: tests under tests/e2e/ are marked `e2e`, and a
test elsewhere that starts processes fails the collection (support.layout). The fixtures that start
processes live in tests/e2e/conftest.py; tests/unit/conftest.py refuses process starts outright.
The helpers live in tests/support (see its __init__ for the map)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from support.controller import FakeController
from support.layout import is_e2e, is_unit, process_starters
from support.wait import wait_for


def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/e2e/ `e2e`; fail the run where a test elsewhere starts processes
    (a process-starting fixture, or a module that imports a helper that starts one), or lives
    neither under tests/unit/ nor under tests/e2e/."""
    misplaced = []
    for item in items:
        if is_e2e(item.path):
            item.add_marker(pytest.mark.e2e)
            continue
        why = process_starters(getattr(item, "fixturenames", ()), getattr(item, "module", None))
        if not is_unit(item.path):
            why.append("neither under tests/unit/ nor under tests/e2e/")
        if why:
            misplaced.append(f"  {item.nodeid}: {', '.join(why)}")
    if misplaced:
        raise pytest.UsageError("a test lives under tests/unit/ (no process starts) or tests/e2e/ (marked e2e); "
                                "these do not:\n" + "\n".join(misplaced))


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture
def env(tmp_path: Path, monkeypatch) -> Path:
    """A clean environment for an in-process sidecar: none of ours, torchrun's or SLURM's
    variables, and the registry under tmp_path/reg (COSMOS_PROFILER_DIR). Returns tmp_path."""
    for key in list(os.environ):
        if key.startswith(("COSMOS_PROFILER_", "TORCHELASTIC_", "SLURM_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("COSMOS_PROFILER_DIR", str(tmp_path / "reg"))
    return tmp_path


@pytest.fixture(autouse=True)
def keep_environ():
    """Give os.environ back as it was after each test: an in-process `sidecar.install()` sets the
    flight recorder's default (TORCH_FR_BUFFER_SIZE) in this process's environment, as it must in a
    job, and every subprocess a later test starts would inherit it."""
    before = dict(os.environ)
    yield
    for key in set(os.environ) - set(before):
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def keep_sigusr1():
    """Give SIGUSR1 back its disposition after each test (a closed sidecar leaves it ignored)."""
    before = signal.getsignal(signal.SIGUSR1)
    yield
    if before is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, before)


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Fail a test that leaves threads running in this process (watchdog does the same); a thread
    that is ending (a saver joining) gets a few seconds."""
    before = set(threading.enumerate())
    yield

    def leaked() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before and t.is_alive()]

    wait_for(lambda: not leaked(), 5.0, interval=0.05, what="the test's threads to end",
             describe=lambda: f"threads leaked: {[t.name for t in leaked()]}")


@pytest.fixture
def controller():
    """A `support.controller.FakeController` on 127.0.0.1, closed at teardown: set its routes
    (`.json(path, obj)`), read what it was asked (`.hits`, `.calls`, `.posted(path)`), or
    make it misbehave (`.mode`)."""
    fake = FakeController()
    yield fake
    fake.close()
