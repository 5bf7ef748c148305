"""2. Idle CPU: what an idle sidecar's threads cost the process, per watch mode.

Every case is a child process (benchmarks/programs/idle.py) that imports and
initializes torch, installs the sidecar (or not: the baseline), and blocks in
a read of stdin, so its main thread costs nothing. All children run at once;
after a settling pause the parent reads each child's CPU time at the start and
end of back-to-back windows (30 s in the full run). A window's value is CPU
time / wall time, in percent of one core.

CPU time is the sum of `se.sum_exec_runtime` over /proc/<pid>/task/*/sched
(nanosecond scheduler accounting; /proc/<pid>/stat ticks are 10 ms, too coarse
for 0.05% of 30 s), read from outside so the child is not woken to ask.

Cases: inotify, polling at 1 s and 0.1 s, each with the default heartbeat
(the rank record is rewritten every heartbeat_interval, 5 s by default) and with 10,000 other rank records in
the same replica directory; "watcher only" runs with a 3600 s heartbeat,
which separate the watcher's cost (the issue's target) from the heartbeat's;
and two references without a sidecar: a bare Python thread that wakes every
1 s or 0.1 s and does nothing, the floor under any polling thread.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import PYTHON, Row, child_env, main, median, wait_ready, write_fake_records, write_toml

BENCH = "2 idle CPU"
NUM_RECORDS = 10_000
# The targets for the watcher, in % of one core: (text, limit).
WATCHER_TARGETS = {"inotify": ("~0 (< 0.01% of a core)", 0.01), "poll 1 s": ("< 0.05% of a core", 0.05)}
REPLICA = "bench-idle"
WATCHDOG_REF = "reference: bare watchdog observer (inotify) on the control directory"
# The goal for the whole sidecar with inotify: within this factor of a bare watchdog observer.
WATCHDOG_FACTOR = 2.0


@dataclass
class Case:
    name: str
    settings: dict | None  # None: no sidecar
    ref_wake: float = 0.0  # no sidecar, a bare Python thread waking this often
    ref_watchdog: bool = False  # no sidecar, a bare watchdog observer on the control directory
    records: int = 0
    target: str = ""
    limit: float | None = None  # % of a core
    proc: subprocess.Popen | None = None
    samples: list[float] | None = None
    mode: str = ""


def _cases() -> list[Case]:
    hb_off = {"heartbeat_interval": 3600.0}
    return [
        Case("no sidecar (torch imported, idle)", None),
        Case("inotify (whole sidecar)", {"watch": "inotify"}, target=WATCHER_TARGETS["inotify"][0], limit=WATCHER_TARGETS["inotify"][1]),
        Case("poll 1 s (whole sidecar)", {"watch": "poll", "poll_interval": 1.0}, target=WATCHER_TARGETS["poll 1 s"][0],
             limit=WATCHER_TARGETS["poll 1 s"][1]),
        Case("poll 0.1 s (whole sidecar)", {"watch": "poll", "poll_interval": 0.1}),
        Case(f"inotify (whole sidecar), {NUM_RECORDS:,} records in the registry", {"watch": "inotify"}, records=NUM_RECORDS),
        Case(f"poll 1 s (whole sidecar), {NUM_RECORDS:,} records in the registry", {"watch": "poll", "poll_interval": 1.0},
             records=NUM_RECORDS),
        Case(f"poll 0.1 s (whole sidecar), {NUM_RECORDS:,} records in the registry", {"watch": "poll", "poll_interval": 0.1},
             records=NUM_RECORDS),
        Case("watcher only: inotify (heartbeat 3600 s)", {"watch": "inotify", **hb_off},
             target=WATCHER_TARGETS["inotify"][0], limit=WATCHER_TARGETS["inotify"][1]),
        Case("watcher only: poll 1 s (heartbeat 3600 s)", {"watch": "poll", "poll_interval": 1.0, **hb_off},
             target=WATCHER_TARGETS["poll 1 s"][0], limit=WATCHER_TARGETS["poll 1 s"][1]),
        Case("watcher only: poll 0.1 s (heartbeat 3600 s)", {"watch": "poll", "poll_interval": 0.1, **hb_off}),
        Case(WATCHDOG_REF, None, ref_watchdog=True),
        Case("reference: bare Python thread waking every 1 s", None, ref_wake=1.0),
        Case("reference: bare Python thread waking every 0.1 s", None, ref_wake=0.1),
    ]


def cpu_seconds(pid: int) -> float:
    """CPU time of all live threads of `pid`, from the scheduler's ns accounting
    (/proc/<pid>/task/*/sched, a CONFIG_SCHED_DEBUG file); where the kernel has
    none, the 10 ms ticks of /proc/<pid>/stat."""
    total_ms, found = 0.0, False
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/sched") as f:
                for line in f:
                    if line.startswith("se.sum_exec_runtime"):
                        total_ms += float(line.split(":")[1])
                        found = True
                        break
        except OSError:
            continue  # a thread that just exited, or no sched file on this kernel
    return total_ms / 1000.0 if found else cpu_seconds_ticks(pid)


def cpu_seconds_ticks(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run(quick: bool) -> list[Row]:
    window = 5.0 if quick else 30.0
    repeats = 2 if quick else 4
    settle = 3.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    cases = _cases()
    logs = []
    try:
        for i, case in enumerate(cases):
            base = tmp / f"case{i}"
            base.mkdir()
            args = [PYTHON, "-m", "benchmarks.programs.idle", "--registry", str(base / "reg"), "--output",
                    str(base / "out"), "--replica", REPLICA]
            if case.ref_watchdog:
                args.append("--ref-watchdog")
            elif case.ref_wake:
                args += ["--ref-wake", str(case.ref_wake)]
            elif case.settings is None:
                args.append("--no-sidecar")
            else:
                args += ["--config", str(write_toml(base / "job.toml", case.settings))]
            if case.records:
                write_fake_records(base / "reg", REPLICA, range(1, case.records + 1))
            out = open(base / "stdout", "wb")
            logs.append(out)
            case.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                         env=child_env(), start_new_session=True)
        for i, case in enumerate(cases):
            line = wait_ready(case.proc, tmp / f"case{i}" / "stdout")
            case.mode = line.split()[2]
            case.samples = []
        time.sleep(settle)
        ticks_start = {c.name: cpu_seconds_ticks(c.proc.pid) for c in cases}
        wall_start = time.monotonic()
        starts = {c.name: (time.monotonic(), cpu_seconds(c.proc.pid)) for c in cases}
        for _ in range(repeats):
            time.sleep(window)
            for case in cases:
                t0, c0 = starts[case.name]
                t1, c1 = time.monotonic(), cpu_seconds(case.proc.pid)
                case.samples.append((c1 - c0) / (t1 - t0) * 100.0)
                starts[case.name] = (t1, c1)
        wall = time.monotonic() - wall_start
        ticks = {c.name: (cpu_seconds_ticks(c.proc.pid) - ticks_start[c.name]) / wall * 100 for c in cases}
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

    rows: list[Row] = []
    baseline = median(cases[0].samples)
    by_name = {c.name: c for c in cases}
    note = (f"CPU time of the idle child (all threads, scheduler ns accounting) over {repeats} back-to-back "
            f"{window:g} s windows, as % of one core; baseline = a child with torch imported and no sidecar. "
            "Includes the heartbeat thread rewriting the rank record every 5 s (the default heartbeat_interval); the 'watcher only' rows set the "
            "heartbeat to 3600 s; 'reference' rows are a bare Python thread waking at that interval, no sidecar.")
    for case in cases:
        value = median(case.samples)
        added = value - baseline
        met = None
        target = case.target
        if case.limit is not None:
            met = added < case.limit
        if case.records:
            plain = by_name[case.name.split(",")[0]]
            ref = median(plain.samples)
            target = "same as without the records"
            met = value - ref < max(0.2 * (ref - baseline), 0.005)
            delta = f"{added:+.4f}% of a core ({value - ref:+.4f} vs no records)"
        elif case.settings is None and not case.ref_wake and not case.ref_watchdog:
            delta = ""
        else:
            delta = f"{added:+.4f}% of a core ({added / 100 * 60 * 1000:.1f} ms CPU/min)"
        if case.settings is not None and case.mode != case.settings["watch"]:
            delta += f"; ran as {case.mode}!"
        rows.append(Row(
            BENCH, case.name, value, "%", baseline=None if case is cases[0] else baseline,
            baseline_label="" if case is cases[0] else "no sidecar", delta=delta, samples=case.samples,
            target=target, met=met, note=note,
            extra={"ticks_percent": ticks[case.name], "watch_mode": case.mode},
        ))
    # The ratio: the whole sidecar (inotify) against a bare watchdog observer, both above the baseline.
    whole, ref = by_name["inotify (whole sidecar)"], by_name[WATCHDOG_REF]
    added_whole, added_ref = median(whole.samples) - baseline, median(ref.samples) - baseline
    ratio = added_whole / added_ref if added_ref > 0 else float("inf")
    rows.append(Row(
        BENCH, "inotify (whole sidecar) / bare watchdog observer", ratio, "x", delta=(
            f"{added_whole:+.4f}% vs {added_ref:+.4f}% of a core above the baseline"),
        target=f"<= {WATCHDOG_FACTOR:g}x", met=ratio <= WATCHDOG_FACTOR,
        note="The CPU the whole idle sidecar adds (its inotify watcher, which reads the events itself, and its "
             "heartbeat, which rewrites the record only when it changed and otherwise sets its mtime) over what a "
             "bare watchdog Observer on the same control directory adds; same run, same windows."))
    return rows


if __name__ == "__main__":
    main(run)
