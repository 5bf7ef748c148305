"""`profile set` on real ranks that have not stepped yet (sidecar.fleet.control, startstep.standing_still):
their records, written once at their start, hold no pace, and they will not be rewritten for a
heartbeat (30 s here); their counters stood still, so the plan is made at once, without waiting up
to 5 s for a pace. What the CLI did is read off its own debug log, not off a clock."""

from __future__ import annotations

import json
import os
import subprocess
import time

from sidecar.common import clock, startstep
from sidecar.common.records import RankRecord, write_record
from sidecar.common.recordscan import read_records
from support.launch import PYTHON, base_env
from support.wait import wait_for

# The CLI as `python -m sidecar` runs it, with the `sidecar` logger's debug lines on stderr.
DEBUG_CLI = ("import logging, sys; logging.basicConfig(level=logging.DEBUG, stream=sys.stderr); "
             "from sidecar.cli import main; main(prog_name='cosmos-profiler')")


def test_profile_set_plans_at_once_for_ranks_that_have_not_stepped(spawn, tmp_path):
    registry = tmp_path / "reg"
    config = tmp_path / "job.toml"
    config.write_text("[sidecar]\nheartbeat_interval = 30.0\n[profiler]\nenable_profiler = true\n")
    for k in range(2):
        spawn.rank(registry, "--pause-at", "0", "--config", str(config), replica="still", name=f"still-{k}",
                   env_extra={"RANK": str(k), "WORLD_SIZE": "2"})

    def standing_still():
        records = read_records(registry, "still")
        now = clock.fs_now(registry)
        return len(records) == 2 and all(startstep.standing_still(r, now) for r in records) and records

    records = wait_for(standing_still, 60, what="two ranks standing still for STILL_AFTER_S")
    # The case that used to wait: no pace in either record, and none coming before the next heartbeat.
    assert [startstep.step_rate(r) for r in records] == [None, None]
    assert all(r.step == 0 for r in records)

    done = _debug_cli("profile", "set", "still", "-rf", "all", "--no-wait", "--json", "--registry", str(registry))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["start_step"], result["lead_steps"]) == (startstep.MIN_LEAD_STEPS, startstep.MIN_LEAD_STEPS)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert "for the pace of" not in done.stderr, done.stderr
    # ... and says what that start step assumes of ranks that have not stepped.
    assert ("Warning: ranks 0-1 (2) have not stepped since starting, so no pace is known: step 3 assumes they read "
            "the request before stepping.") in done.stderr, done.stderr

    # The same log does show the wait where there is one: a rank that stepped, with no pace yet.
    other = tmp_path / "other"
    now = time.time()
    path = write_record(other, RankRecord(replica="young", role="policy", rank=0, host="node-elsewhere", pid=4242,
                                          started_at=now - 0.1, heartbeat_at=now, heartbeat_interval=0.1, step=3,
                                          recent_steps=[[now, 3]], last_step_at=now))
    os.utime(path, (now, now))
    done = _debug_cli("profile", "set", "young", "--no-wait", "--json", "--registry", str(other))
    assert done.returncode == 0, done.stderr
    assert "profile set young: waiting up to 0.2s for the pace of rank 0" in done.stderr, done.stderr  # 1.5 heartbeats
    assert "not stepped since starting" not in done.stderr, done.stderr


def _debug_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", DEBUG_CLI, *args], capture_output=True, text=True, timeout=120,
                          env=base_env())
