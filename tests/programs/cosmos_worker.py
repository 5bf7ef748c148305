"""A Cosmos-RL style worker loop using CosmosProfiler exactly as Cosmos-RL's trainers do.

    python tests/programs/cosmos_worker.py --config train.toml --replica pol-0 --rank 0 --stop-file F
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

import torch

from cosmos_rl.utils.profiler import CosmosProfiler


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--replica", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--role", default="policy")
    p.add_argument("--controller", default="")
    p.add_argument("--dynamic-at", type=int, default=-1, help="call start_dynamic at this step")
    p.add_argument("--stop-file", required=True)
    args = p.parse_args()

    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    profiler = CosmosProfiler(
        args.config,
        SimpleNamespace(global_rank=args.rank),
        args.replica,
        alternative_urls=[args.controller] if args.controller else None,
        role=args.role,
    )
    profiler.start()  # the static [profiler] config
    print(f"READY {os.getpid()}", flush=True)
    step = 0
    while not os.path.exists(args.stop_file):
        if step == args.dynamic_at:
            profiler.start_dynamic(active_steps=2, rank_filter=[args.rank], record_shape=True,
                                   profile_memory=False, with_stack=False, with_modules=False)
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        profiler.step()
        if profiler.check_finished():
            print(f"FINISHED at step {step}", flush=True)
        step += 1
        time.sleep(0.01)
    profiler.close()
    print(f"DONE {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
