"""Run the benchmarks and print one table.

    python -m benchmarks.run [--quick] [--only NAME[,NAME]] [--json] [--out FILE]

Each benchmark module runs in its own interpreter (its torch state, threads
and children stay its own); its stderr goes to a log file, named when it
fails. The table is markdown, for the README; `--json` prints rows and the
machine instead. Nothing here asserts a time: read the table.

The package is byte-compiled first, as `pip install` leaves it: the children
run it from this tree, and with PYTHONDONTWRITEBYTECODE set (or a read-only
tree) every CLI run would otherwise compile it again (~45 ms of CPU), a cost an
installed CLI never pays.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from benchmarks.common import PYTHON, ROOT, Row, child_env
from benchmarks.table import render_markdown

# name: (module, what it measures, seconds it takes in --quick / full, roughly)
BENCHMARKS = {
    "overhead": ("benchmarks.overhead", "1. idle overhead per step", (15, 60)),
    "idle_cpu": ("benchmarks.idle_cpu", "2. idle CPU of the watcher", (45, 120)),
    "latency": ("benchmarks.latency", "3. trigger latency and CLI wall time", (70, 200)),
    "save_stall": ("benchmarks.save_stall", "4. save stall", (150, 750)),
    "registry_scale": ("benchmarks.registry_scale", "5. registry scale", (25, 120)),
    "profiling": ("benchmarks.profiling", "6. profiling overhead, for reference", (15, 60)),
    "alignment": ("benchmarks.alignment", "7. aligned starts under changing speed", (80, 200)),
    "stall_idle": ("benchmarks.stall_idle", "8. idle CPU of the stall watch", (25, 140)),
    "analysis_vs_hta": ("benchmarks.analysis_vs_hta", "9. profile diff and summary vs HTA, same traces", (300, 1800)),
    "watchdog_inotify": ("benchmarks.watchdog_inotify", "10. file watching: ours vs watchdog's InotifyFD", (120, 300)),
    "fleet_scale": ("benchmarks.fleet_scale", "11. fleet scale: registry syscalls at rest, node agent off vs on", (120, 900)),
    "redis_registry": ("benchmarks.redis_registry", "12. redis:// registry vs files: request to armed, idle CPU",
                       (60, 150)),
    "summaries": ("benchmarks.summaries", "13. trace summaries: the child per trace, the record's size and parse", (10, 60)),
    "ondemand_save": ("benchmarks.ondemand_save", "14. save on kineto's on-demand path vs the Python path", (150, 600)),
}
TIMEOUT_S = 1200  # per benchmark, or three times its expected full time where that is longer


def machine() -> dict[str, object]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "?"
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch_version,
        "commit": commit,
    }


def run_one(name: str, quick: bool, logs: Path) -> tuple[list[Row], float, str]:
    module, what, _ = BENCHMARKS[name]
    rows_out = logs / f"{name}.json"
    log = logs / f"{name}.log"
    cmd = [PYTHON, "-m", module, "--rows-out", str(rows_out)] + (["--quick"] if quick else [])
    t0 = time.monotonic()
    with open(log, "wb") as f:
        try:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                  timeout=max(TIMEOUT_S, 3 * BENCHMARKS[name][2][1]))
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    took = time.monotonic() - t0
    if code != 0 or not rows_out.exists():
        tail = log.read_text(errors="replace")[-1500:]
        row = Row(what, "FAILED", None, "", status=f"failed ({code}); log: {log}", note=tail.strip().splitlines()[-1]
                  if tail.strip() else "")
        return [row], took, f"failed ({code}), log {log}"
    rows = [Row.from_json(r) for r in json.loads(rows_out.read_text())]
    return rows, took, "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 5 s idle windows, no 100 MB trace "
                                                             "(about 3-4 minutes)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"run only these (repeatable or comma-separated): {', '.join(BENCHMARKS)}")
    parser.add_argument("--json", action="store_true", help="print JSON (rows and machine) instead of the table")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON here")
    args = parser.parse_args()

    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    compileall.compile_dir(ROOT / "sidecar", quiet=1)
    logs = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    info = machine()
    info["mode"] = "quick" if args.quick else "full"
    info["command"] = "bin/bench " + " ".join(sys.argv[1:])
    info["load_before"] = os.getloadavg()
    started = time.time()
    rows: list[Row] = []
    timings = {}
    for name in names:
        expected = BENCHMARKS[name][2][0 if args.quick else 1]
        print(f"[bench] {name}: {BENCHMARKS[name][1]} (~{expected} s) ...", file=sys.stderr, flush=True)
        got, took, status = run_one(name, args.quick, logs)
        timings[name] = round(took, 1)
        print(f"[bench] {name}: {status} in {took:.0f} s", file=sys.stderr, flush=True)
        rows += got
    info["load_after"] = os.getloadavg()
    info["seconds"] = round(time.time() - started)
    info["seconds_by_benchmark"] = timings
    info["logs"] = str(logs)
    data = {"machine": info, "rows": [r.to_json() for r in rows]}
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1))
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        load = ", ".join(f"{x:.2f}" for x in info["load_before"]) + " -> " + ", ".join(
            f"{x:.2f}" for x in info["load_after"])
        print(f"Machine: {info['cpu']}, {info['nproc']} CPUs, {info['memory_gib']} GiB, Linux {info['kernel']}; "
              f"Python {info['python']}, torch {info['torch']}; commit {info['commit']}; load average {load}")
        print(f"Command: {info['command']}   ({info['mode']} run, {info['seconds']} s)")
        print()
        print(render_markdown(rows))
    return 1 if any(r.case == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
