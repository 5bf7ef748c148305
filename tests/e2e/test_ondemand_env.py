"""kineto's on-demand environment (sidecar.rank.ondemand_env), set up in real fresh interpreters: what it
sets, what it leaves alone, and that a process with no sidecar keeps its endpoint drained."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

from sidecar.rank import kinetoipc

ROOT = Path(__file__).resolve().parents[2]

PREPARE = """
import json, os, sys
from sidecar.rank import ondemand_env
p = ondemand_env.prepare()
keys = ("KINETO_USE_DAEMON", "KINETO_IPC_SOCKET_DIR", "KINETO_CONFIG", "KINETO_ONDEMAND_TRACE_DIR",
        "COSMOS_PROFILER_ONDEMAND_PID")
print(json.dumps({"prepared": p is not None, "why": ondemand_env.why_not(), "pid": os.getpid(),
                  "env": {k: os.environ.get(k) for k in keys},
                  "base": open(os.environ["KINETO_CONFIG"]).read() if p else None}))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETO_", "COSMOS_PROFILER_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _prepare(code: str = PREPARE, **extra: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(**extra))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_prepare_sets_a_private_endpoint_and_a_base_config_that_keeps_the_users(tmp_path):
    user = tmp_path / "user.conf"
    user.write_text("CUPTI_ACTIVITY_BUFFER_SIZE=4\nON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=5\n")
    out = _prepare(KINETO_CONFIG=str(user))
    assert out["prepared"] and out["why"] is None
    env = out["env"]
    directory = Path(env["KINETO_IPC_SOCKET_DIR"])
    assert env["KINETO_USE_DAEMON"] == "1" and env["KINETO_ONDEMAND_TRACE_DIR"] == str(directory)
    assert env["COSMOS_PROFILER_ONDEMAND_PID"] == str(out["pid"])
    assert directory.name.startswith(f"cpk{out['pid']}-") and stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert len(str(directory / ("dynoconfigclient" + "x" * 36))) < 108
    assert env["KINETO_CONFIG"] == str(directory / "libkineto.conf")
    assert out["base"] == "CUPTI_ACTIVITY_BUFFER_SIZE=4\nON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n"


def test_a_jobs_own_dynolog_the_opt_out_and_an_earlier_torch_are_left_alone():
    out = _prepare(KINETO_USE_DAEMON="1")
    assert not out["prepared"] and "a dynolog of its own" in out["why"] and out["env"]["KINETO_IPC_SOCKET_DIR"] is None
    out = _prepare(COSMOS_PROFILER_ONDEMAND="off")
    assert not out["prepared"] and out["why"] == "COSMOS_PROFILER_ONDEMAND=off turns the on-demand path off"
    assert out["env"]["KINETO_USE_DAEMON"] is None
    out = _prepare("import torch\n" + PREPARE)
    assert not out["prepared"] and out["why"] == "torch was imported before the sidecar could set kineto's environment"


def test_a_child_of_a_prepared_process_gets_an_endpoint_of_its_own():
    parent = _prepare()
    child = _prepare(**{k: v for k, v in parent["env"].items() if v is not None})
    assert child["prepared"]
    assert child["env"]["KINETO_IPC_SOCKET_DIR"] != parent["env"]["KINETO_IPC_SOCKET_DIR"]
    assert child["env"]["COSMOS_PROFILER_ONDEMAND_PID"] == str(child["pid"])
    assert child["base"] == parent["base"]


DRAINED = """
import os, socket, sys, time
from sidecar.rank import ondemand_env
p = ondemand_env.prepare()
print(os.path.join(p.directory, "dynolog"), flush=True)
sys.stdin.readline()
"""


def test_a_process_with_no_sidecar_keeps_its_endpoint_drained(tmp_path):
    # A unix datagram socket queues max_dgram_qlen (512 by default) datagrams; undrained, the sender blocks:
    # kineto's poll thread would then retry each poll for seconds, logging errors.
    proc = subprocess.Popen([sys.executable, "-c", DRAINED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=_env())
    try:
        endpoint = proc.stdout.readline().strip()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        client.settimeout(60)
        poll = kinetoipc.encode_poll(kinetoipc.Poll(kinetoipc.ACTIVITIES, 0, (proc.pid,)))
        for _ in range(3000):
            client.sendto(poll, endpoint)
        client.close()
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
