"""`profile hang`: the analysis on small hand-written flight recorder dumps and records. Real gloo
jobs where one rank stops calling collectives: tests/e2e/test_hang_jobs.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from sidecar.common.layout import control_path
from sidecar.common.stackdump import HEADER, THREAD_PREFIX
from sidecar.fleet.hang import RankView, analyze, group_states
from support.cli import invoke
from support.files import read_json
from support.records import alive_record, update_record
from support.wait import wait_for

NOW = 1_800_000_000.0

WAITING_FRAMES = ['File "train.py", line 80, in main', 'File "/x/torch/distributed/distributed_c10d.py", line 3252, in all_reduce']

LOOPING_FRAMES = ['File "train.py", line 76, in main', 'File "train.py", line 23, in wandered_off']


def entry(pg: str, seq: int, op: str = "gloo:all_reduce", sizes=((4,),), created: float | None = None,
          desc: str = "default_pg", retired: bool = False) -> dict:
    return {"collective_seq_id": seq, "profiling_name": op, "process_group": [pg, desc], "input_sizes": sizes,
            "output_sizes": sizes, "is_p2p": False, "retired": retired, "state": "scheduled",
            "time_created_ns": int(created * 1e9) if created else 0}


def view(rank: int, status: dict[str, tuple[int, int]] | None, entries=(), frames=WAITING_FRAMES, step: int = 20,
         last_step_ago: float = 5.0, recorder: str = "cpu", fr_error: str | None = None) -> RankView:
    groups = None
    if status is not None:
        doc = {"available": True, "recorders": {recorder: {
            "pg_status": {pg: {"last_enqueued_collective": str(e), "last_completed_collective": str(c),
                               "last_started_collective": "-1"} for pg, (e, c) in status.items()},
            "entries": list(entries)}}}
        groups = group_states(doc)
    return RankView(rank, host="h", step=step, dumped_at=NOW, last_step_at=NOW - last_step_ago, frames=list(frames),
                    groups=groups, fr_error=fr_error)


def waiting_rank(rank: int, seq: int = 70, waited: float = 12.0) -> RankView:
    return view(rank, {"0": (seq, seq - 1)}, [entry("0", seq - 1, retired=True), entry("0", seq, created=NOW - waited)])


def test_the_rank_that_has_not_entered_the_collective_is_the_suspect():
    ranks = [waiting_rank(0), waiting_rank(1, waited=11.0),
             view(2, {"0": (69, 69)}, [entry("0", 69, retired=True)], frames=LOOPING_FRAMES), waiting_rank(3)]
    report = analyze(ranks, "r", now=NOW)
    assert report.suspects == [2]
    g = report.collective
    assert (g.op, g.seq, g.process_group, g.waiting, g.behind) == ("gloo:all_reduce", 70, "cpu:0", [0, 1, 3], [2])
    assert g.positions == {0: (70, 69), 1: (70, 69), 2: (69, 69), 3: (70, 69)}
    assert (round(g.waited_s, 3), g.waited_from) == (12.0, "flight recorder")
    suspect = report.ranks[2]
    assert suspect.role == "suspect" and suspect.main_stack == LOOPING_FRAMES
    assert "has not entered gloo:all_reduce (pg 0 default_pg, seq 70; it entered up to seq 69)" in suspect.where
    assert "not in a collective: in wandered_off (train.py:23)" in suspect.where
    assert [r.role for r in report.ranks] == ["waiting", "waiting", "suspect", "waiting"]
    assert report.verdict == "Rank 2 is the suspect." and report.fallback is None


def test_a_rank_in_a_different_collective_is_the_suspect():
    odd = view(1, {"0": (70, 69)}, [entry("0", 70, op="gloo:broadcast", created=NOW - 3)])
    report = analyze([waiting_rank(0), odd, waiting_rank(2)], "r", now=NOW)
    assert report.suspects == [1]
    assert report.collective.different == [1] and report.collective.op == "gloo:all_reduce"
    assert "entered gloo:broadcast as seq 70 of pg 0 default_pg, where the others entered gloo:all_reduce" \
        in report.ranks[1].where


def test_other_sizes_at_the_same_sequence_number_are_a_different_collective():
    odd = view(2, {"0": (70, 69)}, [entry("0", 70, sizes=((8,),), created=NOW - 3)])
    report = analyze([waiting_rank(0), waiting_rank(1), odd], "r", now=NOW)
    assert report.suspects == [2]


def test_all_completed_is_no_hang():
    done = [view(k, {"0": (70, 70)}, [entry("0", 70, retired=True)]) for k in range(3)]
    report = analyze(done, "r", now=NOW)
    assert report.suspects == [] and report.groups == [] and report.collective is None
    assert report.verdict.startswith("No collective is in flight")
    assert {r.role for r in report.ranks} == {"ok"}


def test_a_completed_count_left_one_behind_by_gloo_is_read_from_the_retired_entry():
    """gloo's worker threads race to set `last_completed_collective` (torch 2.13): after three
    all_reduces every entry is retired and it can still say 2 for good. No collective is in flight."""
    lagging = view(1, {"0": (70, 69)}, [entry("0", 69, retired=True), entry("0", 70, retired=True)])
    done = [view(k, {"0": (70, 70)}, [entry("0", 70, retired=True)]) for k in (0, 2)]
    report = analyze([done[0], lagging, done[1]], "r", now=NOW)
    assert report.groups == [] and report.suspects == [] and report.verdict.startswith("No collective is in flight")
    assert lagging.groups["cpu:0"].completed == 70


def test_ranks_without_a_flight_recorder_are_the_suspects_when_every_other_rank_waits():
    silent = RankView(2, phase="timeout", error="no answer within 30s")
    no_fr = view(3, None, frames=LOOPING_FRAMES, fr_error="no process group")
    report = analyze([waiting_rank(0), waiting_rank(1), silent, no_fr], "r", now=NOW)
    assert report.suspects == [2, 3]
    assert report.collective.unknown == [2, 3]
    assert report.ranks[2].role == "suspect" and report.ranks[2].where == "no answer (timeout: no answer within 30s)"
    assert report.ranks[3].role == "suspect"
    assert "no flight recorder (no process group) while the others wait in gloo:all_reduce" in report.ranks[3].where


def test_a_rank_missing_from_the_report_does_not_hide_the_one_behind():
    silent = RankView(3, phase="dead", error="process gone")
    report = analyze([waiting_rank(0), view(1, {"0": (69, 69)}, frames=LOOPING_FRAMES), silent], "r", now=NOW)
    assert report.suspects == [1]
    assert (report.ranks[2].role, report.ranks[2].where) == ("no answer", "no answer (dead: process gone)")


def test_the_root_of_a_chain_is_the_suspect():
    # rank 3 hangs; rank 2 waits for it in pg 1 (ranks 2,3); ranks 0,1 wait for rank 2 in pg 0.
    r0, r1 = waiting_rank(0), waiting_rank(1)
    r2 = view(2, {"0": (69, 69), "1": (5, 4)}, [entry("1", 5, desc="undefined", created=NOW - 20)])
    r3 = view(3, {"0": (69, 69), "1": (4, 4)}, frames=LOOPING_FRAMES)
    report = analyze([r0, r1, r2, r3], "r", now=NOW)
    assert report.suspects == [3]
    by_pg = {g.process_group: g for g in report.groups}
    assert by_pg["cpu:0"].suspects == [2, 3] and by_pg["cpu:1"].suspects == [3]
    assert report.collective.process_group == "cpu:0"
    assert report.ranks[2].role == "waiting"


def test_every_rank_in_and_none_done_has_no_suspect_and_says_so():
    report = analyze([waiting_rank(k) for k in range(3)], "r", now=NOW)
    assert report.suspects == []
    assert "none completed it" in report.verdict


def test_without_a_creation_time_the_wait_comes_from_the_last_step():
    ranks = [view(k, {"0": (70, 69)}, [entry("0", 70)], last_step_ago=7.5) for k in (0, 1)]
    ranks.append(view(2, {"0": (69, 69)}, frames=LOOPING_FRAMES))
    report = analyze(ranks, "r", now=NOW)
    assert (report.collective.waited_s, report.collective.waited_from) == (7.5, "last step")


def test_nccl_and_cpu_recorders_are_separate_process_groups():
    r0 = view(0, {"0": (10, 9)}, [entry("0", 10, op="nccl:all_reduce", created=NOW - 4)], recorder="nccl")
    r1 = view(1, {"0": (9, 9)}, recorder="nccl", frames=LOOPING_FRAMES)
    report = analyze([r0, r1], "r", now=NOW)
    assert report.suspects == [1] and report.collective.process_group == "nccl:0"
    assert report.collective.op == "nccl:all_reduce"


def test_fallback_without_a_flight_recorder_uses_stacks_and_steps():
    no_fr = "the flight recorder is off (TORCH_FR_BUFFER_SIZE=0 when the process group was created)"
    same_step = [view(0, None, fr_error=no_fr), view(1, None, frames=LOOPING_FRAMES, fr_error=no_fr),
                 view(2, None, fr_error=no_fr)]
    report = analyze(same_step, "r", now=NOW)
    assert report.suspects == [1] and not report.flight_recorder
    assert report.fallback == f"no flight recorder data: {no_fr}"
    assert "rank 1 is not in torch.distributed while the others are" in report.verdict
    behind = [view(0, None, step=21, fr_error=no_fr), view(1, None, step=20, fr_error=no_fr)]
    report = analyze(behind, "r", now=NOW)
    assert report.suspects == [1] and "From step counters: rank 1 is behind step 21." in report.verdict
    # A job that steps is no hang, whatever its step counters say (ranks run apart between collectives).
    stepping = [view(0, None, step=119, last_step_ago=0.1, fr_error=no_fr),
                view(1, None, step=121, last_step_ago=0.2, fr_error=no_fr)]
    report = analyze(stepping, "r", now=NOW)
    assert report.suspects == [] and "No hang: every rank stepped within the last 3 s" in report.verdict


def _answer_hang(registry: Path, out: Path, records: dict, answers: dict[int, dict | None], stop) -> None:
    """Answer the next hang request as each rank's watcher thread would: a stacks dump and a flight
    recorder file per rank in `answers` (rank -> flight recorder document; None: stay silent)."""
    def hang_request() -> dict | None:
        request = read_json(control_path(registry, "r1"))
        return request if request and request.get("kind") == "hang" else None

    wait_for(lambda: stop.is_set() or hang_request(), 20, interval=0.01, what="the CLI's hang request")
    request = hang_request()
    if request is None:  # stopped before the CLI asked
        return
    rid = request["id"]
    for rank, doc in answers.items():
        if doc is None:
            continue
        rank_dir = out / "profile_trace" / f"r1_{rank}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        frames = LOOPING_FRAMES if rank == 1 else WAITING_FRAMES
        stacks = rank_dir / "0_stacks.txt"
        stacks.write_text(f"{HEADER} replica=r1 rank={rank} host=h pid=1 step=20 state=idle request={rid} "
                          f"last_step_at={NOW - 9:.3f} at={NOW:.3f}\n{THREAD_PREFIX}MainThread (ident 1, main)\n"
                          + "".join(f"  {f}\n    call()\n" for f in frames))
        fr = rank_dir / "0_flight_recorder.json"
        fr.write_text(json.dumps(doc))
        update_record(registry, records[rank], stacks_path=str(stacks), history=[
            {"state": "idle", "request_id": rid, "stacks": str(stacks), "flight_recorder": str(fr),
             "flight_recorder_error": None if doc["available"] else doc["reason"]}])


def _fr_doc(entered: int, completed: int, created: float | None = None) -> dict:
    return {"available": True, "reason": None, "cosmos_profiler": {"dumped_at": NOW}, "recorders": {"cpu": {
        "pg_status": {"0": {"last_enqueued_collective": str(entered), "last_completed_collective": str(completed)}},
        "entries": [entry("0", entered, created=created)]}}}


def test_profile_hang_cli_names_a_silent_rank_when_the_others_all_wait(tmp_path):
    reg, out = tmp_path / "reg", tmp_path / "out"
    records = {k: alive_record(reg, "r1", k, world_size=4, step=20) for k in range(4)}
    answers = {0: _fr_doc(70, 69, NOW - 9), 1: _fr_doc(70, 69, NOW - 8), 2: _fr_doc(70, 69, NOW - 9), 3: None}
    stop = threading.Event()
    fake = threading.Thread(target=_answer_hang, args=(reg, out, records, answers, stop))
    fake.start()
    try:
        result = invoke("profile", "hang", "r1", "--registry", str(reg), "--timeout", "2", "--json")
    finally:
        stop.set()
        fake.join(10)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["suspects"] == [3] and answer["collective"]["unknown"] == [3]
    assert answer["collective"]["waiting"] == [0, 1, 2] and answer["collective"]["waited_s"] == 9.0
    rank3 = answer["ranks"][3]
    assert rank3["role"] == "suspect" and rank3["where"].startswith("no answer (timeout: the watcher thread did not answer within 2s")
    assert answer["ranks"][0]["last_step_at"] == round(NOW - 9, 3)
