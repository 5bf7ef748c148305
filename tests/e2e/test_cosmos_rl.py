"""Living next to the real cosmos-rl 0.4.7, in a venv that `bin/cosmos-rl-venv` builds once per machine.

- Installing and uninstalling our wheel, in either order, leaves every file of cosmos-rl as its
  RECORD says, and cosmos-rl's `cosmos-cli` and `Config` keep working.
- A worker that drives cosmos-rl's real `CosmosProfiler` as its SFT/policy workers do becomes
  sidecar-driven with no code change (`python -m sidecar.run`, or COSMOS_PROFILER_SIDECAR=1).
- Our stand-in's public surface equals the real one's (golden, by `inspect`).

Skipped only where cosmos-rl cannot be installed (bin/test builds the venv first and records why
it could not). The subprocesses here never see the checkout on PYTHONPATH: they use the wheel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from sidecar.common.layout import control_path, record_path
from sidecar.common.signames import parse_signal
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env
from support.s3 import CREDENTIALS
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

COSMOS_RL_VERSION = "0.4.7"
VENV = Path(os.environ.get("COSMOS_RL_VENV", ROOT / ".cache" / f"cosmos-rl-{COSMOS_RL_VERSION}"))
STAMP = VENV / f".cosmos-rl-{COSMOS_RL_VERSION}-ready"
BUILD_ERROR = VENV.parent / f"cosmos-rl-{COSMOS_RL_VERSION}.error"
WORKER = ROOT / "tests" / "programs" / "cosmos_worker.py"
SURFACE = ROOT / "tests" / "programs" / "cosmos_surface.py"
DIST = "cosmos-profiler-sidecar"

pytestmark = pytest.mark.timeout(900)

RECORD_CHECK = r"""
import base64, hashlib, json, sys
from importlib.metadata import distribution
dist = distribution(sys.argv[1])
bad, checked = [], 0
for f in dist.files or []:
    if f.hash is None:
        continue
    checked += 1
    try:
        data = f.locate().read_bytes()
    except OSError as exc:
        bad.append(f"{f}: {exc.strerror}")
        continue
    digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
    if digest != f.hash.value:
        bad.append(f"{f}: content changed")
print(json.dumps({"checked": checked, "bad": bad}))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The test environment without the checkout on PYTHONPATH (it would shadow site-packages)."""
    env = base_env(**extra)
    env.pop("PYTHONPATH", None)
    return env


def run(cmd: list, timeout: float = 300, cwd: Path | None = None, env: dict | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or "/", env=env or clean_env())
    if check:
        assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def cosmos_python() -> Path:
    if not STAMP.exists():
        why = BUILD_ERROR.read_text()[-1500:] if BUILD_ERROR.exists() else "run bin/cosmos-rl-venv (bin/test does)"
        pytest.skip(f"no venv with cosmos-rl {COSMOS_RL_VERSION} at {VENV}: {why}")
    return VENV / "bin" / "python"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", out, ROOT],
        timeout=600, env=base_env())
    (path,) = out.glob("cosmos_profiler_sidecar-*.whl")
    return path


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return run([python, "-m", "pip", "--disable-pip-version-check", "-q", *args], timeout=600)


def uninstall_ours(python: Path) -> None:
    run([python, "-m", "pip", "--disable-pip-version-check", "-q", "uninstall", "-y", DIST], check=False)


def assert_cosmos_rl_intact(python: Path) -> None:
    result = json.loads(run([python, "-c", RECORD_CHECK, "cosmos-rl"]).stdout)
    assert result["checked"] > 500 and result["bad"] == [], result["bad"][:20]


def assert_cosmos_rl_works(python: Path) -> None:
    cli = run([python.parent / "cosmos-cli", "--help"], timeout=120)
    assert "cosmos-profiler" not in cli.stdout and "sidecar" not in cli.stdout, cli.stdout
    code = "import cosmos_rl; from cosmos_rl.policy.config import Config; print(cosmos_rl.__file__, Config.__module__)"
    out = run([python, "-c", code], timeout=120).stdout
    assert "cosmos_profiler_standin" not in out and "cosmos_rl.policy.config" in out, out


def test_installing_and_uninstalling_in_either_order_never_touches_cosmos_rl(cosmos_python, wheel, tmp_path):
    uninstall_ours(cosmos_python)
    assert_cosmos_rl_intact(cosmos_python)

    # cosmos-rl first, then ours
    pip(cosmos_python, "install", str(wheel))
    assert_cosmos_rl_intact(cosmos_python)
    assert_cosmos_rl_works(cosmos_python)
    ours = run([cosmos_python.parent / "cosmos-profiler", "replica", "ls", "--registry", tmp_path], timeout=60)
    assert "No replicas" in ours.stdout or ours.stdout.strip() == "", ours.stdout
    uninstall_ours(cosmos_python)
    assert_cosmos_rl_intact(cosmos_python)
    assert (cosmos_python.parent / "cosmos-cli").exists()

    # ours first (the stand-in serves `cosmos_rl`), then cosmos-rl
    pip(cosmos_python, "uninstall", "-y", "cosmos-rl")
    try:
        pip(cosmos_python, "install", str(wheel))
        where = run([cosmos_python, "-c", "import cosmos_rl.cli.cli as m; print(m.__file__)"]).stdout
        assert "cosmos_profiler_standin" in where, where
        verbatim = run([cosmos_python, "-m", "cosmos_rl.cli.cli", "replica", "ls", "--help"], timeout=60)
        assert "-cp, --controller-port" in verbatim.stdout
    finally:
        pip(cosmos_python, "install", "--no-deps", f"cosmos-rl=={COSMOS_RL_VERSION}")
    assert_cosmos_rl_intact(cosmos_python)
    assert_cosmos_rl_works(cosmos_python)
    uninstall_ours(cosmos_python)
    assert_cosmos_rl_intact(cosmos_python)
    assert_cosmos_rl_works(cosmos_python)


@pytest.fixture(scope="module")
def with_ours(cosmos_python, wheel):
    """Our wheel installed next to cosmos-rl for the module's remaining tests, removed after."""
    pip(cosmos_python, "install", "--force-reinstall", "--no-deps", str(wheel))
    pip(cosmos_python, "install", str(wheel))
    yield cosmos_python
    uninstall_ours(cosmos_python)
    assert_cosmos_rl_intact(cosmos_python)


