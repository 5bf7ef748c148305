"""`profile hang`: the analysis on small hand-written flight recorder dumps, and a real 4-rank gloo job
where one rank stops calling collectives."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from sidecar.common.layout import control_path
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from sidecar.common.stackdump import HEADER, THREAD_PREFIX
from sidecar.fleet.hang import RankView, analyze, group_states
from support.cli import invoke
from support.files import read_json
from support.launch import PYTHON, base_env, torchrun_cmd
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


# --- a real 4-rank gloo job ---------------------------------------------------------------------


def _hang_cli(registry: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", "profile", "hang", name, "--registry", str(registry), *args],
                          capture_output=True, text=True, timeout=120, env=base_env())


def _hung_job(spawn, tmp_path, registry, name: str, nproc: int, hang_rank: int, **env_extra: str):
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1", **env_extra)
    proc = spawn(name, ["--hang-at", "20", "--hang-rank", str(hang_rank)], env, program=torchrun_cmd(nproc, name))
    wait_for(lambda: "HANGING" in proc.stdout(), timeout=120, what=f"rank {hang_rank} to wander off")
    wait_for(lambda: len(r := read_records(registry, name)) == nproc and all(x.step == 20 for x in r), timeout=60,
             what="every rank at step 20")
    return proc


def test_profile_hang_names_the_rank_that_stopped_calling_collectives(spawn, tmp_path, registry):
    proc = _hung_job(spawn, tmp_path, registry, "hang4", 4, hang_rank=2)

    def settled():  # the three others have entered the step's all_reduce
        done = _hang_cli(registry, "hang4", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        return answer if answer["collective"] and answer["collective"]["waiting"] == [0, 1, 3] else None

    answer = wait_for(settled, timeout=60, interval=0.5, what="ranks 0,1,3 waiting in a collective")
    assert answer["suspects"] == [2] and answer["replica"] == "hang4" and answer["flight_recorder"] is True
    c = answer["collective"]
    seq = c["seq"]
    assert (c["op"], c["process_group"], c["desc"], c["behind"]) == ("gloo:all_reduce", "cpu:0", "default_pg", [2])
    assert c["input_sizes"] == [[1]] and c["waited_from"] == "flight recorder" and c["waited_s"] >= 0
    assert c["positions"] == [{"rank": k, "entered": seq - (k == 2), "completed": seq - 1} for k in range(4)]
    ranks = {r["rank"]: r for r in answer["ranks"]}
    assert [ranks[k]["role"] for k in range(4)] == ["waiting", "waiting", "suspect", "waiting"]
    assert ranks[2]["suspect"] is True and "in wandered_off" in ranks[2]["main_stack"][-1]
    assert all(ranks[k]["in_flight"][0]["seq"] == seq for k in (0, 1, 3)) and ranks[2]["in_flight"] == []
    for k in range(4):
        assert ranks[k]["step"] == 20 and ranks[k]["since_last_step_s"] >= 0
        assert Path(ranks[k]["flight_recorder_path"]).name.endswith("_flight_recorder.json")
        assert Path(ranks[k]["flight_recorder_path"]).parent.name == f"hang4_{k}"

    done = _hang_cli(registry, "hang4")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("Replica hang4: Rank 2 is the suspect.")
    assert f"Ranks 0-1,3 wait in gloo:all_reduce (pg 0 default_pg, seq {seq}) for " in text
    assert f"Suspect rank 2 on {ranks[2]['host']} (step 20" in text
    assert f"has not entered gloo:all_reduce (pg 0 default_pg, seq {seq}; it entered up to seq {seq - 1})" in text
    assert "in wandered_off (ddp_train.py:" in text
    assert 'ddp_train.py", line ' in text and "in wandered_off\n" in text
    assert f"ranks 0-1,3 {seq}/{seq - 1} · rank 2 {seq - 1}/{seq - 1}" in text

    # `echo '{"kind": "hang"}' > control/hang4.json` does the same without the CLI: every rank (no rank_filter)
    write_request(registry, "hang4", {"kind": "hang", "id": "by-hand"})

    def answered():
        entries = [next((h for h in r.history if h.get("request_id") == "by-hand"), None)
                   for r in read_records(registry, "hang4")]
        return all(entries) and entries

    for entry in wait_for(answered, timeout=60, what="every rank's answer to the hand-written request"):
        assert entry["stacks"].endswith("_stacks.txt") and entry["flight_recorder_error"] is None
        doc = json.loads(Path(entry["flight_recorder"]).read_text())
        assert doc["available"] is True and doc["cosmos_profiler"]["request"] == "by-hand"
    proc.kill()


def test_profile_hang_without_a_flight_recorder_falls_back_to_stacks(spawn, tmp_path, registry):
    proc = _hung_job(spawn, tmp_path, registry, "nofr", 2, hang_rank=1, TORCH_FR_BUFFER_SIZE="0")

    def settled():
        done = _hang_cli(registry, "nofr", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        return answer if answer["suspects"] == [1] else None

    answer = wait_for(settled, timeout=60, interval=0.5, what="rank 0 in all_reduce and rank 1 outside")
    assert answer["flight_recorder"] is False and answer["collective"] is None
    assert answer["fallback"] == ("no flight recorder data: the flight recorder is off "
                                  "(TORCH_FR_BUFFER_SIZE=0 when the process group was created)")
    ranks = {r["rank"]: r for r in answer["ranks"]}
    assert "in wandered_off" in ranks[1]["main_stack"][-1]
    assert any("all_reduce" in f for f in ranks[0]["main_stack"])
    done = _hang_cli(registry, "nofr")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Replica nofr: From stacks: rank 1 is not in torch.distributed while the others are.")
    assert "(no flight recorder data: the flight recorder is off (TORCH_FR_BUFFER_SIZE=0" in done.stdout
    assert "main thread, innermost last:" in done.stdout and "in wandered_off" in done.stdout
    assert "  Rank 0 waits in torch.distributed, " in done.stdout and [r["role"] for r in answer["ranks"]] == [
        "waiting", "suspect"]
    proc.kill()


def test_a_stall_in_a_real_job_dumps_each_ranks_stacks_and_flight_recorder(spawn, tmp_path, registry):
    # Nobody asks: with stall_after_s on, each rank that stops stepping dumps once by itself.
    proc = _hung_job(spawn, tmp_path, registry, "stall2", 2, hang_rank=1, COSMOS_PROFILER_STALL_AFTER_S="1")
    records = wait_for(lambda: (r := read_records(registry, "stall2")) and all(
        x.state == "stalled" and (x.stall or {}).get("flightrec_path") for x in r) and r,
        timeout=60, what="both ranks stalled, with their flight recorders dumped")
    for rec in records:
        doc = json.loads(Path(rec.stall["flightrec_path"]).read_text())
        assert doc["available"] is True and doc["cosmos_profiler"]["stall_step"] == 20, doc.get("reason")
        assert Path(rec.stall["flightrec_path"]).name.endswith("_flight_recorder.json")
        assert Path(rec.stall["stacks_path"]).parent == Path(rec.stall["flightrec_path"]).parent
    by_rank = {rec.rank: rec for rec in records}
    frames = Path(by_rank[1].stall["stacks_path"]).read_text()
    assert "in wandered_off" in frames  # the one that left; rank 0 waits in all_reduce
    assert "in all_reduce" in Path(by_rank[0].stall["stacks_path"]).read_text()
    proc.kill()


def test_a_rank_without_a_process_group_writes_the_reason_and_its_stacks(spawn, registry):
    proc = spawn.rank(registry, "--hang-at", "5", replica="solo")
    wait_for(lambda: "HANGING" in proc.stdout(), what="the main thread to block")

    def stuck_long_enough():  # within hang.STEPPING_S of its last step, a rank counts as stepping
        done = _hang_cli(registry, "solo", "--json")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        return None if answer["verdict"].startswith("No hang: ") else answer

    answer = wait_for(stuck_long_enough, timeout=60, interval=1, what="a verdict on a rank stuck for 3 s")
    (rank,) = answer["ranks"]
    assert rank["flight_recorder_error"].startswith("no process group: torch.distributed is not ")
    assert answer["fallback"] == f"no flight recorder data: {rank['flight_recorder_error']}"
    assert answer["suspects"] == [] and answer["verdict"] == "Stacks and step counters alike on every rank: no suspect."
    assert "in stuck_in_a_long_call" in rank["main_stack"][-1] and rank["step"] == 5
    doc = json.loads(Path(rank["flight_recorder_path"]).read_text())  # the file holds the reason too
    assert (doc["available"], doc["reason"], doc["cosmos_profiler"]["step"]) == (False, rank["flight_recorder_error"], 5)
    proc.kill()


# --- the CLI over hand-written ranks (no torch job) ------------------------------------------


def _answer_hang(registry: Path, out: Path, records: dict, answers: dict[int, dict | None], stop) -> None:
    """Answer the next hang request as each rank's watcher thread would: a stacks dump and a flight
    recorder file per rank in `answers` (rank -> flight recorder document; None: stay silent)."""
    while not stop.is_set():
        request = read_json(control_path(registry, "r1"))
        if request and request.get("kind") == "hang":
            break
        stop.wait(0.01)
    else:
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
