"""A CPU process shaped like a cosmos-rl 0.4.7 rollout worker, for `python -m sidecar.run`.

    python -m sidecar.run --replica R tests/programs/cosmos_rollout.py --stop-file F

It imports cosmos-rl's rollout package (`RolloutWorkerBase` lives there; constructing it
needs CUDA and a controller) and then does what a rollout does for the sidecar: forward
passes, no CosmosProfiler, no optimizer step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import cosmos_rl.rollout  # noqa: F401 - what a rollout worker's process imports


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-file", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 32)
    print(f"READY {os.getpid()}", flush=True)
    while not os.path.exists(args.stop_file):
        with torch.no_grad():
            model(torch.randn(8, 32))
        time.sleep(0.01)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
