"""The CLI in a test: as the user runs it, a subprocess of `python -m sidecar` (`run_cli`),
or in this process through click's CliRunner (`invoke`)."""

from __future__ import annotations

import re
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


def run_cli_tty(*args: str, timeout: float = 120.0, env: dict | None = None) -> tuple[int, str, str]:
    """Run `python -m sidecar ARGS` with stderr on a pseudo-terminal (stdout a pipe), as on a
    user's terminal with stdout redirected. Returns (exit code, stdout, what the terminal showed)."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen([PYTHON, "-m", "sidecar", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, text=True, env=env or base_env())
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        reader.join(timeout=10)
        os.close(master)
    return proc.returncode, out, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def stack_group_headers(text: str) -> list[str]:
    """The group headers of `profile stacks` output ("ranks 0,2-3 (3 ranks): MainThread, step 20")."""
    return [line for line in text.splitlines() if re.match(r"^ranks? \S+ \(\d+ ranks?\):", line)]
