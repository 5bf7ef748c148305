"""A training loop with the sidecar installed, for the latency benchmark.

    python -m benchmarks.programs.train --registry R --output O --replica NAME --config T --stop-file F

Runs `Trainer(--model)` steps back to back (unless --step-sleep), so the
watcher thread competes with a busy training thread for the GIL, calling
`sc.step()` after each. Prints `READY <pid> <watch mode>` once the sidecar is installed; stops
when the stop file exists (checked every 32 steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import sidecar
from benchmarks.models import Trainer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--registry", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--replica", required=True)
    p.add_argument("--config")
    p.add_argument("--stop-file", required=True)
    p.add_argument("--model", default="small")
    p.add_argument("--step-sleep", type=float, default=0.0, help="sleep this long after each step (GIL free)")
    args = p.parse_args()

    trainer = Trainer(args.model)
    for _ in range(5):
        trainer.step()
    sc = sidecar.install(output_dir=args.output, replica=args.replica, rank=0, config=args.config,
                         registry=args.registry)
    print(f"READY {os.getpid()} {sc.file_trigger.mode}", flush=True)
    step = 0
    while True:
        trainer.step()
        sc.step()
        step += 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if step % 32 == 0 and os.path.exists(args.stop_file):
            break
    sc.close()
    print(f"DONE {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
