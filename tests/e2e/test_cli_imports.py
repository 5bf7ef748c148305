"""What the CLI imports to list replicas: `replica ls` and `replica lsr` load neither the modules
that write and follow requests (`sidecar.fleet.control`, `follow`, `answers`), nor the live
progress of a wait, nor the trace analysis, nor torch. Every command pays for its imports at
start (issue 29 times `replica ls`).

Each check runs in a fresh interpreter, so what this test process imported does not count; the
command runs in process through the `cosmos` group with click's standalone_mode=False (`main`
would end the process with `os._exit` before sys.modules could be read).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from support.launch import PYTHON, ROOT, base_env
from support.records import remote_record

# What listing replicas must not load, by exact name or as a package prefix; of the standard
# library, what only other commands use: hashlib (it loads OpenSSL) and tomllib (--config).
NEVER = ("sidecar.fleet.control", "sidecar.fleet.follow", "sidecar.fleet.answers", "sidecar.fleet.hang",
         "sidecar.fleet.stackgroups", "sidecar.cli.progress", "sidecar.traces", "torch", "hashlib", "tomllib")


def loaded_after(args: list[str]) -> tuple[list[str], str]:
    """Run `cosmos-profiler ARGS` in a new interpreter; the modules of NEVER it loaded, and what it printed."""
    code = (
        "import io, json, sys, contextlib\n"
        "from sidecar.cli import cosmos\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    cosmos.main(args={args!r}, prog_name='cosmos-profiler', standalone_mode=False)\n"
        f"never = {NEVER!r}\n"
        "loaded = sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in never))\n"
        "print(json.dumps({'loaded': loaded, 'output': out.getvalue()}))\n"
    )
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, env=base_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["loaded"], result["output"]


def test_replica_ls_of_an_empty_registry_loads_no_request_writer_follower_or_trace_module(tmp_path):
    loaded, output = loaded_after(["replica", "ls", "--registry", str(tmp_path)])
    assert loaded == []
    assert output.startswith("No replicas"), output  # the command did run, and found nothing


@pytest.mark.parametrize("as_json", [False, True])
def test_replica_ls_and_lsr_of_a_live_rank_load_none_of_them(tmp_path, as_json):
    remote_record(tmp_path, "r1", 0, heartbeat_age=0.0, world_size=1)
    flag = ["--json"] if as_json else []
    loaded, listed = loaded_after(["replica", "ls", "--registry", str(tmp_path), *flag])
    assert loaded == []
    loaded, ranks = loaded_after(["replica", "lsr", "r1", "--registry", str(tmp_path), *flag])
    assert loaded == []
    if as_json:
        assert [r["replica"] for r in json.loads(listed)["replicas"]] == ["r1"]
        assert [r["host"] for r in json.loads(ranks)["ranks"]] == ["node-elsewhere"]
    else:
        assert "r1" in listed and "1/1" in listed, listed
        assert "node-elsewhere" in ranks and "4242" in ranks, ranks


def test_the_check_sees_a_command_that_does_load_them(tmp_path):
    """`profile status` reads through `follow`: the probe is not blind."""
    remote_record(tmp_path, "r1", 0, heartbeat_age=0.0, world_size=1)
    loaded, _ = loaded_after(["profile", "status", "r1", "--registry", str(tmp_path)])
    assert "sidecar.fleet.follow" in loaded
