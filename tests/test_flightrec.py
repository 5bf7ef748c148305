"""The flight recorder: its environment names follow the running torch (`sidecar.rank.fr_env`), `sidecar.run`
sets a default buffer size before the script runs, and `sidecar.rank.flightrec.dump` reads it in-process."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest

from sidecar.rank import fr_env
from support.launch import PYTHON, ROOT, base_env, free_port

SHOW_ENV = "import os; print('FR', os.environ.get('TORCH_FR_BUFFER_SIZE'), os.environ.get('TORCH_NCCL_TRACE_BUFFER_SIZE'))"


@pytest.mark.parametrize(("version", "name"), [
    ((2, 13), "TORCH_FR_BUFFER_SIZE"), ((2, 8), "TORCH_FR_BUFFER_SIZE"), ((2, 7), "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ((2, 4), "TORCH_NCCL_TRACE_BUFFER_SIZE"), ((3, 0), "TORCH_FR_BUFFER_SIZE"),
])
def test_the_buffer_size_name_follows_the_torch_version(version, name):
    assert fr_env.buffer_env_name(version) == name


def test_the_running_torch_reads_the_name_we_set():
    assert fr_env.parse_version("2.13.0+cu128") == (2, 13) and fr_env.parse_version("nightly") is None
    import torch.distributed.distributed_c10d as c10d

    name = fr_env.buffer_env_name()
    assert fr_env.torch_version() == fr_env.parse_version(__import__("torch").__version__)
    # what this torch build references: its process-group code reads the name first
    assert f'"{name}"' in Path(c10d.__file__).read_text()


def test_ensure_default_sets_it_keeps_the_users_and_is_too_late_after_the_process_group(monkeypatch, caplog):
    env: dict[str, str] = {}
    assert fr_env.ensure_default(env, (2, 13)) == "set" and env == {"TORCH_FR_BUFFER_SIZE": "2000"}
    env = {}
    assert fr_env.ensure_default(env, (2, 6)) == "set" and env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    for user in ({"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}):
        env = dict(user)
        assert fr_env.ensure_default(env, (2, 13)) == "user" and env == user
    monkeypatch.setattr(fr_env, "process_group_exists", lambda: True)
    monkeypatch.setattr(fr_env, "_logged_too_late", False)
    env = {}
    with caplog.at_level(logging.INFO, logger="sidecar"):
        assert fr_env.ensure_default(env, (2, 13)) == "too late"
        assert fr_env.ensure_default(env, (2, 13)) == "too late"
    assert env == {}
    too_late = [r.getMessage() for r in caplog.records if "too late" in r.getMessage() or "cannot set" in r.getMessage()]
    assert len(too_late) == 1 and "TORCH_FR_BUFFER_SIZE" in too_late[0], too_late


@pytest.mark.parametrize(("user", "shown"), [
    ({}, "FR 2000 None"),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, "FR None 50"),
    ({"TORCH_FR_BUFFER_SIZE": "0"}, "FR 0 None"),
])
def test_sidecar_run_sets_a_default_before_the_script_runs(tmp_path, registry, user, shown):
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV + "\n")
    done = subprocess.run([PYTHON, "-m", "sidecar.run", "--replica", "env", "--output", str(tmp_path / "out"),
                           str(script)], capture_output=True, text=True, timeout=120,
                          env=base_env(registry, **user), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert shown in done.stdout.splitlines(), done.stdout


DUMP_SCRIPT = """
import json, sys, threading, time
import torch, torch.distributed as dist
from sidecar.rank import flightrec
out = sys.argv[1]
print("BEFORE", json.dumps(flightrec.dump(out + "/before.json", {"rank": 0})))
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s", rank=0, world_size=1)
t = torch.ones(3)
for _ in range(3):
    dist.all_reduce(t)
# gloo retires an entry on its own thread, a moment after all_reduce returns
status = lambda: json.loads(torch._C._distributed_c10d._dump_fr_trace_json())["pg_status"]["0"]
deadline = time.monotonic() + 90  # the state it needs, however loaded the machine: never a count of tries
while status()["last_completed_collective"] != "3":
    if time.monotonic() > deadline:
        sys.exit("gloo never retired the third all_reduce: " + json.dumps(status()))
    time.sleep(0.01)
result = []
side = threading.Thread(target=lambda: result.append(flightrec.dump(out + "/after.json", {"rank": 0, "step": 3})))
side.start(); side.join()
print("AFTER", json.dumps(result[0]))
dist.destroy_process_group()
"""


def test_dump_reads_the_flight_recorder_in_process_from_a_side_thread(tmp_path):
    done = subprocess.run([PYTHON, "-c", DUMP_SCRIPT % free_port(), str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=base_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("BEFORE", "AFTER")))
    assert json.loads(lines["BEFORE"]) == [False, "no process group: torch.distributed is not initialized in this process"]
    before = json.loads((tmp_path / "before.json").read_text())
    assert before["available"] is False and before["reason"].startswith("no process group")
    assert json.loads(lines["AFTER"]) == [True, ""]
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["available"] is True and after["cosmos_profiler"]["step"] == 3
    assert after["cosmos_profiler"]["torch"].startswith("2.")
    cpu = after["recorders"]["cpu"]
    assert cpu["pg_status"]["0"]["last_enqueued_collective"] == cpu["pg_status"]["0"]["last_completed_collective"] == "3"
    assert [e["profiling_name"] for e in cpu["entries"]] == ["gloo:all_reduce"] * 3


def test_dump_never_raises(tmp_path):
    from sidecar.rank import flightrec

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ok, reason = flightrec.dump(blocker / "fr.json")
    assert ok is False and reason.startswith(f"writing the flight recorder dump {blocker / 'fr.json'} failed: ")
