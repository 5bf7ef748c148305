"""The gpu check's verdicts: pure functions of what a run produced (a trace, a summary, a memory
snapshot, a hang report, the save-stall bench's results), each returning its `ok` line's evidence
or raising CheckFailed with its `FAIL` line's reason. No processes, no GPU: tested on CPU
(tests/test_gpu_check.py)."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Kernels of a step may start a little after its host window ends (the optimizer's, launched
# last); more than this share outside every window means the clocks do not line up.
MAX_OUTSIDE_SHARE = 0.1
# `profile summary`'s kernel time against the trace's own sum of kernel durations.
KERNEL_SUM_TOLERANCE = 0.01
CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, the "Device Type" of a [memory] event
SNAPSHOT_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                              "segment_map", "segment_unmap", "snapshot", "oom"})


class CheckFailed(Exception):
    """A check's verdict: the message is the reason on its FAIL line."""


# --- traces, summaries, snapshots, hangs -----------------------------------------------------------


@dataclass
class TraceFacts:
    """What the checks need from one Chrome trace, read in one streaming pass."""

    path: str
    num_events: int = 0
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # host ProfilerStep#N -> (ts, dur)
    kernels: list[tuple[float, float, str]] = field(default_factory=list)  # (ts, dur, name), cat "kernel"
    memory_devices: Counter = field(default_factory=Counter)  # "Device Type" of each [memory] event
    device_properties: list[dict[str, Any]] = field(default_factory=list)


