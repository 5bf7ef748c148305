"""bin/gpu-check's checks: every CUDA path of the sidecar, on one GPU, in one short run.

    python -m gpu_check --out DIR [--gpu-expected] [--budget-s 285] [--big-mb 200] [--device cuda|cpu]

bin/gpu-check sets up a Python with a CUDA torch and runs this. One line per check, as it
ends: `ok   <check>: <evidence>` or `FAIL <check>: <reason>`, then a summary line; exit 1
on any FAIL. Without a usable GPU: one line, `no GPU: skipped`, exit 0 (with
--gpu-expected, where bin/gpu-check saw a GPU, that is a `FAIL setup` instead).

  1 kernels, summary    gpu_check/cuda_train.py (matmuls and an all-reduce on a
                        one-rank NCCL group) under `python -m sidecar.run`; `profile set -as 2
                        --wait`: CUDA kernels inside the ProfilerStep windows;
                        `profile summary --json`: kernel time per step, as the trace adds up;
    ondemand            that capture came through kineto's on-demand path (sidecar.run's environment)
  2 profile-memory,     `profile set -pm`: CUDA [memory] events; a {"kind": "memory"} request:
    memory-snapshot     a `torch.cuda.memory._snapshot()` pickle with Python frames, which
                        torch's memory_viz renders
  3 fork-writer,        gpu_check/cuda_save_stall.py: the first save of a CUDA + NCCL
    writers             process forked (COSMOS_PROFILER_SAVE_WRITER=fork): complete, with
                        deviceProperties, training steps on; then fork, auto and thread side
                        by side (stall, slowdown)
  4 hang                the training job's rank stopped in an NCCL all-reduce (GPU sleeps
                        queued before it); `profile hang`: the flight recorder names it
  5 save-stall          a ~200 MB CUDA trace: ours against a synchronous export_chrome_trace

The verifiers (gpu_check/verify.py) are pure and tested on CPU (tests/test_gpu_check.py); the
rest needs the GPU. Every child runs in a session of its own, dies with this process
(PR_SET_PDEATHSIG) and is killed at the end; every wait has a deadline inside --budget-s.
Artifacts (traces, snapshot, logs) go under DIR/work; DIR/report.txt holds the lines and
DIR/results.json the numbers. Nothing here imports torch: the GPU is probed in a child.
`--device cpu` (`bin/gpu-check --device cpu` passes it on) runs the same plumbing on CPU and
gloo, for developing this without a GPU: the CUDA checks then FAIL, each saying what a CPU run
lacks.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_check.checks import bench_checks, cli_checks
from gpu_check.harness import Run, probe_gpu

SKIPPED = "no GPU: skipped"



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
