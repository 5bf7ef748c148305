"""Stacks, hang and the slowdown watch through a redis:// registry, in real 2-rank torchrun jobs (gloo)
on one node: the ranks' requests (the slowdown watch's) go to the store like the CLI's, and every node's
agent takes them from there. The file-registry versions: test_hang_jobs.py, test_slowdown_jobs.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support.launch import PYTHON, base_env, torchrun_cmd
from support.traces import load_trace, profiler_steps
from support.wait import wait_for


def _env(tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    # No disk floor for the slowdown watch: its captures do not depend on how full the test machine's disk is.
    return base_env(None, COSMOS_PROFILER_DIR=url, COSMOS_PROFILER_NODE_DIR=str(tmp_path / "node"),
                    COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1",
                    COSMOS_PROFILER_SLOWDOWN_MIN_FREE_PCT="0", **extra)


def _cli(url: str, *args: str, timeout: float = 170) -> subprocess.CompletedProcess:
    done = subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True, timeout=timeout,
                          env=base_env(None, COSMOS_PROFILER_DIR=url))
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _lsr(url: str, name: str) -> dict:
    done = _cli(url, "replica", "lsr", name, "--json")
    return {r["rank"]: r for r in json.loads(done.stdout)["ranks"]} if done.returncode == 0 else {}


def test_profile_hang_and_stacks_through_redis(spawn, tmp_path, redis_server):
    redis_server.start()
    url = redis_server.url
    proc = spawn("rhang", ["--hang-at", "20", "--hang-rank", "1"], _env(tmp_path, url, TORCH_FR_BUFFER_SIZE="0"),
                 program=torchrun_cmd(2, "rhang"))
    wait_for(lambda: "HANGING" in proc.stdout(), timeout=120, what="rank 1 to wander off")
    wait_for(lambda: (ranks := _lsr(url, "rhang")) and set(ranks) == {0, 1}
             and all(r["step"] == 20 and r["alive"] for r in ranks.values()), timeout=90, interval=0.5,
             what="both ranks at step 20, listed through Redis")

    def settled():
        done = _cli(url, "profile", "hang", "rhang", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        return answer if answer["suspects"] == [1] else None

    answer = wait_for(settled, timeout=90, interval=0.5, what="rank 1 named the suspect through Redis")
    ranks = {r["rank"]: r for r in answer["ranks"]}
    assert "in wandered_off" in ranks[1]["main_stack"][-1]
    assert any("all_reduce" in f for f in ranks[0]["main_stack"])
    stacks = _cli(url, "profile", "stacks", "rhang", "--json")
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    assert "wandered_off" in stacks.stdout
    proc.kill()


def test_slowdown_watch_through_redis(spawn, tmp_path, redis_server):
    """A watch armed through Redis fires on a slowed job; the firing rank's request reaches both ranks
    through the store: one aligned capture of the same steps on each."""
    redis_server.start()
    url = redis_server.url
    slow_file = tmp_path / "slow"
    proc = spawn("rslow", ["--step-sleep", "0.02", "--slow-file", str(slow_file)], _env(tmp_path, url),
                 program=torchrun_cmd(2, "rslow"))
    wait_for(lambda: set(_lsr(url, "rslow")) == {0, 1}, timeout=120, interval=0.5, what="both ranks listed")
    cli = subprocess.Popen([PYTHON, "-m", "sidecar", "profile", "set", "rslow", "-rf", "all", "--on-slowdown", "2.5",
                            "-as", "2", "--wait", "--timeout", "150"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=base_env(None, COSMOS_PROFILER_DIR=url))
    try:
        # The baseline saved on both ranks (or more: on a loaded machine the watch may fire on its own
        # before the slow file does; the capture it asks for is the one checked below either way).
        wait_for(lambda: (ranks := _lsr(url, "rslow")) and all(r["num_captures"] >= 1 for r in ranks.values()),
                 timeout=120, interval=0.5, what="the baseline capture on both ranks")
        tmp = slow_file.with_suffix(".tmp")
        tmp.write_text("1 0 0.08 busy")
        tmp.replace(slow_file)
        out, err = cli.communicate(timeout=170)
    finally:
        cli.kill()
    assert cli.returncode == 0, out + err
    assert "Slowdown: capture" in out, out
    ranks = _lsr(url, "rslow")
    ids = {r["request_id"] for r in ranks.values()}
    assert len(ids) == 1 and ids.pop().endswith(".slow-1"), ranks
    steps = [profiler_steps(load_trace(Path(r["trace_path"]))) for r in ranks.values()]
    assert steps[0] == steps[1] and len(steps[0]) == 2, steps
    proc.kill()


def test_slowdown_claim_is_one_for_all_nodes(spawn, tmp_path, redis_server):
    """The watch's claim is taken in Redis too: where a rank of another node holds the claim of
    capture 1 already, this node's rank that fires sends no request of its own (it waits for that
    rank's), where before it only saw its own node's claims."""
    redis_server.start()
    url = redis_server.url
    slow_file = tmp_path / "slow"
    proc = spawn("rclaim", ["--step-sleep", "0.02", "--slow-file", str(slow_file)], _env(tmp_path, url),
                 program=torchrun_cmd(1, "rclaim"))
    wait_for(lambda: set(_lsr(url, "rclaim")) == {0}, timeout=120, interval=0.5, what="the rank listed")
    armed = _cli(url, "profile", "set", "rclaim", "--on-slowdown", "2.5", "--no-baseline", "--consecutive", "2")
    assert armed.returncode == 0, armed.stdout + armed.stderr
    def watching():
        done = _cli(url, "profile", "status", "rclaim", "--json")
        watches = json.loads(done.stdout).get("slowdown", []) if done.returncode == 0 else []
        # (its median: not awaited; a node record is not rewritten for the watch's moving numbers alone)
        return watches[0] if watches and watches[0]["state"] == "watching" else None

    watch = wait_for(watching, timeout=90, interval=0.5, what="the watch armed",
                     describe=lambda: _cli(url, "profile", "status", "rclaim", "--json").stdout[-3000:])
    client = redis_server.client()
    key = f"cosmos-profiler:claim:replicas/rclaim/slowdown-{watch['id']}-1.claim"
    assert client.set(key, "another node's rank 7", nx=True, ex=600)
    tmp = slow_file.with_suffix(".tmp")
    tmp.write_text("1 0 0.1")
    tmp.replace(slow_file)
    wait_for(lambda: "another rank asked for capture 1 first" in proc.stdout() + proc.stderr(), timeout=90,
             interval=0.2,
             what="the claim lost to the other node's rank")
    request = client.hget("cosmos-profiler:control:rclaim", "data")
    assert b".slow-1" not in (request or b""), request  # no request of its own
    assert client.get(key) == b"another node's rank 7"
    proc.kill()
