"""bin/gpu-check's checks: every CUDA path of the sidecar, on one GPU, in one short run.

    python -m benchmarks.gpu_check --out DIR [--gpu-expected] [--budget-s 285] [--big-mb 200]

bin/gpu-check sets up a Python with a CUDA torch and runs this. One line per check, as it
ends: `ok   <check>: <evidence>` or `FAIL <check>: <reason>`, then a summary line; exit 1
on any FAIL. Without a usable GPU: one line, `no GPU: skipped`, exit 0 (with
--gpu-expected, where bin/gpu-check saw a GPU, that is a `FAIL setup` instead).

  1 kernels, summary    benchmarks/programs/cuda_train.py (matmuls and an all-reduce on a
                        one-rank NCCL group) under `python -m sidecar.run`; `profile set -as 2
                        --wait`: CUDA kernels inside the ProfilerStep windows;
                        `profile summary --json`: kernel time per step, as the trace adds up
  2 profile-memory,     `profile set -pm`: CUDA [memory] events; a {"kind": "memory"} request:
    memory-snapshot     a `torch.cuda.memory._snapshot()` pickle with Python frames, which
                        torch's memory_viz renders
  3 fork-writer,        benchmarks/cuda_save_stall.py: the first save of a CUDA + NCCL
    writers             process forked (COSMOS_PROFILER_SAVE_WRITER=fork): complete, with
                        deviceProperties, training steps on; then fork, auto and thread side
                        by side (stall, slowdown)
  4 hang                the training job's rank stopped in an NCCL all-reduce (GPU sleeps
                        queued before it); `profile hang`: the flight recorder names it
  5 save-stall          a ~200 MB CUDA trace: ours against a synchronous export_chrome_trace

The verifiers (`check_*`, `read_trace`) are pure and tested on CPU (tests/unit/test_gpu_check.py);
the rest needs the GPU. Every child runs in a session of its own, dies with this process
(PR_SET_PDEATHSIG) and is killed at the end; every wait has a deadline inside --budget-s.
Artifacts (traces, snapshot, logs) go under DIR/work; DIR/report.txt holds the lines and
DIR/results.json the numbers. Nothing here imports torch: the GPU is probed in a child.
`--device cpu` runs the same plumbing on CPU and gloo, for developing this without a GPU: the
CUDA checks then FAIL, each saying what a CPU run lacks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, child_env, wait_for

PROGRAM = ROOT / "benchmarks" / "programs" / "cuda_train.py"
REPLICA = "gpucheck"
SKIPPED = "no GPU: skipped"
ACTIVE_STEPS = 2
# Kernels of a step may start a little after its host window ends (the optimizer's, launched
# last); more than this share outside every window means the clocks do not line up.
MAX_OUTSIDE_SHARE = 0.1
# `profile summary`'s kernel time against the trace's own sum of kernel durations.
KERNEL_SUM_TOLERANCE = 0.01
CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, the "Device Type" of a [memory] event
SNAPSHOT_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                              "segment_map", "segment_unmap", "snapshot", "oom"})
CHECKS = ("kernels", "summary", "profile-memory", "memory-snapshot", "fork-writer", "writers", "hang", "save-stall")


class CheckFailed(Exception):
    """A check's verdict: the message is the reason on its FAIL line."""


# --- pure verifiers ---------------------------------------------------------------------------


@dataclass
class TraceFacts:
    """What the checks need from one Chrome trace, read in one streaming pass."""

    path: str
    num_events: int = 0
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # host ProfilerStep#N -> (ts, dur)
    kernels: list[tuple[float, float, str]] = field(default_factory=list)  # (ts, dur, name), cat "kernel"
    memory_devices: Counter = field(default_factory=Counter)  # "Device Type" of each [memory] event
    device_properties: list[dict[str, Any]] = field(default_factory=list)


