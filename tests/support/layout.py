"""Where a test lives says what it may do: tests/unit/ starts no process, tests/e2e/ does.

conftest.py marks every test under tests/e2e/ `e2e` (`pytest -m "not e2e"` is `bin/test --fast`)
and fails the collection of a test outside it that uses a process-starting fixture or helper
(`process_starters`); tests/unit/conftest.py refuses the process starts themselves
(`STARTERS_PATCHED`) while a unit test runs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parents[1]
E2E_DIR = TESTS / "e2e"
UNIT_DIR = TESTS / "unit"

# conftest.py's fixtures that start processes: training runs, torchrun jobs, sshd, moto's server.
PROCESS_FIXTURES = frozenset({"spawn", "netfs", "s3_server", "capture", "ddp2_slowed", "ddp4_slowed", "redis_server"})

# Where a process starts, in the standard library ("module:attribute"): refused in unit tests.
STARTERS_PATCHED = (
    "subprocess:Popen._execute_child", "os:fork", "os:forkpty", "os:posix_spawn", "os:posix_spawnp", "os:system",
    "multiprocessing.process:BaseProcess.start",
)


class ProcessStartInUnitTest(RuntimeError):
    """A unit test started a process: it belongs under tests/e2e/."""


def is_e2e(path: Path | str) -> bool:
    """Whether the test file at `path` is an end-to-end one (under tests/e2e/)."""
    return Path(path).resolve().is_relative_to(E2E_DIR)


def is_unit(path: Path | str) -> bool:
    """Whether the test file at `path` is a unit one (under tests/unit/)."""
    return Path(path).resolve().is_relative_to(UNIT_DIR)


def _starter_helpers() -> dict[int, str]:
    """id -> name of the support helpers (and modules) that start processes."""
    from . import browser, capture, cli, launch, netfs, redisserver, s3

    helpers = {
        "support.launch.Spawner": launch.Spawner, "support.launch.TrainProc": launch.TrainProc,
        "support.launch.torchrun_cmd": launch.torchrun_cmd,
        "support.capture.two_rank_capture": capture.two_rank_capture,
        "support.capture.slowed_ddp_captures": capture.slowed_ddp_captures,
        "support.cli.run_cli": cli.run_cli, "support.cli.run_cli_tty": cli.run_cli_tty,
        "support.browser.render": browser.render, "support.browser.rendered_ok": browser.rendered_ok,
        "support.browser.screenshot": browser.screenshot, "support.netfs": netfs, "support.s3.S3Server": s3.S3Server,
        "support.redisserver.RedisServer": redisserver.RedisServer,
        "subprocess": subprocess,
    }
    return {id(obj): name for name, obj in helpers.items()}


def process_starters(fixturenames: Iterable[str], module: ModuleType | None) -> list[str]:
    """What makes a test start processes: the process-starting fixtures it uses, and the
    process-starting helpers its module imports. Empty for a test that may be a unit test."""
    found = [f"fixture {name}" for name in sorted(set(fixturenames) & PROCESS_FIXTURES)]
    if module is not None:
        helpers = _starter_helpers()
        found += sorted({f"imports {helpers[id(value)]}" for value in vars(module).values() if id(value) in helpers})
    return found
