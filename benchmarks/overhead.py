"""1. Idle overhead per step: what an installed, idle sidecar adds to each step.

Two phases, both interleaved and repeated in one process; a row is the median
over rounds of the per-round difference (or ratio), spread its min-max.

Phase 1, the per-call cost (many short rounds, one sidecar installed and idle,
its watcher and heartbeat threads running). Each round times, in a rotating
order, three blocks of the same loop:
  A'  the loop alone (the sidecar is installed but not called, no hook)
  B   the loop plus an explicit `sc.step()` per iteration
  C   the loop with `enable_auto_step()`: torch's global optimizer post-hook
      counts the steps (removed again by one explicit step() after the block)
Loops: `bare` (`for _ in range(n): sc.step()` against `pass`) and `tiny` (a
do-nothing `torch.optim.Optimizer` step: only torch's step wrapper runs, which
calls the global step hooks; a few microseconds).

Phase 2, the real loop (an MLP of three 1024-wide layers). Each round runs
  A   no sidecar at all (none installed: no threads, no hook)
and, under a freshly installed sidecar closed after, B and C; the order of
A, B and C rotates over rounds.

Phase 3, the slowdown watch (sidecar.rank.slowdown): one sidecar, the bare loop and the MLP loop with
explicit `sc.step()`, alternately with a slowdown watch armed (it never fires) and
without one, in rotating order.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import sidecar
from benchmarks.common import Row, main, median, pct
from benchmarks.models import Trainer, describe

BENCH = "1 idle overhead"
TARGET_NS = 1000.0


def _timed(block: Callable[[int], None], n: int, warm: int = 0) -> float:
    """Mean ns per iteration of `block(n)`, after `warm` untimed iterations,
    with the GC kept out of the block (callers collect between rounds)."""
    if warm:
        block(warm)
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        block(n)
        return (time.perf_counter_ns() - t0) / n
    finally:
        gc.enable()


class NoopOptimizer(torch.optim.Optimizer):
    """An optimizer whose step does nothing: what remains is torch's step
    wrapper, which runs the global step hooks (the sidecar's, in condition C)."""

    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        return None


class Loops:
    def __init__(self) -> None:
        self.sc: sidecar.Sidecar | None = None
        self.tiny_opt = NoopOptimizer([torch.nn.Parameter(torch.zeros(1))], {})
        self.mlp = Trainer("mlp")

    # bare
    def bare_none(self, n: int) -> None:
        for _ in range(n):
            pass

    def bare_step(self, n: int) -> None:
        sc = self.sc
        for _ in range(n):
            sc.step()

    # tiny optimizer step
    def tiny_none(self, n: int) -> None:
        step = self.tiny_opt.step
        for _ in range(n):
            step()

    def tiny_step(self, n: int) -> None:
        step, sc = self.tiny_opt.step, self.sc
        for _ in range(n):
            step()
            sc.step()

    # real step
    def mlp_none(self, n: int) -> None:
        step = self.mlp.step
        for _ in range(n):
            step()

    def mlp_step(self, n: int) -> None:
        step, sc = self.mlp.step, self.sc
        for _ in range(n):
            step()
            sc.step()


ORDERS = ("ABC", "BCA", "CAB", "ACB", "BAC", "CBA")


def _phase1(loops: Loops, tmp: Path, rounds: int, sizes: dict[str, int]) -> dict[str, dict[str, list[float]]]:
    """Per-call cost: {kind: {"A": [...], "B": [...], "C": [...]}} in ns per iteration."""
    results = {k: {"A": [], "B": [], "C": []} for k in ("bare", "tiny")}
    loops.sc = sc = sidecar.install(output_dir=tmp / "out", replica="bench-overhead", rank=0, registry=tmp / "reg")
    try:
        sc.enable_auto_step()
        loops.tiny_none(1)  # the tiny optimizer becomes the lead optimizer the hook counts
        sc.step()  # explicit step: the hook is removed again
        for r in range(-2, rounds):  # two warm-up rounds
            if r % 50 == 0:
                gc.collect()
            for kind in ("bare", "tiny"):
                for cond in ORDERS[r % len(ORDERS)]:
                    if cond == "A":
                        value = _timed(getattr(loops, f"{kind}_none"), sizes[kind])
                    elif cond == "B":
                        value = _timed(getattr(loops, f"{kind}_step"), sizes[kind])
                    else:
                        if kind == "bare":
                            continue  # no optimizer: nothing to hook
                        sc.enable_auto_step()
                        before = sc.step_num
                        value = _timed(loops.tiny_none, sizes[kind])
                        counted = sc.step_num - before
                        sc.step()
                        if counted != sizes[kind]:
                            raise RuntimeError(f"the optimizer hook counted {counted} of {sizes[kind]} steps")
                    if r >= 0:
                        results[kind][cond].append(value)
    finally:
        sc.close()
        loops.sc = None
    return results


def _phase2(loops: Loops, tmp: Path, rounds: int, n: int) -> dict[str, list[float]]:
    """The real loop: {"A": [...], "B": [...], "C": [...]} in ns per step."""
    results: dict[str, list[float]] = {"A": [], "B": [], "C": []}

    def run_a(keep: bool) -> None:
        value = _timed(loops.mlp_none, n, warm=1)
        if keep:
            results["A"].append(value)

    def run_bc(keep: bool, b_first: bool) -> None:
        loops.sc = sc = sidecar.install(output_dir=tmp / "out", replica="bench-overhead", rank=0, registry=tmp / "reg")
        try:
            if b_first:
                b = _timed(loops.mlp_step, n, warm=1)
            sc.enable_auto_step()
            before = sc.step_num
            c = _timed(loops.mlp_none, n, warm=1)
            if sc.step_num - before != n + 1:
                raise RuntimeError(f"the optimizer hook counted {sc.step_num - before} of {n + 1} steps")
            if not b_first:
                sc.step()  # explicit step() takes over from the hook
                b = _timed(loops.mlp_step, n, warm=1)
        finally:
            sc.close()
            loops.sc = None
        if keep:
            results["B"].append(b)
            results["C"].append(c)

    for r in range(-1, rounds):
        gc.collect()
        b_first = r % 4 < 2
        if r % 2 == 0:
            run_a(r >= 0)
            run_bc(r >= 0, b_first)
        else:
            run_bc(r >= 0, b_first)
            run_a(r >= 0)
    return results


def _phase3(loops: Loops, tmp: Path, rounds: int, sizes: dict[str, int]) -> dict[str, dict[str, list[float]]]:
    """Per step with and without an armed slowdown watch: {kind: {"off": [...], "on": [...]}} in ns."""
    from sidecar.common.request import ProfileRequest, RankFilter
    from sidecar.rank.slowdown import always_on_request

    results = {k: {"off": [], "on": []} for k in ("bare", "mlp")}
    loops.sc = sc = sidecar.install(output_dir=tmp / "out", replica="bench-watch", rank=0, registry=tmp / "reg")
    # It must never fire: the bare loop's steps and the MLP's differ by far more than any factor, so a
    # run of 1000 slow steps in a row (never reached: a block has 6 MLP steps) is what would fire it.
    request: ProfileRequest = dataclasses.replace(always_on_request(1000.0, "bench", {"rank_filter": RankFilter(None)}),
                                                  consecutive=1000)
    try:
        sc._watches.install(request)  # what a watch request's arming does, without its baseline capture
        watch = sc._watch
        for r in range(-2, rounds):
            if r % 50 == 0:
                gc.collect()
            for cond in (("off", "on") if r % 2 else ("on", "off")):
                sc._watch = watch if cond == "on" else None
                for kind in ("bare", "mlp"):
                    value = _timed(getattr(loops, f"{kind}_step"), sizes[kind], warm=1 if kind == "mlp" else 0)
                    if r >= 0:
                        results[kind][cond].append(value)
        if watch.times.steps_seen == 0 or watch.num_fired:
            raise RuntimeError("the armed watch saw no step, or fired")
    finally:
        sc.close()
        loops.sc = None
    return results


def run(quick: bool) -> list[Row]:
    logging.getLogger("sidecar").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    loops = Loops()
    p1 = _phase1(loops, tmp, rounds=400 if quick else 2000, sizes={"bare": 2_000, "tiny": 200})
    p2 = _phase2(loops, tmp, rounds=6 if quick else 24, n=5)

    rows: list[Row] = []
    a, b = p1["bare"]["A"], p1["bare"]["B"]
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    added_call = median(diffs)
    rows.append(Row(
        BENCH, "bare loop: one sc.step() call", added_call, "ns", baseline=median(a),
        baseline_label="empty loop iteration", delta=f"+{added_call:.0f} ns/step", samples=diffs, spread_q=5,
        target="< 1 us/step", met=added_call < TARGET_NS,
        note="Phase 1 (per call): many short rounds, one sidecar installed and idle (watcher and heartbeat threads "
             "running); each round times the loop alone, with an explicit sc.step(), and with the optimizer hook, "
             "in rotating order. Blocks are short (2,000 bare iterations, 200 optimizer steps) so drift cancels within a "
             "round. Value = median over rounds of the difference; spread = its 5th-95th percentiles.",
    ))
    a = p1["tiny"]["A"]
    for cond, how in (("B", "explicit step()"), ("C", "optimizer hook")):
        diffs = [y - x for x, y in zip(a, p1["tiny"][cond], strict=True)]
        added = median(diffs)
        rows.append(Row(
            BENCH, f"tiny optimizer step (no-op Optimizer), {how}", added, "ns", baseline=median(a) / 1000, baseline_unit="us",
            baseline_label="same step, sidecar not called",
            delta=f"+{added:.0f} ns ({added / median(a) * 100:+.2f}%)", samples=diffs, spread_q=5,
            target="< 1 us/step", met=added < TARGET_NS, note=rows[0].note,
        ))
    a = p2["A"]
    for cond, how in (("B", "explicit step()"), ("C", "optimizer hook")):
        v = p2[cond]
        ratios = [y / x for x, y in zip(a, v, strict=True)]
        ratio = median(ratios)
        within_noise = min(ratios) <= 1.0 <= max(ratios) or ratio < 1.005
        expected = added_call / median(a) * 100
        rows.append(Row(
            BENCH, f"{describe('mlp')}, {how}", ratio, "x", baseline=median(a) / 1e6, baseline_unit="ms",
            baseline_label="step, no sidecar installed",
            delta=f"{pct(ratio)} step time", samples=ratios,
            target="no change beyond noise", met=within_noise,
            note="Phase 2 (real loop): each round times 5 steps (after 1 untimed) with no sidecar installed, and "
                 "5 with explicit step() and 5 with the optimizer hook under a freshly installed sidecar (closed "
                 "after), the order rotating. Value = "
                 "median over rounds of (with / without), spread = min-max of the per-round ratios; 'met' when they "
                 f"straddle 1.0 or the median is under 1.005. The per-call cost above is {expected:.4f}% of this "
                 "step. torch uses one intra-op thread.",
        ))
    p3 = _phase3(loops, tmp, rounds=200 if quick else 1000, sizes={"bare": 2_000, "mlp": 5})
    note3 = ("Phase 3 (the slowdown watch): one sidecar; each round times the bare loop (2,000 sc.step() calls) "
             "and the MLP loop (5 steps after 1 untimed) with a slowdown watch armed (it never fires) and without, "
             "the order alternating. Value = median over rounds of the difference (bare) or ratio (MLP).")
    diffs = [y - x for x, y in zip(p3["bare"]["off"], p3["bare"]["on"], strict=True)]
    added = median(diffs)
    rows.append(Row(
        BENCH, "bare loop: sc.step() with a slowdown watch armed", added, "ns",
        baseline=median(p3["bare"]["off"]), baseline_label="sc.step() call, no watch", delta=f"+{added:.0f} ns/step",
        samples=diffs, spread_q=5, target="< 1 us/step", met=added < TARGET_NS, note=note3,
    ))
    ratios = [y / x for x, y in zip(p3["mlp"]["off"], p3["mlp"]["on"], strict=True)]
    ratio = median(ratios)
    rows.append(Row(
        BENCH, f"{describe('mlp')}, slowdown watch armed", ratio, "x", baseline=median(p3["mlp"]["off"]) / 1e6,
        baseline_unit="ms", baseline_label="step, sidecar idle, no watch", delta=f"{pct(ratio)} step time",
        samples=ratios, target="no change beyond noise", met=min(ratios) <= 1.0 <= max(ratios) or ratio < 1.005,
        note=note3,
    ))
    return rows


if __name__ == "__main__":
    main(run)
