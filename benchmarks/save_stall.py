"""4. Save stall: what finalizing a trace costs the training thread, and how much a save in flight slows training.

One process, every step timed. A capture records `Trainer("deep")` steps
(sixteen 256-wide layers: many small ops, so traces grow fast) with
`record_shapes` and `with_stack` over wait 0, warmup 1 and N active steps; N
is chosen from a calibration capture so the trace JSON is about 1, 10 or 100
MB. From the step after the profiler stops, the loop runs `Trainer("work")`
steps (four 1024-wide layers, batch 64: matmuls, which release the GIL, and a
little Python) until the file is complete, plus 3. Ways to finalize, in
rotating order over repeats:

  sync     what Cosmos-RL does: `on_trace_ready` calls
           `prof.export_chrome_trace(path.gz)` in the training thread (torch
           writes the JSON to a temp file, then gzips it at level 9)
  floor    "stop only": the same capture, the profiler stopped and nothing
           saved; what cannot move off the training thread
  free     "stop + free": as floor, then a thread frees the collected events
           at once; torch's free holds the GIL, so this is what any process
           that keeps running pays torch on its GIL
  before   the sidecar as it was first: saver thread, gzip level 6 on that
           thread, no trace_only, the profile left to the cyclic GC
  process  the sidecar's previous release: kineto's JSON write on the saver
           thread (holding the GIL), the events freed there, gzip level 1 in
           a child process at nice 19 (`sidecar.rank.compress`)
  ours     the sidecar as it is (writer "auto"): as process, but where it
           pays, a forked child writes the JSON off the GIL
           (`sidecar.rank.forkwriter`); the events are freed after it exits

Measured per capture, each step against the median of idle steps of its kind
(20 "deep" steps just before; 20 "work" steps just before and 20 after, so a
machine whose load drifts during the save skews the baseline less):
  stall     the excess of the finalizing step, plus that of every later step
            until the file is complete (+3), plus the excess of a `gc.collect()`
            after the capture over one before it (a finished profile sits in a
            reference cycle; what the cyclic GC frees lands on the training
            thread). The cyclic GC is otherwise paused during a capture.
  slowdown  mean "work" step time from the finalizing step to the file's
            completion, over the idle "work" median, minus 1
  stop      kineto's stop (`stop_trace`), which every way pays in the training thread
The timings come from wrapping torch's `stop_trace` and `export_chrome_trace`
and `sidecar.rank.exporter.export` in this process (instrumentation only). With the
real cosmos-rl installed (bin/cosmos-rl-venv), its `CosmosProfiler` runs the
same model and capture in that venv (benchmarks/programs/cosmos_anchor.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.autograd import profiler as autograd_profiler
from torch.profiler import ProfilerActivity
from torch.profiler import profiler as torch_profiler

import sidecar
import sidecar.rank.compress
import sidecar.rank.core
import sidecar.rank.driver
import sidecar.rank.exporter
import sidecar.rank.forkwriter
from benchmarks.common import PROGRAMS, ROOT, Row, child_env, main, median
from benchmarks.models import Trainer, describe
from sidecar.common.request import ProfileRequest

BENCH = "4 save stall"
MB = 1e6
IDLE_STEPS = 20
TAIL_STEPS = 3
COSMOS_RL_VERSION = "0.4.7"
NOT_INSTALLED = "cosmos-rl not installed (bin/cosmos-rl-venv builds it)"

# The sidecar's save path as it was first, in its previous release, and as it is.
VARIANTS = {
    "before": {"writer": "thread", "level": 6, "lean": False},
    "process": {"writer": "process", "level": 1, "lean": True},
    "ours": {"writer": None, "level": 1, "lean": True},
}
LABELS = {
    "sync": "sync export_chrome_trace(.gz) (Cosmos-RL's way)",
    "floor": "stop only (the floor)",
    "free": "stop + free (what torch holds the GIL for)",
    "before": "before: saver thread, gzip-6 on it, profile left to the GC",
    "process": "previous: JSON on the saver thread, gzip-1 child process",
    "ours": "ours: JSON in a forked child where it pays, gzip-1 child process",
}


class Probe:
    """Timings recorded by the wrappers, keyed by what they measure."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, float, dict[str, Any]]] = []  # (what, start, end, info)

    def wrap(self, owner: Any, name: str, what: str, info: Callable[..., dict[str, Any]] | None = None) -> None:
        original = getattr(owner, name)
        probe = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                end = time.perf_counter()
                probe.events.append((what, start, end, info(*args, **kwargs) if info else {}))

        setattr(owner, name, wrapper)

    def take(self) -> list[tuple[str, float, float, dict[str, Any]]]:
        events, self.events = self.events, []
        return events


