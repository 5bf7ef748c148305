"""End to end: real training subprocesses, driven by the CLI run as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from fakes import FakeController, cosmos_status

from conftest import PYTHON, ROOT, base_env, load_trace, profiler_steps, read_json, wait_for
from sidecar.registry import record_path

BUSY_LINE = ("Replica r1 is busy with request {id} (ranks 0-1, start step {step}, phase armed). "
             "`cosmos-profiler profile cancel r1` ends it.\n")


def cosmos_cli(*args: str, registry: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "cosmos_rl.cli.cli", *args]
    if registry is not None:
        cmd += ["--registry", str(registry)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=base_env(), cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _wait_idle(registry: Path, replica: str, rank: int) -> dict:
    def idle():
        rec = read_json(record_path(registry, replica, rank))
        return rec if rec and rec.get("state") == "idle" else None

    return wait_for(idle, 90, what=f"{replica} rank {rank} to publish its record")


def _trace_paths(stdout: str) -> dict[int, Path]:
    return {int(k): Path(p) for k, p in re.findall(r"^  rank (\d+): (\S+)$", stdout, re.MULTILINE)}


def test_two_ranks_capture_the_same_steps_and_the_cli_follows_them(spawn, tmp_path, registry):
    procs = []
    for rank in (0, 1):
        env = base_env(registry, RANK=str(rank), WORLD_SIZE="2")
        procs.append(spawn(f"rank{rank}", ["--replica", "r1", "--output", str(tmp_path / "out")], env))
    for rank, proc in enumerate(procs):
        proc.wait_ready(90)
        _wait_idle(registry, "r1", rank)

    ls = cosmos_cli("replica", "ls", registry=registry)
    assert ls.returncode == 0, ls.stderr
    row = ls.stdout.splitlines()[1].split()
    assert row[:3] == ["r1", "policy", "2/2"] and row[4] == "idle"
    lsr = json.loads(cosmos_cli("replica", "lsr", "r1", "--json", registry=registry).stdout)
    assert [(r["rank"], r["pid"], r["alive"]) for r in lsr] == [(0, procs[0].pid, True), (1, procs[1].pid, True)]

    out = cosmos_cli("profile", "set", "r1", "-rf", "all", "-as", "2", "--wait", "--timeout", "120", registry=registry)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Set replica r1 to profile mode."
    start = int(re.search(r"the schedule starts at step (\d+)", lines[1]).group(1))
    assert any(line.startswith("rank 0: saved ") for line in lines) and any(line.startswith("rank 1: saved ") for line in lines)
    paths = _trace_paths(out.stdout)
    assert sorted(paths) == [0, 1]
    assert paths[0] == tmp_path / "out" / "profile_trace" / "r1_0" / "0_trace.json.gz"
    # default wait 1 and warmup 1: active steps are start+2 and start+3, on both ranks
    steps = [profiler_steps(load_trace(paths[k])) for k in (0, 1)]
    assert steps[0] == steps[1] == [start + 2, start + 3]
    for rank in (0, 1):
        rec = read_json(record_path(registry, "r1", rank))
        assert rec["capture_start_step"] == start and rec["misaligned"] is False

    status = json.loads(cosmos_cli("profile", "status", "r1", "--json", registry=registry).stdout)
    assert [(c["rank"], c["phase"], c["trace_path"]) for c in status["ranks"]] == [
        (0, "saved", str(paths[0])), (1, "saved", str(paths[1])),
    ]

    # A start step far away (within the 100,000-step horizon): --wait gives up naming both
    # ranks, and the replica is busy until a cancel.
    far_step = read_json(record_path(registry, "r1", 0))["step"] + 50_000
    far = cosmos_cli("profile", "set", "r1", "-rf", "all", "--start-step", str(far_step), "--wait", "--timeout", "2",
                     registry=registry)
    assert far.returncode == 1
    assert "rank 0: armed at step" in far.stdout and "rank 1: armed at step" in far.stdout
    assert far.stderr.startswith("Error: ranks 0, 1 did not finish (rank 0: timeout: timed out after 2s, still armed")
    far_id = re.search(r"^Request (\S+) for ranks 0-1", far.stdout, re.MULTILINE).group(1)
    busy = cosmos_cli("profile", "set", "r1", registry=registry)
    assert (busy.returncode, busy.stderr) == (1, BUSY_LINE.format(id=far_id, step=far_step))

    # A rank killed outright is found dead by its pid.
    procs[1].kill()
    ranks = json.loads(cosmos_cli("replica", "lsr", "r1", "--json", registry=registry).stdout)
    assert [(r["alive"], r["liveness"]) for r in ranks] == [(True, "alive"), (False, "process gone")]
    assert cosmos_cli("replica", "ls", registry=registry).stdout.splitlines()[1].split()[2] == "1/2"
    status = json.loads(cosmos_cli("profile", "status", "r1", "--json", registry=registry).stdout)
    assert [c["phase"] for c in status["ranks"]] == ["armed", "dead"]
    assert procs[0].stop() == 0


def test_controller_path_needs_no_registry_flag(spawn, tmp_path):
    # The Cosmos-RL layout: the sidecar and the CLI both derive the registry
    # from [train] output_dir; the CLI learns it from the controller's /api/meta.
    output_dir = tmp_path / "outputs" / "20260101120000"
    config = tmp_path / "train.toml"
    config.write_text(f"[train]\noutput_dir = {json.dumps(str(output_dir))}\n[profiler]\nenable_profiler = true\n")
    registry = tmp_path / "outputs" / "profile_control"
    proc = spawn("policy", ["--replica", "policy-a", "--config", str(config)], base_env())
    proc.wait_ready(90)
    _wait_idle(registry, "policy-a", 0)

    fake = FakeController()
    try:
        fake.json("/api/status", cosmos_status(["policy-a"], [], ranks=1))
        fake.json("/api/meta", {"config": {"train": {"output_dir": str(output_dir)}}})
        where = ["-cp", str(fake.port), "-ch", "127.0.0.1"]
        ls = cosmos_cli("replica", "ls", *where)
        assert ls.returncode == 0, ls.stderr
        assert ls.stdout.splitlines()[1].split()[:3] == ["policy-a", "policy", "1/1"]

        out = cosmos_cli("profile", "set", "policy-a", *where, "--wait", "--timeout", "120")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines()[0] == "Set replica policy-a to profile mode."
        path = _trace_paths(out.stdout)[0]
        assert path == tmp_path / "outputs" / "profile_trace" / "policy-a_0" / "0_trace.json.gz"
        assert profiler_steps(load_trace(path))
        assert "/api/meta" in fake.hits
    finally:
        fake.close()
    assert proc.stop() == 0
