"""8. Idle CPU of the stall watch (`[sidecar] stall_after_s`): a stepping job with the watch on vs off.

Every case is a child process (benchmarks/programs/stepping.py) that imports
torch, installs the sidecar (inotify, default 5 s heartbeat) and calls
`sc.step()` 20 times a second, doing nothing else; the cases differ only in
`stall_after_s`. All children run at once; their CPU time is read from outside
(`idle_cpu.cpu_seconds`, the scheduler's ns accounting) over back-to-back
windows, as % of one core. The watch's cost is the case minus "watch off", in
the same run, and its ratio to it; that difference is within the noise of a
stepping process (about +-0.01% of a core here), so each row also gives the
stall watch thread's own CPU time (its /proc/<pid>/task/<tid>/sched), which is
exact but leaves out faulthandler's short-lived watchdog thread of each re-arm.

The watch thread wakes every stall_after_s / 4 and, having seen the steps move,
re-arms faulthandler's C-level timer (a join and a start of faulthandler's
watchdog thread); `step()` itself is untouched. The target is the idle_cpu
benchmark's for the inotify watcher (< 0.01% of a core), for a realistic
stall_after_s (>= 10 s); 1 s (the minimum, 4 wakes a second) is shown as the worst case.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import PYTHON, Row, child_env, main, median, wait_ready, write_toml
from benchmarks.idle_cpu import WATCHER_TARGETS, cpu_seconds

BENCH = "8 idle CPU of the stall watch"
REPLICA = "bench-stall"
STEP_EVERY_S = 0.05
TARGET_TEXT, TARGET_LIMIT = WATCHER_TARGETS["inotify"]


@dataclass
class Case:
    name: str
    stall_after_s: float
    has_target: bool = False
    proc: subprocess.Popen | None = None
    samples: list[float] | None = None
    tid: int = 0  # the stall watch thread
    thread_samples: list[float] | None = None


def _cases() -> list[Case]:
    return [
        Case("stepping 20/s, stall watch off", 0.0),
        Case("stepping 20/s, stall_after_s = 300", 300.0, has_target=True),
        Case("stepping 20/s, stall_after_s = 60", 60.0, has_target=True),
        Case("stepping 20/s, stall_after_s = 10", 10.0, has_target=True),
        Case("stepping 20/s, stall_after_s = 1 (the minimum)", 1.0),
    ]


def thread_seconds(pid: int, tid: int) -> float:
    """CPU time of one thread (0 for tid 0: no stall watch), from the scheduler's ns accounting."""
    if not tid:
        return 0.0
    try:
        with open(f"/proc/{pid}/task/{tid}/sched") as f:
            for line in f:
                if line.startswith("se.sum_exec_runtime"):
                    return float(line.split(":")[1]) / 1000.0
    except OSError:
        pass
    return 0.0


def run(quick: bool) -> list[Row]:
    window = 5.0 if quick else 30.0
    repeats = 2 if quick else 4
    settle = 3.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-stall-"))
    cases = _cases()
    logs = []
    try:
        for i, case in enumerate(cases):
            base = tmp / f"case{i}"
            base.mkdir()
            config = write_toml(base / "job.toml", {"watch": "inotify", "stall_after_s": case.stall_after_s})
            out = open(base / "stdout", "wb")
            logs.append(out)
            case.proc = subprocess.Popen(
                [PYTHON, "-m", "benchmarks.programs.stepping", "--registry", str(base / "reg"), "--output",
                 str(base / "out"), "--replica", REPLICA, "--config", str(config), "--step-every", str(STEP_EVERY_S)],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        for i, case in enumerate(cases):
            line = wait_ready(case.proc, tmp / f"case{i}" / "stdout")
            case.tid = int(line.split()[3])
            case.samples, case.thread_samples = [], []
        time.sleep(settle)
        starts = {c.name: (time.monotonic(), cpu_seconds(c.proc.pid), thread_seconds(c.proc.pid, c.tid))
                  for c in cases}
        for _ in range(repeats):
            time.sleep(window)
            for case in cases:
                t0, c0, w0 = starts[case.name]
                t1, c1, w1 = time.monotonic(), cpu_seconds(case.proc.pid), thread_seconds(case.proc.pid, case.tid)
                case.samples.append((c1 - c0) / (t1 - t0) * 100.0)
                case.thread_samples.append((w1 - w0) / (t1 - t0) * 100.0)
                starts[case.name] = (t1, c1, w1)
    finally:
        for case in cases:
            if case.proc is not None and case.proc.poll() is None:
                try:
                    case.proc.stdin.close()
                    case.proc.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    case.proc.kill()
                    case.proc.wait()
        for f in logs:
            f.close()

    baseline = median(cases[0].samples)
    note = (f"CPU time of a child stepping {1 / STEP_EVERY_S:g} times a second and doing nothing else (all threads, "
            f"scheduler ns accounting), median of {repeats} back-to-back {window:g} s windows, as % of one core; "
            "baseline = the same child with the stall watch off, in the same run. met? compares the watch thread's own CPU with the target.")
    rows: list[Row] = []
    for case in cases:
        value = median(case.samples)
        added = value - baseline
        is_base = case is cases[0]
        rows.append(Row(
            BENCH, case.name, value, "%", baseline=None if is_base else baseline,
            baseline_label="" if is_base else "watch off",
            delta="" if is_base else (
                f"x{value / baseline:.3f} ({added:+.4f}% of a core); the watch thread itself: "
                f"{median(case.thread_samples):.4f}% of a core ({median(case.thread_samples) / 100 * 60 * 1000:.2f} ms CPU/min)"),
            samples=case.samples, target=TARGET_TEXT if case.has_target else "",
            met=(median(case.thread_samples) < TARGET_LIMIT) if case.has_target else None, note=note,
            extra={"stall_after_s": case.stall_after_s, "watch_thread_percent": median(case.thread_samples),
                   "watch_thread_samples": case.thread_samples},
        ))
    return rows


if __name__ == "__main__":
    main(run)
