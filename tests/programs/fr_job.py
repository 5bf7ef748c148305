"""A gloo job for torchrun whose flight recorder holds more than all_reduce, with the sidecar installed.

    torchrun --standalone --nproc-per-node 2 tests/programs/fr_job.py --stop-file F [--leave-rank 1]

Before its steps every rank runs: an all_reduce on a second process group (desc "second"),
coalesced all_reduces (`all_reduce_coalesced` and `_coalescing_manager`), and point-to-point
send/recv and `batch_isend_irecv` between ranks 0 and 1. Each step all-reduces. With
--leave-rank, that rank stops calling collectives at --leave-at and the others wait in the
step's all_reduce; with --no-fr-rank, that rank's flight recorder is off (buffer size 0), so
it dumps no data. With --debug-server PORT, every rank also runs torch's debug server
(`torch.distributed.debug.start_debug_server`, its frontend on rank 0 at PORT), with
`sidecar.debugserver.handlers()`: torch's pages plus the aligned capture page.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist


def left() -> None:
    print("HANGING", flush=True)
    time.sleep(3600)


def exercise(rank: int) -> None:
    """The collectives fr_trace knows and our all_reduce steps do not make."""
    t = torch.ones(4)
    second = dist.new_group(list(range(dist.get_world_size())), group_desc="second")
    dist.all_reduce(t, group=second)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
    with dist._coalescing_manager():
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(3))
    if rank in (0, 1):
        peer = 1 - rank
        if rank == 0:
            dist.send(t, peer)
        else:
            dist.recv(t, peer)
        ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, torch.zeros(4), peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    dist.barrier()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-file", required=True)
    p.add_argument("--leave-rank", type=int, default=-1)
    p.add_argument("--leave-at", type=int, default=5)
    p.add_argument("--no-fr-rank", type=int, default=-1)
    p.add_argument("--debug-server", type=int, default=0, help="the debug server's frontend port (0: none)")
    args = p.parse_args()
    if int(os.environ["RANK"]) == args.no_fr_rank:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    import sidecar

    sc = sidecar.install()
    if args.debug_server:
        from torch.distributed.debug import start_debug_server

        from sidecar import debugserver

        start_debug_server(port=args.debug_server, handlers=debugserver.handlers())
    exercise(rank)
    print(f"READY {os.getpid()} rank {rank}", flush=True)
    stop = torch.zeros(1)
    step = 0
    while True:
        if step == args.leave_at and rank == args.leave_rank:
            left()
        stop.zero_()
        if rank == 0 and os.path.exists(args.stop_file):
            stop += 1
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        sc.step()
        step += 1
        time.sleep(0.02)
    sc.close()
    if args.debug_server and rank == 0:
        from torch.distributed.debug import stop_debug_server

        stop_debug_server()
    dist.destroy_process_group()
    print(f"DONE {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
