"""A small real training job with the profiler sidecar: the integration in four lines.

    python examples/demo_train.py --replica demo --output demo-output --steps 3000

An MLP on random data, on the CPU (or CUDA when there is one). Profile it from
another shell with `cosmos-profiler profile set demo --wait`.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import sidecar


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replica", default="demo")
    p.add_argument("--output", default="demo-output")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--stop-file", help="stop early when this file exists")
    args = p.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width), torch.nn.GELU(),
        torch.nn.Linear(args.width, args.width), torch.nn.GELU(),
        torch.nn.Linear(args.width, 1),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    sc = sidecar.install(output_dir=args.output, replica=args.replica)  # 1: install
    print(f"training {args.replica} on {device}, pid {os.getpid()}", flush=True)
    steps = 0
    while steps < args.steps:
        if args.stop_file and os.path.exists(args.stop_file):
            break
        x = torch.randn(64, args.width, device=device)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sc.step()  # 2: one call per training step
        steps += 1
        time.sleep(0.01)  # stand-in for data loading, so the demo does not hog the CPU
    sc.close()  # 3: also done at exit
    print(f"finished after {steps} steps", flush=True)


if __name__ == "__main__":
    main()
