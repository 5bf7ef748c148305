"""CPU workers shaped like cosmos-rl 0.4.7's worker classes that `cosmos_worker.py` does not cover.

    python tests/programs/cosmos_worker_types.py --config train.toml --kind multi_sft|teacher --stop-file F

Each builds `cosmos_rl.utils.profiler.CosmosProfiler` inside its constructor, as
`PolicyWorkerBase.__init__` does (so the profiler sees its worker), with the same
objects as `cosmos_worker.py` (cosmos-rl's own with the real package, plain ones with
the stand-in), then drives it exactly as that class does in 0.4.7:

- `MultiReplicaSFTPolicyWorker` (policy/worker/multi_replica_sft_worker.py): `start()`
  once before the loop, an optimizer step per training step, `check_finished()` on the
  master rank for the train ack, and never `step()`;
- `TeacherWorker` (reference/worker/teacher_worker.py): role REFERENCE, no profiler
  call after the constructor, no optimizer (a forward pass per batch).

The real classes need CUDA, a model and a controller to construct, so these stand in
for them, keeping their names, their `role` and their calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from cosmos_rl.utils.profiler import CosmosProfiler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cosmos_worker import build_cosmos_objects  # noqa: E402


class PolicyWorkerBase:
    """The part of 0.4.7's `PolicyWorkerBase.__init__` that builds the profiler."""

    def __init__(self, config, parallel_dims, api_client, replica_name: str, role: str = "POLICY") -> None:
        self.role = role
        self.replica_name = replica_name
        self.global_rank = parallel_dims.global_rank
        self.profiler = CosmosProfiler(config, parallel_dims, replica_name=self.replica_name, api_client=api_client)


class MultiReplicaSFTPolicyWorker(PolicyWorkerBase):
    def main_loop(self, args: argparse.Namespace) -> int:
        model = torch.nn.Linear(32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        self.profiler.start()
        train_step = 0
        while not os.path.exists(args.stop_file):
            opt.zero_grad()
            model(torch.randn(8, 32)).sum().backward()
            opt.step()  # trainer.step_training
            train_step += 1
            if self.global_rank == 0 and self.profiler.check_finished():  # post_policy_train_ack
                print(f"FINISHED at step {train_step}", flush=True)
            time.sleep(args.step_time)
        return train_step


class TeacherWorker(PolicyWorkerBase):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, role="REFERENCE", **kwargs)

    def main_loop(self, args: argparse.Namespace) -> int:
        model = torch.nn.Linear(32, 32)
        batches = 0
        while not os.path.exists(args.stop_file):
            with torch.no_grad():
                model(torch.randn(8, 32))  # engine.step_forward
            batches += 1
            time.sleep(args.step_time)
        return batches


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--replica", required=True)
    p.add_argument("--kind", choices=("multi_sft", "teacher"), required=True)
    p.add_argument("--controller", default="")
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--stop-file", required=True)
    args = p.parse_args()

    torch.set_num_threads(1)
    config, parallel_dims, api_client = build_cosmos_objects(args)
    cls = MultiReplicaSFTPolicyWorker if args.kind == "multi_sft" else TeacherWorker
    worker = cls(config, parallel_dims, api_client, replica_name=args.replica)
    print(f"PROFILER {type(worker.profiler).__module__}.{type(worker.profiler).__qualname__}", flush=True)
    print(f"READY {os.getpid()} {args.replica}", flush=True)
    steps = worker.main_loop(args)
    print(f"DONE {steps} profiled_times={worker.profiler.profiled_times}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