def _toml(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f"[train]\noutput_dir = '{tmp_path / 'outputs'}'\n"
        "[profiler]\nenable_profiler = true\n"
        "[profiler.sub_profiler_config]\nactive_steps = 2\nrank_filter = [0]\n"
        "[policy.parallelism]\ntp_size = 1\ndp_shard_size = 1\n"
    )
    return path


@pytest.mark.parametrize(("launch", "mode"), [("sidecar.run", "sft"), ("env", "rl")])
def test_real_cosmos_profiler_is_sidecar_driven(with_ours, spawn, tmp_path, controller, launch, mode):
    python = with_ours
    config = _toml(tmp_path)
    args = ["--config", config, "--mode", mode, "--controller", f"127.0.0.1:{controller.port}", "--step-time", "0.02"]
    if mode == "rl":
        args += ["--dynamic-at", "3"]
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if launch == "env":
        env["COSMOS_PROFILER_SIDECAR"] = "1"
        program = [str(python), str(WORKER)]
    else:
        program = [str(python), "-m", "sidecar.run", str(WORKER)]
    proc = spawn("worker", [str(a) for a in args], env, program=program, cwd=tmp_path)
    proc.wait_ready(timeout=180)
    out = proc.stdout()
    assert "PROFILER sidecar.cosmos.CosmosProfiler" in out, out
    replica = out.split("READY ")[1].split()[1]
    # cosmos-rl's Config appended a timestamp; traces and the registry sit in the TOML's output_dir.
    assert f"OUTPUT_DIR {tmp_path / 'outputs'}/" in out
    registry = tmp_path / "outputs" / "profile_control"
    trace_dir = tmp_path / "outputs" / "profile_trace" / f"{replica}_0"
    record = record_path(registry, replica, 0)

    def saved(n: int):
        return (r := read_json(record)) and r["num_captures"] >= n and r["state"] == "idle" and r

    # 1. the worker's own call: start() (SFT) or start_dynamic() (RL), exactly as cosmos-rl makes it
    wait_for(lambda: saved(1), timeout=60, what="the worker's own capture")
    # 2. cosmos-profiler profile set --config <the same TOML> --wait
    cli = run([python.parent / "cosmos-profiler", "profile", "set", replica, "--config", config, "--wait",
               "--timeout", "120"], timeout=180, cwd=tmp_path)
    assert str(trace_dir / "1_trace.json.gz") in cli.stdout, cli.stdout
    # 3. touch of the control file
    control_path(registry, replica).touch()
    wait_for(lambda: saved(3), timeout=60, what="the touch capture")
    # 4. kill -s <the signal the rank publishes>: never SIGUSR1, cosmos-rl's checkpoint signal here
    rank_signal = read_json(record)["signal"]
    assert rank_signal == "SIGRTMIN+3", rank_signal
    lsr = run([python.parent / "cosmos-profiler", "replica", "lsr", replica, "--registry", registry, "--json"],
              timeout=60)
    assert json.loads(lsr.stdout)["ranks"][0]["signal"] == "SIGRTMIN+3", lsr.stdout
    os.kill(proc.pid, parse_signal(rank_signal))
    wait_for(lambda: saved(4), timeout=60, what="the signal capture")
    # 5. SIGUSR1 is the worker's (its real DistributedSignalHandler, built after the profiler as base.py
    # does): a checkpoint (RL) or the end of training (SFT), and no capture (the seed's handler was replaced).
    os.kill(proc.pid, signal.SIGUSR1)
    wait_for(lambda: "CHECKPOINT SIGNAL" in proc.stdout(), timeout=60, what="the worker's checkpoint signal")

    for n in range(4):
        steps = profiler_steps(load_trace(trace_dir / f"{n}_trace.json.gz"))
        assert steps and steps == list(range(steps[0], steps[0] + len(steps))), (n, steps)
    assert len(profiler_steps(load_trace(trace_dir / "0_trace.json.gz"))) == 2  # the config's active_steps
    assert proc.stop(timeout=120) == 0  # the saver is joined: every report has been made
    # Only the worker's own capture (start() or start_dynamic()) is reported through its api_client.
    posts = controller.posted("/api/set_trace_path")
    assert posts == [{"replica_name": replica, "trace_path": str(trace_dir), "global_rank": 0}]
    assert read_json(record)["num_signals"] == 1 and read_json(record)["num_captures"] == 4
    logs = proc.stdout() + proc.stderr()
    assert "SIGUSR1 is the job's (cosmos-rl's checkpoint signal" in logs and "kill -s SIGRTMIN+3" in logs, logs[-3000:]
    assert "cosmos - INFO - [Profiler] save trace for rank: 0 to file:" in logs, logs[-3000:]
    assert "profiled_times=4" in proc.stdout()
    if mode == "rl":
        assert proc.stdout().count("FINISHED") == 1  # check_finished(): once, for the controller's capture


