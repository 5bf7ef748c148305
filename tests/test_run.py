"""Zero code change: `python -m sidecar.run script.py` profiles an unmodified script."""

from __future__ import annotations

import re

import pytest

from sidecar.registry import record_path, write_request
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

PLAIN = str(ROOT / "tests" / "programs" / "plain_train.py")


def _run(spawn, tmp_path, registry, name, *script_args):
    cmd = [PYTHON, "-m", "sidecar.run", "--replica", name, "--output", str(tmp_path / "out"), PLAIN]
    proc = spawn(name, list(script_args), base_env(registry), program=cmd)
    proc.wait_ready()
    wait_for(lambda: read_json(record_path(registry, name, 0)), what="record")
    return proc


@pytest.mark.parametrize("flags", [[], ["--two-optimizers"], ["--explicit"], ["--two-optimizers", "--explicit"]])
def test_steps_are_iterations_whatever_steps_the_optimizers(spawn, tmp_path, registry, flags):
    proc = _run(spawn, tmp_path, registry, "z", "--steps", "60", *flags)
    assert proc.proc.wait(timeout=60) == 0
    done = int(re.search(r"DONE (\d+)", proc.stdout()).group(1))
    record = read_json(record_path(registry, "z", 0))
    assert done == 60
    assert record["step"] == 60, f"counted {record['step']} steps for 60 iterations with {flags}"
    assert record["exited_at"] is not None


def test_unmodified_script_is_profiled_on_request(spawn, tmp_path, registry):
    proc = _run(spawn, tmp_path, registry, "z", "--two-optimizers")
    write_request(registry, "z", {"id": "auto", "active_steps": 2})
    rec = wait_for(lambda: (r := read_json(record_path(registry, "z", 0))) and r.get("trace_path") and r, what="trace")
    start = rec["capture_start_step"]
    assert profiler_steps(load_trace(rec["trace_path"])) == [start + 2, start + 3]
    assert proc.stop() == 0
    assert "[Profiler] start to trace for rank: 0" in proc.stderr()


def test_run_needs_a_script(tmp_path):
    import subprocess

    out = subprocess.run([PYTHON, "-m", "sidecar.run"], capture_output=True, text=True, env=base_env(tmp_path), timeout=60)
    assert out.returncode == 2 and "give a script to run" in out.stderr