def read_trace(path: str | os.PathLike[str]) -> TraceFacts:
    """Read a whole trace (gzip or plain JSON). json.load, not the CLI's streaming reader: a
    200 MB trace parses in seconds here, and the budget is short; `summary` exercises that reader.

    Raises:
        CheckFailed: it is missing, truncated or not a Chrome trace.
    """
    facts = TraceFacts(str(path))
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as f:
            doc = json.load(f)
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise CheckFailed(f"the trace does not read to its end: {path}: {type(exc).__name__}: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise CheckFailed(f"{path} is not a Chrome trace: no traceEvents list")
    for event in events:
        if isinstance(event, dict):
            _add_event(facts, event)
    facts.num_events = len(events)
    props = doc.get("deviceProperties")
    facts.device_properties = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    return facts


def _add_event(facts: TraceFacts, event: Mapping[str, Any]) -> None:
    name, cat = str(event.get("name", "")), str(event.get("cat", "")).lower()
    if name == "[memory]":
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        facts.memory_devices[args.get("Device Type")] += 1
        return
    ts, dur = event.get("ts"), event.get("dur")
    if event.get("ph") != "X" or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
        return
    if cat == "kernel":
        facts.kernels.append((float(ts), float(dur), name))
    elif name.startswith("ProfilerStep#") and not cat.startswith("gpu_") and name[13:].isdigit():
        facts.steps[int(name[13:])] = (float(ts), float(dur))  # the host span (the GPU mirror is gpu_*)


def kernels_per_step(facts: TraceFacts) -> tuple[dict[int, tuple[int, float]], int]:
    """(step -> (kernels that start in its host window, their time in us), kernels outside every window)."""
    per_step = {step: (0, 0.0) for step in facts.steps}
    windows = sorted((ts, ts + dur, step) for step, (ts, dur) in facts.steps.items())
    outside = 0
    for ts, dur, _ in facts.kernels:
        for start, end, step in windows:
            if start <= ts <= end:
                count, time_us = per_step[step]
                per_step[step] = (count + 1, time_us + dur)
                break
        else:
            outside += 1
    return per_step, outside


def check_kernels_in_steps(facts: TraceFacts, active_steps: int) -> str:
    """CUDA kernel events inside the ProfilerStep windows: every captured step has kernels, and
    at most MAX_OUTSIDE_SHARE of them start outside every window."""
    if len(facts.steps) != active_steps:
        raise CheckFailed(f"{len(facts.steps)} ProfilerStep windows in the trace, not the {active_steps} asked for "
                          f"({_steps(facts)})")
    if not facts.kernels:
        raise CheckFailed(f"no CUDA kernel events (cat 'kernel') in the trace ({facts.num_events} events): "
                          "the CUDA activity was not recorded")
    per_step, outside = kernels_per_step(facts)
    empty = [step for step, (count, _) in sorted(per_step.items()) if count == 0]
    if empty:
        raise CheckFailed(f"no kernel starts inside ProfilerStep window(s) {', '.join(f'#{s}' for s in empty)}; "
                          f"{outside} of {len(facts.kernels)} kernels lie outside every window")
    if outside > MAX_OUTSIDE_SHARE * len(facts.kernels):
        raise CheckFailed(f"{outside} of {len(facts.kernels)} kernels start outside every ProfilerStep window "
                          f"(more than {MAX_OUTSIDE_SHARE:.0%}: host and GPU clocks do not line up)")
    nccl = sum(1 for _, _, name in facts.kernels if "nccl" in name.lower())
    steps = ", ".join(f"#{s} {c} kernels {t / 1000:.2f} ms" for s, (c, t) in sorted(per_step.items()))
    return (f"{len(facts.kernels)} kernels ({nccl} NCCL), {len(facts.kernels) - outside} inside the windows: "
            f"{steps}")


def check_summary_kernels(summary: Mapping[str, Any], facts: TraceFacts, active_steps: int) -> str:
    """`profile summary --json` of the capture: its steps, and kernel time that matches the trace's."""
    ranks = summary.get("ranks") or []
    if len(ranks) != 1:
        raise CheckFailed(f"the summary has {len(ranks)} ranks, not 1")
    rank = ranks[0]
    steps = rank.get("steps") or []
    numbers = sorted(s.get("step") for s in steps)
    if numbers != sorted(facts.steps):
        raise CheckFailed(f"the summary's steps {numbers} are not the trace's {sorted(facts.steps)}")
    kernel_s = rank.get("kernel_s")
    if not isinstance(kernel_s, (int, float)) or kernel_s <= 0 or not rank.get("top_kernels"):
        raise CheckFailed(f"the summary reports no kernel time (kernel_s {kernel_s!r}, "
                          f"{len(rank.get('top_kernels') or [])} top kernels)")
    traced_s = sum(dur for _, dur, _ in facts.kernels) / 1e6
    if abs(kernel_s - traced_s) > KERNEL_SUM_TOLERANCE * traced_s:
        raise CheckFailed(f"the summary's kernel time {kernel_s * 1e3:.3f} ms is not the trace's "
                          f"{traced_s * 1e3:.3f} ms (sum of its kernel durations)")
    per_step = kernel_s / len(steps)
    top = rank["top_kernels"][0]
    return (f"kernel time {per_step * 1e3:.3f} ms per step over {len(steps)} steps (step "
            f"{(rank.get('step_s') or 0) * 1e3:.2f} ms, collective wait {(rank.get('collective_wait_s') or 0) * 1e3:.3f} "
            f"ms); top kernel {_short(top.get('name'))} {top.get('self_s', 0) * 1e3:.3f} ms")


def check_complete_trace(facts: TraceFacts, active_steps: int) -> str:
    """A saved CUDA trace is whole: every step asked for, kernels, and kineto's deviceProperties."""
    if len(facts.steps) != active_steps:
        raise CheckFailed(f"{len(facts.steps)} ProfilerStep windows, not {active_steps} ({_steps(facts)})")
    if not facts.kernels:
        raise CheckFailed(f"no CUDA kernel events in {facts.num_events} events")
    if not facts.device_properties:
        raise CheckFailed("no deviceProperties in the trace (kineto could not read the GPU's properties "
                          "where it wrote the JSON)")
    names = sorted({str(p.get("name", "?")) for p in facts.device_properties})
    return (f"{active_steps} steps, {facts.num_events} events ({len(facts.kernels)} kernels), deviceProperties "
            f"{', '.join(names)}")


def check_cuda_memory_events(facts: TraceFacts) -> str:
    """profile_memory on CUDA: [memory] events of the CUDA device type."""
    cuda = facts.memory_devices.get(CUDA_DEVICE_TYPE, 0)
    if not cuda:
        seen = dict(facts.memory_devices) or "none"
        raise CheckFailed(f"no CUDA [memory] events (Device Type {CUDA_DEVICE_TYPE}) in the trace; "
                          f"[memory] events by device type: {seen}")
    other = sum(facts.memory_devices.values()) - cuda
    return f"{cuda} CUDA [memory] events ({other} CPU) over {len(facts.steps)} steps"


def check_memory_snapshot(snapshot: Any, program: str = "") -> str:
    """A `torch.cuda.memory._snapshot()` (what `torch.cuda.memory._dump_snapshot` pickles): segments,
    and a device trace of allocator actions whose frames include Python frames (of `program`, if given)."""
    if not isinstance(snapshot, dict):
        raise CheckFailed(f"the snapshot is a {type(snapshot).__name__}, not the dict of torch.cuda.memory._snapshot()")
    segments, traces = snapshot.get("segments"), snapshot.get("device_traces")
    if not isinstance(segments, list) or not isinstance(traces, list):
        raise CheckFailed(f"the snapshot has no 'segments' and 'device_traces' lists (keys: {sorted(snapshot)})")
    entries = [e for trace in traces if isinstance(trace, list) for e in trace if isinstance(e, dict)]
    if not entries:
        raise CheckFailed(f"the snapshot's device_traces are empty ({len(segments)} segments): "
                          "no allocator history was recorded over the active steps")
    unknown = sorted({str(e.get("action")) for e in entries} - SNAPSHOT_ACTIONS)
    if unknown:
        raise CheckFailed(f"device trace entries with unknown actions {unknown}")
    frames = [f for e in entries for f in (e.get("frames") or []) if isinstance(f, dict)]
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    if not python:
        raise CheckFailed(f"no Python frames in {len(entries)} device trace entries ({len(frames)} frames): "
                          "the history was not recorded with Python stacks")
    ours = [f for f in python if program and str(f.get("filename", "")).endswith(program)]
    if program and not ours:
        raise CheckFailed(f"no frame of {program} among {len(python)} Python frames")
    actions = Counter(str(e.get("action")) for e in entries)
    return (f"{len(segments)} segments, {len(entries)} trace entries ({', '.join(f'{n} {a}' for a, n in actions.most_common(3))}), "
            f"{len(python)} Python frames of {len(frames)}" + (f", {len(ours)} in {program}" if program else ""))


def check_hang_report(report: Mapping[str, Any]) -> str:
    """`profile hang --json` on a rank stopped in an NCCL all-reduce: the flight recorder was read
    and the report names that collective, with the rank waiting in it."""
    if not report.get("flight_recorder"):
        raise CheckFailed(f"no flight recorder data: {report.get('fallback') or report.get('verdict')}")
    coll = report.get("collective")
    if not isinstance(coll, dict):
        raise CheckFailed(f"the report names no collective in flight: {report.get('verdict')}")
    op, pg = str(coll.get("op", "")), str(coll.get("process_group", ""))
    if "all_reduce" not in op or not (op.startswith("nccl:") or pg.startswith("nccl:")):
        raise CheckFailed(f"the collective named is {op} on {pg}, not an NCCL all-reduce: {report.get('verdict')}")
    if 0 not in (coll.get("waiting") or []):
        raise CheckFailed(f"rank 0 is not waiting in {op} (waiting: {coll.get('waiting')}): {report.get('verdict')}")
    waited = coll.get("waited_s")
    return (f"{report.get('verdict')} [{op}, {pg}, seq {coll.get('seq')}, waited "
            f"{'?' if waited is None else f'{waited:.1f}'} s from the {coll.get('waited_from') or '?'}]")


def flight_recorders(dump: Mapping[str, Any]) -> str:
    """Which recorders a `sidecar.rank.flightrec` dump holds, with their entry counts: "nccl 12 entries, cpu 0"."""
    recorders = dump.get("recorders") or {}
    parts = [f"{key} {len((value or {}).get('entries') or [])} entries" for key, value in sorted(recorders.items())]
    errors = dump.get("errors") or {}
    parts += [f"{key}: {why}" for key, why in sorted(errors.items())]
    return ", ".join(parts) or f"no recorder ({dump.get('reason')})"


def writers_line(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Stall and slowdown of each writer side by side: "fork 210 ms +3% | auto ... | thread ..."."""
    parts = []
    for mode, r in results.items():
        slow = r.get("slowdown")
        forked = "forked" if r.get("forked") else "not forked"
        parts.append(f"{mode} stall {r['stall_s'] * 1e3:.0f} ms, slowdown "
                     f"{'n/a' if slow is None else f'{slow * 100:+.0f}%'} ({forked})")
    first = next(iter(results.values()))
    return f"{first['raw_bytes'] / 1e6:.1f} MB JSON, {first['active']} steps: " + " | ".join(parts)


def stall_ratio(sync: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """Ours against a synchronous export_chrome_trace, as a ratio of the training-thread stalls.

    Raises:
        CheckFailed: ours stalls the training thread as long as the synchronous export, or longer.
    """
    sync_s, ours_s = sync["stall_s"], ours["stall_s"]
    size = f"{sync['raw_bytes'] / 1e6:.0f} MB JSON ({sync['active']} steps)"
    if ours_s >= sync_s:
        raise CheckFailed(f"{size}: ours stalls training {ours_s:.2f} s, no less than the synchronous "
                          f"export_chrome_trace's {sync_s:.2f} s")
    slow = ours.get("slowdown")
    return (f"{size}: ours {ours_s:.2f} s vs synchronous export_chrome_trace {sync_s:.2f} s: "
            f"{sync_s / max(ours_s, 1e-9):.1f}x below (stop {ours['stop_s']:.2f} s paid by both; JSON "
            f"{'forked' if ours.get('forked') else 'on the saver thread'}; slowdown while saving "
            f"{'n/a' if slow is None else f'{slow * 100:+.0f}%'})")


def _steps(facts: TraceFacts) -> str:
    return ", ".join(f"#{s}" for s in sorted(facts.steps)) or "none"


def _short(name: Any, limit: int = 60) -> str:
    text = str(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the save stall's results ---------------------------------------------------------------------


def _saved_trace(result: Mapping[str, Any]) -> str:
    """A bench capture's trace, read back whole: what check_complete_trace says."""
    if result.get("sidecar_error"):
        raise CheckFailed(f"the sidecar recorded an error: {result['sidecar_error']}")
    return check_complete_trace(read_trace(result["trace_path"]), result["active"])


def fork_writer_check(first: Mapping[str, Any]) -> tuple[str, Any]:
    if not first.get("forked"):
        why = "the forked child failed and the saver thread wrote it" if first.get("fork_fell_back") else \
            "forkwriter.write was not called"
        raise CheckFailed(f"the first save was not written by a forked child: {why}")
    text = _saved_trace(first)
    return (f"the first save of a CUDA + NCCL process, JSON written in a forked child: {text}; "
            f"{first['steps_on']} training steps after the save"), {"trace": first["trace_path"]}


def writers_check(writers: Mapping[str, Mapping[str, Any]]) -> tuple[str, Any]:
    for mode, result in writers.items():
        try:
            _saved_trace(result)
        except CheckFailed as exc:
            raise CheckFailed(f"writer {mode}: {exc}") from None
    if not writers["fork"].get("forked") or writers["fork"].get("fork_fell_back"):
        raise CheckFailed("writer fork: the JSON was not written by a forked child")
    if writers["thread"].get("forked"):
        raise CheckFailed("writer thread: a child was forked")
    return writers_line(writers), {mode: _numbers(r) for mode, r in writers.items()}


def big_check(big: Mapping[str, Any]) -> tuple[str, Any]:
    sync, ours = big["sync"], big["ours"]
    _saved_trace(ours)  # a whole CUDA trace first: without one (on CPU) the stalls compare nothing
    text = stall_ratio(sync, ours)
    note = "" if sync["raw_bytes"] >= 0.9 * big["requested_mb"] * 1e6 else \
        f" (asked for {big['requested_mb']:.0f} MB; smaller to fit the time or the 1000-step bound)"
    return text + note, {"sync": _numbers(sync), "ours": _numbers(ours)}


def _numbers(result: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("stall_s", "slowdown", "stop_s", "export_s", "finalize_s", "later_s", "gc_s", "raw_bytes", "gz_bytes",
            "active", "forked", "wall_s", "trace_path")
    return {k: result.get(k) for k in keys}


