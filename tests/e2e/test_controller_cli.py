"""The controller path from a real CLI process: `python -m cosmos_rl.cli.cli` against a closed port.
The in-process controller tests (tests/unit/test_controller.py) use the stand-in on 127.0.0.1."""

from __future__ import annotations

import subprocess

from support.launch import PYTHON, ROOT, base_env, free_port


def test_unreachable_controller_in_a_real_cli_process():
    port = free_port()
    proc = subprocess.run(
        [PYTHON, "-m", "cosmos_rl.cli.cli", "profile", "set", "r1", "-cp", str(port), "-ch", "127.0.0.1"],
        capture_output=True, text=True, timeout=60, env=base_env(), cwd=ROOT,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"Error: cannot reach the controller at http://127.0.0.1:{port}: connection refused "
        "(is the controller running on that port?)\n"
    )