def _json_size(self: Any, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    try:
        return {"bytes": os.path.getsize(path)}
    except OSError:
        return {}


PROBE = Probe()
PROBE.wrap(autograd_profiler.profile, "export_chrome_trace", "json", _json_size)  # kineto's JSON write
PROBE.wrap(torch_profiler._KinetoProfile, "export_chrome_trace", "export")  # sync's whole in-thread export
PROBE.wrap(torch_profiler._KinetoProfile, "stop_trace", "stop")
PROBE.wrap(sidecar.rank.forkwriter, "write", "fork")  # the JSON written by a forked child

# The variant the sidecar's saver runs now (set per capture; read on the saver thread).
_variant: dict[str, Any] = VARIANTS["ours"]
_export = sidecar.rank.exporter.export
_release_events = sidecar.rank.exporter.release_events
_trace_only_config = sidecar.rank.driver.trace_only_config


def _variant_export(result: Any, final_path: Path, place: Any = None, **kwargs: Any) -> Path:
    start = time.perf_counter()
    try:
        return _export(result, final_path, gzip_level=_variant["level"], place=place, writer=_variant["writer"])
    finally:
        PROBE.events.append(("saver", start, time.perf_counter(), {}))


sidecar.rank.exporter.export = _variant_export
sidecar.rank.exporter.release_events = lambda prof: _release_events(prof) if _variant["lean"] else None
sidecar.rank.driver.trace_only_config = lambda request: _trace_only_config(request) if _variant["lean"] else None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Collect, then keep the cyclic GC out of the measured steps: a full collection
    takes ~0.2 s and would land on random steps. What it would free is timed apart."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Bench:
    """`make_trainer(name)` builds the "deep" and "work" loops; `activities` are the torch
    captures' (the sidecar adds CUDA itself where it is available). bin/gpu-check passes CUDA
    trainers and both activities (gpu_check/cuda_save_stall.py)."""

    def __init__(self, tmp: Path, make_trainer: Callable[[str], Any] = Trainer,
                 activities: tuple[ProfilerActivity, ...] = (ProfilerActivity.CPU,)) -> None:
        self.tmp = tmp
        self.activities = list(activities)
        self.deep = make_trainer("deep")
        self.work = make_trainer("work")
        logging.getLogger("sidecar").setLevel(logging.ERROR)
        self.sc = sidecar.install(output_dir=tmp / "out", replica="bench-save", rank=0, registry=tmp / "reg")
        self.num = 0
        self.kept: list[Any] = []  # the floor's profiles, freed outside the measurement

    def close(self) -> None:
        self.sc.close()

    def capture(self, how: str, active: int) -> dict[str, Any]:
        global _variant
        self.num += 1
        if how in VARIANTS:
            _variant = VARIANTS[how]
            call, finished, saved, path_of = self._sidecar(active)
        else:
            call, finished, saved, path_of = self._torch(how, active)
        with _gc_paused():
            deep_base = median([_timed(lambda: (self.deep.step(), call(False))) for _ in range(IDLE_STEPS)])
            work_before = [_timed(lambda: (self.work.step(), call(False))) for _ in range(IDLE_STEPS)]
            gc_base = _timed(gc.collect)
            PROBE.take()
            call(True)  # start
            finalize = None
            while finalize is None:
                took = _timed(lambda: (self.deep.step(), call(False)))
                if finished():
                    finalize = took - deep_base
            window: list[float] = []
            while not saved():
                window.append(_timed(lambda: (self.work.step(), call(False))))
            tail = [_timed(lambda: (self.work.step(), call(False))) for _ in range(TAIL_STEPS)]
            gc_excess = _timed(gc.collect) - gc_base
            events = PROBE.take()
            after = [_timed(lambda: (self.work.step(), call(False))) for _ in range(IDLE_STEPS)]
            work_base = median(work_before + after)
        self.kept.clear()
        gc.collect()
        path = path_of()
        later = sum(s - work_base for s in window + tail)
        spans = {what: [e - s for w, s, e, _ in events if w == what]
                 for what in ("stop", "json", "export", "saver", "fork")}
        json_bytes = [i.get("bytes", 0) for w, _, _, i in events if w == "json"]
        export = spans["export" if how == "sync" else "saver"]
        return {
            "how": how, "deep_base_s": deep_base, "work_base_s": work_base, "finalize_s": finalize,
            "later_s": later, "gc_s": gc_excess, "stall_s": finalize + later + gc_excess,
            "slowdown": (sum(window) / len(window) / work_base - 1.0) if window else None,
            "window_steps": len(window), "stop_s": sum(spans["stop"]), "json_s": sum(spans["json"]),
            "export_s": sum(export), "json_bytes": sum(json_bytes), "gz_bytes": path.stat().st_size if path else 0,
            "forked": bool(spans["fork"]),
        }

    def _sidecar(self, active: int):
        sc = self.sc
        finished_before, saved_before = sc.num_finished, sc.num_captures
        request = ProfileRequest(id=f"bench-{self.num}", active_steps=active, warmup_steps=1, wait_steps=0,
                                 record_shape=True, with_stack=True)

        def call(start: bool) -> None:
            if start and not sc.request_capture(request, begin_now=True):
                raise RuntimeError(f"the sidecar refused the capture: {sc.record().refused or sc.record().error}")
            sc.step()

        def saved() -> bool:
            if sc.state == "error":
                raise RuntimeError(f"capture failed: {sc.record().error}")
            return sc.num_captures > saved_before

        return (call, lambda: sc.num_finished > finished_before, saved, lambda: Path(sc.trace_paths[-1]))

    def _torch(self, how: str, active: int):
        path = self.tmp / f"{how}_{self.num}_trace.json.gz"
        ready, freed = threading.Event(), threading.Event()

        def on_ready(p: Any) -> None:
            if how == "sync":
                p.export_chrome_trace(str(path))
            elif how == "free":
                threading.Thread(target=lambda: (_release_events(p), freed.set())).start()
            else:
                self.kept.append(p)  # the floor: stop only; nothing saved, nothing freed here
            ready.set()

        state: dict[str, Any] = {"prof": None}

        def call(start: bool) -> None:
            if start:
                state["prof"] = torch.profiler.profile(
                    activities=self.activities, record_shapes=True, with_stack=True,
                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=active, repeat=1),
                    on_trace_ready=on_ready)
                state["prof"].start()
            prof = state["prof"]
            if prof is not None:
                prof.step()
                if ready.is_set():
                    prof.stop()
                    state["prof"] = None  # Cosmos-RL: `del self.profiler`

        saved = freed.is_set if how == "free" else ready.is_set
        return call, ready.is_set, saved, lambda: path if how == "sync" else None


