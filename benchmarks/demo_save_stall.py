"""The training thread's save stall for a trace of bin/demo's size.

    python -m benchmarks.demo_save_stall [--repeats 5]

The demo's model (examples/demo_train.py: MLP 3x256, AdamW, batch 64) and its
request (`profile set demo --active-steps 2 --record-shape`: wait 1, warmup 1,
active 2). For each repeat: the extra wall time of the step on which the
capture finalizes (and of the steps after it, until the file is in place) over
the median idle step, with the sidecar (kineto's JSON write on the saver
thread, gzip in a child process) against Cosmos-RL's synchronous
`export_chrome_trace(path.gz)` in the training thread. Prints medians and the
spread; asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank.core import build_sidecar

WIDTH = 256


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
        torch.nn.Linear(WIDTH, 1),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        x = torch.randn(64, WIDTH)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ours(tmp: Path) -> tuple[float, int]:
    """Stall in ms over the idle step, and the trace's size in bytes."""
    train = _model()
    sc = build_sidecar(output_dir=tmp / "out", replica="demo", registry=tmp / "reg").start()
    try:
        idle = [_timed(lambda: (train(), sc.step())) for _ in range(30)]
        base = statistics.median(idle[10:])
        request = ProfileRequest(id="stall", active_steps=2, record_shape=True, rank_filter=RankFilter(None))
        sc.request_capture(request, begin_now=True)
        excess = 0.0
        saving = False
        for _ in range(200):
            dt = _timed(lambda: (train(), sc.step()))
            if sc.state == "saving" or saving:
                saving = True
                excess += max(0.0, dt - base)
            if saving and sc.state != "saving":
                break
        path = Path(sc.trace_paths[-1])
        return excess * 1e3, path.stat().st_size
    finally:
        sc.close()


def sync(tmp: Path) -> float:
    """Cosmos-RL's way: export_chrome_trace(path.gz) from the training thread."""
    train = _model()
    idle = [_timed(train) for _ in range(30)]
    base = statistics.median(idle[10:])
    out = tmp / "sync.json.gz"
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                   schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(os.fspath(out)))
    prof.start()
    excess = 0.0
    for i in range(4):
        dt = _timed(lambda: (train(), prof.step()))
        if i == 3:
            excess = max(0.0, dt - base)
    prof.stop()
    return excess * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    logging.getLogger("sidecar").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    mine, theirs, sizes = [], [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            stall, size = ours(Path(d))
            mine.append(stall)
            sizes.append(size)
            theirs.append(sync(Path(d)))
    print(f"demo-size trace: {statistics.median(sizes) / 1024:.0f} KiB gzip")
    print(f"sidecar (saver thread + gzip child): training-thread stall {statistics.median(mine):.1f} ms "
          f"(min {min(mine):.1f}, max {max(mine):.1f}, n={len(mine)})")
    print(f"synchronous export_chrome_trace(.gz): {statistics.median(theirs):.1f} ms "
          f"(min {min(theirs):.1f}, max {max(theirs):.1f}, n={len(theirs)})")
    print(f"ratio: {statistics.median(theirs) / max(statistics.median(mine), 1e-9):.1f}x smaller")


if __name__ == "__main__":
    main()
