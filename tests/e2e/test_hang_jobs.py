"""`profile hang` and the stall dump against real gloo jobs (torchrun) where one rank stops calling
collectives. The analysis on hand-written dumps is tests/unit/test_hang.py's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from support.launch import PYTHON, base_env, torchrun_cmd
from support.wait import wait_for


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


def test_a_rank_asked_through_faulthandler_still_sends_its_flight_recorder_once_it_runs_again(spawn, tmp_path,
                                                                                               registry):
    """The rank that left holds the GIL when `profile hang` asks: the CLI takes its faulthandler stacks,
    which carry no flight recorder; once the rank runs Python again, its watcher's answer (with the
    flight recorder) replaces them, and the rank is named from its position, not for want of data."""
    fifo = tmp_path / "gil.fifo"
    os.mkfifo(fifo)
    config = tmp_path / "job.toml"
    config.write_text("[profiler]\nenable_profiler = true\n[sidecar]\nheartbeat_interval = 0.5\n")
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    proc = spawn("late2", ["--hang-at", "20", "--hang-rank", "1", "--gil-fifo", str(fifo), "--config", str(config)],
                 env, program=torchrun_cmd(2, "late2"))
    wait_for(lambda: "HOLDING" in proc.stdout(), timeout=120, what="rank 1 to hold the GIL")
    cli = subprocess.Popen([PYTHON, "-m", "sidecar", "profile", "hang", "late2", "--registry", str(registry), "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=base_env(COSMOS_PROFILER_STACKS_FALLBACK_S="0.5"))
    try:
        dumped = registry / "replicas" / "late2" / "rank-1.faulthandler.txt"
        wait_for(lambda: dumped.is_file() and "File " in dumped.read_text(errors="replace"), timeout=60,
                 what="rank 1's faulthandler dump")
        with open(fifo, "wb") as f:  # let the rank run Python again
            f.write(b"x")
        out, err = cli.communicate(timeout=120)
    finally:
        cli.kill()
    assert cli.returncode == 0, out + err
    answer = json.loads(out)
    ranks = {r["rank"]: r for r in answer["ranks"]}
    assert ranks[1]["flight_recorder_error"] is None, ranks[1]
    assert Path(ranks[1]["flight_recorder_path"]).name.endswith("_flight_recorder.json")
    assert not ranks[1]["stacks_path"].endswith(".faulthandler.txt")
    assert "in wandered_off" in ranks[1]["main_stack"][-1]
    assert answer["suspects"] == [1] and answer["collective"]["behind"] == [1], json.dumps(answer)[:3000]
    assert answer["collective"]["waiting"] == [0]
