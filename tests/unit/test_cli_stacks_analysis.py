"""`profile stacks`: grouping, answers and rendering over hand-written ranks (CliRunner), and the
reader of a real dump's text."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from sidecar.common.layout import control_path
from sidecar.common.records import RankRecord
from sidecar.common.stackdump import HEADER, THREAD_PREFIX, format_stacks, read_stacks
from sidecar.fleet import answers, control
from sidecar.fleet.stackgroups import group_stacks
from support.cli import invoke, stack_group_headers
from support.files import read_json
from support.records import alive_record, dead_record, remote_record, update_record
from support.wait import wait_for

ALL_REDUCE = [("train.py", 83, "<module>"), ("train.py", 65, "main"), ("distributed_c10d.py", 3252, "all_reduce")]

WANDERED = [("train.py", 83, "<module>"), ("train.py", 61, "main"), ("train.py", 23, "wandered_off")]


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

    def _stacks_request(self) -> dict | None:
        request = read_json(control_path(self.registry, "r1"))
        return request if request and request.get("kind") == "stacks" and request != self._old else None

    def _run(self) -> None:
        wait_for(lambda: self._stop.is_set() or self._stacks_request(), 20, interval=0.01,
                 what="the CLI's stacks request")
        request = self.request = self._stacks_request()
        if request is None:  # stopped before the CLI asked
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



def test_stacks_group_the_odd_rank_out(tmp_path):
    reg, out = tmp_path / "reg", tmp_path / "out"
    records = ranks_of(reg, 4)
    with FakeRanks(reg, out, records, {0: ALL_REDUCE, 1: WANDERED, 2: ALL_REDUCE, 3: ALL_REDUCE}) as fake:
        result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--timeout", "20")
    assert result.exit_code == 0, result.output
    assert fake.request == {"id": fake.request["id"], "kind": "stacks", "rank_filter": "all"}
    text = result.stdout
    assert text.splitlines()[0] == f"Stacks of replica r1 (request {fake.request['id']}): 4 of 4 ranks answered."
    assert stack_group_headers(text) == ["ranks 0,2-3 (3 ranks): MainThread, step 20", "rank 1 (1 rank): MainThread, step 20"]
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
    assert stack_group_headers(result.stdout) == ["rank 0 (1 rank): MainThread, step 20", "rank 1 (1 rank): MainThread, step 20"]
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
    assert stack_group_headers(result.stdout) == ["rank 0 (1 rank): MainThread, step 20"]
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
    assert fake.request["rank_filter"] == "1" and stack_group_headers(result.stdout) == ["rank 1 (1 rank): MainThread, step 20"]

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