def gil_probe(bench: Bench, active: int) -> dict[str, float]:
    """How long each part of the save keeps a pure-Python main thread from running.

    After a capture of `active` steps (no with_stack, so trace_only applies), a
    thread runs each part in turn (kineto's JSON write, the same in a forked
    child, freeing the events, gzip-1 on the thread, gzip-1 in the child) while
    the main thread spins and sums its gaps over 1 ms.
    """
    request = ProfileRequest(id="gil", active_steps=active, record_shape=True)
    prof = torch.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                                  experimental_config=_trace_only_config(request))
    out: dict[str, float] = {}
    raw = bench.tmp / "gil_probe.json"
    with _gc_paused():
        prof.start()
        for _ in range(active):
            bench.deep.step()
        prof.stop()

        def gzip_with(writer: str) -> Callable[[], None]:
            def run() -> None:
                with open(raw, "rb") as src, open(f"{raw}.{writer}.gz", "wb") as dst:
                    sidecar.rank.compress.gzip_file(src, dst, "gil_probe.json", 1, writer)
            return run

        parts = (("json", lambda: prof.export_chrome_trace(str(raw))),
                 ("json_fork", lambda: sidecar.rank.forkwriter.write(prof, bench.tmp / "gil_probe_fork.json")),
                 ("free", lambda: _release_events(prof)),
                 ("gzip_thread", gzip_with("thread")), ("gzip_process", gzip_with("process")))
        for name, target in parts:
            took: list[float] = []

            def later(target: Callable[[], Any] = target, took: list[float] = took) -> None:
                time.sleep(0.05)  # so a part that holds the GIL from its start blocks the loop, not Thread.start()
                t0 = time.perf_counter()
                target()
                took.append(time.perf_counter() - t0)

            thread = threading.Thread(target=later)
            thread.start()
            blocked, last = 0.0, time.perf_counter()
            while thread.is_alive():
                now = time.perf_counter()
                if now - last > 0.001:
                    blocked += now - last
                last = now
            thread.join()
            out[f"{name}_s"], out[f"{name}_blocked_s"] = took[0], blocked
    out["json_bytes"] = raw.stat().st_size
    return out


