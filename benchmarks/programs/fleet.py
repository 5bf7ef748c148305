"""Many lightweight ranks: real sidecars in forked processes, without torch.

    python -m benchmarks.programs.fleet --num N --registry R --output O --replica NAME --config T

The parent imports `sidecar` (which does not import torch), then forks N
children before any thread exists; child k installs a real Sidecar as rank k
of a world of N (watch mode and interval from the config) and then waits
forever. It never calls step(), so a request it accepts stays `armed` in its
record: what the registry benchmark waits for. The parent prints `READY` and
waits for SIGTERM, which it passes on to its children.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def _child(args: argparse.Namespace, rank: int) -> None:
    os.environ["WORLD_SIZE"] = str(args.num)
    os.environ["RANK"] = str(rank)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import sidecar

    sidecar.install(output_dir=args.output, replica=args.replica, rank=rank, config=args.config,
                    registry=args.registry)
    threading.Event().wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--registry", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--replica", required=True)
    p.add_argument("--config", required=True)
    args = p.parse_args()

    import logging

    import sidecar  # noqa: F401 - imported once, shared by every fork

    logging.getLogger("sidecar").setLevel(logging.WARNING)
    children = []
    for rank in range(args.num):
        pid = os.fork()
        if pid == 0:
            try:
                _child(args, rank)
            finally:
                os._exit(0)
        children.append(pid)

    def stop(signum: int, frame: object) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"READY {os.getpid()} {len(children)}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
