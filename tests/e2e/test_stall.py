"""The stall watch (`[sidecar] stall_after_s`) in real training processes: a rank that stops stepping
dumps its stacks once per stall, marks its record `stalled` (which `replica ls`/`lsr` show) and logs
where the dump is; a healthy job with the watch on writes nothing. Its rules:
tests/unit/test_stall_rules.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sidecar.common.stackdump import read_stacks
from support.cli import invoke
from support.records import wait_record
from support.wait import wait_for

FAST_HEARTBEAT = "[sidecar]\nheartbeat_interval = 0.2\n"


def _config(tmp_path: Path) -> str:
    path = tmp_path / "job.toml"
    path.write_text(FAST_HEARTBEAT)
    return str(path)


def _main_frames(path: str) -> tuple[dict[str, str], list[str], str]:
    header, threads, main = read_stacks(path)
    assert main is not None, Path(path).read_text()
    return header, list(threads[main].frames), "\n".join(t.name for t in threads)


def _stall_lines(proc) -> list[str]:
    return [line for line in proc.stderr().splitlines() if " stalled (stall_after_s=" in line]


def _replica_state(registry: Path) -> str:
    data = json.loads(invoke("replica", "ls", "--registry", str(registry), "--json").stdout)
    return data["replicas"][0]["state"]


def test_a_rank_that_stops_stepping_is_stalled_once_until_it_steps_again(spawn, registry, tmp_path):
    release = tmp_path / "release"  # the pause lasts until the test has seen the stall (it was 6 s and hoped)
    proc = spawn.rank(registry, "--config", _config(tmp_path), "--pause-at", "30", "--pause-until-file", str(release),
                      env_extra={"COSMOS_PROFILER_STALL_AFTER_S": "1"})
    rec = wait_record(registry, lambda r: r["state"] == "stalled", what="the stalled record")
    stall = rec["stall"]
    assert rec["stall_after_s"] == 1.0 and rec["step"] == 30
    assert (stall["step"], stall["gil_held"], stall["ended_at"]) == (30, False, None) and stall["seconds"] >= 1.0
    header, frames, names = _main_frames(stall["stacks_path"])
    assert frames[-1].endswith(", in paused") and 'programs/train.py", line' in frames[-1]
    assert (header["request"], header["source"], header["step"]) == ("stall-30", "watcher", "30")
    assert "cosmos-profiler-heartbeat" in names
    assert Path(stall["stacks_path"]).name == "0_stacks.txt"

    assert _replica_state(registry) == "stalled"
    ls = invoke("replica", "ls", "--registry", str(registry)).stdout.splitlines()
    assert ls[1].split()[4] == "stalled"
    lsr = invoke("replica", "lsr", "r1", "--registry", str(registry), "--json").stdout
    assert [r["state"] for r in json.loads(lsr)["ranks"]] == ["stalled"]
    wait_for(lambda: _stall_lines(proc), what="the stall's log line")
    line = _stall_lines(proc)[0]
    assert "[Profiler] rank 0 stalled (stall_after_s=1): no training step for " in line
    assert f"s after step 30; stacks saved to {stall['stacks_path']}; no flight recorder (" in line

    release.touch()
    rec = wait_record(registry, lambda r: r["state"] == "idle" and r["step"] > 30, timeout=60,
                      what="the record back to idle once steps resume")
    assert rec["stall"]["ended_at"] is not None and rec["stall"]["seconds"] >= stall["seconds"]
    assert re.search(r"\[Profiler\] rank 0 is stepping again \(step \d+\) after a stall of [\d.]+s at step 30\n",
                     proc.stderr())
    assert proc.stop() == 0
    assert len(_stall_lines(proc)) == 1
    assert sorted(p.name for p in (tmp_path / "out" / "profile_trace" / "r1_0").glob("*_stacks.txt")) == ["0_stacks.txt"]


def test_a_stall_with_the_gil_held_is_dumped_by_faulthandler_and_reported_when_it_ends(spawn, registry, tmp_path):
    proc = spawn.rank(registry, "--config", _config(tmp_path), "--gil-at", "30", "--gil-s", "5",
                      env_extra={"COSMOS_PROFILER_STALL_AFTER_S": "1"})
    wait_for(lambda: "RELEASED" in proc.stdout(), timeout=90, what="the C call to return")
    rec = wait_record(registry, lambda r: r["state"] == "idle" and (r.get("stall") or {}).get("ended_at"),
                      what="the stall, over")
    stall = rec["stall"]
    # The watch thread could not run during the call: it saw the stall when the GIL came back, either
    # still at step 30 or (the training thread first) after the steps resumed, knowing the last step it saw.
    assert stall["gil_held"] is True and 0 < stall["step"] <= 30
    header, frames, names = _main_frames(stall["stacks_path"])
    assert frames[-1].endswith(", in held_the_gil") and 'programs/train.py", line' in frames[-1]
    assert header["source"] == "faulthandler" and "cosmos-profiler-heartbeat" in names
    wait_for(lambda: _stall_lines(proc), what="the stall's log line")
    line = _stall_lines(proc)[0]
    assert "[Profiler] rank 0 stalled (stall_after_s=1): no Python thread ran for " in line
    assert (f"(a C call held the GIL), between step {stall['step']} (the last the watch saw) and step "
            f"{stall.get('resumed_step')} (where it is stepping again)") in line or \
        "after step 30 (a C call held the GIL)" in line
    assert f"faulthandler's dump rewritten with thread names; stacks saved to {stall['stacks_path']}" in line
    assert proc.stop() == 0
    assert len(_stall_lines(proc)) == 1
    assert len(list((tmp_path / "out" / "profile_trace" / "r1_0").glob("*_stacks.txt"))) == 1


def test_a_rank_frozen_in_a_c_call_shows_as_stalled_and_its_dump_is_on_disk(spawn, registry, tmp_path):
    proc = spawn.rank(registry, "--config", _config(tmp_path), "--gil-at", "30",
                      env_extra={"COSMOS_PROFILER_STALL_AFTER_S": "1"})
    wait_for(lambda: "HOLDING" in proc.stdout(), what="the C call")
    dump = registry / "replicas" / "r1" / "rank-0.faulthandler.txt"
    text = wait_for(lambda: "in held_the_gil" in (t := dump.read_text()) and t, what="faulthandler's timer dump")
    assert text.startswith("Timeout (0:00:03)!\n")
    assert wait_for(lambda: _replica_state(registry) == "stalled", what="replica ls to say stalled")
    lsr = json.loads(invoke("replica", "lsr", "r1", "--registry", str(registry), "--json").stdout)
    assert [(r["state"], r["alive"]) for r in lsr["ranks"]] == [("stalled", True)]
    assert "RELEASED" not in proc.stdout()


def test_a_healthy_job_with_the_watch_on_writes_nothing(spawn, registry, tmp_path):
    proc = spawn.rank(registry, "--config", _config(tmp_path), env_extra={"COSMOS_PROFILER_STALL_AFTER_S": "2"})
    wait_record(registry, lambda r: r["step"] >= 400, timeout=120, what="400 steps (two stall periods or more)")
    assert proc.stop() == 0
    assert not (tmp_path / "out").exists()  # no trace dir: nothing was dumped
    assert sorted(p.name for p in (registry / "replicas" / "r1").iterdir()) == ["rank-0.json"]  # the empty dump file went at close
    assert not _stall_lines(proc) and "stepping again" not in proc.stderr()
    rec = wait_record(registry, lambda r: r.get("exited_at"))
    assert (rec["stall_after_s"], rec["stall"]) == (2.0, None)
