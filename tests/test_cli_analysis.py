"""`profile stacks|summary|merge|export`: grouping and rendering over hand-written ranks (CliRunner),
and end to end against a stuck process, a torchrun job that hangs, and a real 2-rank capture."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sidecar.common.layout import control_path, record_path
from sidecar.common.records import RankRecord, write_record
from sidecar.common.recordscan import read_records
from sidecar.common.stackdump import HEADER, THREAD_PREFIX, format_stacks, read_stacks
from sidecar.fleet import answers, control
from sidecar.fleet.stackgroups import group_stacks
from support.capture import two_rank_capture
from support.cli import invoke
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env, torchrun_cmd
from support.records import alive_record, dead_record, remote_record, update_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

ALL_REDUCE = [("train.py", 83, "<module>"), ("train.py", 65, "main"), ("distributed_c10d.py", 3252, "all_reduce")]
WANDERED = [("train.py", 83, "<module>"), ("train.py", 61, "main"), ("train.py", 23, "wandered_off")]


def cosmos_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True,
                          timeout=timeout, env=base_env(), cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def frame_lines(frames) -> list[str]:
    return [f'File "{file}", line {line}, in {func}' for file, line, func in frames]


def dump_text(rank: int, request_id: str, main=ALL_REDUCE, step: int = 20, others: dict | None = None) -> str:
    """A stacks dump in `format_stacks`'s format."""
    others = {"cosmos-profiler-heartbeat": [("threading.py", 331, "wait")]} if others is None else others
    lines = [f"{HEADER} replica=r1 rank={rank} host=h pid=1 step={step} state=idle request={request_id} at=1.0"]
    for name, frames, flags in [("MainThread", main, ", main"), *((n, f, ", daemon") for n, f in others.items())]:
        lines.append(f"{THREAD_PREFIX}{name} (ident {100 + len(lines)}{flags})")
        for frame in frame_lines(frames):
            lines += [f"  {frame}", "    some_call()"]
    return "\n".join(lines) + "\n"


class FakeRanks:
    """Answers the next stacks request for hand-written records, as each rank's watcher thread would.

    `answers`: rank -> main-thread frames (answer), "refuse", or None (stay silent).
    """

    def __init__(self, registry: Path, out: Path, records: dict[int, RankRecord], answers: dict, **dump_args):
        self.registry, self.out, self.records, self.answers, self.dump_args = registry, out, records, answers, dump_args
        self.request: dict | None = None
        self._old = read_json(control_path(registry, "r1"))  # answer only a request written after this
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-ranks")

    def __enter__(self) -> FakeRanks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        deadline = time.monotonic() + 20
        while not self._stop.is_set() and time.monotonic() < deadline:
            request = read_json(control_path(self.registry, "r1"))
            if request and request.get("kind") == "stacks" and request != self._old:
                self.request = request
                break
            self._stop.wait(0.01)
        else:
            return
        rid = request["id"]
        for rank, answer in self.answers.items():
            if answer == "refuse":
                update_record(self.registry, self.records[rank],
                              refused=f"request {rid} refused: profiler is disabled for this job")
            elif answer is not None:
                path = self.out / "profile_trace" / f"r1_{rank}" / "0_stacks.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(dump_text(rank, rid, answer, **self.dump_args))
                update_record(self.registry, self.records[rank], stacks_path=str(path),
                              history=[{"state": "idle", "stacks": str(path), "request_id": rid}])


def ranks_of(registry: Path, n: int, **fields) -> dict[int, RankRecord]:
    return {k: alive_record(registry, "r1", k, world_size=n, step=20, **fields) for k in range(n)}


