"""A Cosmos-RL job's own Redis as the registry (issue 30): a worker of the real cosmos-rl 0.4.7, with no
registry configured, registers in the Redis its config names (`Config.redis`, the port its controller's
Redis listens on; the controller's host from its APIClient), and the CLI finds that Redis through
`-ch/-cp` (GET /api/meta serving the real Config as cosmos-rl's controller serves it).

Uses the venv `bin/cosmos-rl-venv` builds (skipped, saying why, without it), read-only: this checkout's
`sidecar` reaches it through a directory on PYTHONPATH that holds only a link to it, so the real
cosmos_rl stays the one imported (the checkout's root would put the stand-in first)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.controller import cosmos_status
from support.launch import ROOT, base_env
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

VENV = Path(os.environ.get("COSMOS_RL_VENV", ROOT / ".cache" / "cosmos-rl-0.4.7"))
STAMP = VENV / ".cosmos-rl-0.4.7-ready"
WORKER = ROOT / "tests" / "programs" / "cosmos_worker.py"

pytestmark = pytest.mark.timeout(600)

CONFIG_DUMP = """
import json, sys, toml
from cosmos_rl.policy.config import Config
print(json.dumps(Config.from_dict(toml.load(sys.argv[1])).model_dump(mode="json")))
"""


@pytest.fixture
def cosmos_python() -> Path:
    if not STAMP.exists():
        pytest.skip(f"no venv with cosmos-rl 0.4.7 at {VENV} (bin/cosmos-rl-venv builds it)")
    return VENV / "bin" / "python"


def test_a_cosmos_rl_worker_uses_its_jobs_redis_and_the_cli_finds_it(cosmos_python, spawn, tmp_path, controller,
                                                                      redis_server):
    redis_server.start()
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    (path_dir / "sidecar").symlink_to(ROOT / "sidecar")
    job = tmp_path / "job.toml"
    job.write_text(f"redis = '{redis_server.port}'\n[train]\noutput_dir = '{tmp_path / 'outputs'}'\n"
                   "[profiler]\nenable_profiler = true\n"
                   "[profiler.sub_profiler_config]\nactive_steps = 2\nrank_filter = [0]\n"
                   "[policy.parallelism]\ntp_size = 1\ndp_shard_size = 1\n")
    env = base_env(None, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", PYTHONPATH=str(path_dir),
                   COSMOS_PROFILER_NODE_DIR=str(tmp_path / "node"))
    dumped = subprocess.run([str(cosmos_python), "-c", CONFIG_DUMP, str(job)], capture_output=True, text=True,
                            timeout=300, env=env, cwd=tmp_path)
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    config = json.loads(dumped.stdout.strip().splitlines()[-1])  # cosmos_rl prints as it imports
    assert config["redis"] == str(redis_server.port)  # the real Config keeps the port, as its controller sets it
    controller.json("/api/meta", {"config": config})

    worker = spawn("worker", ["--config", str(job), "--mode", "sft", "--controller", f"127.0.0.1:{controller.port}",
                              "--step-time", "0.02"], env,
                   program=[str(cosmos_python), "-m", "sidecar.run", str(WORKER)], cwd=tmp_path)
    worker.wait_ready(timeout=180)
    out = worker.stdout()
    assert "PROFILER sidecar.cosmos.CosmosProfiler" in out, out
    replica = out.split("READY ")[1].split()[1]
    controller.json("/api/status", cosmos_status([replica], [], ranks=1))

    cli = base_env(None)
    source = ["-ch", "127.0.0.1", "-cp", str(controller.port)]

    def listed():
        done = subprocess.run([str(cosmos_python), "-m", "sidecar", "replica", "lsr", replica, *source, "--json"],
                              capture_output=True, text=True, timeout=120, env={**cli, "PYTHONPATH": str(path_dir)})
        assert "Traceback" not in done.stderr, done.stderr
        answer = json.loads(done.stdout) if done.returncode == 0 else {}
        return answer if [r["rank"] for r in answer.get("ranks", []) if r["alive"]] == [0] else None

    answer = wait_for(listed, 120, interval=0.5, what=f"{replica} rank 0 listed through the job's Redis")
    assert answer["registry"] == f"redis://127.0.0.1:{redis_server.port}/0", answer
    assert "the job's Redis" in answer["registry_from"], answer
    done = subprocess.run([str(cosmos_python), "-m", "sidecar", "profile", "set", replica, *source, "--wait",
                           "--timeout", "120", "--json"], capture_output=True, text=True, timeout=180,
                          env={**cli, "PYTHONPATH": str(path_dir)})
    assert done.returncode == 0, done.stdout + done.stderr
    (rank,) = json.loads(done.stdout)["ranks"]
    assert profiler_steps(load_trace(Path(rank["trace_path"]))), rank
    assert any(k.startswith(b"cosmos-profiler:file:replicas/") for k in redis_server.client().keys("*"))
    assert not (tmp_path / "outputs" / "profile_control").exists()  # no file registry beside the outputs
    assert worker.stop(timeout=120) == 0
