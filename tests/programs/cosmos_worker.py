"""A CPU worker that drives `CosmosProfiler` exactly as cosmos-rl 0.4.7's workers do.

    python tests/programs/cosmos_worker.py --config train.toml [--mode sft|rl] --stop-file F

With the real cosmos-rl installed it builds cosmos-rl's own objects: `Config.from_dict`
of the TOML (which appends a timestamp to train.output_dir), `ParallelDims` from the
config's parallelism, and an `APIClient` for --controller; the profiler is whatever
`cosmos_rl.utils.profiler.CosmosProfiler` is (cosmos-rl's, or the sidecar's when the
import hook is on). With the stand-in it passes the TOML path and plain objects.

In base.py's order (policy/worker/base.py, `PolicyWorkerBase.__init__`): the profiler, then,
with the real cosmos-rl and `train.save_ckpt_at_exit`, the real `DistributedSignalHandler` on
`train.signal_to_handle` (SIGUSR1 by default).

SFT (policy/worker/sft_worker.py): `start()` once before the loop, `step()` after each
training step, and a checkpoint signal stops training. RL (policy/worker/rl_worker.py):
`start_dynamic(...)` when a command asks (--dynamic-at, --dynamic-file), `step()` after the step, then
`check_finished()` on the master rank; a checkpoint signal saves a checkpoint (printed here).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from types import SimpleNamespace

import torch

from cosmos_rl.utils.profiler import CosmosProfiler


def build_cosmos_objects(args: argparse.Namespace):
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        from cosmos_rl.policy.config import Config
    except ImportError:  # the stand-in: no Config class, the profiler takes the TOML path
        api_client = SimpleNamespace(base_urls=[f"http://{args.controller}"]) if args.controller else None
        return args.config, SimpleNamespace(global_rank=int(os.environ.get("RANK", "0")), world_size=world_size), \
            api_client

    import toml

    from cosmos_rl.dispatcher.api.client import APIClient
    from cosmos_rl.utils.parallelism import ParallelDims

    config = Config.from_dict(toml.load(args.config))
    parallel_dims = ParallelDims.from_config_for_analysis(config.policy.parallelism, world_size)
    api_client = None
    if args.controller:
        host, port = args.controller.rsplit(":", 1)
        from cosmos_rl.dispatcher.protocol import Role

        api_client = APIClient(Role.POLICY, remote_ips=[host], remote_port=int(port))
    print(f"OUTPUT_DIR {config.train.output_dir}", flush=True)
    return config, parallel_dims, api_client


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--replica", default=None, help="default: a uuid, as cosmos-rl names replicas")
    p.add_argument("--mode", choices=("sft", "rl"), default="sft")
    p.add_argument("--controller", default="", help="HOST:PORT of a controller to report trace paths to")
    p.add_argument("--dynamic-at", type=int, default=-1, help="rl: call start_dynamic at this step")
    p.add_argument("--dynamic-file", default=None, help="rl: call start_dynamic at the first step this file exists")
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--stop-file", required=True)
    args = p.parse_args()

    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config, parallel_dims, api_client = build_cosmos_objects(args)
    replica = args.replica or str(uuid.uuid4())
    profiler = CosmosProfiler(config, parallel_dims, replica_name=replica, api_client=api_client)
    print(f"PROFILER {type(profiler).__module__}.{type(profiler).__qualname__}", flush=True)
    signal_handler = None
    if getattr(getattr(config, "train", None), "save_ckpt_at_exit", False):
        from cosmos_rl.utils.dist_signal_handler import DistributedSignalHandler

        signal_handler = DistributedSignalHandler.get_instance(config.train.signal_to_handle)
    if args.mode == "sft":
        profiler.start()
    print(f"READY {os.getpid()} {replica}", flush=True)
    step = 0
    while not os.path.exists(args.stop_file):
        asked = step == args.dynamic_at or (args.dynamic_file is not None and os.path.exists(args.dynamic_file))
        if args.mode == "rl" and asked:
            if args.dynamic_file is not None:
                args.dynamic_file = None  # once
            print(f"DYNAMIC at step {step}", flush=True)
            profiler.start_dynamic(active_steps=2, rank_filter=[parallel_dims.global_rank], record_shape=True,
                                   profile_memory=False, with_stack=False, with_modules=False)
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        profiler.step()
        if args.mode == "rl" and parallel_dims.global_rank == 0 and profiler.check_finished():
            print(f"FINISHED at step {step}", flush=True)
        step += 1
        if signal_handler is not None and any(signal_handler.signals_received()):
            signal_handler.release()
            signal_handler = None
            print(f"CHECKPOINT SIGNAL at step {step}: " + ("save a checkpoint" if args.mode == "rl" else
                                                           "stop training"), flush=True)
            if args.mode == "sft":
                break
        if step == 5:
            print("STEP 5", flush=True)
        time.sleep(args.step_time)
    print(f"DONE {step} profiled_times={profiler.profiled_times}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
