"""Liveness on one clock (sidecar.common.clock): a rank on another host whose wall clock runs
5 minutes ahead or behind is alive while it trains, takes `profile set --wait`, and reads
dead within a minute of SIGKILL.

The rank runs in its own UTS namespace (`unshare --uts`, root only) under another host
name, so the CLI cannot ask psutil and must judge it by its record; its CLOCK_REALTIME
(time.time(), gettimeofday, time) is shifted by a tiny LD_PRELOAD shim built here with
the system's cc. The kernel's clock, which stamps the registry's files, is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support.cli import run_cli
from support.clockshim import ENV_OFFSET, build_clock_shim
from support.launch import PYTHON, TRAIN, base_env
from support.records import wait_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

SKEWED_HOST = "skewed-node"


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """The clock shim, checked to shift Python's time.time() in a child; skips where it cannot be."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the skewed rank runs in its own UTS namespace (unshare --uts)")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing: the skewed rank needs its own UTS namespace")
    probe = subprocess.run(["unshare", "--uts", "hostname", SKEWED_HOST], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare --uts is not permitted here: {probe.stderr.strip()}")
    built = build_clock_shim(tmp_path_factory.mktemp("clockshim"))
    if isinstance(built, str):
        pytest.skip(built)
    d = built.parent
    env = {**os.environ, "LD_PRELOAD": str(d / "shim.so"), ENV_OFFSET: "-300"}
    shifted = subprocess.run([PYTHON, "-c", "import time; print(time.time())"], capture_output=True, text=True,
                             env=env, timeout=60)
    assert shifted.returncode == 0, shifted.stderr
    assert abs(float(shifted.stdout) - (time.time() - 300)) < 30, "the shim does not shift Python's time.time()"
    return d / "shim.so"


def _lsr(registry: Path) -> dict:
    code, out, err, _ = run_cli("replica", "lsr", "skew", "--registry", str(registry), "--json")
    assert code == 0, err
    (rank,) = json.loads(out)["ranks"]
    return rank


@pytest.mark.parametrize("offset", [300, -300], ids=["ahead", "behind"])
def test_a_rank_with_a_skewed_clock_on_another_host(tmp_path, spawn, shim, offset):
    registry = tmp_path / "registry"
    env = base_env(registry, LD_PRELOAD=str(shim), **{ENV_OFFSET: str(offset)})
    program = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', SKEWED_HOST, PYTHON, str(TRAIN)]
    rank = spawn("skew", ["--replica", "skew", "--output", str(tmp_path / "out"), "--step-sleep", "0.02"], env,
                 program=program)
    rank.wait_ready(120)
    rec = wait_record(registry, lambda r: r.get("state") == "idle" and r.get("step", 0) > 0, "skew",
                      what="the skewed rank's first record")
    assert rec["host"] == SKEWED_HOST and rec["pid"] == rank.pid
    assert abs(rec["heartbeat_at"] - (time.time() + offset)) < 30, "the rank's clock is not shifted"

    # Alive while it trains, by its record, on the registry's clock.
    code, out, err, _ = run_cli("replica", "ls", "--registry", str(registry), "--json")
    assert code == 0, err
    (row,) = json.loads(out)["replicas"]
    assert (row["replica"], row["num_alive"], row["state"]) == ("skew", 1, "idle"), row
    assert row["heartbeat_age_s"] < 10, row
    first = _lsr(registry)
    assert first["alive"] and first["liveness"] == "alive", first

    # `profile set --wait` plans its start step and follows the rank to its trace.
    code, out, err, _ = run_cli("profile", "set", "skew", "-as", "2", "--wait", "--timeout", "120",
                                "--registry", str(registry), "--json", timeout=180)
    assert code == 0, out + err
    (done,) = json.loads(out)["ranks"]
    assert done["phase"] == "saved", done
    steps = profiler_steps(load_trace(Path(done["trace_path"])))
    assert len(steps) == 2 and steps[1] == steps[0] + 1, steps

    # Dead within a minute of SIGKILL.
    rank.kill()

    def dead() -> dict | None:
        row = _lsr(registry)
        return None if row["alive"] else row

    gone = wait_for(dead, 60, interval=0.5, what="the killed skewed rank to read dead")
    assert gone["liveness"].startswith("no heartbeat for"), gone
