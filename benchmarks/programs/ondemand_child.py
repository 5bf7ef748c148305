"""One process of the on-demand save benchmark (benchmarks/ondemand_save.py): one path, every size.

    python benchmarks/programs/ondemand_child.py --path ondemand|python --actives 2,19 --tmp DIR [--idle-s 30]

The on-demand path's environment is set before torch is imported, as `sidecar.run` sets it. A Sidecar is
installed; each capture is a request with no start step (what a signal asks: "from the next step"),
`Trainer("deep")` steps with record_shapes + with_stack through warmup 1 and N active steps, then
`Trainer("work")` steps until the file is saved, plus 3. Prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import statistics
import sys
import time

from sidecar.rank import ondemand_env

IDLE_STEPS = 20
MB = 1e6


def thread_cpu() -> dict[str, tuple[str, int]]:
    """Each thread of this process: (its name, its CPU ticks so far)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (name, int(fields[11]) + int(fields[12]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--path", choices=("ondemand", "python"), required=True)
    p.add_argument("--actives", default="", help="one capture of each number of active steps (after a calibration)")
    p.add_argument("--tmp", required=True)
    p.add_argument("--idle-s", type=float, default=0.0, help="measure idle CPU over this many seconds (0: not)")
    args = p.parse_args()
    if args.path == "ondemand":
        if ondemand_env.prepare() is None:
            raise SystemExit(f"no on-demand environment: {ondemand_env.why_not()}")
    else:
        os.environ["COSMOS_PROFILER_ONDEMAND"] = "off"

    import sidecar
    from benchmarks.models import Trainer
    from sidecar.common.request import ProfileRequest

    deep, work = Trainer("deep"), Trainer("work")
    sc = sidecar.install(output_dir=os.path.join(args.tmp, "out"), replica=f"bench-{args.path}",
                         registry=os.path.join(args.tmp, "reg"))
    saved_at: list[float] = []
    sc.on_saved.append(lambda kind, path, request: saved_at.append(time.perf_counter()))
    for _ in range(5):
        deep.step()
        work.step()
        sc.step()

    # idle CPU: the process asleep with its sidecar (and, on the on-demand path, the responder and kineto's polls)
    idle_cpu, by_thread = None, {}
    if args.idle_s:
        time.sleep(2.0)
        threads0 = thread_cpu()
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(args.idle_s)
        wall = time.monotonic() - wall0
        idle_cpu = (time.process_time() - cpu0) / wall
        threads1 = thread_cpu()
        for tid, (name, ticks) in threads1.items():
            used = ticks - threads0.get(tid, (name, 0))[1]
            if used > 0:
                by_thread[name] = by_thread.get(name, 0.0) + used / os.sysconf("SC_CLK_TCK") / wall
    else:  # a pace the sidecar knows (its lead before an on-demand window is a poll's wait at this pace)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:
            deep.step()
            sc.step()

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def capture(active: int) -> dict:
        n = sc.num_captures
        gc.collect()
        gc_before = timed(gc.collect)
        deep_base = statistics.median([timed(lambda: (deep.step(), sc.step())) for _ in range(IDLE_STEPS)])
        work_base = statistics.median([timed(lambda: (work.step(), sc.step())) for _ in range(IDLE_STEPS)])
        gc.disable()
        req = ProfileRequest(id=f"b{time.monotonic_ns()}", wait_steps=0, warmup_steps=1, active_steps=active,
                             record_shape=True, with_stack=True)
        t_req = time.perf_counter()
        sc.request_capture(req)
        boundary_at: dict[int, float] = {}
        first = None
        while sc.num_finished == n:  # deep steps until the window ends (the finalizing boundary is inside)
            start = sc.step_num
            t0 = time.perf_counter()
            deep.step()
            sc.step()
            boundary_at[start + 1] = time.perf_counter()
            dt = time.perf_counter() - t0
            if first is None and sc.state.value == "tracing":
                first = sc._capture.record_fields()["capture_start_step"] + 1  # warmup 1: the first recorded step
        finalize_s = dt - deep_base
        t_end = time.perf_counter()
        during = []
        while sc.num_captures == n:
            if sc.state.value == "error":
                raise SystemExit(f"capture failed: {sc.record().error}")
            during.append(timed(lambda: (work.step(), sc.step())))
        after = [timed(lambda: (work.step(), sc.step())) for _ in range(3)]
        gc.enable()
        gc_after = timed(gc.collect)
        later = sum(t - work_base for t in during + after)
        rec = sc.record()
        path = rec.trace_path
        with gzip.open(path, "rb") as f:
            json_bytes = len(f.read())
        first_at = boundary_at.get(first) if first is not None else None
        return {
            "active": active, "json_bytes": json_bytes, "gz_bytes": os.path.getsize(path),
            "stall_s": max(finalize_s, 0.0) + max(later, 0.0) + max(gc_after - gc_before, 0.0),
            "finalize_s": finalize_s, "later_s": later, "gc_s": gc_after - gc_before,
            "slowdown": (sum(during) / len(during) / work_base - 1.0) if during else None,
            "window_steps": len(during), "deep_base_s": deep_base, "work_base_s": work_base,
            "request_to_first_s": (first_at - t_req) if first_at is not None else None,
            "last_step_to_file_s": saved_at[-1] - t_end,
            "path": "ondemand" if any(h.get("path") == "ondemand" for h in rec.history) else "python",
        }

    calib = capture(4)  # also the first capture of the process, which pays one-time costs
    out = {"path": args.path, "idle_cpu": idle_cpu, "idle_cpu_by_thread": by_thread, "json_per_step": calib["json_bytes"] / 4,
           "captures": [capture(int(a)) for a in args.actives.split(",") if a]}
    sc.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
