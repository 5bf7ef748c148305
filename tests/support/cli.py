"""The CLI as the user runs it: a subprocess of `python -m sidecar`."""

from __future__ import annotations

import subprocess
import time

from .launch import PYTHON, base_env


def run_cli(*args: str, timeout: float = 60.0, env: dict | None = None) -> tuple[int, str, str, float]:
    """Run `python -m sidecar ARGS` (the cosmos-profiler CLI). Returns (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or base_env())
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started
