"""The CLI in a test: as the user runs it, a subprocess of `python -m sidecar` (`run_cli`),
or in this process through click's CliRunner (`invoke`)."""

from __future__ import annotations

import subprocess
import time

from click.testing import CliRunner, Result

from sidecar.cli import cosmos

from .launch import PYTHON, base_env


def run_cli(*args: str, timeout: float = 60.0, env: dict | None = None) -> tuple[int, str, str, float]:
    """Run `python -m sidecar ARGS` (the cosmos-profiler CLI). Returns (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or base_env())
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in this process with click's CliRunner, COSMOS_PROFILER_DIR unset unless `env`
    sets it. A traceback in the output, or an exception other than SystemExit, fails the test."""
    result = CliRunner(env={"COSMOS_PROFILER_DIR": None, **(env or {})}).invoke(cosmos, list(args))
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result
