"""An unmodified training script: it knows nothing of the sidecar.

    python -m sidecar.run --replica z tests/programs/plain_train.py --stop-file F [--two-optimizers]

With --two-optimizers each iteration steps a generator and a discriminator
optimizer (GAN style); the sidecar must count iterations, not optimizer calls.
With --explicit, it also calls sidecar.current().step(), which takes over.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-file", required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--two-optimizers", action="store_true")
    p.add_argument("--explicit", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(1)
    gen, disc = torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    opt_d = torch.optim.Adam(disc.parameters(), lr=0.01)
    print(f"READY {os.getpid()}", flush=True)
    step = 0
    while step < args.steps and not os.path.exists(args.stop_file):
        opt_g.zero_grad()
        opt_d.zero_grad()
        disc(gen(torch.randn(8, 16))).mean().backward()
        opt_g.step()
        if args.two_optimizers:
            opt_d.step()
        if args.explicit:
            import sidecar

            sidecar.current().step()
        step += 1
        time.sleep(0.01)
    print(f"DONE {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
