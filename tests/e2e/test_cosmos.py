"""The Cosmos-RL drop-in: CosmosProfiler behaves as Cosmos-RL's and also listens to the control file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sidecar.common.layout import control_path, record_path
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env, free_port
from support.records import wait_record, wait_saved_and_idle
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
    # The static capture saved and the rank idle again: a touch while it is still saving is refused.
    wait_saved_and_idle(registry, 1, "pol-0")
    # cosmos-rl's profiler.start() begins at once: wait at step 0, warmup 1, active 2-3.
    assert profiler_steps(load_trace(trace_dir / "0_trace.json.gz")) == [2, 3]

    control_path(registry, "pol-0").touch()
    rec = wait_for(lambda: (r := read_json(record_path(registry, "pol-0", 0))) and r["num_captures"] == 2 and r)
    assert rec["trace_path"] == str(trace_dir / "1_trace.json.gz")
    assert proc.stop() == 0  # the saver is joined: every report has been made
    # Only the worker's own capture is reported as its own; the touch's is not the controller's to see.
    posts = controller.posted("/api/set_trace_path")
    assert posts == [{"replica_name": "pol-0", "trace_path": str(trace_dir), "global_rank": 0}]
    assert "profiled_times=2" in proc.stdout()
    err = proc.stderr()
    assert "[Profiler] init profiler for rank 0" in err
    assert "[Profiler] start to trace for rank: 0" in err
    assert f"[Profiler] save trace for rank: 0 to file: {trace_dir / '0_trace.json.gz'} after 4 steps." in err
    assert err.count("[Profiler] stop trace for rank: 0") == 1  # the worker's own capture


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


WORKER_TYPES = ROOT / "tests" / "programs" / "cosmos_worker_types.py"


def _cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True, timeout=120,
                          env=env or base_env(), cwd=cwd)


def test_controller_request_waits_for_a_running_capture(spawn, tmp_path):
    # 0.4.7's controller asks (start_dynamic) while a control-file capture runs. Before: refused with a
    # warning at every step, then check_finished() said True for the other capture, so the controller
    # took its request as done (and was told the other capture's directory).
    cfg = _config(tmp_path, rank_filter=(5,))
    registry = tmp_path / "outputs" / "profile_control"
    asks = tmp_path / "controller-asks"
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-q", "--mode", "rl", "--dynamic-file", str(asks),
                       "--step-time", "0.02"], base_env(RANK="0", WORLD_SIZE="1"), program=WORKER)
    proc.wait_ready()
    wait_for(lambda: read_json(record_path(registry, "pol-q", 0)), what="record")
    control_path(registry, "pol-q").write_text('{"id": "long", "rank_filter": "0", "active_steps": 1000, '
                                               '"wait_steps": 0, "warmup_steps": 0}')
    wait_record(registry, lambda r: r["state"] == "tracing" and r["request_id"] == "long", "pol-q",
                what="the control file's capture to trace")
    asks.touch()  # the controller asks now, while that capture runs
    wait_for(lambda: "this profile request waits for request long" in proc.stderr(), what="the controller's request to wait")
    control_path(registry, "pol-q").write_text('{"kind": "cancel"}')  # the long capture ends: the controller's runs
    rec = wait_saved_and_idle(registry, 2, "pol-q")
    assert proc.stop() == 0
    trace_dir = tmp_path / "outputs" / "profile_trace" / "pol-q_0"
    long_steps = profiler_steps(load_trace(trace_dir / "0_trace.json.gz"))
    own_steps = profiler_steps(load_trace(trace_dir / "1_trace.json.gz"))
    out, err = proc.stdout(), proc.stderr()
    asked_at = int(out.split("DYNAMIC at step ")[1].split()[0])
    assert long_steps[0] <= asked_at <= long_steps[-1], (asked_at, long_steps)  # asked while it traced
    assert len(own_steps) == 2 and own_steps[0] > long_steps[-1], own_steps  # the command's active 2, after it
    assert rec["trace_path"] == str(trace_dir / "1_trace.json.gz")
    assert out.count("FINISHED") == 1, out  # once, for the controller's own capture
    finished_at = int(out.split("FINISHED at step ")[1].split()[0])
    assert finished_at >= own_steps[-1], (finished_at, own_steps)
    assert err.count("this profile request waits for request long") == 1, err


@pytest.fixture
def types_env(tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    return base_env(RANK="0", WORLD_SIZE="1", XDG_RUNTIME_DIR=str(xdg))


def test_multi_replica_sft_worker_is_counted_at_its_optimizer(spawn, tmp_path, types_env):
    # 0.4.7's MultiReplicaSFTPolicyWorker calls start() but never step(): its capture never ended.
    cfg = _config(tmp_path, active=2)
    registry = tmp_path / "outputs" / "profile_control"
    proc = spawn("m", ["--config", str(cfg), "--replica", "sft-m", "--kind", "multi_sft"], types_env,
                 program=WORKER_TYPES)
    proc.wait_ready()
    rec = wait_for(lambda: (r := read_json(record_path(registry, "sft-m", 0))) and r["num_captures"] == 1 and r,
                   what="start()'s capture, counted at optimizer.step()")
    assert rec["counts_steps_by"] == "optimizer" and rec["cannot_trace"] is None and rec["role"] == "policy"
    trace_dir = tmp_path / "outputs" / "profile_trace" / "sft-m_0"
    assert profiler_steps(load_trace(trace_dir / "0_trace.json.gz")) == [2, 3]
    wait_for(lambda: "FINISHED" in proc.stdout(), what="check_finished() in the train ack")
    done = _cli("profile", "set", "sft-m", "--config", str(cfg), "--wait", "--timeout", "60", cwd=tmp_path,
                env=types_env)
    assert done.returncode == 0, done.stderr
    assert str(trace_dir / "1_trace.json.gz") in done.stdout
    assert len(profiler_steps(load_trace(trace_dir / "1_trace.json.gz"))) == 2
    assert proc.stop() == 0


def test_teacher_worker_cannot_be_traced_and_says_why(spawn, tmp_path, types_env):
    # 0.4.7's TeacherWorker builds a profiler, calls nothing on it and steps no optimizer: a request
    # used to stay armed forever, under role "policy".
    cfg = _config(tmp_path)
    registry = tmp_path / "outputs" / "profile_control"
    proc = spawn("t", ["--config", str(cfg), "--replica", "teacher-0", "--kind", "teacher"], types_env,
                 program=WORKER_TYPES)
    proc.wait_ready()
    rec = wait_for(lambda: read_json(record_path(registry, "teacher-0", 0)), what="record")
    assert rec["role"] == "reference" and rec["counts_steps_by"] == "none"
    assert "TeacherWorker" in rec["cannot_trace"]
    done = _cli("profile", "set", "teacher-0", "--config", str(cfg), cwd=tmp_path, env=types_env)
    assert done.returncode == 1 and "replica teacher-0 cannot be traced" in done.stderr, done.stderr
    assert "TeacherWorker (role REFERENCE) calls no profiler method" in done.stderr
    assert not (registry / "control" / "teacher-0.json").exists()  # nothing was written
    control_path(registry, "teacher-0").touch()  # another way in: refused on the rank, never armed
    rec = wait_for(lambda: (r := read_json(record_path(registry, "teacher-0", 0))) and r["refused"] and r)
    assert rec["state"] == "idle" and "TeacherWorker" in rec["refused"] and rec["num_refused"] == 1
    assert proc.stop() == 0


def test_relative_output_dir_from_another_directory(spawn, tmp_path, types_env):
    # cosmos-rl's default output_dir is ./outputs, relative to the launch directory; the CLI resolved
    # it against its own directory and said "not found".
    launch, elsewhere = tmp_path / "launch", tmp_path / "elsewhere"
    launch.mkdir()
    elsewhere.mkdir()
    cfg = tmp_path / "train.toml"
    cfg.write_text("[train]\noutput_dir = './outputs'\n[profiler]\nenable_profiler = true\n"
                   "[profiler.sub_profiler_config]\nactive_steps = 2\nwith_stack = true\n")
    proc = spawn("w", ["--config", str(cfg), "--replica", "rel-0", "--step-time", "0.02"], types_env,
                 program=WORKER, cwd=launch)
    proc.wait_ready()
    registry = launch / "outputs" / "profile_control"
    # The worker's launch-time capture (its start(), rank 0 by default) saved and the rank idle: until
    # then `profile set` rightly says the replica is busy.
    wait_saved_and_idle(registry, 1, "rel-0")
    done = _cli("profile", "set", "rel-0", "--config", str(cfg), cwd=elsewhere, env=types_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Requested a profile of replica rel-0 through its control file."
    # What the capture records, before it starts: the rank's [profiler.sub_profiler_config] where no flag was given.
    assert lines[2] == ("It records: wait_steps=1 warmup_steps=1 active_steps=2 record_shape=false "
                        "profile_memory=false with_stack=true with_modules=false (wait_steps, warmup_steps, "
                        "active_steps, record_shape, profile_memory, with_stack, with_modules from the rank's "
                        "[profiler.sub_profiler_config]; cosmos-cli would send active_steps=1 and false for flags "
                        "not given).")
    assert (registry / "control" / "rel-0.json").exists()
    # Without the pointer (another user's default registry): say what was relative and what to do.
    other = tmp_path / "other-xdg"
    other.mkdir(mode=0o700)
    lost = _cli("profile", "set", "rel-0", "--config", str(cfg), cwd=elsewhere,
                env={**types_env, "XDG_RUNTIME_DIR": str(other)})
    assert lost.returncode == 1, lost.stdout
    assert f"[train] output_dir in {cfg} = './outputs' is relative" in lost.stderr, lost.stderr
    assert f"resolved against this directory ({elsewhere})" in lost.stderr
    assert "Run the command from the job's launch directory, or pass --registry" in lost.stderr
    assert proc.stop() == 0
