"""A training process that sits idle: torch imported and initialized, the
sidecar installed (unless --no-sidecar), and nothing else running.

    python -m benchmarks.programs.idle --registry R --output O --replica NAME [--config T] [--no-sidecar]

Prints `READY <pid>` and then blocks reading stdin until the parent closes it,
so the main thread itself costs no CPU while it waits.
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
    p.add_argument("--replica", default="bench-idle")
    p.add_argument("--config")
    p.add_argument("--no-sidecar", action="store_true")
    p.add_argument("--ref-wake", type=float, default=0.0,
                   help="no sidecar; one Python thread that wakes every this many seconds and does nothing "
                        "(the floor under any polling thread)")
    p.add_argument("--ref-watchdog", action="store_true",
                   help="no sidecar; a bare watchdog observer (inotify) on the registry's control directory")
    args = p.parse_args()

    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    model(torch.randn(4, 64)).sum().backward()  # initialize autograd and the allocator

    sc = None
    if args.ref_watchdog:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        control = os.path.join(args.registry, "control")
        os.makedirs(control, exist_ok=True)
        observer = Observer()
        observer.daemon = True
        observer.schedule(FileSystemEventHandler(), control, recursive=False)
        observer.start()
    elif args.ref_wake:
        stop = threading.Event()

        def wake() -> None:
            while not stop.wait(args.ref_wake):
                pass

        threading.Thread(target=wake, daemon=True).start()
    elif not args.no_sidecar:
        import sidecar

        sc = sidecar.install(output_dir=args.output, replica=args.replica, rank=0, config=args.config,
                             registry=args.registry)
    print(f"READY {os.getpid()} {sc.file_trigger.mode if sc else 'none'}", flush=True)
    sys.stdin.read()
    if sc is not None:
        sc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
