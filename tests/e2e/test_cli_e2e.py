"""End to end: real training subprocesses, driven by the CLI run as a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from sidecar.common.identity import host_name
from sidecar.common.layout import control_path, record_path
from support.controller import FakeController, cosmos_status
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env
from support.records import wait_record
from support.traces import load_trace, profiler_steps

BUSY_LINE = ("Replica r1 is busy with request {id} (ranks 0-1, start step {step}, phase armed). "
             "`cosmos-profiler profile cancel r1 --registry {registry}` ends it.\n")


def cosmos_cli(*args: str, registry: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "sidecar", *args]
    if registry is not None:
        cmd += ["--registry", str(registry)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=base_env(), cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _trace_paths(stdout: str) -> dict[int, Path]:
    return {int(k): Path(p) for k, p in re.findall(r"^  rank (\d+): (\S+)$", stdout, re.MULTILINE)}


def test_two_ranks_capture_the_same_steps_and_the_cli_follows_them(spawn, tmp_path, registry):
    procs = []
    for rank in (0, 1):
        env = base_env(registry, RANK=str(rank), WORLD_SIZE="2")
        procs.append(spawn(f"rank{rank}", ["--replica", "r1", "--output", str(tmp_path / "out")], env))
    for rank, proc in enumerate(procs):
        proc.wait_ready(90)
        wait_record(registry, lambda r: r.get("state") == "idle", "r1", rank, 90, what="the record, idle")

    ls = cosmos_cli("replica", "ls", registry=registry)
    assert ls.returncode == 0, ls.stderr
    row = ls.stdout.splitlines()[1].split()
    assert row[:3] == ["r1", "policy", "2/2"] and row[4] == "idle"
    lsr = json.loads(cosmos_cli("replica", "lsr", "r1", "--json", registry=registry).stdout)["ranks"]
    assert [(r["rank"], r["pid"], r["alive"]) for r in lsr] == [(0, procs[0].pid, True), (1, procs[1].pid, True)]

    out = cosmos_cli("profile", "set", "r1", "-rf", "all", "-as", "2", "--wait", "--timeout", "120", registry=registry)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Requested a profile of replica r1 through its control file."
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
    assert (busy.returncode, busy.stderr) == (1, BUSY_LINE.format(id=far_id, step=far_step, registry=registry))

    # A rank killed outright is found dead by its pid.
    procs[1].kill()
    ranks = json.loads(cosmos_cli("replica", "lsr", "r1", "--json", registry=registry).stdout)["ranks"]
    assert [(r["alive"], r["liveness"]) for r in ranks] == [(True, "alive"), (False, "process gone")]
    assert cosmos_cli("replica", "ls", registry=registry).stdout.splitlines()[1].split()[2] == "1/2"
    status = json.loads(cosmos_cli("profile", "status", "r1", "--json", registry=registry).stdout)
    assert [c["phase"] for c in status["ranks"]] == ["armed", "dead"]
    assert procs[0].stop() == 0


def test_controller_path_needs_no_registry_flag(spawn, tmp_path):
    # The Cosmos-RL layout: the sidecar reads the TOML as the user wrote it; the controller's
    # /api/meta holds the loaded config, whose output_dir cosmos-rl timestamped. Both derive
    # the same registry (the output root: see sidecar.common.config).
    output_dir = tmp_path / "outputs" / "20260101120000"
    config = tmp_path / "train.toml"
    config.write_text(f"[train]\noutput_dir = {json.dumps(str(tmp_path / 'outputs'))}\n"
                      "[profiler]\nenable_profiler = true\n")
    registry = tmp_path / "outputs" / "profile_control"
    proc = spawn("policy", ["--replica", "policy-a", "--config", str(config)], base_env())
    proc.wait_ready(90)
    wait_record(registry, lambda r: r.get("state") == "idle", "policy-a", 0, 90, what="the record, idle")

    fake = FakeController()
    try:
        fake.json("/api/status", cosmos_status(["policy-a"], [], ranks=1))
        fake.json("/api/meta", {"config": {"train": {"output_dir": str(output_dir), "timestamp": "20260101120000"}}})
        where = ["-cp", str(fake.port), "-ch", "127.0.0.1"]
        ls = cosmos_cli("replica", "ls", *where)
        assert ls.returncode == 0, ls.stderr
        assert ls.stdout.splitlines()[1].split()[:3] == ["policy-a", "policy", "1/1"]

        out = cosmos_cli("profile", "set", "policy-a", *where, "--wait", "--timeout", "120")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines()[0] == "Requested a profile of replica policy-a through its control file."
        path = _trace_paths(out.stdout)[0]
        assert path == tmp_path / "outputs" / "profile_trace" / "policy-a_0" / "0_trace.json.gz"
        assert profiler_steps(load_trace(path))
        assert "/api/meta" in fake.hits
    finally:
        fake.close()
    assert proc.stop() == 0


BAD_FIELDS = {"rank": "zero", "step": [], "heartbeat_at": "x"}


def _bad_record(registry: Path, replica: str, rank: int, fields: dict) -> Path:
    path = record_path(registry, replica, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"replica": replica, "role": "policy", "rank": rank, **fields}))
    return path


# Proves: records with wrong field types, a FIFO and a symlink named like records
# crash or hang none of ls, lsr, status and set; each is a row or a warning naming
# the file and the field, and a healthy replica beside them is listed and profiled.
def test_bad_records_are_rows_with_errors_never_a_crash_or_a_hang(spawn, tmp_path, registry):
    proc = spawn("good", ["--replica", "good", "--output", str(tmp_path / "out")], base_env(registry, WORLD_SIZE="2"))
    proc.wait_ready(90)
    wait_record(registry, lambda r: r.get("state") == "idle", "good", 0, 90, what="the record, idle")
    for rank, (key, value) in enumerate(BAD_FIELDS.items()):  # one wrong field per record of replica "bad"
        _bad_record(registry, "bad", rank, {key: value})
    kind = {0: "string", 1: "array", 2: "string"}
    expected = {rank: f"rank record {record_path(registry, 'bad', rank)}: field {key!r} must be "
                      f"{'a number' if key == 'heartbeat_at' else 'an integer'}, got {kind[rank]}"
                for rank, key in enumerate(BAD_FIELDS)}
    _bad_record(registry, "good", 1, {"step": []})  # a bad record beside a live rank
    os.mkfifo(record_path(registry, "good", 2))
    record_path(registry, "good", 3).symlink_to(record_path(registry, "good", 0))

    ls = cosmos_cli("replica", "ls", registry=registry, timeout=30)
    assert ls.returncode == 0, ls.stderr
    rows = {line.split()[0]: line.split() for line in ls.stdout.splitlines()[1:]}
    assert rows["good"][1:3] == ["policy", "1/4"] and rows["good"][4] == "idle"
    assert rows["bad"][2] == "0/3" and rows["bad"][4] == "unknown"
    warnings = ls.stderr.splitlines()
    assert [w for w in warnings if "replica bad" in w] == [f"Warning: replica bad: {expected[k]}" for k in range(3)]
    assert f"Warning: replica good: rank record {record_path(registry, 'good', 2)} is not a regular file" in ls.stderr
    assert f"Warning: replica good: rank record {record_path(registry, 'good', 3)} is a symlink; refusing" in ls.stderr
    data = json.loads(cosmos_cli("replica", "ls", "--json", registry=registry, timeout=30).stdout)
    assert [(r["replica"], len(r["problems"])) for r in data["replicas"]] == [("bad", 3), ("good", 3)]

    lsr = json.loads(cosmos_cli("replica", "lsr", "bad", "--json", registry=registry).stdout)["ranks"]
    assert [(r["rank"], r["liveness"], r["error"]) for r in lsr] == [(k, "bad record", expected[k]) for k in range(3)]
    lsr_good = cosmos_cli("replica", "lsr", "good", registry=registry)
    assert lsr_good.returncode == 0
    good_rows = lsr_good.stdout.splitlines()[1:]
    assert good_rows[0].split()[:5] == ["0", host_name(), str(proc.pid), "SIGUSR1", "yes"]
    assert "no (bad record)" in good_rows[1] and "field 'step' must be an integer, got array" in good_rows[1]

    status = cosmos_cli("profile", "status", "bad", "--json", registry=registry)
    assert status.returncode == 0, status.stderr
    assert [(c["rank"], c["phase"], c["error"]) for c in json.loads(status.stdout)["ranks"]] == [
        (k, "missing", expected[k]) for k in range(3)]
    refused = cosmos_cli("profile", "set", "bad", registry=registry)
    assert refused.returncode == 1
    assert refused.stderr == (f"Error: replica bad has no usable rank record under {registry}: "
                              + "; ".join(expected[k] for k in range(3)) + "\n")
    assert not control_path(registry, "bad").exists(), "a refused request writes nothing"

    done = cosmos_cli("profile", "set", "good", "-rf", "all", "--wait", "--timeout", "120", registry=registry)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"Warning: rank 1 will not be profiled: rank record {record_path(registry, 'good', 1)}: "
            "field 'step' must be an integer, got array") in done.stderr
    assert profiler_steps(load_trace(_trace_paths(done.stdout)[0]))
    status = json.loads(cosmos_cli("profile", "status", "good", "--json", registry=registry).stdout)
    assert [(c["rank"], c["phase"]) for c in status["ranks"]] == [(0, "saved"), (1, "missing"), (2, "missing"),
                                                                   (3, "missing")]
    assert proc.stop() == 0


# Proves: a registry that does not exist, or is a file, is an error naming it
# (exit 1) for every command that reads it; an existing empty one is an empty listing.
def test_a_missing_registry_is_an_error_unlike_an_empty_one(tmp_path):
    missing, plain, empty = tmp_path / "no" / "such", tmp_path / "file", tmp_path / "empty"
    plain.write_text("")
    empty.mkdir()
    for root, why in ((missing, "does not exist"), (plain, "is not a directory")):
        for args in (["replica", "ls"], ["replica", "lsr", "r1"], ["profile", "status", "r1"], ["profile", "set", "r1"]):
            result = cosmos_cli(*args, registry=root)
            assert (result.returncode, result.stdout) == (1, ""), (args, result.stdout, result.stderr)
            assert result.stderr.startswith(f"Error: registry {root} {why}"), (args, result.stderr)
    ls = cosmos_cli("replica", "ls", registry=empty)
    assert (ls.returncode, ls.stdout, ls.stderr) == (0, f"No replicas registered under {empty}.\n", "")
    assert json.loads(cosmos_cli("replica", "ls", "--json", registry=empty).stdout)["replicas"] == []
    lsr = cosmos_cli("replica", "lsr", "r1", registry=empty)
    assert (lsr.returncode, lsr.stderr.splitlines()[0]) == (1, "Replica r1 not found.")
