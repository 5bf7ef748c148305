"""`profile stacks|summary|merge|export` end to end: against a stuck process, a torchrun job that hangs,
and a real 2-rank capture. Grouping and rendering over hand-written ranks are
tests/unit/test_cli_stacks_analysis.py's."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from sidecar.common.layout import record_path
from sidecar.common.records import RankRecord, write_record
from sidecar.common.recordscan import read_records
from support.capture import two_rank_capture
from support.cli import invoke, stack_group_headers
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env, torchrun_cmd
from support.records import alive_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for


def cosmos_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True,
                          timeout=timeout, env=base_env(), cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc



@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """Two ranks of tests/programs/train.py: capture 0 on both ranks, then capture 1 on rank 0 only."""
    schedule = {"active_steps": 2, "wait_steps": 0, "warmup_steps": 1}
    taken = two_rank_capture(tmp_path_factory.mktemp("capture"), [
        ({"id": "cap0", "rank_filter": "all", **schedule}, (0, 1)),
        ({"id": "cap1", "rank_filter": "0", **schedule}, (0,)),
    ])
    taken.second = Path(taken.captures[1][0]["trace_path"])
    return taken


def test_summary_of_a_replica_by_name_and_by_path(capture):
    reg = str(capture.registry)
    latest = invoke("profile", "summary", "r1", "--registry", reg)
    assert latest.exit_code == 0, latest.output
    assert latest.stdout.startswith("trace summary: replica r1, capture 1, 1 rank\n")
    assert latest.stderr == "Warning: rank 1 has traces, but none for capture 1 (n counts each rank's own captures)\n"

    first = invoke("profile", "summary", "r1", "--capture", "0", "--top", "3", "--registry", reg)
    assert first.exit_code == 0 and first.stderr == ""
    text = first.stdout
    assert text.startswith("trace summary: replica r1, capture 0, 2 ranks\n")
    for rank, rec in capture.records.items():
        assert f"rank {rank} ({rec['host']})  {capture.paths[rank]}" in text
    assert text.count("  top 3 CPU ops by self time") == 2
    assert "straggler: " in text

    data = json.loads(invoke("profile", "summary", "r1", "--capture", "0", "--json", "--registry", reg).stdout)
    assert data["replica"] == "r1" and data["capture"] == 0 and data["missing_ranks"] == []
    assert {r["rank"]: r["trace_path"] for r in data["ranks"]} == {k: str(p) for k, p in capture.paths.items()}
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    for r in data["ranks"]:
        assert [s["step"] for s in r["steps"]] == profiler_steps(load_trace(capture.paths[r["rank"]]))

    # the same capture from its paths: output dir, profile_trace dir, a rank dir, one file
    for where in (capture.out, capture.out / "profile_trace", capture.paths[1].parent):
        by_path = invoke("profile", "summary", str(where), "--capture", "0", "--top", "3")
        assert by_path.exit_code == 0, by_path.output
        assert by_path.stdout == first.stdout
    one = invoke("profile", "summary", str(capture.paths[1]))
    assert one.exit_code == 0 and one.stdout.startswith("trace summary: replica r1, capture 0, 1 rank\n")
    assert f"rank 1 ({capture.records[1]['host']})" in one.stdout


def test_merge_and_export_in_process(capture, tmp_path, monkeypatch):
    reg = str(capture.registry)
    monkeypatch.chdir(tmp_path)
    relative = invoke("profile", "merge", "r1", "-o", "rel.json.gz", "--registry", reg)
    assert f"Wrote {tmp_path / 'rel.json.gz'};" in relative.stdout  # absolute, to paste anywhere
    out = tmp_path / "m.json.gz"
    merged = invoke("profile", "merge", "r1", "-o", str(out), "--capture", "0", "--registry", reg)
    assert merged.exit_code == 0, merged.output
    doc = load_trace(out)
    n = sum(1 for e in doc["traceEvents"] if e.get("ph") != "M")
    assert merged.stdout.splitlines() == [
        f"Merged capture 0 of replica r1: 2 ranks (0-1), {n} events.",
        f"Wrote {out}; open it in https://ui.perfetto.dev or chrome://tracing.",
    ]
    data = json.loads(invoke("profile", "merge", "r1", "-o", str(out), "--json", "--registry", reg).stdout)
    assert (data["ranks"], data["capture"], data["trace_path"]) == ([{"rank": 0, "shift_s": 0.0}], 1, str(out))

    flat = tmp_path / "hta"
    exported = invoke("profile", "export", "r1", "--capture", "0", str(flat), "--registry", reg)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout.splitlines()[:3] == [
        f"Exported capture 0 of replica r1 (2 ranks) to {flat}:",
        f"  rank 0: {flat / 'rank0.0_trace.json.gz'}",
        f"  rank 1: {flat / 'rank1.0_trace.json.gz'}",
    ]
    for rank in (0, 1):
        assert os.path.samefile(flat / f"rank{rank}.0_trace.json.gz", capture.paths[rank])
    again = invoke("profile", "export", "r1", "--capture", "0", str(flat), "--registry", reg, "--json")
    assert json.loads(again.stdout)["ranks"] == [{"rank": 0, "trace_path": str(flat / "rank0.0_trace.json.gz")},
                                                 {"rank": 1, "trace_path": str(flat / "rank1.0_trace.json.gz")}]
    # the exported folder is a directory of loose traces: summary and merge read it, export does not
    loose = invoke("profile", "summary", str(flat))
    assert loose.exit_code == 0 and "2 ranks" in loose.stdout.splitlines()[0]
    bad = invoke("profile", "export", str(flat), str(tmp_path / "again"))
    assert bad.exit_code == 2 and "so the rank of each file is not known" in bad.stderr
    # into a folder that already holds another capture: refused (HTA would read both)
    mixed = invoke("profile", "export", "r1", str(flat), "--registry", reg)
    assert mixed.exit_code == 1 and mixed.stderr.startswith(f"Error: {flat} already holds other traces")


def test_ranks_with_different_output_dirs(capture, tmp_path):
    # as on two nodes: each rank's record names its own output directory
    reg = tmp_path / "reg"
    for rank in (0, 1):
        node = tmp_path / f"node{rank}"
        shutil.copytree(capture.paths[rank].parent, node / "profile_trace" / f"r1_{rank}")
        write_record(reg, RankRecord(**{**capture.records[rank], "output_dir": str(node)}))
    result = invoke("profile", "summary", "r1", "--capture", "0", "--json", "--registry", str(reg))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {r["rank"]: r["trace_path"] for r in data["ranks"]} == {
        rank: str(tmp_path / f"node{rank}" / "profile_trace" / f"r1_{rank}" / "0_trace.json.gz") for rank in (0, 1)
    }
    # a node whose disk this machine cannot see: the rest, with a warning
    shutil.rmtree(tmp_path / "node1")
    result = invoke("profile", "summary", "r1", "--capture", "0", "--registry", str(reg))
    assert result.exit_code == 0 and "1 rank" in result.stdout.splitlines()[0]
    assert f"Warning: not included: rank 1: {tmp_path / 'node1'} is not a directory on this machine" in result.stderr
    shutil.rmtree(tmp_path / "node0")
    result = invoke("profile", "summary", "r1", "--registry", str(reg))
    assert result.exit_code == 1 and result.stderr.startswith("Error: no traces found for replica r1: rank 0: ")


def test_trace_errors_are_one_line(capture, tmp_path):
    reg = str(capture.registry)

    def error(*args, code=1):
        result = invoke(*args)
        assert result.exit_code == code, result.output
        return result.stderr.strip()

    assert error("profile", "summary", "r1", "--capture", "7", "--registry", reg) == (
        "Error: replica 'r1' has no capture 7; captures: 0, 1")
    assert error("profile", "summary", "nope", "--registry", reg) == (
        f"Replica nope not found.\nSearched the registry {reg} (from --registry); replicas there: r1.")
    assert error("profile", "summary", "./no/such") == "Error: ./no/such: no such file or directory"
    assert "Invalid value for '--capture'" in error("profile", "summary", "r1", "--capture", "-1", code=2)
    assert "Invalid value for '--top'" in error("profile", "summary", "r1", "--top", "0", code=2)
    assert "is one trace file; --capture picks" in error("profile", "summary", str(capture.paths[0]), "--capture", "0",
                                                         code=2)
    assert "Invalid value for 'PATH_OR_REPLICA'" in error("profile", "summary", "bad name!", code=2)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert error("profile", "summary", str(empty)).startswith(f"Error: no traces in {empty}")
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"'))
    assert error("profile", "summary", str(broken)) == f"Error: {broken} is truncated: it ends in the middle of an event in traceEvents"

    two = tmp_path / "two"
    for replica in ("a", "b"):
        shutil.copytree(capture.paths[0].parent, two / "profile_trace" / f"{replica}_0")
    assert "holds the traces of 2 replicas (a, b)" in error("profile", "summary", str(two))
    summary = invoke("profile", "summary", str(two / "profile_trace" / "b_0"), "--capture", "0")
    assert summary.exit_code == 0 and summary.stdout.startswith("trace summary: replica r1")  # named inside the trace

    assert "is one of the traces to merge" in error("profile", "merge", "r1", "-o", str(capture.second),
                                                    "--registry", reg, code=2)
    assert "Invalid value for '--output' / '-o'" in error("profile", "merge", "r1", "-o", str(tmp_path),
                                                          "--registry", reg, code=2)
    assert "Missing option '--output' / '-o'" in error("profile", "merge", "r1", code=2)

    no_traces = tmp_path / "reg"
    alive_record(no_traces, "fresh", 0, world_size=1, output_dir=str(tmp_path / "fresh-out"))
    (tmp_path / "fresh-out").mkdir()
    assert error("profile", "summary", "fresh", "--registry", str(no_traces)).startswith(
        "Error: no traces found for replica fresh: rank 0: no traces found for replica 'fresh'")


def test_cli_summary_merge_export_of_a_real_capture(capture, tmp_path):
    reg = ["--registry", str(capture.registry)]
    summary = cosmos_cli("profile", "summary", "r1", "--capture", "0", *reg)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0] == "trace summary: replica r1, capture 0, 2 ranks"
    steps = re.findall(r"^  steps: (#\d+ .*\(mean .* ms\))$", summary.stdout, re.MULTILINE)
    assert len(steps) == 2, summary.stdout
    assert any(line.startswith(("straggler: rank ", "no straggler: ")) for line in lines)

    out = tmp_path / "merged.json.gz"
    merge = cosmos_cli("profile", "merge", "r1", "-o", str(out), "--capture", "0", *reg)
    assert merge.returncode == 0, merge.stderr
    num = int(re.search(r"2 ranks \(0-1\), (\d+) events\.", merge.stdout).group(1))
    doc = load_trace(out)
    assert num == sum(1 for e in doc["traceEvents"] if e.get("ph") != "M")
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert {f"rank {k} ({capture.records[k]['host']})" for k in (0, 1)} <= names

    flat = tmp_path / "hta"
    export = cosmos_cli("profile", "export", "r1", "--capture", "0", str(flat), *reg)
    assert export.returncode == 0, export.stderr
    assert sorted(p.name for p in flat.iterdir()) == ["rank0.0_trace.json.gz", "rank1.0_trace.json.gz"]
    assert f"  rank 1: {flat / 'rank1.0_trace.json.gz'}" in export.stdout


def test_cli_stacks_of_a_stuck_process(spawn, tmp_path, registry):
    proc = spawn("r1", ["--replica", "r1", "--output", str(tmp_path / "out"), "--hang-at", "30"], base_env(registry))
    proc.wait_ready()
    wait_for(lambda: "HANGING" in proc.stdout(), 60, what="the main thread to block")
    wait_for(lambda: (read_json(record_path(registry, "r1", 0)) or {}).get("step") == 30, 30, what="step 30 published")
    result = cosmos_cli("profile", "stacks", "r1", "--registry", str(registry), "--timeout", "30")
    assert result.returncode == 0, result.stdout + result.stderr
    assert stack_group_headers(result.stdout) == ["rank 0 (1 rank): MainThread, step 30"]
    frames = [line for line in result.stdout.splitlines() if line.startswith("  File ")]
    assert frames[-1].endswith("in stuck_in_a_long_call") and "train.py" in frames[-1]
    assert "cosmos-profiler-heartbeat" in result.stdout  # among the other threads
    assert "0_stacks.txt" in result.stdout
    proc.kill()


def test_cli_stacks_find_the_rank_that_hangs_a_collective(spawn, tmp_path, registry):
    cmd = torchrun_cmd(2, "hang")
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    proc = spawn("hang", ["--hang-at", "20", "--hang-rank", "1"], env, program=cmd)
    try:
        wait_for(lambda: "HANGING" in proc.stdout(), timeout=120, what="rank 1 to wander off")
        wait_for(lambda: len(read_records(registry, "hang")) == 2, 30, what="both rank records")
        result = cosmos_cli("profile", "stacks", "hang", "--registry", str(registry), "--timeout", "60")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 of 2 ranks answered" in result.stdout
        headers = stack_group_headers(result.stdout)
        assert sorted(headers) == ["rank 0 (1 rank): MainThread, step 20", "rank 1 (1 rank): MainThread, step 20"]
        blocks = {block.splitlines()[0].split()[1]: block for block in result.stdout.split("\n\n")[1:3]}
        frames = {rank: [line.strip() for line in block.splitlines() if line.startswith("  File ")]
                  for rank, block in blocks.items()}
        assert frames["1"][-1].endswith("in wandered_off")
        assert frames["0"][-1].endswith("in all_reduce"), frames["0"]
    finally:
        # torchrun starts each worker in a session of its own: kill them by pid, not only the agent's group
        for pid in map(int, re.findall(r"^READY (\d+) rank \d+$", proc.stdout(), re.MULTILINE)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
