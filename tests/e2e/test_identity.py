"""Identity without surprises, with real processes: two jobs under one replica name,
torchrun without --rdzv-id, and replica names from the environment that are not valid."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from sidecar.common.identity import host_name
from sidecar.common.layout import SUMMARY_FILE_RE, record_path
from sidecar.common.recordscan import read_records
from sidecar.common.registry import list_replicas
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env, torchrun_cmd
from support.records import wait_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

FAST = """\
[profiler]
enable_profiler = true
[sidecar]
heartbeat_interval = 0.2
"""
SAVED = re.compile(r"\[Profiler\] save trace for rank: 0 to file: (\S+) after")


def cli(registry: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, "-m", "cosmos_rl.cli.cli", *args, "--registry", str(registry)],
                          capture_output=True, text=True, timeout=120, env=base_env(), cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _saved(proc) -> list[str]:
    return SAVED.findall(proc.stderr())


# Proves: two live jobs under one replica name and rank, writing one output dir,
# keep every trace (numbers claimed on disk), are each told at start or at their
# next heartbeat, and `replica ls` shows the conflict until one of them exits.
def test_two_jobs_under_one_name_keep_every_trace_and_see_the_conflict(spawn, tmp_path, registry):
    config = tmp_path / "fast.toml"
    config.write_text(FAST)
    out = tmp_path / "out"
    env = base_env(registry, COSMOS_PROFILER_REPLICA="same")
    args = ["--output", str(out), "--config", str(config)]
    first = spawn("first", args, env)
    first.wait_ready()
    wait_for(lambda: (read_json(record_path(registry, "same", 0)) or {}).get("pid") == first.pid, what="first's record")
    second = spawn("second", args, env)
    second.wait_ready()
    here = host_name()

    # The second is told at start, the first at its next heartbeat; one line each.
    told = "[Profiler] replica same rank 0 is also held by a live process of another job"
    wait_for(lambda: told in second.stderr(), what="the warning of the second job")
    line = next(line for line in second.stderr().splitlines() if told in line)
    assert f"(pid:{here}:{first.pid}; this one is pid:{here}:{second.pid}): pid {first.pid} on {here}." in line
    wait_for(lambda: f"{told} (pid:{here}:{second.pid}; " in first.stderr(), what="the warning of the first job")

    def conflict_listed():
        data = json.loads(cli(registry, "replica", "ls", "--json").stdout)["replicas"]
        return data if data[0]["conflicts"] else None

    data = wait_for(conflict_listed, what="replica ls to show the conflict")
    assert [r["replica"] for r in data] == ["same"]
    (conflict,) = data[0]["conflicts"]
    assert conflict["rank"] == 0 and conflict["host"] == here and conflict["pid"] in (first.pid, second.pid)
    assert conflict["job"] == f"pid:{here}:{conflict['pid']}"
    table = wait_for(lambda: (t := cli(registry, "replica", "ls").stdout) and "CONFLICT" in t and t,
                     what="the CONFLICT column")
    assert re.search(r"rank 0: also held by pid \d+ on ", table.splitlines()[1]), table

    # Captures alternate: 0 by the first job, 1 by the second, 2 by the first again.
    # A per-process counter would give the first job's second trace number 1 again.
    first.signal()
    wait_for(lambda: len(_saved(first)) == 1, 60, what="the first job's trace")
    second.signal()
    wait_for(lambda: len(_saved(second)) == 1, 60, what="the second job's trace")
    # The first job logs its save a moment before it is idle again, and a busy rank refuses a signal.
    wait_record(registry, lambda r: r["pid"] == first.pid and r["num_captures"] == 1 and r["state"] == "idle", "same",
                what="a record of the first job, idle after its capture")
    first.signal()
    wait_for(lambda: len(_saved(first)) == 2, 60, what="the first job's second trace")
    trace_dir = out / "profile_trace" / "same_0"
    assert _saved(first) == [str(trace_dir / "0_trace.json.gz"), str(trace_dir / "2_trace.json.gz")]
    assert _saved(second) == [str(trace_dir / "1_trace.json.gz")]
    # beside each trace, at most its summary (sidecar.rank.summarizer), named by the trace's own n
    assert sorted(p.name for p in trace_dir.iterdir() if not SUMMARY_FILE_RE.match(p.name)) == [
        f"{n}_trace.json.gz" for n in range(3)]
    writers = [load_trace(trace_dir / f"{n}_trace.json.gz")["cosmos_profiler"]["pid"] for n in range(3)]
    assert writers == [first.pid, second.pid, first.pid]
    assert all(profiler_steps(load_trace(trace_dir / f"{n}_trace.json.gz")) for n in range(3))

    # The second job exits: the first says the conflict is over, and ls stops showing it.
    assert second.stop() == 0
    # Why it is over depends on timing: "(it exited)" when the first job reads the second's last record,
    # "(it has not written the record for 10s)" when its own write replaced that record first.
    wait_for(lambda: f"the conflict with pid {second.pid} on {here} is over (" in first.stderr(),
             what="the first job to see the conflict end")
    wait_for(lambda: json.loads(cli(registry, "replica", "ls", "--json").stdout)["replicas"][0]["conflicts"] == [],
             what="replica ls without the conflict")
    assert "CONFLICT" not in cli(registry, "replica", "ls").stdout
    assert first.stop() == 0


# Proves: TORCHELASTIC_RUN_ID=exp/42 does not stop training: the name is made safe,
# and one log line names the variable.
def test_an_invalid_replica_name_from_the_environment_is_made_safe(spawn, tmp_path, registry):
    env = base_env(registry, TORCHELASTIC_RUN_ID="exp/42")
    proc = spawn("exp", ["--output", str(tmp_path / "out")], env)
    proc.wait_ready()
    wait_for(lambda: read_records(registry, "exp-42"), what="a record under exp-42")
    assert list_replicas(registry) == ["exp-42"]
    assert proc.stop() == 0
    warnings = [line for line in proc.stderr().splitlines() if "TORCHELASTIC_RUN_ID" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "[Profiler] TORCHELASTIC_RUN_ID='exp/42' is not a valid replica name "
        "(1-200 letters, digits and ._- , starting with a letter or digit); using replica name 'exp-42'"
    ), proc.stderr()
    assert "Traceback" not in proc.stderr()


# Proves: without --rdzv-id (TORCHELASTIC_RUN_ID=none) the ranks of one torchrun job
# form one replica, named for the store endpoint they share, and profile as one.
def test_torchrun_without_rdzv_id_is_one_replica(spawn, tmp_path, registry):
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    proc = spawn("norun", [], env, program=torchrun_cmd(2, None))
    wait_for(lambda: sum(len(read_records(registry, n)) for n in list_replicas(registry)) == 2 if registry.is_dir()
             else False, 120, what="two rank records")
    data = json.loads(cli(registry, "replica", "ls", "--json").stdout)["replicas"]
    assert [(r["num_ranks"], r["num_alive"]) for r in data] == [(2, 2)], data
    name = data[0]["replica"]
    records = read_records(registry, name)
    master = re.fullmatch(r"rdzv-(.+)-(\d+)", name)
    assert master, name
    assert {r.job for r in records} == {f"rdzv:{master.group(1)}@{host_name()}:{master.group(2)}"
                                         if master.group(1) == "localhost" else f"rdzv:{master.group(1)}:{master.group(2)}"}
    done = cli(registry, "profile", "set", name, "-rf", "all", "--wait", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    recs = {r.rank: r for r in read_records(registry, name)}
    assert profiler_steps(load_trace(recs[0].trace_path)) == profiler_steps(load_trace(recs[1].trace_path))
    assert proc.stop(timeout=120) == 0
