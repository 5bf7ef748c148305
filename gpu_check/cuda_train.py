"""A small CUDA training loop on a one-rank NCCL group, for bin/gpu-check (gpu_check/checks.py).

    python -m sidecar.run --replica gpucheck --output O gpu_check/cuda_train.py \
        --store S --stop-file F --hang-file H

Each step: a few matmuls forward and backward, an all-reduce of the loss on the NCCL group,
the loss read back (a sync, as a loop that logs its loss does), then `optimizer.step()`,
which `sidecar.run` counts as the step. Prints `READY <pid>` after the first step (CUDA and
NCCL are up then). Stops when --stop-file exists.

When --hang-file appears, the rank stops in a collective: it queues GPU sleeps on its stream,
then an all-reduce behind them, and waits for it (`torch.cuda.synchronize`), printing
`HANGING`. The all-reduce is entered and never completes while the sleeps run, which is
what the flight recorder shows for a rank stuck in a collective; `profile hang` reads it.
The process is killed after that (it dies with its parent, too).

`--device cpu` runs the same loop on CPU and gloo (the hang then only sleeps), so that
`bin/gpu-check --device cpu` can exercise its plumbing without a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

PR_SET_PDEATHSIG = 1
# torch.cuda._sleep spins for this many GPU cycles: about 1 s at the H200's 1.98 GHz. The hang
# queues many short sleeps rather than one long one, so a kill never waits long on a kernel.
SLEEP_CYCLES = 2_000_000_000
HANG_SLEEPS = 120


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (the check must stop by itself)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def hang(token: torch.Tensor) -> None:
    if token.device.type != "cuda":
        print("HANGING", flush=True)
        time.sleep(3600)
    for _ in range(HANG_SLEEPS):
        torch.cuda._sleep(SLEEP_CYCLES)
    dist.all_reduce(token)
    print("HANGING", flush=True)
    torch.cuda.synchronize()
    print("HANG ENDED", flush=True)


def main() -> int:
    die_with_parent()
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True, help="a file for the NCCL group's FileStore")
    p.add_argument("--stop-file", required=True)
    p.add_argument("--hang-file", required=True)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--step-sleep", type=float, default=0.01)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()

    if os.path.exists(args.store):
        os.unlink(args.store)  # an earlier run's FileStore
    if args.device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method=f"file://{args.store}",
                            rank=0, world_size=1)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=args.device)
    y = torch.randn(args.batch, 1, device=args.device)
    token = torch.ones(1, device=args.device)

    step = 0
    while not os.path.exists(args.stop_file):
        if os.path.exists(args.hang_file):
            hang(token)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        float(reduced)  # the loss read back: the step's kernels are done before the step ends
        opt.step()
        step += 1
        if step == 1:
            print(f"READY {os.getpid()}", flush=True)
        time.sleep(args.step_sleep)
    dist.destroy_process_group()
    print(f"DONE {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