def writer_probe(bench: Bench, json_path: Path, size_mb: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """The gzip writers alone, on a ~`size_mb` MB trace JSON: for each, "work" steps while it
    compresses, against 20 idle ones just before. Returns writer -> [(slowdown, seconds it took)]."""
    big = bench.tmp / "writer_probe.json"
    data = json_path.read_bytes()
    with open(big, "wb") as f:
        for _ in range(max(1, round(size_mb * MB / len(data)))):
            f.write(data)
    out: dict[str, list[tuple[float, float]]] = {w: [] for w in sidecar.rank.compress.WRITERS}
    with _gc_paused():
        for r in range(rounds):
            for writer in sidecar.rank.compress.WRITERS[r % 2:] + sidecar.rank.compress.WRITERS[:r % 2]:
                base = median([_timed(bench.work.step) for _ in range(IDLE_STEPS)])

                def run(writer: str = writer) -> None:
                    with open(big, "rb") as src, open(f"{big}.gz", "wb") as dst:
                        sidecar.rank.compress.gzip_file(src, dst, big.name, sidecar.rank.exporter.GZIP_LEVEL, writer)

                thread = threading.Thread(target=run)
                t0 = time.perf_counter()
                thread.start()
                during = []
                while thread.is_alive():
                    during.append(_timed(bench.work.step))
                thread.join()
                out[writer].append((sum(during) / len(during) / base - 1.0, time.perf_counter() - t0))
    out["json_bytes"] = big.stat().st_size  # type: ignore[assignment]
    return out


def _writer_rows(probe: dict[str, Any]) -> list[Row]:
    note = (f"The gzip writers alone, alternating: {describe('work')} steps while one compresses the same trace JSON "
            "(a real trace repeated to the size) at level 1, against the median of 20 idle steps just before; "
            "slowdown = mean step time while it runs over that median. The process writer runs at nice 19.")
    label = f"gzip writers alone, {probe['json_bytes'] / MB:.0f} MB JSON"
    names = {"process": "child process (ours)", "thread": "saver thread"}
    rows = []
    for writer in sidecar.rank.compress.WRITERS:
        slow = [x[0] * 100 for x in probe[writer]]
        rows.append(Row(BENCH, f"{label}: work-step slowdown while the {names[writer]} compresses", median(slow), "%",
                        delta=f"it took {median([x[1] for x in probe[writer]]):.1f} s", samples=slow, note=note))
    return rows


def anchor(active: int, repeats: int) -> dict[str, Any] | None:
    """cosmos-rl's own CosmosProfiler on the same capture, or None where its venv is missing."""
    venv = Path(os.environ.get("COSMOS_RL_VENV", ROOT / ".cache" / f"cosmos-rl-{COSMOS_RL_VERSION}"))
    if not (venv / f".cosmos-rl-{COSMOS_RL_VERSION}-ready").exists():
        return None
    env = child_env(PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(venv / "bin" / "python"), "-I", "-B", str(PROGRAMS / "cosmos_anchor.py"),
                           "--active", str(active), "--repeats", str(repeats)],
                          capture_output=True, text=True, env=env, cwd="/", timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"the cosmos-rl anchor failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    if data["profiler"] != "cosmos_rl.utils.profiler.CosmosProfiler" or not data["file"].startswith(str(venv)):
        raise RuntimeError(f"the anchor did not run cosmos-rl's own CosmosProfiler: {data['profiler']} {data['file']}")
    return data


def run(quick: bool) -> list[Row]:
    sizes_mb = (1, 10) if quick else (1, 10, 100)
    repeats = 2 if quick else 3
    methods = ("sync", "floor", "free", "before", "process", "ours")
    tmp = Path(tempfile.mkdtemp(prefix="bench-save-"))
    bench = Bench(tmp)
    rows: list[Row] = []
    try:
        for _ in range(3):
            bench.deep.step()
            bench.work.step()
        calib = bench.capture("sync", 4)
        for how in methods[1:]:
            bench.capture(how, 2)
        per_step = calib["json_bytes"] / 4
        for size in sizes_mb:
            active = max(1, min(1000, round(size * MB / per_step)))
            results: dict[str, list[dict[str, Any]]] = {how: [] for how in methods}
            for r in range(repeats):
                for how in methods[r % len(methods):] + methods[:r % len(methods)]:
                    results[how].append(bench.capture(how, active))
            try:
                cosmos = anchor(active, repeats)
            except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as exc:
                cosmos = {"error": str(exc)}
            rows += _rows(size, active, results, cosmos, big=size == max(sizes_mb))
        probe_active = max(1, round(10 * MB / per_step))
        rows += _gil_rows(gil_probe(bench, probe_active), probe_active)
        rows += _writer_rows(writer_probe(bench, tmp / "gil_probe.json", max(sizes_mb), repeats))
    finally:
        bench.close()
    return rows


MIN_FLOOR_S = 0.005  # a floor under 5 ms (a 1 MB capture on a noisy machine) gives no meaningful ratio


def _ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}x" if floor > MIN_FLOOR_S else "n/a (floor in the noise)"


