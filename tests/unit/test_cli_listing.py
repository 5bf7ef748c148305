"""`replica ls`, `replica lsr` and `profile status`, byte for byte (text and --json), over a
registry of several replicas whose ranks cover every liveness, state and phase the tables show.

The expected output lives in tests/golden/listing/; the registry is written by hand with
heartbeats relative to a frozen clock, the CLI's host is pinned, and the same-host ranks name
pid 1 (which exists on every machine), so the output is the same on every run. The registry's
path is shown as <REG>; the CLI is given it through a link of one fixed length in /tmp (the
columns that show it are as wide on every machine, whatever the length of pytest's temp path). These pin the rendering: a change to what these commands print is a
deliberate edit of the golden files (COSMOS_UPDATE_GOLDEN=1 rewrites them from the code).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from sidecar.common import clock
from sidecar.common.layout import control_path, record_path
from sidecar.common.records import RankRecord, start_since_boot, write_record
from sidecar.common.registry import write_request
from sidecar.fleet import replicas
from support.cli import invoke as run

GOLDEN = Path(__file__).parents[1] / "golden" / "listing"
NOW = 1_800_000_000.25  # the frozen clock of every command here
HOST = "login-node"  # the CLI's host: ranks on it are alive by pid and create time


def _init_create_time() -> float | None:
    """pid 1's create time (the same-host ranks' process), or None where it cannot be read."""
    try:
        return psutil.Process(1).create_time()
    except (psutil.Error, OSError):
        return None


INIT_CREATE = _init_create_time()
REQUEST = {"id": "req-1", "rank_filter": "0-9", "start_step": 2000, "active_steps": 1, "warmup_steps": 0}
REQUEST_MTIME = NOW - 30.0


def _rank(reg: Path, replica: str, rank: int, age: float = 1.0, **fields) -> RankRecord:
    values = {
        "replica": replica, "role": "policy", "rank": rank, "local_rank": rank % 8, "world_size": 14,
        "host": f"node-{rank // 4}", "pid": 5000 + rank, "started_at": NOW - 3600.0, "heartbeat_at": NOW - age,
        "step": 1990 + rank, "watch": "poll", "version": "golden", "signal": "SIGUSR1",
    }
    values.update(fields)
    record = RankRecord(**values)
    write_record(reg, record)
    then = values["heartbeat_at"]
    os.utime(record_path(reg, replica, rank), (then, then))  # its age on the registry's clock (sidecar.common.clock)
    return record


def build_registry(reg: Path) -> None:
    saved = "/t/r1_0/0_trace.json.gz"
    # r1: every phase of `profile status` against the control file's request req-1 (ranks 0-9).
    _rank(reg, "r1", 0, request_id="req-1", selected=True, capture_start_step=2000, trace_path=saved,
          history=[{"state": "idle", "request_id": "req-1", "saved": saved, "step": 2000}],
          conflict={"pid": 777, "host": "node-x", "job": "pid:node-x:777", "seen_at": NOW - 5.0})
    _rank(reg, "r1", 1, request_id="req-1", selected=True, state="tracing", capture_start_step=2003,
          misaligned=True, signal="SIGRTMIN+3")  # SIGUSR1 is the job's (a cosmos-rl worker)
    _rank(reg, "r1", 2, request_id="req-1", selected=True, state="armed", capture_start_step=2000,
          request={"start_step": 2000}, signal=None)  # the job took its signal, or it is off
    _rank(reg, "r1", 3, mtime_heartbeat=True, heartbeat_at=NOW - 400.0)  # alive by its file's mtime: pending
    os.utime(record_path(reg, "r1", 3), (NOW - 2.0, NOW - 2.0))
    _rank(reg, "r1", 4, request_id="req-1", selected=False)
    _rank(reg, "r1", 5, request_id="cli-old", refused="request req-1 refused: the rank is busy with cli-old")
    _rank(reg, "r1", 6, request_id="req-1", selected=True, state="error",
          error="capture failed at step 2001: out of disk")
    _rank(reg, "r1", 7, age=600.0, state="armed", request_id="req-1", selected=True)  # dead before saving
    _rank(reg, "r1", 8, host=HOST, pid=1, create_time=INIT_CREATE, start_since_boot=start_since_boot(1),
          request_id="req-1", selected=True,
          cancelled=True, cancel={"id": "c-9", "request_id": "req-1", "outcome": "disarmed", "step": 1999,
                                  "at": NOW - 20.0})
    _rank(reg, "r1", 9, host=HOST, pid=1, create_time=INIT_CREATE - 1000.0,  # a reused pid: process gone
          start_since_boot=(start_since_boot(1) or 0.0) + 1000.0)
    _rank(reg, "r1", 10, exited_at=NOW - 50.0, request_id="sig-1", state="idle",
          history=[{"state": "idle", "request_id": "sig-1", "saved": "/t/r1_10/0_trace.json.gz"}])
    (record_path(reg, "r1", 11)).write_text("{not json")  # a bad record
    # rank 12: no record at all
    _rank(reg, "r1", 13, age=8.0, heartbeat_interval=2.0, stall_after_s=5.0, started_at=NOW - 10.0,
          state="idle")  # frozen: stalled; started after the request, so its own (none)
    write_request(reg, "r1", REQUEST)
    os.utime(control_path(reg, "r1"), ns=(int(REQUEST_MTIME * 1e9), int(REQUEST_MTIME * 1e9)))
    # r2: a healthy rollout replica on five hosts, no control file.
    for k in range(5):
        _rank(reg, "r2", k, role="rollout", world_size=5, host=f"gpu-{k:02d}", age=3.0 + k, step=40)
    # r3: down (every heartbeat stale), one rank profiling when it went.
    for k in range(2):
        _rank(reg, "r3", k, world_size=2, age=7200.0 + k, state="tracing" if k else "idle", step=7)
    # r4: only a control file (a touch) and one bad record.
    (record_path(reg, "r4", 0)).parent.mkdir(parents=True, exist_ok=True)
    (record_path(reg, "r4", 0)).write_text('{"replica": "r4"}')
    control_path(reg, "r4").touch()
    os.utime(control_path(reg, "r4"), ns=(int(REQUEST_MTIME * 1e9), int(REQUEST_MTIME * 1e9)))


COMMANDS = {
    "ls": ["replica", "ls"],
    "lsr_r1": ["replica", "lsr", "r1"],
    "status_r1": ["profile", "status", "r1"],
    "status_r2": ["profile", "status", "r2"],
    "status_r4": ["profile", "status", "r4"],
}


@pytest.fixture
def frozen(monkeypatch):
    if INIT_CREATE is None:
        pytest.skip("pid 1 cannot be inspected here (hidepid?): the same-host ranks need a live pid to point at")
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(clock, "fs_now", lambda directory: NOW)  # the registry filesystem's clock, frozen too
    monkeypatch.setattr(replicas, "host_name", lambda: HOST)


@pytest.fixture
def fixed_length_registry(tmp_path):
    """tmp_path/reg, named through /tmp/cpl-XXXXXXXX/reg (a link: the CLI's abspath keeps it)."""
    real = tmp_path / "reg"
    real.mkdir()
    try:
        link_dir = Path(tempfile.mkdtemp(prefix="cpl-", dir="/tmp"))
    except OSError as exc:
        pytest.skip(f"/tmp is not writable here ({exc.strerror}): the pinned widths need a path of fixed length")
    assert len(str(link_dir)) == len("/tmp/cpl-XXXXXXXX"), link_dir
    (link_dir / "reg").symlink_to(real)
    yield link_dir / "reg"
    (link_dir / "reg").unlink()
    link_dir.rmdir()


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_listing_output_is_pinned(fixed_length_registry, frozen, command, as_json):
    reg = fixed_length_registry
    build_registry(reg)
    result = run(*COMMANDS[command], "--registry", str(reg), *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    got = {"stdout": result.stdout.replace(str(reg), "<REG>"), "stderr": result.stderr.replace(str(reg), "<REG>")}
    if as_json:
        json.loads(result.stdout)
    path = GOLDEN / f"{command}.{'json' if as_json else 'txt'}"
    if os.environ.get("COSMOS_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got["stdout"] + ("" if not got["stderr"] else "--- stderr ---\n" + got["stderr"]))
    expected = path.read_text()
    out, _, err = expected.partition("--- stderr ---\n")
    assert got["stdout"] == out
    assert got["stderr"] == err
