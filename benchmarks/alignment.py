"""7. Aligned starts under changing speed: how many captures start late on some rank.

A real 8-rank torchrun job on gloo (tests/programs/ddp_train.py, a small DDP
model) whose step time changes about 5x every `PERIOD_S` seconds of wall time,
in both directions (sleep 5 ms, then 100 ms, then 5 ms, ...). The parent runs
`python -m cosmos_rl.cli.cli profile set NAME -rf all --wait --json` back to
back, with the default start step (the CLI's lead), and checks each capture:
it is misaligned when any rank recorded `misaligned: true`, started at another
step than the one the CLI chose, or saved other `ProfilerStep#` numbers than
the other ranks. Value = misaligned captures / captures.

tests/e2e/test_distributed.py runs a shorter version of this and asserts zero.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CLI_MODULE, PYTHON, ROOT, Row, child_env, stop_child, wait_for
from benchmarks.common import main as bench_main
from sidecar.common.recordscan import read_records

BENCH = "7 aligned starts"
DDP = ROOT / "tests" / "programs" / "ddp_train.py"
REPLICA = "bench-align"
NPROC = 8
SLOW = (0.15, 5.0)  # (step sleep, seconds): slow steps for 5 s,
FAST = (0.005, 2.5)  # then steps about 5x faster for 2.5 s, and again
MAX_PAUSE_S = 3.0  # a random pause before each capture: a user comes at any time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profiler_steps(path: str) -> dict[int, float]:
    """{N: duration in ms} of every `ProfilerStep#N` span in a gzipped Chrome trace."""
    with gzip.open(path, "rb") as f:
        trace = json.load(f)
    steps = {}
    for event in trace["traceEvents"]:
        match = re.fullmatch(r"ProfilerStep#(\d+)", str(event.get("name", "")))
        if match and event.get("ph") == "X":
            steps[int(match.group(1))] = float(event.get("dur", 0.0)) / 1000.0
    return steps


def check_capture(done: dict[str, Any]) -> tuple[bool, str]:
    """(aligned, why not) for one `profile set --wait --json` answer."""
    start = done["start_step"]
    captures = done["ranks"]  # each rank's capture (docs/json.md)
    problems = []
    late = [c["rank"] for c in captures if c["misaligned"] or c["capture_start_step"] != start]
    if late:
        starts = {c["rank"]: c["capture_start_step"] for c in captures if c["rank"] in late}
        problems.append(f"start step {start}, ranks started at {starts}")
    steps = {c["rank"]: sorted(profiler_steps(c["trace_path"])) for c in captures if c["trace_path"]}
    if len({tuple(s) for s in steps.values()}) > 1:
        problems.append(f"ProfilerStep numbers differ: {steps}")
    return not problems, "; ".join(problems)


def start_job(work: Path, nproc: int = NPROC) -> tuple[subprocess.Popen, Path, Path]:
    """The torchrun job; returns (process, registry, stop file)."""
    registry, stop = work / "registry", work / "stop"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", REPLICA,
           "--monitor-interval", "0.5", str(DDP), "--stop-file", str(stop),
           "--speed-schedule", f"{SLOW[0]}:{SLOW[1]},{FAST[0]}:{FAST[1]}"]
    env = child_env(COSMOS_PROFILER_DIR=str(registry), COSMOS_PROFILER_OUTPUT_DIR=str(work / "out"),
                    OMP_NUM_THREADS="1")
    if os.environ.get("BENCH_ALIGNMENT_PATH") == "ondemand":
        # every rank starts as the startup hook makes it: captures on kineto's on-demand path (docs/ondemand.md)
        env["COSMOS_PROFILER_SIDECAR"] = "1"
    log = open(work / "job.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    wait_for(lambda: len(r := read_records(registry, REPLICA)) == nproc and all(x.step > 0 for x in r),
             timeout=180, interval=0.2, what=f"{nproc} ranks stepping")
    return proc, registry, stop


def run(quick: bool) -> list[Row]:
    num = 8 if quick else 20
    work = Path(tempfile.mkdtemp(prefix="bench-align-"))
    rng = random.Random(7)
    proc, registry, stop = start_job(work)
    misaligned, notes, leads, step_ms = 0, [], [], []
    try:
        for _ in range(num):
            time.sleep(rng.uniform(0.0, MAX_PAUSE_S))
            done = subprocess.run([PYTHON, "-m", CLI_MODULE, "profile", "set", REPLICA, "-rf", "all", "--wait",
                                   "--timeout", "120", "--json", "--registry", str(registry)],
                                  capture_output=True, text=True, env=child_env(), timeout=180)
            if done.returncode != 0:
                raise RuntimeError(f"profile set failed ({done.returncode}): {done.stderr[-2000:]}")
            answer = json.loads(done.stdout)
            leads.append(answer["lead_steps"])
            ok, why = check_capture(answer)
            if not ok:
                misaligned += 1
                notes.append(why)
            first = answer["ranks"][0]["trace_path"]
            step_ms.extend(profiler_steps(first).values())
    finally:
        stop_child(proc, stop, timeout=60)
    return [Row(
        BENCH, f"{NPROC} ranks, step time changing ~5x both ways, default lead", misaligned / num * 100, "%",
        delta=f"{misaligned} of {num} captures misaligned", target="0 misaligned", met=misaligned == 0,
        note=f"A torchrun job of {NPROC} ranks on gloo (a small DDP model) whose step sleep is {SLOW[0] * 1000:g} ms "
             f"for {SLOW[1]:g} s, then {FAST[0] * 1000:g} ms for {FAST[1]:g} s, and again (traced steps took "
             f"{min(step_ms):.0f} to {max(step_ms):.0f} ms); after a random pause of up to {MAX_PAUSE_S:g} s, "
             "`profile set -rf all --wait` with the CLI's default start step (its lead: "
             f"{min(leads)} to {max(leads)} steps). A capture is misaligned when a rank started after the chosen "
             "step or the ranks' ProfilerStep numbers differ."
             + (f" Misses: {' | '.join(notes[:3])}" if notes else ""),
    )]


if __name__ == "__main__":
    bench_main(run)
