"""6. Profiling overhead itself (for reference): step time while torch.profiler records.

What a capture costs the steps it traces, by option, as a ratio to the same
steps with no profiler, on two loops: the real MLP (three 1024-wide layers,
compute-bound) and `deep` (sixteen 256-wide layers: many small ops, where the
per-op cost of the profiler shows). A round times a block of steps with no
profiler and one inside the active phase of a `torch.profiler.profile`
(CPU activity; wait 0, warmup 1) for each option set, in rotating order; the
trace is dropped, not exported. Value = median over rounds of the per-round
ratio.
"""

from __future__ import annotations

import gc
import time

import torch
from torch.profiler import ProfilerActivity

from benchmarks.common import Row, main, median
from benchmarks.models import Trainer, describe

BENCH = "6 profiling overhead"
OPTIONS = {
    "default (CPU activity)": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_stack": {"with_stack": True},
}


def _block(trainer: Trainer, n: int, options: dict | None) -> float:
    """Mean seconds per step over `n` steps, with a profiler recording them unless `options` is None."""
    gc.collect()
    if options is None:
        trainer.step()
        t0 = time.perf_counter()
        for _ in range(n):
            trainer.step()
        return (time.perf_counter() - t0) / n
    prof = torch.profiler.profile(activities=[ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(wait=0, warmup=1, active=n + 1, repeat=1),
                                  **options)
    prof.start()
    trainer.step()
    prof.step()  # warmup -> record
    t0 = time.perf_counter()
    for _ in range(n):
        trainer.step()
        prof.step()
    took = (time.perf_counter() - t0) / n
    prof.stop()
    return took


def run(quick: bool) -> list[Row]:
    rounds = 4 if quick else 20
    rows: list[Row] = []
    for model, n in (("mlp", 5), ("deep", 10)):
        trainer = Trainer(model)
        for _ in range(3):
            trainer.step()
        names = [None, *OPTIONS]
        ratios: dict[str, list[float]] = {name: [] for name in OPTIONS}
        base: list[float] = []
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            times = {name: _block(trainer, n, None if name is None else OPTIONS[name]) for name in order}
            base.append(times[None])
            for name in OPTIONS:
                ratios[name].append(times[name] / times[None])
        for name in OPTIONS:
            ratio = median(ratios[name])
            rows.append(Row(
                BENCH, f"{describe(model)}: {name}", ratio, "x", baseline=median(base) * 1000, baseline_unit="ms",
                baseline_label="step, no profiler", delta=f"{(ratio - 1) * 100:+.0f}% step time", samples=ratios[name],
                note="Steps inside torch.profiler's active phase (CPU activity), as a ratio to the same steps with no "
                     f"profiler in the same round; {rounds} rounds, rotating order; the trace is dropped. For "
                     "reference: this is torch's cost while a capture runs, not the sidecar's.",
            ))
    return rows


if __name__ == "__main__":
    main(run)
