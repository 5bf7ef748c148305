"""A training process that steps at a steady pace and does nothing else: torch imported
and initialized, the sidecar installed, `sc.step()` every --step-every seconds.

    python -m benchmarks.programs.stepping --registry R --output O --replica NAME --config T [--step-every S]

Prints `READY <pid> <watch mode> <native thread id of the stall watch, 0 when off>` and steps until the parent closes its stdin. For the idle
cost of what watches the steps (the stall watch), next to the same job without it.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--registry")
    p.add_argument("--output")
    p.add_argument("--replica", default="bench-stepping")
    p.add_argument("--config")
    p.add_argument("--step-every", type=float, default=0.05)
    args = p.parse_args()

    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    model(torch.randn(4, 64)).sum().backward()  # initialize autograd and the allocator

    import sidecar

    sc = sidecar.install(output_dir=args.output, replica=args.replica, rank=0, config=args.config,
                         registry=args.registry)
    stop = threading.Event()

    def read_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    watch = sc._stall_watch._worker._thread if sc._stall_watch is not None else None
    print(f"READY {os.getpid()} {sc.file_trigger.mode} {watch.native_id if watch else 0}", flush=True)
    while not stop.wait(args.step_every):
        sc.step()
    sc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