# Proves: a worker of the real cosmos-rl with [train.ckpt] upload_s3 in its loaded Config uploads
# its trace through the hook: read from cosmos-rl's own Config object, with boto3 as cosmos-rl
# has it, to one key per rank (0.4.7 would put it at <s3_prefix>/0_trace.json.gz).
def test_real_cosmos_config_uploads_traces_to_s3(with_ours, spawn, tmp_path, s3_server):
    config = _toml(tmp_path)
    config.write_text(config.read_text() + "[train.ckpt]\nupload_s3 = 'final'\ns3_bucket = 'ckpt'\n"
                      "s3_prefix = 'exp'\n")
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", AWS_ENDPOINT_URL=s3_server.url, **CREDENTIALS)
    proc = spawn("worker", ["--config", str(config), "--mode", "sft", "--step-time", "0.02"], env,
                 program=[str(with_ours), "-m", "sidecar.run", str(WORKER)], cwd=tmp_path)
    proc.wait_ready(timeout=180)
    replica = proc.stdout().split("READY ")[1].split()[1]
    record = record_path(tmp_path / "outputs" / "profile_control", replica, 0)
    url = f"s3://ckpt/exp/profile_trace/{replica}_0/0_trace.json.gz"
    wait_for(lambda: (r := read_json(record)) and r.get("trace_url") == url, timeout=90,
             what="the worker's start() capture uploaded")
    data = s3_server.client().get_object(Bucket="ckpt", Key=url.split("/", 3)[3])["Body"].read()
    assert data == (tmp_path / "outputs" / "profile_trace" / f"{replica}_0" / "0_trace.json.gz").read_bytes()
    assert proc.stop(timeout=120) == 0


def test_stand_in_surface_matches_cosmos_rl(cosmos_python, tmp_path):
    real_dir, ours_dir = tmp_path / "real", tmp_path / "ours"
    real_dir.mkdir()
    ours_dir.mkdir()
    real = json.loads(run([cosmos_python, SURFACE, real_dir], timeout=180,
                          env=clean_env(COSMOS_PROFILER_DIR=str(real_dir))).stdout.splitlines()[-1])
    ours = json.loads(run([PYTHON, SURFACE, ours_dir], timeout=120, cwd=ROOT,
                          env=base_env(COSMOS_PROFILER_DIR=str(ours_dir))).stdout.splitlines()[-1])
    assert real["module"] == "cosmos_rl.utils.profiler" and ours["module"] == "sidecar.cosmos"
    assert ours["init"] == real["init"]
    for name, params in real["methods"].items():
        assert ours["methods"].get(name) == params, name
    assert set(real["attributes"]) - {"profiler"} <= set(ours["attributes"]), set(real["attributes"]) - set(ours["attributes"])
    assert "profiler" in ours["properties"]
    assert ours["config"] == real["config"]


