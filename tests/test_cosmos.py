"""The Cosmos-RL drop-in: CosmosProfiler behaves as Cosmos-RL's and also listens to the control file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sidecar.registry import control_path, record_path
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env, free_port
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

WORKER = ROOT / "tests" / "programs" / "cosmos_worker.py"


def _config(tmp_path: Path, enable: bool = True, active: int = 1, rank_filter=(0,)) -> Path:
    """A cosmos-rl TOML: no train.timestamp, so cosmos-rl appends one and traces land under outputs/."""
    path = tmp_path / "cosmos.toml"
    path.write_text(
        f"[train]\noutput_dir = '{tmp_path / 'outputs'}'\nepoch = 1\n"
        f"[profiler]\nenable_profiler = {str(enable).lower()}\n"
        f"[profiler.sub_profiler_config]\nactive_steps = {active}\nrank_filter = {list(rank_filter)}\n"
    )
    return path


def test_sft_start_then_control_file_then_controller_report(spawn, tmp_path, controller):
    cfg = _config(tmp_path, active=2)
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-0", "--controller", f"127.0.0.1:{controller.port}"],
                 base_env(RANK="0", WORLD_SIZE="1"), program=WORKER)
    proc.wait_ready()
    assert "PROFILER sidecar.cosmos.CosmosProfiler" in proc.stdout()
    registry = tmp_path / "outputs" / "profile_control"  # <output root>/profile_control
    trace_dir = tmp_path / "outputs" / "profile_trace" / "pol-0_0"
    wait_for(lambda: (trace_dir / "0_trace.json.gz").exists(), what="static capture")
    # cosmos-rl's profiler.start() begins at once: wait at step 0, warmup 1, active 2-3.
    assert profiler_steps(load_trace(trace_dir / "0_trace.json.gz")) == [2, 3]

    control_path(registry, "pol-0").touch()
    rec = wait_for(lambda: (r := read_json(record_path(registry, "pol-0", 0))) and r["num_captures"] == 2 and r)
    assert rec["trace_path"] == str(trace_dir / "1_trace.json.gz")
    posts = wait_for(lambda: len(p := controller.posted("/api/set_trace_path")) == 2 and p, what="two trace-path reports")
    assert posts[0] == {"replica_name": "pol-0", "trace_path": str(trace_dir), "global_rank": 0}
    assert proc.stop() == 0
    assert "profiled_times=2" in proc.stdout()
    err = proc.stderr()
    assert "[Profiler] init profiler for rank 0" in err
    assert "[Profiler] start to trace for rank: 0" in err
    assert f"[Profiler] save trace for rank: 0 to file: {trace_dir / '0_trace.json.gz'} after 4 steps." in err
    assert err.count("[Profiler] stop trace for rank: 0") == 2


def test_rl_start_dynamic_and_check_finished(spawn, tmp_path):
    cfg = _config(tmp_path, rank_filter=(5,))  # the static config does not select rank 0
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-1", "--mode", "rl", "--dynamic-at", "10"],
                 base_env(RANK="0", WORLD_SIZE="1"), program=WORKER)
    proc.wait_ready()
    registry = tmp_path / "outputs" / "profile_control"
    rec = wait_for(lambda: (r := read_json(record_path(registry, "pol-1", 0))) and r.get("trace_path") and r)
    assert rec["capture_start_step"] == 10
    trace = load_trace(rec["trace_path"])
    assert profiler_steps(trace) == [12, 13]  # the config's wait 1 and warmup 1, the command's active 2
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"]), "record_shape was not applied"
    wait_for(lambda: "FINISHED" in proc.stdout(), what="check_finished() to report the capture")
    assert proc.stop() == 0
    assert proc.stdout().count("FINISHED") == 1


def test_disabled_profiler_does_nothing_and_refuses_requests(spawn, tmp_path):
    cfg = _config(tmp_path, enable=False)
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-1"], base_env(), program=WORKER)
    proc.wait_ready()
    registry = tmp_path / "outputs" / "profile_control"
    wait_for(lambda: read_json(record_path(registry, "pol-1", 0)), what="record")
    control_path(registry, "pol-1").touch()
    rec = wait_for(lambda: (r := read_json(record_path(registry, "pol-1", 0))) and r.get("refused") and r)
    assert "enable_profiler = false" in rec["refused"]
    assert proc.stop() == 0
    assert not (tmp_path / "outputs" / "profile_trace").exists()


def test_no_api_client_and_a_dead_controller_never_reach_the_worker(spawn, tmp_path):
    # cosmos-rl 0.4.7 raises AttributeError into step() when api_client is None, and blocks
    # stop_and_save for ~50 minutes of retries when the controller is gone.
    cfg = _config(tmp_path, active=1)
    dead = f"127.0.0.1:{free_port()}"
    registry = tmp_path / "outputs" / "profile_control"
    for name, extra in (("none", []), ("dead", ["--controller", dead])):
        proc = spawn(name, ["--config", str(cfg), "--replica", f"pol-{name}", *extra], base_env(), program=WORKER)
        proc.wait_ready()
        wait_for(lambda n=name: (r := read_json(record_path(registry, f"pol-{n}", 0))) and r["num_captures"] == 1,
                 what="the static capture")
        step = read_json(record_path(registry, f"pol-{name}", 0))["step"]
        wait_for(lambda n=name, s=step: read_json(record_path(registry, f"pol-{n}", 0))["step"] > s + 5,
                 what="training to go on after the save")
        assert proc.stop() == 0, proc.stderr()
        if name == "dead":
            wait_for(lambda p=proc: "could not report the trace path" in p.stderr(), what="the report warning")


@pytest.mark.parametrize(("replica", "env", "why"), [
    ("bad/name", {"RANK": "0"}, "replica name 'bad/name' is not valid"),
    ("pol-2", {"RANK": "-3"}, "no usable global_rank"),
])
def test_unusable_identity_leaves_the_worker_training(spawn, tmp_path, replica, env, why):
    cfg = _config(tmp_path)
    proc = spawn("w", ["--config", str(cfg), "--replica", replica], base_env(**env), program=WORKER)
    proc.wait_ready()
    wait_for(lambda: "STEP 5" in proc.stdout(), what="training steps")
    assert proc.stop() == 0, proc.stderr()
    err = proc.stderr()
    assert err.count("[Profiler] the profiler sidecar is off") == 1 and why in err, err
    assert int(proc.stdout().split("DONE ")[1].split()[0]) > 0


def test_cli_config_finds_the_workers_registry(spawn, tmp_path):
    # The worker's config is the TOML; `--config` with the same TOML derives the same registry.
    cfg = _config(tmp_path, rank_filter=(7,))
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-3"], base_env(), program=WORKER)
    proc.wait_ready()
    wait_for(lambda: read_json(record_path(tmp_path / "outputs" / "profile_control", "pol-3", 0)), what="record")
    done = subprocess.run([PYTHON, "-m", "sidecar", "profile", "set", "pol-3", "--config", str(cfg), "--wait",
                           "--timeout", "60"], capture_output=True, text=True, timeout=90, env=base_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trace = tmp_path / "outputs" / "profile_trace" / "pol-3_0" / "0_trace.json.gz"
    assert str(trace) in done.stdout and profiler_steps(load_trace(trace))
    assert proc.stop() == 0
