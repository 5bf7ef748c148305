"""One process of the on-demand save benchmark (benchmarks/ondemand_save.py): one path, every size.

    python benchmarks/programs/ondemand_child.py --path ondemand|python --sizes 1,10,100 --repeats 3 --tmp DIR

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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--path", choices=("ondemand", "python"), required=True)
    p.add_argument("--sizes", default="1,10")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--tmp", required=True)
    p.add_argument("--idle-s", type=float, default=20.0)
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
    time.sleep(2.0)
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(args.idle_s)
    idle_cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)

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

    calib = capture(4)
    per_step = calib["json_bytes"] / 4
    out = {"path": args.path, "idle_cpu": idle_cpu, "sizes": {}}
    for size in (int(s) for s in args.sizes.split(",")):
        active = max(1, min(2000, round(size * MB / per_step)))
        out["sizes"][size] = [capture(active) for _ in range(args.repeats)]
    sc.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
