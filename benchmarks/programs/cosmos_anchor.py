"""The anchor: cosmos-rl 0.4.7's own `CosmosProfiler`, timed on the save benchmark's model and capture.

    <cosmos-rl venv>/bin/python -I -B benchmarks/programs/cosmos_anchor.py --active N [--repeats R]

Run by benchmarks/save_stall.py with the interpreter of the venv that bin/cosmos-rl-venv builds
(`-I`: neither this checkout, whose cosmos_rl/ is our stand-in, nor PYTHONPATH is on sys.path;
`-B`: the venv is only read). It builds cosmos-rl's `Config` (`Config.from_dict`) and
`ParallelDims`, drives `CosmosProfiler` as the SFT worker does (`start()` once, `step()` after
each training step) with wait 0, warmup 1, N active steps, record_shape and with_stack, and
times every step. Per capture, against the median of 20 idle steps just before: the excess of
the step in which `stop_and_save` ran (kineto's stop, export_chrome_trace(path.gz), the thread
pool's shutdown) plus 3 later steps, and the cyclic GC's collection that frees the profile (cosmos-rl
drops it with `del`). Prints one JSON line: {"profiler": "<module>.<class>", "file": ..., "results": [...]}.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

IDLE_STEPS = 20
TAIL_STEPS = 3
HERE = Path(__file__).resolve().parent


def _trainer_class():
    spec = importlib.util.spec_from_file_location("bench_models", HERE.parent / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Trainer


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def capture(trainer, active: int, out: Path, num: int) -> dict:
    from cosmos_rl.policy.config import Config
    from cosmos_rl.utils.parallelism import ParallelDims
    from cosmos_rl.utils.profiler import CosmosProfiler

    config = Config.from_dict({
        "train": {"output_dir": str(out / f"run{num}")},
        "profiler": {"enable_profiler": True, "sub_profiler_config": {
            "active_steps": active, "warmup_steps": 1, "wait_steps": 0, "rank_filter": [0],
            "record_shape": True, "with_stack": True}},
        "policy": {"parallelism": {"tp_size": 1, "dp_shard_size": 1}},
    })
    dims = ParallelDims.from_config_for_analysis(config.policy.parallelism, 1)
    client = SimpleNamespace(post_trace_path=lambda request: None)
    profiler = CosmosProfiler(config, dims, replica_name="anchor", api_client=client)
    gc.collect()
    gc.disable()
    try:
        base = statistics.median(_timed(lambda: (trainer.step(), profiler.step())) for _ in range(IDLE_STEPS))
        gc_base = _timed(gc.collect)
        profiler.start()
        steps, finalize = [], None
        while finalize is None or len(steps) <= finalize + TAIL_STEPS:
            before = profiler.profiled_times
            steps.append(_timed(lambda: (trainer.step(), profiler.step())))
            if finalize is None and profiler.profiled_times > before:
                finalize = len(steps) - 1
        gc_after = _timed(gc.collect)
    finally:
        gc.enable()
    (path,) = Path(profiler.output_dir).glob("*_trace.json.gz")
    excess = [s - base for s in steps]
    return {"base_s": base, "finalize_s": excess[finalize], "later_s": sum(excess[finalize + 1:]),
            "gc_s": gc_after - gc_base, "stall_s": sum(excess[finalize:]) + gc_after - gc_base,
            "gz_bytes": path.stat().st_size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--active", type=int, required=True)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import logging

    import torch

    from cosmos_rl.utils.profiler import CosmosProfiler

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    trainer = _trainer_class()("deep")
    for _ in range(3):
        trainer.step()
    with tempfile.TemporaryDirectory(prefix="cosmos-anchor-") as tmp:
        results = [capture(trainer, args.active, Path(tmp), n) for n in range(args.repeats)]
    import cosmos_rl

    print(json.dumps({"profiler": f"{CosmosProfiler.__module__}.{CosmosProfiler.__qualname__}",
                      "file": os.path.abspath(cosmos_rl.__file__), "results": results}))


if __name__ == "__main__":
    main()