def test_install_takes_cosmos_rl_pydantic_configs(with_ours, tmp_path):
    # Before: TypeError for anything but our own ProfilerConfig, though the README promised it.
    code = """
import sys, sidecar
from cosmos_rl.policy.config import Config, ProfilerConfig
sc = sidecar.install(config=ProfilerConfig(enable_profiler=True, sub_profiler_config={"active_steps": 3}),
                     replica="p1", registry=sys.argv[1] + "/reg", output_dir=sys.argv[1])
assert sc.enabled and sc.job.profiler.sub_profiler_config.active_steps == 3
sc.close()
config = Config.from_dict({"train": {"output_dir": sys.argv[1] + "/outputs"}})  # appends a timestamp
sc = sidecar.install(config=config, replica="p2")
print("ROOTS", sc.registry_root, sc.output_dir, sc.enabled)
sc.close()
"""
    out = run([with_ours, "-c", code, tmp_path], timeout=180, cwd=tmp_path).stdout
    assert f"ROOTS {tmp_path / 'outputs' / 'profile_control'} {tmp_path / 'outputs'} False" in out, out


# --- what cosmos-rl accepts, the sidecar accepts ----------------------------------------------------

# TOML-typed values for each kind of field of Cosmos-RL's profiler tables.
COERCION_CASES = {
    "enable_profiler": [True, 1, 0, 2, 1.0, 0.5, "yes", "Yes", " yes", "on", "off", "t", "n", "1", "FALSE", "maybe",
                        "", [1]],
    "active_steps": [2, True, 2.0, 2.5, "2", " 2 ", "2.0", "2.", "+2", "-2", "1_000", "1__0", "0x10", "", 10**30,
                     1e20, "1e3", -7, "٣"],
    "rank_filter": [[1, "2"], [1.0], [1.5], "1,2", 1, [True], [], ["a"]],
}

COERCE_THEIRS = """
import json, sys
from cosmos_rl.policy.config import ProfilerConfig
out = []
for key, value in json.loads(sys.argv[1]):
    data = {"sub_profiler_config": {key: value}} if key != "enable_profiler" else {key: value}
    try:
        cfg = ProfilerConfig.model_validate(data)
        out.append(getattr(cfg if key == "enable_profiler" else cfg.sub_profiler_config, key))
    except Exception:
        out.append("refused")
print(json.dumps(out))
"""


def test_the_profiler_tables_take_exactly_what_cosmos_rl_takes(cosmos_python):
    from sidecar.common.config import ProfilerConfig
    from sidecar.common.exceptions import ConfigError

    cases = [(key, value) for key, values in COERCION_CASES.items() for value in values]
    theirs = json.loads(run([cosmos_python, "-c", COERCE_THEIRS, json.dumps(cases)], timeout=180).stdout.splitlines()[-1])
    ours = []
    for key, value in cases:
        data = {"sub_profiler_config": {key: value}} if key != "enable_profiler" else {key: value}
        try:
            cfg = ProfilerConfig(**data)
            ours.append(getattr(cfg if key == "enable_profiler" else cfg.sub_profiler_config, key))
        except ConfigError:
            ours.append("refused")
    assert dict(zip(map(repr, cases), ours, strict=True)) == dict(zip(map(repr, cases), theirs, strict=True))


