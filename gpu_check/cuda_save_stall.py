"""The save stall on a GPU, for bin/gpu-check (its checks `fork-writer`, `writers` and `save-stall`).

    python -m gpu_check.cuda_save_stall --tmp DIR [--writers-mb 20] [--big-mb 200] [--deadline-s 200]

`benchmarks.save_stall`'s in-process bench (its captures, its stall and slowdown) on CUDA
trainers, in a process that holds CUDA and a one-rank NCCL group (each step all-reduces a
token on it and synchronizes). Prints one `RESULT {json}` line per phase, as it ends:

  first_fork  the process's first save, with COSMOS_PROFILER_SAVE_WRITER=fork: a forked child
              writes the JSON of a CUDA trace (kineto reads the device properties lazily, and
              CUDA does not work in a forked child: `sidecar.rank.forkwriter` reads them first)
  writer      the same capture (~--writers-mb of JSON) with the writer `fork`, `auto`, `thread`
              in turn: stall and slowdown side by side (one line each)
  big         a ~--big-mb capture (fewer MB where the deadline would not allow it): the
              sidecar as it is (`auto`) against a synchronous `export_chrome_trace(.gz)`
  error       what went wrong, before the process exits 1

Each result names its trace, which gpu_check/checks.py reads back. Every capture ends
with training steps after the save (the bench's idle steps, then STEPS_ON more), so
"training steps on" is shown by the result arriving at all. Dies with its parent.
`--device cpu` (gloo, CPU trainers) runs the same phases without a GPU, for development.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity

import sidecar.rank.compress
import sidecar.rank.forkwriter
from benchmarks import save_stall
from benchmarks.models import Trainer
from gpu_check.cuda_train import die_with_parent

MB = 1e6
FIRST_ACTIVE = 3
MAX_ACTIVE = 1000  # a request's active_steps bound
STEPS_ON = 5
WRITER_MODES = ("fork", "auto", "thread")

# Whether each forked write succeeded (False: the child failed and the saver thread wrote it).
FORKS: list[bool] = []
_fork_write = sidecar.rank.forkwriter.write


def _recording_write(*args: Any, **kwargs: Any) -> bool:
    ok = _fork_write(*args, **kwargs)
    FORKS.append(bool(ok))
    return ok


sidecar.rank.forkwriter.write = _recording_write


class CudaTrainer(Trainer):
    """benchmarks.models.Trainer on the GPU; each step also all-reduces a token on the NCCL
    group and synchronizes (a loop that reads its loss back)."""

    def __init__(self, name: str, device: str = "cuda") -> None:
        super().__init__(name, device=device)
        self.token = torch.ones(1, device=device)

    def step(self) -> None:
        super().step()
        dist.all_reduce(self.token)
        if self.token.is_cuda:
            torch.cuda.synchronize()


def emit(phase: str, **data: Any) -> None:
    print("RESULT " + json.dumps({"phase": phase, **data}), flush=True)


def raw_bytes(path: Path) -> int:
    """The JSON size of a gzip trace (decompressed, streaming)."""
    total = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            total += len(chunk)
    return total


def capture(bench: save_stall.Bench, how: str, active: int, writer: str | None) -> dict[str, Any]:
    """One measured capture: `how` is a save_stall method ("ours": the sidecar, writer from the
    environment; "sync": export_chrome_trace in the training thread)."""
    if writer is None:
        os.environ.pop(sidecar.rank.compress.WRITER_ENV, None)
    else:
        os.environ[sidecar.rank.compress.WRITER_ENV] = writer
    forks_before = len(FORKS)
    started = time.monotonic()
    result = bench.capture(how, active)
    for _ in range(STEPS_ON):
        bench.work.step()
        bench.sc.step()
    result["wall_s"] = time.monotonic() - started
    forks = FORKS[forks_before:]
    result["forked"] = any(forks)
    result["fork_fell_back"] = forks.count(False)
    result["active"] = active
    result["steps_on"] = save_stall.TAIL_STEPS + save_stall.IDLE_STEPS + STEPS_ON
    if how == "sync":
        result["trace_path"] = str(bench.tmp / f"sync_{bench.num}_trace.json.gz")
    else:
        result["trace_path"] = bench.sc.trace_paths[-1]
        record = bench.sc.record()
        result["sidecar_state"], result["sidecar_error"] = record.state, record.error
    result["raw_bytes"] = raw_bytes(Path(result["trace_path"]))
    return result


def big_size(requested_mb: float, per_mb_s: float, left_s: float) -> float:
    """The big capture's size: the requested MB, or what fits in `left_s` when a sync export and
    ours, each ~per_mb_s per MB to record and save (sync about 3x ours), would not."""
    fits = (left_s - 15.0) / max(per_mb_s * 4.0, 1e-3)
    return max(5.0, min(requested_mb, fits))


def main() -> int:
    die_with_parent()
    p = argparse.ArgumentParser()
    p.add_argument("--tmp", required=True)
    p.add_argument("--writers-mb", type=float, default=20.0)
    p.add_argument("--big-mb", type=float, default=200.0)
    p.add_argument("--deadline-s", type=float, default=200.0, help="seconds from now to have finished")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()
    cuda = args.device == "cuda"
    deadline = time.monotonic() + args.deadline_s
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        if cuda:
            torch.cuda.set_device(0)
        (tmp / "store").unlink(missing_ok=True)  # an earlier run's FileStore
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp / 'store'}", rank=0,
                                world_size=1)
        bench = save_stall.Bench(tmp, make_trainer=lambda name: CudaTrainer(name, args.device),
                                 activities=(ProfilerActivity.CPU, *((ProfilerActivity.CUDA,) if cuda else ())))
        try:
            for _ in range(3):
                bench.deep.step()
                bench.work.step()
            first = capture(bench, "ours", FIRST_ACTIVE, "fork")
            emit("first_fork", **first)
            per_step = first["raw_bytes"] / FIRST_ACTIVE
            active = max(1, min(MAX_ACTIVE, round(args.writers_mb * MB / per_step)))
            per_mb_s = None
            for mode in WRITER_MODES:
                result = capture(bench, "ours", active, mode)
                emit("writer", mode=mode, **result)
                if mode == "thread":
                    per_mb_s = result["wall_s"] / max(result["raw_bytes"] / MB, 1e-3)
            size = big_size(args.big_mb, per_mb_s or 1.0, deadline - time.monotonic())
            active = max(1, min(MAX_ACTIVE, round(size * MB / per_step)))
            sync = capture(bench, "sync", active, None)
            ours = capture(bench, "ours", active, None)
            emit("big", requested_mb=args.big_mb, sync=sync, ours=ours)
        finally:
            bench.close()
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to bin/gpu-check as a result line
        emit("error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