def group_headers(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^ranks? \S+ \(\d+ ranks?\):", line)]


# --- profile stacks over hand-written ranks --------------------------------------------


def test_stacks_group_the_odd_rank_out(tmp_path):
    reg, out = tmp_path / "reg", tmp_path / "out"
    records = ranks_of(reg, 4)
    with FakeRanks(reg, out, records, {0: ALL_REDUCE, 1: WANDERED, 2: ALL_REDUCE, 3: ALL_REDUCE}) as fake:
        result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--timeout", "20")
    assert result.exit_code == 0, result.output
    assert fake.request == {"id": fake.request["id"], "kind": "stacks", "rank_filter": "all"}
    text = result.stdout
    assert text.splitlines()[0] == f"Stacks of replica r1 (request {fake.request['id']}): 4 of 4 ranks answered."
    assert group_headers(text) == ["ranks 0,2-3 (3 ranks): MainThread, step 20", "rank 1 (1 rank): MainThread, step 20"]
    blocks = text.split("\n\n")
    assert blocks[1].splitlines()[1:] == [
        *(f"  {line}" for line in frame_lines(ALL_REDUCE)),
        "  + 1 other thread: cosmos-profiler-heartbeat (--all-threads shows them)",
    ]
    assert blocks[2].splitlines()[3] == '  File "train.py", line 23, in wandered_off'  # innermost last
    assert "Stack files:\n  rank 0: " + str(out / "profile_trace" / "r1_0" / "0_stacks.txt") in text


def test_stacks_no_group_all_threads_and_json(tmp_path):
    reg, out = tmp_path / "reg", tmp_path / "out"
    records = ranks_of(reg, 2)
    others = {"worker": [("threading.py", 331, "wait")], "loader": [("queue.py", 171, "get")]}
    with FakeRanks(reg, out, records, {0: ALL_REDUCE, 1: ALL_REDUCE}, others=others):
        result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--no-group", "--all-threads")
    assert result.exit_code == 0, result.output
    assert group_headers(result.stdout) == ["rank 0 (1 rank): MainThread, step 20", "rank 1 (1 rank): MainThread, step 20"]
    assert "thread worker: rank 0 (1 rank):\n  File \"threading.py\", line 331, in wait" in result.stdout
    assert "thread loader: rank 1 (1 rank):" in result.stdout and "other thread" not in result.stdout

    with FakeRanks(reg, out, records, {0: ALL_REDUCE, 1: ALL_REDUCE}, others=others, step=21):
        result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--json", "--all-threads")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(r["rank"], r["phase"]) for r in data["ranks"]] == [(0, "saved"), (1, "saved")]
    assert data["ranks"][1]["stacks_path"] == str(out / "profile_trace" / "r1_1" / "0_stacks.txt")
    main, *rest = data["groups"]
    assert (main["ranks"], main["ranks_text"], main["thread"], main["is_main"]) == (
        [{"rank": 0}, {"rank": 1}], "0-1", "MainThread", True)
    assert main["frames"] == frame_lines(ALL_REDUCE) and main["steps"] == [21]
    assert main["other_threads"] == ["worker", "loader"]
    assert [(g["thread"], g["ranks_text"], g["is_main"]) for g in rest] == [("worker", "0-1", False),
                                                                          ("loader", "0-1", False)]
    assert data["request"]["kind"] == "stacks" and data["control_path"] == str(control_path(reg, "r1"))


def test_stacks_name_the_ranks_that_did_not_answer(tmp_path):
    reg, out = tmp_path / "reg", tmp_path / "out"
    records = ranks_of(reg, 4)
    records[1] = dead_record(reg, "r1", 1, world_size=4)
    started = time.monotonic()
    with FakeRanks(reg, out, records, {0: WANDERED, 2: None, 3: "refuse"}):
        result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--timeout", "1")
    assert time.monotonic() - started < 15
    assert result.exit_code == 1
    assert group_headers(result.stdout) == ["rank 0 (1 rank): MainThread, step 20"]
    assert "1 of 4 ranks answered" in result.stdout
    error = result.stderr.strip()
    assert error.startswith(
        "Error: no stacks from ranks 1-3 (rank 1: dead: process gone; rank 2: timeout: the watcher thread did not answer within 1s; "
        "its heartbeat is fresh (step 20), so its watcher thread did not see the request; rank 3: refused: "
    ), error
    assert "rank 3: refused: request cli-" in error and "profiler is disabled" in error


def test_a_rank_whose_heartbeat_stopped_is_stuck_as_a_whole(tmp_path):
    reg = tmp_path / "reg"
    remote_record(reg, "r1", 0, heartbeat_age=8.0, world_size=1)  # not yet stale (10 s), but no Python runs
    result = control.dump_stacks(reg, "r1", timeout=0.2)
    assert [(r.rank, r.phase) for r in result.ranks] == [(0, "timeout")]
    assert "heartbeat stopped 8s ago too (at step 1000), so the whole process is stuck; " \
           "try py-spy dump --pid 4242 on node-elsewhere" in result.ranks[0].error


def test_stacks_rank_filter_and_errors(tmp_path):
    reg, out = tmp_path / "reg", tmp_path / "out"
    records = ranks_of(reg, 3)
    with FakeRanks(reg, out, records, {1: WANDERED}) as fake:
        result = invoke("profile", "stacks", "r1", "-rf", "1", "--registry", str(reg))
    assert result.exit_code == 0, result.output
    assert fake.request["rank_filter"] == "1" and group_headers(result.stdout) == ["rank 1 (1 rank): MainThread, step 20"]

    bad = invoke("profile", "stacks", "r1", "-rf", "5", "--registry", str(reg))
    assert bad.exit_code == 2 and "rank 5 is out of range: replica r1 has 3 ranks (0-2)" in bad.stderr
    bad = invoke("profile", "stacks", "r1", "-rf", "x", "--registry", str(reg))
    assert bad.exit_code == 2 and "Invalid value for '--rank-filter' / '-rf'" in bad.stderr
    bad = invoke("profile", "stacks", "nope", "--registry", str(reg))
    assert (bad.exit_code, bad.stderr) == (1, f"Replica nope not found.\nSearched the registry {reg} (from --registry); "
                                               "replicas there: r1.\n")
    bad = invoke("profile", "stacks", "../x", "--registry", str(reg))
    assert bad.exit_code == 2 and "Invalid value for 'NAME'" in bad.stderr

    gone = tmp_path / "gone"
    dead_record(gone, "r1", 0, world_size=1)
    bad = invoke("profile", "stacks", "r1", "--registry", str(gone))
    assert bad.exit_code == 1
    assert bad.stderr.splitlines()[0].startswith(
        "Error: no live rank of replica r1 matches rank filter all (rank 0: process gone (on ")
    assert not control_path(gone, "r1").exists()


def test_read_stacks_finds_the_main_thread_of_a_real_dump(tmp_path):
    path = tmp_path / "0_stacks.txt"
    path.write_text(format_stacks({"rank": 0, "step": 7, "state": "tracing"}, skip_current=False))
    header, threads, main = read_stacks(path)
    assert header["rank"] == "0" and header["step"] == "7" and header["state"] == "tracing"
    assert threads[main].name == threading.main_thread().name
    assert any("in test_read_stacks_finds_the_main_thread_of_a_real_dump" in f for f in threads[main].frames)

    answer = answers.RankStacks(0, "saved", path=str(tmp_path / "nope.txt"))
    groups = group_stacks([answer])  # only answered dumps are grouped
    assert groups[0].ranks == [0] and groups[0].thread == "(no main thread)"
    (tmp_path / "x.txt").write_text("not a dump\n")
    with pytest.raises(ValueError, match="does not start with"):
        read_stacks(tmp_path / "x.txt")


def test_stacks_answer_phases():
    rid = "cli-1"
    rec = RankRecord(replica="r1", role="policy", rank=0)
    assert answers.stacks_answer(rec, rid, True).phase == "pending"
    assert answers.stacks_answer(rec, rid, False, "process gone").error == "process gone before answering"
    saved = RankRecord(replica="r1", role="policy", rank=0, history=[{"stacks": "/s/0_stacks.txt", "request_id": rid},
                                                                     {"stacks": "/s/1_stacks.txt", "request_id": "x"}])
    assert (answers.stacks_answer(saved, rid, False).phase, answers.stacks_answer(saved, rid, False).path) == (
        "saved", "/s/0_stacks.txt")  # answered, then exited: still answered
    failed = RankRecord(replica="r1", role="policy", rank=0, error=f"request {rid}: writing stacks to /s failed: EIO")
    assert answers.stacks_answer(failed, rid, True).phase == "error"
    other = RankRecord(replica="r1", role="policy", rank=0, refused="request cli-10 refused: busy")
    assert answers.stacks_answer(other, rid, True).phase == "pending"  # cli-10 is not cli-1


# --- a real capture: summary / merge / export ------------------------------------------------


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


# --- end to end: the CLI as a subprocess ---------------------------------------------------


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
    assert group_headers(result.stdout) == ["rank 0 (1 rank): MainThread, step 30"]
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
        headers = group_headers(result.stdout)
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