def test_a_worker_whose_config_the_sidecar_bounds_stays_profileable(with_ours, spawn, tmp_path):
    # active_steps = 1500 turned the worker's sidecar off ("its config is unusable"), and the CLI's
    # --config refused the TOML.
    python = with_ours
    config = tmp_path / "job.toml"
    config.write_text(f"[train]\noutput_dir = '{tmp_path / 'outputs'}'\n"
                      "[profiler]\nenable_profiler = true\nfuture_key = 1\n"
                      "[profiler.sub_profiler_config]\nactive_steps = 1500\nwarmup_steps = '1'\nunknown = 'x'\n"
                      "[policy.parallelism]\ntp_size = 1\ndp_shard_size = 1\n")
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", COSMOS_PROFILER_SIDECAR="1")
    proc = spawn("worker", ["--config", str(config), "--mode", "rl", "--step-time", "0.02"], env,
                 program=[str(python), str(WORKER)], cwd=tmp_path)
    proc.wait_ready(timeout=180)
    replica = proc.stdout().split("READY ")[1].split()[1]
    record = record_path(tmp_path / "outputs" / "profile_control", replica, 0)
    wait_for(lambda: read_json(record), timeout=60, what="the worker's record")
    cli = run([python.parent / "cosmos-profiler", "profile", "set", replica, "--config", config, "-as", "2", "--wait",
               "--timeout", "120"], timeout=180, cwd=tmp_path)
    trace = read_json(record)["trace_path"]
    assert trace in cli.stdout, cli.stdout
    assert len(profiler_steps(load_trace(trace))) == 2
    assert proc.stop(timeout=120) == 0
    logs = proc.stdout() + proc.stderr()
    assert "profiler.sub_profiler_config.active_steps = 1500 is above the sidecar's limit of 1000; 1000 is used" in logs
    assert "sidecar is off" not in logs


WORKER_TYPES = ROOT / "tests" / "programs" / "cosmos_worker_types.py"
ROLLOUT = ROOT / "tests" / "programs" / "cosmos_rollout.py"


def test_real_worker_types(with_ours, spawn, tmp_path):
    """MultiReplicaSFTPolicyWorker (start(), never step()) is counted at its optimizer;
    TeacherWorker (no profiler call, no optimizer) registers as role reference and is refused, saying why;
    so is a rollout worker's process under sidecar.run (no CosmosProfiler, no optimizer)."""
    python = with_ours
    config = _toml(tmp_path)
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", XDG_RUNTIME_DIR=str(tmp_path))
    procs = {kind: spawn(kind, ["--config", str(config), "--replica", kind.replace("_", "-"), "--kind", kind], env,
                         program=[str(python), "-m", "sidecar.run", str(WORKER_TYPES)], cwd=tmp_path)
             for kind in ("multi_sft", "teacher")}
    # A rollout worker's process: cosmos-rl's rollout package, no CosmosProfiler, no optimizer.
    procs["rollout"] = spawn("rollout", ["--stop-file", str(tmp_path / "rollout.stop")], env,
                             program=[str(python), "-m", "sidecar.run", "--replica", "rollout-0", str(ROLLOUT)],
                             cwd=tmp_path)
    for kind, proc in procs.items():
        proc.wait_ready(timeout=180)
        assert kind == "rollout" or "PROFILER sidecar.cosmos.CosmosProfiler" in proc.stdout()
    registry = tmp_path / "outputs" / "profile_control"
    default_root = tmp_path / "cosmos-profiler"  # $XDG_RUNTIME_DIR/cosmos-profiler: the rollout has no TOML
    rec = wait_for(lambda: (r := read_json(record_path(registry, "multi-sft", 0))) and r["num_captures"] == 1 and r,
                   timeout=60, what="start()'s capture, counted at optimizer.step()")
    assert rec["counts_steps_by"] == "optimizer" and rec["role"] == "policy"
    assert profiler_steps(load_trace(rec["trace_path"])) == [2, 3]
    cli = run([python.parent / "cosmos-profiler", "profile", "set", "multi-sft", "--config", config, "--wait",
               "--timeout", "120"], timeout=180, cwd=tmp_path, env=env)
    assert "1_trace.json.gz" in cli.stdout, cli.stdout
    teacher = wait_for(lambda: read_json(record_path(registry, "teacher", 0)), what="the teacher's record")
    assert teacher["role"] == "reference" and teacher["counts_steps_by"] == "none"
    refused = run([python.parent / "cosmos-profiler", "profile", "set", "teacher", "--config", config],
                  timeout=120, cwd=tmp_path, env=env, check=False)
    assert refused.returncode == 1 and "TeacherWorker (role REFERENCE)" in refused.stderr, refused.stderr
    rollout = wait_for(lambda: (r := read_json(record_path(default_root, "rollout-0", 0))) and r["cannot_trace"] and r,
                       what="the rollout's record")
    assert rollout["role"] == "rollout" and rollout["counts_steps_by"] == "none"
    refused = run([python.parent / "cosmos-profiler", "profile", "set", "rollout-0"], timeout=120, cwd=tmp_path,
                  env=env, check=False)
    assert refused.returncode == 1 and "rollout code, whose workers build no CosmosProfiler" in refused.stderr, \
        refused.stderr
    for proc in procs.values():
        assert proc.stop(timeout=120) == 0
    assert "FINISHED" in procs["multi_sft"].stdout()
