"""kind "stacks" dumps every thread's stack from the watcher thread, even while training is stuck;
kind "memory" is refused without CUDA. The dump's format: tests/unit/test_stackdump.py."""

from __future__ import annotations

from pathlib import Path

from sidecar.common.layout import record_path
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from sidecar.common.stackdump import parse_stacks
from support.files import read_json
from support.launch import base_env, torchrun_cmd
from support.wait import wait_for


def test_stacks_of_a_rank_whose_main_thread_is_stuck(spawn, tmp_path, registry):
    proc = spawn("r1", ["--replica", "r1", "--output", str(tmp_path / "out"), "--hang-at", "30"], base_env(registry))
    proc.wait_ready()
    wait_for(lambda: "HANGING" in proc.stdout(), what="the main thread to block")
    write_request(registry, "r1", {"id": "why-stuck", "kind": "stacks"})
    rec = wait_for(lambda: (r := read_json(record_path(registry, "r1", 0))) and r.get("stacks_path") and r)
    text = Path(rec["stacks_path"]).read_text()
    main = next(s for s in parse_stacks(text) if s.name == "MainThread")
    assert "in stuck_in_a_long_call" in main.frames[-1]
    assert rec["stacks_path"].endswith("r1_0/0_stacks.txt")
    assert rec["step"] == 30 and rec["state"] == "idle"
    assert "cosmos-profiler-heartbeat" in text
    proc.kill()


def test_stacks_find_the_rank_that_hangs_a_collective(spawn, tmp_path, registry):
    cmd = torchrun_cmd(2, "hang")
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    proc = spawn("hang", ["--hang-at", "20", "--hang-rank", "1"], env, program=cmd)
    wait_for(lambda: "HANGING" in proc.stdout(), timeout=120, what="rank 1 to wander off")
    write_request(registry, "hang", {"id": "who", "kind": "stacks", "rank_filter": "all"})
    recs = wait_for(lambda: (r := read_records(registry, "hang")) and len(r) == 2 and all(x.stacks_path for x in r) and r,
                    timeout=60, what="both ranks' stacks")
    mains = {r.rank: next(s for s in parse_stacks(Path(r.stacks_path).read_text()) if s.name == "MainThread") for r in recs}
    assert "in wandered_off" in mains[1].frames[-1]
    assert any("all_reduce" in f for f in mains[0].frames), mains[0].frames[-3:]
    proc.kill()


def test_memory_kind_is_refused_without_cuda(spawn, tmp_path, registry):
    proc = spawn("r1", ["--replica", "r1", "--output", str(tmp_path / "out")], base_env(registry))
    proc.wait_ready()
    wait_for(lambda: read_json(record_path(registry, "r1", 0)), what="record")
    write_request(registry, "r1", {"id": "mem", "kind": "memory"})
    rec = wait_for(lambda: (r := read_json(record_path(registry, "r1", 0))) and r.get("refused") and r)
    assert "kind 'memory' needs CUDA" in rec["refused"] and rec["state"] == "idle"
    assert proc.stop() == 0
