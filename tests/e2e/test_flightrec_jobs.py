"""The flight recorder in real processes: `sidecar.run` sets a default buffer size before the script
runs, and `sidecar.rank.flightrec.dump` reads it in-process from a side thread."""

from __future__ import annotations

import json
import subprocess

import pytest

from support.launch import PYTHON, ROOT, base_env, free_port

SHOW_ENV = "import os; print('FR', os.environ.get('TORCH_FR_BUFFER_SIZE'), os.environ.get('TORCH_NCCL_TRACE_BUFFER_SIZE'))"


@pytest.mark.parametrize(("user", "shown"), [
    ({}, "FR 2000 None"),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, "FR None 50"),
    ({"TORCH_FR_BUFFER_SIZE": "0"}, "FR 0 None"),
])
def test_sidecar_run_sets_a_default_before_the_script_runs(tmp_path, registry, user, shown):
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV + "\n")
    done = subprocess.run([PYTHON, "-m", "sidecar.run", "--replica", "env", "--output", str(tmp_path / "out"),
                           str(script)], capture_output=True, text=True, timeout=120,
                          env=base_env(registry, **user), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert shown in done.stdout.splitlines(), done.stdout


DUMP_SCRIPT = """
import json, sys, threading
import torch, torch.distributed as dist
from sidecar.rank import flightrec
from tests.support.wait import wait_for
out = sys.argv[1]
print("BEFORE", json.dumps(flightrec.dump(out + "/before.json", {"rank": 0})))
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s", rank=0, world_size=1)
t = torch.ones(3)
for _ in range(3):
    dist.all_reduce(t)
# gloo retires an entry on its own thread, a moment after all_reduce returns. Not pg_status's
# last_completed_collective: gloo's worker threads race to set it, and it can stay at "2" for good.
entries = lambda: json.loads(torch._C._distributed_c10d._dump_fr_trace_json())["entries"]
wait_for(lambda: len(entries()) == 3 and all(e["retired"] for e in entries()), 90, interval=0.01,
         what="gloo to retire the 3 all_reduces")
result = []
side = threading.Thread(target=lambda: result.append(flightrec.dump(out + "/after.json", {"rank": 0, "step": 3})))
side.start(); side.join()
print("AFTER", json.dumps(result[0]))
dist.destroy_process_group()
"""


def test_dump_reads_the_flight_recorder_in_process_from_a_side_thread(tmp_path):
    done = subprocess.run([PYTHON, "-c", DUMP_SCRIPT % free_port(), str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=base_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("BEFORE", "AFTER")))
    assert json.loads(lines["BEFORE"]) == [False, "no process group: torch.distributed is not initialized in this process"]
    before = json.loads((tmp_path / "before.json").read_text())
    assert before["available"] is False and before["reason"].startswith("no process group")
    assert json.loads(lines["AFTER"]) == [True, ""]
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["available"] is True and after["cosmos_profiler"]["step"] == 3
    assert after["cosmos_profiler"]["torch"].startswith("2.")
    cpu = after["recorders"]["cpu"]
    status = cpu["pg_status"]["0"]
    assert status["last_enqueued_collective"] == "3" and status["last_completed_collective"] in ("2", "3"), status
    assert [(e["profiling_name"], e["collective_seq_id"], e["retired"]) for e in cpu["entries"]] == [
        ("gloo:all_reduce", seq, True) for seq in (1, 2, 3)]