def read_trace(path: str | os.PathLike[str]) -> TraceFacts:
    """Read a whole trace (gzip or plain JSON). json.load, not the CLI's streaming reader: a
    200 MB trace parses in seconds here, and the budget is short; `summary` exercises that reader.

    Raises:
        CheckFailed: it is missing, truncated or not a Chrome trace.
    """
    facts = TraceFacts(str(path))
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as f:
            doc = json.load(f)
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise CheckFailed(f"the trace does not read to its end: {path}: {type(exc).__name__}: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise CheckFailed(f"{path} is not a Chrome trace: no traceEvents list")
    for event in events:
        if isinstance(event, dict):
            _add_event(facts, event)
    facts.num_events = len(events)
    props = doc.get("deviceProperties")
    facts.device_properties = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    return facts


def _add_event(facts: TraceFacts, event: Mapping[str, Any]) -> None:
    name, cat = str(event.get("name", "")), str(event.get("cat", "")).lower()
    if name == "[memory]":
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        facts.memory_devices[args.get("Device Type")] += 1
        return
    ts, dur = event.get("ts"), event.get("dur")
    if event.get("ph") != "X" or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
        return
    if cat == "kernel":
        facts.kernels.append((float(ts), float(dur), name))
    elif name.startswith("ProfilerStep#") and not cat.startswith("gpu_") and name[13:].isdigit():
        facts.steps[int(name[13:])] = (float(ts), float(dur))  # the host span (the GPU mirror is gpu_*)


def kernels_per_step(facts: TraceFacts) -> tuple[dict[int, tuple[int, float]], int]:
    """(step -> (kernels that start in its host window, their time in us), kernels outside every window)."""
    per_step = {step: (0, 0.0) for step in facts.steps}
    windows = sorted((ts, ts + dur, step) for step, (ts, dur) in facts.steps.items())
    outside = 0
    for ts, dur, _ in facts.kernels:
        for start, end, step in windows:
            if start <= ts <= end:
                count, time_us = per_step[step]
                per_step[step] = (count + 1, time_us + dur)
                break
        else:
            outside += 1
    return per_step, outside


def check_kernels_in_steps(facts: TraceFacts, active_steps: int) -> str:
    """CUDA kernel events inside the ProfilerStep windows: every captured step has kernels, and
    at most MAX_OUTSIDE_SHARE of them start outside every window."""
    if len(facts.steps) != active_steps:
        raise CheckFailed(f"{len(facts.steps)} ProfilerStep windows in the trace, not the {active_steps} asked for "
                          f"({_steps(facts)})")
    if not facts.kernels:
        raise CheckFailed(f"no CUDA kernel events (cat 'kernel') in the trace ({facts.num_events} events): "
                          "the CUDA activity was not recorded")
    per_step, outside = kernels_per_step(facts)
    empty = [step for step, (count, _) in sorted(per_step.items()) if count == 0]
    if empty:
        raise CheckFailed(f"no kernel starts inside ProfilerStep window(s) {', '.join(f'#{s}' for s in empty)}; "
                          f"{outside} of {len(facts.kernels)} kernels lie outside every window")
    if outside > MAX_OUTSIDE_SHARE * len(facts.kernels):
        raise CheckFailed(f"{outside} of {len(facts.kernels)} kernels start outside every ProfilerStep window "
                          f"(more than {MAX_OUTSIDE_SHARE:.0%}: host and GPU clocks do not line up)")
    nccl = sum(1 for _, _, name in facts.kernels if "nccl" in name.lower())
    steps = ", ".join(f"#{s} {c} kernels {t / 1000:.2f} ms" for s, (c, t) in sorted(per_step.items()))
    return (f"{len(facts.kernels)} kernels ({nccl} NCCL), {len(facts.kernels) - outside} inside the windows: "
            f"{steps}")


def check_summary_kernels(summary: Mapping[str, Any], facts: TraceFacts, active_steps: int) -> str:
    """`profile summary --json` of the capture: its steps, and kernel time that matches the trace's."""
    ranks = summary.get("ranks") or []
    if len(ranks) != 1:
        raise CheckFailed(f"the summary has {len(ranks)} ranks, not 1")
    rank = ranks[0]
    steps = rank.get("steps") or []
    numbers = sorted(s.get("step") for s in steps)
    if numbers != sorted(facts.steps):
        raise CheckFailed(f"the summary's steps {numbers} are not the trace's {sorted(facts.steps)}")
    kernel_s = rank.get("kernel_s")
    if not isinstance(kernel_s, (int, float)) or kernel_s <= 0 or not rank.get("top_kernels"):
        raise CheckFailed(f"the summary reports no kernel time (kernel_s {kernel_s!r}, "
                          f"{len(rank.get('top_kernels') or [])} top kernels)")
    traced_s = sum(dur for _, dur, _ in facts.kernels) / 1e6
    if abs(kernel_s - traced_s) > KERNEL_SUM_TOLERANCE * traced_s:
        raise CheckFailed(f"the summary's kernel time {kernel_s * 1e3:.3f} ms is not the trace's "
                          f"{traced_s * 1e3:.3f} ms (sum of its kernel durations)")
    per_step = kernel_s / len(steps)
    top = rank["top_kernels"][0]
    return (f"kernel time {per_step * 1e3:.3f} ms per step over {len(steps)} steps (step "
            f"{(rank.get('step_s') or 0) * 1e3:.2f} ms, collective wait {(rank.get('collective_wait_s') or 0) * 1e3:.3f} "
            f"ms); top kernel {_short(top.get('name'))} {top.get('self_s', 0) * 1e3:.3f} ms")


def check_complete_trace(facts: TraceFacts, active_steps: int) -> str:
    """A saved CUDA trace is whole: every step asked for, kernels, and kineto's deviceProperties."""
    if len(facts.steps) != active_steps:
        raise CheckFailed(f"{len(facts.steps)} ProfilerStep windows, not {active_steps} ({_steps(facts)})")
    if not facts.kernels:
        raise CheckFailed(f"no CUDA kernel events in {facts.num_events} events")
    if not facts.device_properties:
        raise CheckFailed("no deviceProperties in the trace (kineto could not read the GPU's properties "
                          "where it wrote the JSON)")
    names = sorted({str(p.get("name", "?")) for p in facts.device_properties})
    return (f"{active_steps} steps, {facts.num_events} events ({len(facts.kernels)} kernels), deviceProperties "
            f"{', '.join(names)}")


def check_cuda_memory_events(facts: TraceFacts) -> str:
    """profile_memory on CUDA: [memory] events of the CUDA device type."""
    cuda = facts.memory_devices.get(CUDA_DEVICE_TYPE, 0)
    if not cuda:
        seen = dict(facts.memory_devices) or "none"
        raise CheckFailed(f"no CUDA [memory] events (Device Type {CUDA_DEVICE_TYPE}) in the trace; "
                          f"[memory] events by device type: {seen}")
    other = sum(facts.memory_devices.values()) - cuda
    return f"{cuda} CUDA [memory] events ({other} CPU) over {len(facts.steps)} steps"


def check_memory_snapshot(snapshot: Any, program: str = "") -> str:
    """A `torch.cuda.memory._snapshot()` (what `torch.cuda.memory._dump_snapshot` pickles): segments,
    and a device trace of allocator actions whose frames include Python frames (of `program`, if given)."""
    if not isinstance(snapshot, dict):
        raise CheckFailed(f"the snapshot is a {type(snapshot).__name__}, not the dict of torch.cuda.memory._snapshot()")
    segments, traces = snapshot.get("segments"), snapshot.get("device_traces")
    if not isinstance(segments, list) or not isinstance(traces, list):
        raise CheckFailed(f"the snapshot has no 'segments' and 'device_traces' lists (keys: {sorted(snapshot)})")
    entries = [e for trace in traces if isinstance(trace, list) for e in trace if isinstance(e, dict)]
    if not entries:
        raise CheckFailed(f"the snapshot's device_traces are empty ({len(segments)} segments): "
                          "no allocator history was recorded over the active steps")
    unknown = sorted({str(e.get("action")) for e in entries} - SNAPSHOT_ACTIONS)
    if unknown:
        raise CheckFailed(f"device trace entries with unknown actions {unknown}")
    frames = [f for e in entries for f in (e.get("frames") or []) if isinstance(f, dict)]
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    if not python:
        raise CheckFailed(f"no Python frames in {len(entries)} device trace entries ({len(frames)} frames): "
                          "the history was not recorded with Python stacks")
    ours = [f for f in python if program and str(f.get("filename", "")).endswith(program)]
    if program and not ours:
        raise CheckFailed(f"no frame of {program} among {len(python)} Python frames")
    actions = Counter(str(e.get("action")) for e in entries)
    return (f"{len(segments)} segments, {len(entries)} trace entries ({', '.join(f'{n} {a}' for a, n in actions.most_common(3))}), "
            f"{len(python)} Python frames of {len(frames)}" + (f", {len(ours)} in {program}" if program else ""))


def check_hang_report(report: Mapping[str, Any]) -> str:
    """`profile hang --json` on a rank stopped in an NCCL all-reduce: the flight recorder was read
    and the report names that collective, with the rank waiting in it."""
    if not report.get("flight_recorder"):
        raise CheckFailed(f"no flight recorder data: {report.get('fallback') or report.get('verdict')}")
    coll = report.get("collective")
    if not isinstance(coll, dict):
        raise CheckFailed(f"the report names no collective in flight: {report.get('verdict')}")
    op, pg = str(coll.get("op", "")), str(coll.get("process_group", ""))
    if "all_reduce" not in op or not (op.startswith("nccl:") or pg.startswith("nccl:")):
        raise CheckFailed(f"the collective named is {op} on {pg}, not an NCCL all-reduce: {report.get('verdict')}")
    if 0 not in (coll.get("waiting") or []):
        raise CheckFailed(f"rank 0 is not waiting in {op} (waiting: {coll.get('waiting')}): {report.get('verdict')}")
    waited = coll.get("waited_s")
    return (f"{report.get('verdict')} [{op}, {pg}, seq {coll.get('seq')}, waited "
            f"{'?' if waited is None else f'{waited:.1f}'} s from the {coll.get('waited_from') or '?'}]")


def flight_recorders(dump: Mapping[str, Any]) -> str:
    """Which recorders a `sidecar.rank.flightrec` dump holds, with their entry counts: "nccl 12 entries, cpu 0"."""
    recorders = dump.get("recorders") or {}
    parts = [f"{key} {len((value or {}).get('entries') or [])} entries" for key, value in sorted(recorders.items())]
    errors = dump.get("errors") or {}
    parts += [f"{key}: {why}" for key, why in sorted(errors.items())]
    return ", ".join(parts) or f"no recorder ({dump.get('reason')})"


def writers_line(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Stall and slowdown of each writer side by side: "fork 210 ms +3% | auto ... | thread ..."."""
    parts = []
    for mode, r in results.items():
        slow = r.get("slowdown")
        forked = "forked" if r.get("forked") else "not forked"
        parts.append(f"{mode} stall {r['stall_s'] * 1e3:.0f} ms, slowdown "
                     f"{'n/a' if slow is None else f'{slow * 100:+.0f}%'} ({forked})")
    first = next(iter(results.values()))
    return f"{first['raw_bytes'] / 1e6:.1f} MB JSON, {first['active']} steps: " + " | ".join(parts)


def stall_ratio(sync: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """Ours against a synchronous export_chrome_trace, as a ratio of the training-thread stalls.

    Raises:
        CheckFailed: ours stalls the training thread as long as the synchronous export, or longer.
    """
    sync_s, ours_s = sync["stall_s"], ours["stall_s"]
    size = f"{sync['raw_bytes'] / 1e6:.0f} MB JSON ({sync['active']} steps)"
    if ours_s >= sync_s:
        raise CheckFailed(f"{size}: ours stalls training {ours_s:.2f} s, no less than the synchronous "
                          f"export_chrome_trace's {sync_s:.2f} s")
    slow = ours.get("slowdown")
    return (f"{size}: ours {ours_s:.2f} s vs synchronous export_chrome_trace {sync_s:.2f} s: "
            f"{sync_s / max(ours_s, 1e-9):.1f}x below (stop {ours['stop_s']:.2f} s paid by both; JSON "
            f"{'forked' if ours.get('forked') else 'on the saver thread'}; slowdown while saving "
            f"{'n/a' if slow is None else f'{slow * 100:+.0f}%'})")


def _steps(facts: TraceFacts) -> str:
    return ", ".join(f"#{s}" for s in sorted(facts.steps)) or "none"


def _short(name: Any, limit: int = 60) -> str:
    text = str(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the run ------------------------------------------------------------------------------------


class Run:
    """Lines as checks end, children killed at the end, one deadline over everything."""

    def __init__(self, out: Path, budget_s: float, device: str = "cuda") -> None:
        self.device = device
        self.out, self.work = out, out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.lines: list[str] = []
        self.results: dict[str, Any] = {"checks": {}}
        self.failed = 0
        self.procs: list[subprocess.Popen] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def report(self, name: str, ok: bool, text: str, data: Any = None) -> None:
        line = f"{'ok  ' if ok else 'FAIL'} {name}: {' '.join(text.split())}"
        self.lines.append(line)
        print(line, flush=True)
        self.results["checks"][name] = {"ok": ok, "text": text, "data": data}
        self.failed += not ok

    def check(self, name: str, fn: Callable[[], str | tuple[str, Any]]) -> bool:
        """Run one check; its CheckFailed (or any error) is its FAIL line."""
        if self.left() <= 0:
            self.report(name, False, "not run: the time budget is spent")
            return False
        try:
            out = fn()
        except CheckFailed as exc:
            self.report(name, False, str(exc))
            return False
        except subprocess.TimeoutExpired as exc:
            self.report(name, False, f"timed out after {exc.timeout:.0f} s: {_cmd(exc.cmd)}")
            return False
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a FAIL line, never a traceback
            self.report(name, False, f"{type(exc).__name__}: {exc}")
            return False
        text, data = out if isinstance(out, tuple) else (out, None)
        self.report(name, True, text, data)
        return True

    def fail_all(self, names: Sequence[str], reason: str) -> None:
        for name in names:
            if name not in self.results["checks"]:
                self.report(name, False, reason)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(self.work, name, cmd, env)
        self.procs.append(proc.popen)
        with open(self.work / "children", "a") as f:  # bin/gpu-check kills these sessions on exit
            f.write(f"{proc.popen.pid}\n")
        return proc

    def kill_children(self) -> None:
        for popen in self.procs:
            _kill_session(popen)

    def timeout(self, limit: float) -> float:
        """A step's timeout: `limit`, or what is left of the budget."""
        left = self.left()
        if left <= 1:
            raise CheckFailed("not run: the time budget is spent")
        return min(limit, left)


class Proc:
    """A child in a session of its own, stdout and stderr to files under work/."""

    def __init__(self, work: Path, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.out_path, self.err_path = work / f"{name}.out", work / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          cwd=ROOT, start_new_session=True)

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def tail(self, chars: int = 400) -> str:
        err = self.err_path.read_text(errors="replace").strip()
        return " ".join(err[-chars:].split()) or "(no output on stderr)"


def _kill_session(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def _cmd(cmd: Any) -> str:
    return " ".join(str(c) for c in cmd) if isinstance(cmd, (list, tuple)) else str(cmd)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `predicate` until it is truthy; CheckFailed naming `what` at the deadline."""
    try:
        return wait_for(predicate, timeout, interval, what)
    except TimeoutError:
        raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}") from None


# --- the GPU ----------------------------------------------------------------------------------

PROBE = """
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": False}
try:
    info["available"] = torch.cuda.is_available()
    if info["available"]:
        import torch.distributed as dist
        info.update(name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
                    nccl=dist.is_available() and dist.is_nccl_available())
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(info))
"""


def probe_gpu(timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=ROOT)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"available": False, "error": f"python -c 'import torch' failed ({done.returncode}): "
                                              f"{' '.join(done.stderr.split())[-300:]}"}


# --- checks 1, 2 and 4: the CLI on a CUDA training job ----------------------------------------------


class Job:
    """benchmarks/programs/cuda_train.py under `python -m sidecar.run`, and the CLI that talks to it."""

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
    names = ("kernels", "summary", "profile-memory", "memory-snapshot", "hang")
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
        return f"{text}; {complete}; training stepped on to #{on}", {"trace": rank["trace_path"]}

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
    run.check("summary", summary)
    run.check("profile-memory", profile_memory)
    run.check("memory-snapshot", memory_snapshot)
    run.check("hang", hang)
    _kill_session(job.proc.popen)


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
    proc = run.spawn("bench", [sys.executable, "-m", "benchmarks.cuda_save_stall", "--tmp", str(run.work / "bench"),
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
        _kill_session(proc.popen)
        return
    run.check("fork-writer", lambda: fork_writer_check(first))
    writers: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(3):
            result = next_result(120, "the writers' captures")
            writers[result["mode"]] = result
    except CheckFailed as exc:
        run.fail_all(names, str(exc))
        _kill_session(proc.popen)
        return
    run.check("writers", lambda: writers_check(writers))
    run.check("save-stall", lambda: big_check(next_result(run.left(), "the big capture")))
    _kill_session(proc.popen)


def _saved_trace(result: Mapping[str, Any]) -> str:
    """A bench capture's trace, read back whole: what check_complete_trace says."""
    if result.get("sidecar_error"):
        raise CheckFailed(f"the sidecar recorded an error: {result['sidecar_error']}")
    return check_complete_trace(read_trace(result["trace_path"]), result["active"])


def fork_writer_check(first: Mapping[str, Any]) -> tuple[str, Any]:
    if not first.get("forked"):
        why = "the forked child failed and the saver thread wrote it" if first.get("fork_fell_back") else \
            "forkwriter.write was not called"
        raise CheckFailed(f"the first save was not written by a forked child: {why}")
    text = _saved_trace(first)
    return (f"the first save of a CUDA + NCCL process, JSON written in a forked child: {text}; "
            f"{first['steps_on']} training steps after the save"), {"trace": first["trace_path"]}


def writers_check(writers: Mapping[str, Mapping[str, Any]]) -> tuple[str, Any]:
    for mode, result in writers.items():
        try:
            _saved_trace(result)
        except CheckFailed as exc:
            raise CheckFailed(f"writer {mode}: {exc}") from None
    if not writers["fork"].get("forked") or writers["fork"].get("fork_fell_back"):
        raise CheckFailed("writer fork: the JSON was not written by a forked child")
    if writers["thread"].get("forked"):
        raise CheckFailed("writer thread: a child was forked")
    return writers_line(writers), {mode: _numbers(r) for mode, r in writers.items()}


def big_check(big: Mapping[str, Any]) -> tuple[str, Any]:
    sync, ours = big["sync"], big["ours"]
    text = stall_ratio(sync, ours)
    _saved_trace(ours)
    note = "" if sync["raw_bytes"] >= 0.9 * big["requested_mb"] * 1e6 else \
        f" (asked for {big['requested_mb']:.0f} MB; smaller to fit the time or the 1000-step bound)"
    return text + note, {"sync": _numbers(sync), "ours": _numbers(ours)}


def _numbers(result: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("stall_s", "slowdown", "stop_s", "export_s", "finalize_s", "later_s", "gc_s", "raw_bytes", "gz_bytes",
            "active", "forked", "wall_s", "trace_path")
    return {k: result.get(k) for k in keys}


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bin/gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where report.txt, results.json and work/ go")
    p.add_argument("--gpu-expected", action="store_true", help="a GPU was seen: no usable CUDA is a FAIL, not a skip")
    p.add_argument("--budget-s", type=float, default=285.0, help="finish within this many seconds")
    p.add_argument("--writers-mb", type=float, default=20.0, help="trace size of the fork/auto/thread comparison")
    p.add_argument("--big-mb", type=float, default=200.0, help="trace size of the save-stall check")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the same plumbing on CPU and gloo, for development (the CUDA checks FAIL)")
    args = p.parse_args(argv)
    run = Run(Path(args.out), args.budget_s, args.device)

    def stop(signum: int, frame: Any) -> None:
        print(f"FAIL gpu-check: stopped by {signal.Signals(signum).name}", flush=True)
        raise SystemExit(1)  # the `finally` below kills the children

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        gpu = probe_gpu(run.timeout(120)) if args.device == "cuda" else {"name": "CPU (--device cpu)", "nccl": True,
                                                                          "available": True}
        run.results["device"] = gpu
        if not gpu.get("available"):
            if not args.gpu_expected:
                print(SKIPPED, flush=True)
                return 0
            why = gpu.get("error") or (f"torch {gpu.get('torch')} is not a CUDA build" if not gpu.get("cuda")
                                       else "torch.cuda.is_available() is False")
            run.report("setup", False, f"a GPU is here but CUDA is not usable from Python: {why}")
        elif not gpu.get("nccl"):
            run.report("setup", False, f"torch {gpu.get('torch')} has no NCCL (torch.distributed.is_nccl_available())")
        else:
            cli_checks(run)
            bench_checks(run, args.writers_mb, args.big_mb)
    finally:
        run.kill_children()
    ok = len(run.results["checks"]) - run.failed
    gpu = run.results["device"]
    device = gpu.get("name", "no GPU") + (f", torch {gpu['torch']}" if gpu.get("torch") else "")
    took = time.monotonic() - run.started
    line = (f"gpu-check: {ok} of {len(run.results['checks'])} checks ok" +
            (f", {run.failed} FAILED" if run.failed else "") + f" ({device}; {took:.0f} s)")
    print(line, flush=True)
    (run.out / "report.txt").write_text("\n".join([*run.lines, line]) + "\n")
    run.results.update(summary=line, seconds=round(took, 1))
    (run.out / "results.json").write_text(json.dumps(run.results, indent=1, default=str) + "\n")
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