def _med(results: list[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in results])


NOTE = (f"In-process, capture of {describe('deep')} steps (record_shapes + with_stack, wait 0 / warmup 1 / N "
        f"active), then {describe('work')} steps until the file is complete (+3). Stall = excess over the idle "
        "median (work steps: 20 before the capture and 20 after the save) of the finalizing step + every later step + the excess of a gc.collect() after the capture (what "
        "the cyclic GC frees on the training thread). Slowdown = mean step time while the save is in flight over "
        "the idle median. Sync = export_chrome_trace(path.gz) in the training thread (gzip-9). The cyclic GC is "
        "otherwise paused during a capture. Shared 2-core machine: the saver's CPU is partly taken from training.")


def _rows(size: int, active: int, results: dict[str, list[dict[str, Any]]], cosmos: dict[str, Any] | None,
          big: bool) -> list[Row]:
    sync, floor, ours = results["sync"], results["floor"], results["ours"]
    json_mb = _med(sync, "json_bytes") / MB
    label = f"~{size} MB trace ({json_mb:.1f} MB JSON, {_med(ours, 'gz_bytes') / MB:.2f} MB gz-1; {active} active steps)"
    stall = {how: _med(rs, "stall_s") for how, rs in results.items()}
    base_ms = _med(sync, "deep_base_s") * 1000
    rows = [
        Row(BENCH, f"{label}: {LABELS['sync']}, training-thread stall", stall["sync"] * 1000, "ms",
            baseline=base_ms, baseline_label="idle deep step",
            delta=f"stop {_med(sync, 'stop_s') * 1000:.0f} + export {_med(sync, 'export_s') * 1000:.0f} ms",
            samples=[r["stall_s"] * 1000 for r in sync], note=NOTE, extra={"results": sync}),
        Row(BENCH, f"{label}: {LABELS['floor']}, training-thread stall", stall["floor"] * 1000, "ms",
            baseline=stall["sync"] * 1000, baseline_label="sync stall",
            delta=f"stop {_med(floor, 'stop_s') * 1000:.0f} ms", samples=[r["stall_s"] * 1000 for r in floor],
            note=NOTE, extra={"results": floor}),
        Row(BENCH, f"{label}: {LABELS['free']}, training-thread stall", stall["free"] * 1000, "ms",
            baseline=stall["floor"] * 1000, baseline_label="stop only",
            delta=f"{_ratio(stall['free'], stall['floor'])} stop only (stop "
                  f"{_med(results['free'], 'stop_s') * 1000:.0f} ms, then the free)",
            samples=[r["stall_s"] * 1000 for r in results["free"]], note=NOTE, extra={"results": results["free"]}),
    ]
    for how in ("before", "process", "ours"):
        rs = results[how]
        to_floor = stall[how] / stall["floor"] if stall["floor"] > MIN_FLOOR_S else float("nan")
        forked = sum(1 for r in rs if r.get("forked"))
        rows.append(Row(
            BENCH, f"{label}: {LABELS[how]}, training-thread stall", stall[how] * 1000, "ms",
            baseline=stall["floor"] * 1000, baseline_label="stop only",
            delta=f"{_ratio(stall[how], stall['floor'])} stop only, {_ratio(stall[how], stall['free'])} stop + free; "
                  f"{stall['sync'] / max(stall[how], 1e-9):.1f}x below sync (stop "
                  f"{_med(rs, 'stop_s') * 1000:.0f}, finalizing step {_med(rs, 'finalize_s') * 1000:.0f}, later steps "
                  f"{_med(rs, 'later_s') * 1000:+.0f}, gc {_med(rs, 'gc_s') * 1000:+.0f} ms"
                  + (f"; JSON forked in {forked} of {len(rs)})" if how == "ours" else ")"),
            samples=[r["stall_s"] * 1000 for r in rs], note=NOTE, extra={"results": rs},
            target="<= 1.2x stop only" if how == "ours" and big else "",
            met=(to_floor <= 1.2) if how == "ours" and big else None))
    ratio = stall["sync"] / max(stall["ours"], 1e-9)
    rows.append(Row(BENCH, f"{label}: ours vs sync, training-thread stall", ratio, "x",
                    baseline=stall["sync"] * 1000, baseline_unit="ms", baseline_label="sync stall",
                    delta=f"{ratio:.1f}x below", samples=[], note=NOTE,
                    target=">= 10x below sync" if big else "", met=(ratio >= 10) if big else None))
    for how in ("before", "process", "ours"):
        rs = results[how]
        slow = [r["slowdown"] * 100 for r in rs if r["slowdown"] is not None]
        if not slow:
            continue
        rows.append(Row(
            BENCH, f"{label}: {LABELS[how]}, work-step slowdown while the save is in flight", median(slow), "%",
            baseline=_med(rs, "work_base_s") * 1000, baseline_unit="ms", baseline_label="idle work step",
            delta=f"over {_med(rs, 'window_steps'):.0f} steps; save {_med(rs, 'export_s') * 1000:.0f} ms "
                  f"(JSON {_med(rs, 'json_s') * 1000:.0f} ms)",
            samples=slow, note=NOTE, target="< 10%" if how == "ours" and big else "",
            met=(median(slow) < 10) if how == "ours" and big else None))
    case = f"{label}: cosmos-rl {COSMOS_RL_VERSION}'s own CosmosProfiler (anchor), training-thread stall"
    if cosmos is None:
        rows.append(Row(BENCH, case, None, "", status=NOT_INSTALLED, note=NOTE))
    elif "error" in cosmos:
        rows.append(Row(BENCH, case, None, "", status="failed", note=cosmos["error"][-300:]))
    else:
        rs = cosmos["results"]
        anchor_ms = _med(rs, "stall_s") * 1000
        rows.append(Row(BENCH, case, anchor_ms, "ms", baseline=stall["ours"] * 1000, baseline_label="ours",
                        delta=f"ours {anchor_ms / max(stall['ours'] * 1000, 1e-9):.1f}x below; sync here "
                              f"{stall['sync'] * 1000:.0f} ms (its venv, its process)",
                        samples=[r["stall_s"] * 1000 for r in rs], note=NOTE, extra={"results": rs}))
    return rows


def _gil_rows(probe: dict[str, float], active: int) -> list[Row]:
    note = ("GIL probe: after a capture without with_stack (trace_only on), a thread runs one part of the save "
            "while the main thread spins in pure Python; value = the sum of the main thread's gaps over 1 ms, "
            "baseline = how long the part took. On a shared 2-core machine, gaps also come from CPU contention.")
    label = f"GIL probe, {active}-step trace ({probe['json_bytes'] / MB:.0f} MB JSON)"
    parts = (("json", "kineto's JSON write"), ("json_fork", "kineto's JSON write in a forked child"),
             ("free", "freeing the collected events"),
             ("gzip_thread", "gzip-1 on the thread"), ("gzip_process", "gzip-1 in the child process"))
    return [Row(BENCH, f"{label}: main thread blocked during {what}", probe[f"{name}_blocked_s"] * 1000, "ms",
                baseline=probe[f"{name}_s"] * 1000, baseline_label="its duration",
                delta=f"{probe[f'{name}_blocked_s'] / max(probe[f'{name}_s'], 1e-9) * 100:.0f}% of it", note=note)
            for name, what in parts]


if __name__ == "__main__":
    main(run)
