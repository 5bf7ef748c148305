"""What a `profile hang` dump costs a rank with a full flight recorder (standalone; not in bin/bench's table yet).

    python -m benchmarks.flightrec_cost

A 1-rank gloo job fills its flight recorder (2500 all_reduce, more than the 2000-entry
buffer), then, five times: torch's own dump (`_dump_fr_trace_json`) and how fast a
Python thread (the training thread's stand-in) runs meanwhile, relative to its free
rate (the dump holds the GIL most of the time); the sidecar's `flightrec.render`
(torch's dump plus one JSON parse and write); and the CLI's `json.loads` of the file.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import torch
import torch.distributed as dist

from sidecar.rank import flightrec

ROUNDS = 5


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.ones(3)
    for _ in range(2500):
        dist.all_reduce(t)
    c10d = torch._C._distributed_c10d
    count, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.2)
    try:
        for _ in range(ROUNDS):
            c0, t0 = count[0], time.perf_counter()
            time.sleep(0.1)
            free = (count[0] - c0) / (time.perf_counter() - t0)
            c0, t0 = count[0], time.perf_counter()
            raw = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
            took = time.perf_counter() - t0
            share = (count[0] - c0) / took / free
            t1 = time.perf_counter()
            data, _, _ = flightrec.render({"rank": 0})
            t2 = time.perf_counter()
            json.loads(data)
            t3 = time.perf_counter()
            print(f"torch dump {len(raw) / 1e6:.2f} MB in {took * 1e3:.0f} ms (a Python thread ran at {share:.0%} "
                  f"meanwhile); flightrec.render {len(data) / 1e6:.2f} MB in {(t2 - t1) * 1e3:.0f} ms; "
                  f"CLI json.loads {(t3 - t2) * 1e3:.0f} ms")
    finally:
        stop.set()
        spinner.join()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
