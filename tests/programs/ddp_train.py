"""A small DDP job on gloo for torchrun, with the sidecar installed.

    torchrun --standalone --nproc-per-node 2 tests/programs/ddp_train.py --stop-file F

Every rank stops at the same step: rank 0 looks for --stop-file and the
decision is all-reduced, so no rank is left waiting in a collective.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if os.environ.get("COSMOS_PROFILER_SIDECAR", "").strip() not in ("", "0"):
    # What the installed startup hook (.pth) does at interpreter start, before torch is imported:
    # kineto's on-demand environment (sidecar.rank.ondemand_env). The tests' venv has no .pth.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sitehook"))
    import _cosmos_profiler_startup  # noqa: F401

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def wandered_off(gil_fifo: str | None = None) -> None:
    """The rank that hangs: it never reaches the next collective. With `gil_fifo`, it first holds
    the GIL in a C call (libc's read through ctypes.PyDLL, which keeps it) until a byte is written
    to that FIFO: no thread of the process runs Python meanwhile."""
    print("HANGING", flush=True)
    if gil_fifo:
        import ctypes

        fd = os.open(gil_fifo, os.O_RDWR)  # O_RDWR: the open itself does not wait for a writer
        print("HOLDING", flush=True)
        ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)
        os.close(fd)
        print("RELEASED", flush=True)
    time.sleep(3600)


class SlowFile:
    """--slow-file: which rank is slowed, and by how much, changed while the job runs."""

    def __init__(self, path: str | None, rank: int) -> None:
        self.path, self.rank, self.mtime, self.extra, self.busy = path, rank, None, 0.0, False

    def extra_sleep(self) -> float:
        if self.path is None:
            return 0.0
        try:
            st = os.stat(self.path)
            mtime = (st.st_ino, st.st_mtime_ns)  # the test replaces the file (a new inode)
        except FileNotFoundError:
            return self.extra
        if mtime != self.mtime:
            self.mtime = mtime
            with open(self.path) as f:
                gen, slow_rank, seconds, *how = f.read().split()
            self.extra = float(seconds) if int(slow_rank) == self.rank else 0.0
            self.busy = how == ["busy"]
            print(f"SLOW {gen} rank {self.rank}", flush=True)
        return self.extra


def busy_for(seconds: float) -> None:
    """Work the profiler sees (aten::mm) for about `seconds`: an op that grew, for profile diff to name."""
    a = torch.randn(256, 256)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        torch.mm(a, a)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-file", required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--speed-schedule", default="",
                   help="SLEEP:SECONDS,... : step sleeps over a cycle of wall time (the same on every rank), "
                        "e.g. 0.1:5,0.005:2.5 for 5 s of slow steps, then 2.5 s of fast ones, and again")
    p.add_argument("--slow-poll-rank", type=int, default=-1, help="this rank polls every 3 s (sees requests late)")
    p.add_argument("--no-sidecar", action="store_true", help="run plain (for python -m sidecar.run)")
    p.add_argument("--hang-at", type=int, default=-1, help="at this step, --hang-rank stops and the others block")
    p.add_argument("--hang-rank", type=int, default=0)
    p.add_argument("--config", help="the job's TOML config, given to sidecar.install")
    p.add_argument("--gil-fifo", help="the hanging rank holds the GIL until a byte is written to this FIFO")
    p.add_argument("--slow-file", help="a file 'GEN RANK SECONDS [busy]': that rank sleeps SECONDS more in each "
                                       "step (the straggler), or with `busy` multiplies matrices (aten::mm) for "
                                       "that long; read whenever it changes; each rank prints SLOW GEN rank R")
    args = p.parse_args()
    schedule = [tuple(float(x) for x in part.split(":")) for part in args.speed_schedule.split(",") if part]
    cycle = sum(seconds for _, seconds in schedule)

    def step_sleep() -> float:
        if not schedule:
            return args.step_sleep
        at = time.time() % cycle
        for sleep, seconds in schedule:
            if at < seconds:
                return sleep
            at -= seconds
        return schedule[-1][0]

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 32), torch.randn(8, 1)

    sc = None
    if not args.no_sidecar:
        if rank == args.slow_poll_rank:
            os.environ["COSMOS_PROFILER_WATCH"] = "poll"
            os.environ["COSMOS_PROFILER_POLL_INTERVAL"] = "3"
        import sidecar

        sc = sidecar.install(config=args.config)
    print(f"READY {os.getpid()} rank {rank}", flush=True)

    slow = SlowFile(args.slow_file, rank)
    stop = torch.zeros(1)
    step = 0
    while step < args.steps:
        if step == args.hang_at and rank == args.hang_rank:
            wandered_off(args.gil_fifo)
        stop.zero_()
        if rank == 0 and os.path.exists(args.stop_file):
            stop += 1
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if sc is not None:
            sc.step()
        step += 1
        extra = slow.extra_sleep()
        if slow.busy:
            busy_for(extra)
            extra = 0.0
        time.sleep(step_sleep() + extra)
    if sc is not None:
        sc.close()
    dist.destroy_process_group()
    print(f"DONE {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
