"""The gpu check's checks, each run against the GPU by driving real processes: checks 1, 2 and 4
(kernels, ondemand, summary, profile-memory, memory-snapshot, hang) through the CLI on
gpu_check/cuda_train.py under `python -m sidecar.run`, checks 3 and 5 (fork-writer, writers,
save-stall) from gpu_check/cuda_save_stall.py's results. Their verdicts: gpu_check.verify."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, child_env
from gpu_check.harness import Run, kill_session, wait_until
from gpu_check.verify import (
    CheckFailed,
    TraceFacts,
    big_check,
    check_complete_trace,
    check_cuda_memory_events,
    check_hang_report,
    check_kernels_in_steps,
    check_memory_snapshot,
    check_summary_kernels,
    flight_recorders,
    fork_writer_check,
    read_trace,
    writers_check,
)

PROGRAM = ROOT / "gpu_check" / "cuda_train.py"
# The training job's replica. The CLI runs from the checkout, where `profile summary NAME` reads a
# folder NAME as a trace directory: no top-level folder may have this name (the package is gpu_check).
REPLICA = "gpucheck"
ACTIVE_STEPS = 2


# --- checks 1, 2 and 4: the CLI on a CUDA training job ----------------------------------------------


class Job:
    """gpu_check/cuda_train.py under `python -m sidecar.run`, and the CLI that talks to it."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.registry, self.output = run.work / "registry", run.work / "out"
        self.hang_file = run.work / "hang"
        for stale in (self.hang_file, run.work / "train.stop", run.work / "train.store"):  # an earlier run's
            stale.unlink(missing_ok=True)
        env = child_env(COSMOS_PROFILER_DIR=str(self.registry), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")  # one rank on one host: NCCL's bootstrap stays on loopback
        self.env = env
        self.proc = run.spawn("train", [
            sys.executable, "-m", "sidecar.run", "--replica", REPLICA, "--output", str(self.output),
            "--registry", str(self.registry), str(PROGRAM), "--store", str(run.work / "train.store"),
            "--stop-file", str(run.work / "train.stop"), "--hang-file", str(self.hang_file), "--device", run.device,
            *(("--width", "256", "--batch", "64") if run.device == "cpu" else ()),
        ], env)

    def record(self) -> Any:
        from sidecar.common.recordscan import read_records

        records = read_records(self.registry, REPLICA)
        return records[0] if records else None

    def wait_training(self, timeout: float) -> Any:
        def stepping() -> Any:
            if self.proc.popen.poll() is not None:
                raise CheckFailed(f"the CUDA training job exited ({self.proc.popen.returncode}): {self.proc.tail()}")
            rec = self.record()
            return rec if rec is not None and rec.pid == self.proc.popen.pid and rec.step >= 3 else None

        return wait_until(stepping, timeout, "the CUDA training job to register and step")

    def cli(self, *args: str, timeout: float) -> tuple[int, dict[str, Any]]:
        if self.proc.popen.poll() is not None:
            raise CheckFailed(f"the CUDA training job exited ({self.proc.popen.returncode}): {self.proc.tail()}")
        done = subprocess.run([sys.executable, "-m", "sidecar", *args, "--registry", str(self.registry), "--json"],
                              capture_output=True, text=True, timeout=self.run.timeout(timeout), env=self.env,
                              cwd=ROOT)
        try:
            return done.returncode, json.loads(done.stdout)
        except ValueError:
            raise CheckFailed(f"`cosmos-profiler {' '.join(args)}` exited {done.returncode} without JSON: "
                              f"{' '.join((done.stdout + done.stderr).split())[-400:]}") from None

    def capture(self, *flags: str) -> tuple[dict[str, Any], TraceFacts]:
        code, out = self.cli("profile", "set", REPLICA, "-as", str(ACTIVE_STEPS), *flags, "--wait", "--timeout", "90",
                             timeout=120)
        ranks = out.get("ranks") or [{}]
        if code != 0 or ranks[0].get("phase") != "saved":
            raise CheckFailed(f"`profile set {REPLICA} -as {ACTIVE_STEPS} {' '.join(flags)} --wait` exited {code}: "
                              f"{ranks[0].get('phase')}: {ranks[0].get('error') or out.get('error')}")
        return ranks[0], read_trace(ranks[0]["trace_path"])


def cli_checks(run: Run) -> None:
    names = ("kernels", "ondemand", "summary", "profile-memory", "memory-snapshot", "hang")
    job = Job(run)
    try:
        job.wait_training(run.timeout(120))
    except CheckFailed as exc:
        run.fail_all(names, f"the CUDA training job did not start: {exc}")
        return
    state: dict[str, Any] = {}

    def kernels() -> tuple[str, Any]:
        rank, facts = job.capture()
        state["facts"] = facts
        text = check_kernels_in_steps(facts, ACTIVE_STEPS)
        complete = check_complete_trace(facts, ACTIVE_STEPS)
        last = max(facts.steps)
        on = wait_until(lambda: (r := job.record()) is not None and r.step > last + 3 and r.step, 30,
                        f"the training job to step on past #{last}")
        state["record"] = job.record()
        return f"{text}; {complete}; training stepped on to #{on}", {"trace": rank["trace_path"]}

    def ondemand() -> tuple[str, Any]:
        # The job runs under `python -m sidecar.run`, which sets kineto's on-demand environment before torch:
        # the kernels check's capture must have come through kineto's on-demand path, CUDA activity and all.
        if "record" not in state:  # set once the kernels check passed
            raise CheckFailed("no capture with CUDA kernels to check (the kernels check failed)")
        rec = state["record"]
        paths = [h.get("path") for h in (rec.history if rec is not None else []) if h.get("path")]
        if paths != ["ondemand"]:
            log = job.proc.err_path.read_text(errors="replace")
            why = [line for line in log.splitlines() if "captures on" in line or "on-demand" in line]
            raise CheckFailed(f"the CUDA capture took the Python path, not kineto's on-demand path: "
                              f"{why[-1] if why else 'the job log says nothing about it'}")
        facts = state["facts"]
        return (f"the CUDA capture came through kineto's on-demand path: {len(facts.kernels)} kernels in "
                f"ProfilerStep windows {', '.join(f'#{s}' for s in sorted(facts.steps))}"), None

    def summary() -> str:
        if "facts" not in state:
            raise CheckFailed("no capture to summarize (the kernels check failed)")
        code, out = job.cli("profile", "summary", REPLICA, timeout=120)
        if code != 0:
            raise CheckFailed(f"`profile summary {REPLICA} --json` exited {code}: {out.get('error')}")
        return check_summary_kernels(out, state["facts"], ACTIVE_STEPS)

    def profile_memory() -> tuple[str, Any]:
        rank, facts = job.capture("-pm")
        return check_cuda_memory_events(facts), {"trace": rank["trace_path"]}

    def memory_snapshot() -> tuple[str, Any]:
        return snapshot_check(run, job)

    def hang() -> tuple[str, Any]:
        return hang_check(run, job)

    run.check("kernels", kernels)
    run.check("ondemand", ondemand)
    run.check("summary", summary)
    run.check("profile-memory", profile_memory)
    run.check("memory-snapshot", memory_snapshot)
    run.check("hang", hang)
    kill_session(job.proc.popen)


MEMORY_VIZ = """
import pickle, sys
from torch.cuda import _memory_viz
with open(sys.argv[1], "rb") as f:
    snapshot = pickle.load(f)
print(len(_memory_viz.trace_plot(snapshot)))
"""


def snapshot_check(run: Run, job: Job) -> tuple[str, Any]:
    from sidecar.common.registry import write_request

    request_id = f"gpucheck-memory-{os.getpid()}"
    write_request(job.registry, REPLICA, {"id": request_id, "kind": "memory", "active_steps": ACTIVE_STEPS,
                                          "wait_steps": 0, "warmup_steps": 0})

    def saved() -> Any:
        rec = job.record()
        if rec is None:
            return None
        for why in (rec.refused, rec.error):  # a refused request keeps the last request_id: its id is in the text
            if why and request_id in why:
                raise CheckFailed(f"rank 0 did not take the memory request: {why}")
        if rec.request_id != request_id:
            return None
        if rec.error:
            raise CheckFailed(f"the memory request failed on rank 0: {rec.error}")
        return rec.memory_path if rec.state == "idle" and rec.memory_path else None

    path = wait_until(saved, run.timeout(60), "the memory snapshot")
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # our own file: plain dicts and lists
    text = check_memory_snapshot(snapshot, PROGRAM.name)
    done = subprocess.run([sys.executable, "-c", MEMORY_VIZ, path], capture_output=True, text=True,
                          timeout=run.timeout(90), env=child_env(), cwd=ROOT)
    if done.returncode != 0:
        raise CheckFailed(f"{text}; but torch's memory_viz cannot render it: {' '.join(done.stderr.split())[-300:]}")
    html = int(done.stdout.strip().splitlines()[-1])
    return f"{Path(path).name}: {text}; memory_viz.trace_plot renders it ({html / 1e3:.0f} kB of HTML)", {"path": path}


def hang_check(run: Run, job: Job) -> tuple[str, Any]:
    from sidecar.fleet.hang import read_dump

    job.hang_file.touch()
    wait_until(lambda: "HANGING" in job.proc.stdout(), run.timeout(30), "the rank to stop in its all-reduce")
    code, report = job.cli("profile", "hang", REPLICA, "--timeout", "30", timeout=60)
    if code != 0:
        raise CheckFailed(f"`profile hang {REPLICA} --json` exited {code}: {report.get('error') or report.get('verdict')}")
    text = check_hang_report(report)
    rank = (report.get("ranks") or [{}])[0]
    fr_path = rank.get("flight_recorder_path")
    if not fr_path:
        raise CheckFailed(f"{text}; but rank 0 names no flight recorder dump ({rank.get('flight_recorder_error')})")
    return f"{text}; dump: {flight_recorders(read_dump(fr_path))}", {"flight_recorder": fr_path}


# --- checks 3 and 5: the save stall on CUDA ----------------------------------------------------------


def bench_checks(run: Run, writers_mb: float, big_mb: float) -> None:
    names = ("fork-writer", "writers", "save-stall")
    if run.left() < 30:
        run.fail_all(names, "not run: the time budget is spent")
        return
    env = child_env()
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    proc = run.spawn("bench", [sys.executable, "-m", "gpu_check.cuda_save_stall", "--tmp", str(run.work / "bench"),
                               "--writers-mb", str(writers_mb), "--big-mb", str(big_mb), "--device", run.device,
                               "--deadline-s", str(max(10.0, run.left() - 20))], env)
    seen = 0

    def next_result(timeout: float, what: str) -> dict[str, Any]:
        nonlocal seen

        def arrived() -> Any:
            lines = [line for line in proc.stdout().splitlines() if line.startswith("RESULT ")]
            if len(lines) > seen:
                return json.loads(lines[seen][len("RESULT "):])
            if proc.popen.poll() is not None:
                raise CheckFailed(f"the CUDA bench exited ({proc.popen.returncode}) before {what}: {proc.tail()}")
            return None

        result = wait_until(arrived, run.timeout(timeout), what, interval=0.2)
        seen += 1
        if result["phase"] == "error":
            raise CheckFailed(f"the CUDA bench failed before {what}: {result['error']}")
        return result

    try:
        first = next_result(150, "its first (forked) save")
    except CheckFailed as exc:
        run.fail_all(names, str(exc))
        kill_session(proc.popen)
        return
    run.check("fork-writer", lambda: fork_writer_check(first))
    writers: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(3):
            result = next_result(120, "the writers' captures")
            writers[result["mode"]] = result
    except CheckFailed as exc:
        run.fail_all(names, str(exc))
        kill_session(proc.popen)
        return
    run.check("writers", lambda: writers_check(writers))
    run.check("save-stall", lambda: big_check(next_result(run.left(), "the big capture")))
    kill_session(proc.popen)


