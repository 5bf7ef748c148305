"""The GPU acceptance check's verifiers (gpu_check/verify.py), on CPU.

The checks themselves run on a GPU (docs/gpu-check.md). Here every verifier accepts what a GPU
run gives and fails what it must not accept: a CPU trace, kernels outside the step windows, a
summary that disagrees with its trace, a snapshot without Python frames, a gloo hang, a save that
stalls as long as a synchronous one. The script without a GPU: tests/e2e/test_gpu_check_setup.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpu_check import verify
from gpu_check.verify import CheckFailed
from sidecar.cli.render_hang import hang_json
from sidecar.fleet.hang import RankView, analyze, group_states
from support.cli import invoke
from support.traces import span, write_trace


def kernel(name: str, ts: float, dur: float) -> dict:
    return span(name, ts, dur, cat="kernel", pid=0, tid=7, args={"device": 0, "stream": 7})


def cuda_trace(path: Path, kernels: list[dict] | None = None, properties: bool = True, memory: bool = False) -> Path:
    """A CUDA trace as kineto writes one: host ProfilerStep#10 and #11 (1000 us each), their GPU mirrors,
    kernels (default: two GEMMs in each step and an NCCL all-reduce in #11), deviceProperties."""
    events = []
    for n, ts in ((10, 0.0), (11, 1000.0)):
        events.append(span(f"ProfilerStep#{n}", ts, 1000.0, cat="user_annotation"))
        events.append(span(f"ProfilerStep#{n}", ts + 5, 990.0, cat="gpu_user_annotation", pid=0, tid=7))
        events.append(span("aten::mm", ts + 10, 50.0))
    if kernels is None:
        kernels = [kernel("sm90_xmma_gemm_f32", 20, 100), kernel("sm90_xmma_gemm_f32", 200, 100),
                   kernel("sm90_xmma_gemm_f32", 1020, 100), kernel("sm90_xmma_gemm_f32", 1200, 100),
                   kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1400, 30)]
    events += kernels
    if memory:
        events += [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                    "ts": 30.0 + i, "args": {"Device Type": device, "Device Id": 0, "Bytes": 4096}}
                   for i, device in enumerate((1, 1, 0))]
    meta = {"deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000}]} if properties else {}
    return write_trace(path, events, schemaVersion=1, **meta)


def test_kernels_inside_the_step_windows_pass_and_outside_them_fail(tmp_path: Path) -> None:
    facts = verify.read_trace(cuda_trace(tmp_path / "ok.json.gz"))
    text = verify.check_kernels_in_steps(facts, 2)
    assert text.startswith("5 kernels (1 NCCL), 5 inside the windows: #10 2 kernels 0.20 ms, #11 3 kernels 0.23 ms")
    # the host clock and the GPU's apart: every kernel after the steps
    late = [kernel("gemm", 5000 + 100 * i, 50) for i in range(4)]
    with pytest.raises(CheckFailed, match=r"no kernel starts inside ProfilerStep window\(s\) #10, #11; 4 of 4"):
        verify.check_kernels_in_steps(verify.read_trace(cuda_trace(tmp_path / "late.json.gz", late)), 2)
    # every step has kernels, but a third of them lie outside
    some = [kernel("gemm", 20, 50), kernel("gemm", 1020, 50), kernel("gemm", 9000, 50)]
    with pytest.raises(CheckFailed, match="1 of 3 kernels start outside every ProfilerStep window"):
        verify.check_kernels_in_steps(verify.read_trace(cuda_trace(tmp_path / "some.json.gz", some)), 2)
    with pytest.raises(CheckFailed, match="2 ProfilerStep windows in the trace, not the 3 asked for"):
        verify.check_kernels_in_steps(facts, 3)


def test_a_real_cpu_trace_has_no_kernels_and_no_cuda_memory_events(tmp_path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Linear(16, 16)
    path = tmp_path / "cpu_trace.json"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(3):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    facts = verify.read_trace(path)
    assert len(facts.steps) == 2 and facts.memory_devices.get(0), facts
    with pytest.raises(CheckFailed, match=r"no CUDA kernel events \(cat 'kernel'\) in the trace"):
        verify.check_kernels_in_steps(facts, 2)
    with pytest.raises(CheckFailed, match="no CUDA kernel events in"):
        verify.check_complete_trace(facts, 2)
    with pytest.raises(CheckFailed, match=r"no CUDA \[memory\] events \(Device Type 1\).*by device type: \{0: "):
        verify.check_cuda_memory_events(facts)


def test_a_complete_cuda_trace_names_its_device_and_a_cut_one_fails(tmp_path: Path) -> None:
    path = cuda_trace(tmp_path / "t.json.gz", memory=True)
    facts = verify.read_trace(path)
    assert verify.check_complete_trace(facts, 2) == "2 steps, 14 events (5 kernels), deviceProperties NVIDIA H200"
    assert verify.check_cuda_memory_events(facts) == "2 CUDA [memory] events (1 CPU) over 2 steps"
    with pytest.raises(CheckFailed, match="no deviceProperties in the trace"):
        verify.check_complete_trace(verify.read_trace(cuda_trace(tmp_path / "n.json.gz", properties=False)), 2)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-200]))
    with pytest.raises(CheckFailed, match="the trace does not read to its end"):
        verify.read_trace(cut)


def test_the_summary_must_report_the_kernel_time_its_trace_holds(tmp_path: Path) -> None:
    path = cuda_trace(tmp_path / "t.json.gz")
    facts = verify.read_trace(path)
    result = invoke("profile", "summary", str(path), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    text = verify.check_summary_kernels(summary, facts, 2)
    assert text.startswith("kernel time 0.215 ms per step over 2 steps (step 1.00 ms, collective wait 0.015 ms)"), text
    assert "top kernel sm90_xmma_gemm_f32 0.400 ms" in text
    summary["ranks"][0]["kernel_s"] *= 2
    with pytest.raises(CheckFailed, match="the summary's kernel time 0.860 ms is not the trace's 0.430 ms"):
        verify.check_summary_kernels(summary, facts, 2)
    plain = write_trace(tmp_path / "p.json.gz", [span("ProfilerStep#10", 0, 100, cat="user_annotation"),
                                                 span("ProfilerStep#11", 100, 100, cat="user_annotation")])
    no_kernels = json.loads(invoke("profile", "summary", str(plain), "--json").output)
    with pytest.raises(CheckFailed, match="the summary reports no kernel time"):
        verify.check_summary_kernels(no_kernels, facts, 2)


def snapshot(frames: list[dict], action: str = "alloc") -> dict:
    entry = {"action": action, "addr": 1 << 20, "size": 4096, "stream": 0, "time_us": 1, "frames": frames}
    return {"segments": [{"device": 0, "address": 1 << 20, "total_size": 2 << 20, "blocks": []}],
            "device_traces": [[entry, {**entry, "action": "free_requested"}]], "allocator_settings": {}}


def test_a_memory_snapshot_needs_allocator_history_with_python_frames() -> None:
    ours = {"filename": "/w/gpu_check/cuda_train.py", "line": 80, "name": "main"}
    cpp = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}
    text = verify.check_memory_snapshot(snapshot([ours, cpp]), "cuda_train.py")
    assert text == "1 segments, 2 trace entries (1 alloc, 1 free_requested), 2 Python frames of 4, 2 in cuda_train.py"
    with pytest.raises(CheckFailed, match=r"no Python frames in 2 device trace entries \(2 frames\)"):
        verify.check_memory_snapshot(snapshot([cpp]))
    with pytest.raises(CheckFailed, match="no frame of cuda_train.py among 2 Python frames"):
        verify.check_memory_snapshot(snapshot([{**ours, "filename": "/w/other.py"}]), "cuda_train.py")
    with pytest.raises(CheckFailed, match="unknown actions"):
        verify.check_memory_snapshot(snapshot([ours], action="allocate"))
    with pytest.raises(CheckFailed, match="device_traces are empty"):
        verify.check_memory_snapshot({**snapshot([ours]), "device_traces": [[]]})
    with pytest.raises(CheckFailed, match="no 'segments' and 'device_traces' lists"):
        verify.check_memory_snapshot({"segments": []})
    with pytest.raises(CheckFailed, match="is a list, not the dict"):
        verify.check_memory_snapshot([])


def hang_report(op: str, recorder: str) -> dict:
    """`profile hang --json` of one rank stopped in `op`: entered seq 12, completed 11."""
    entry = {"collective_seq_id": 12, "profiling_name": op, "process_group": ["0", "default_pg"],
             "input_sizes": [[1]], "output_sizes": [[1]], "is_p2p": False, "retired": False, "state": "scheduled",
             "time_created_ns": int(1_799_999_996 * 1e9)}
    doc = {"recorders": {recorder: {"entries": [entry], "pg_status": {"0": {
        "last_enqueued_collective": 12, "last_completed_collective": 11}}}}}
    view = RankView(0, host="h", step=40, dumped_at=1_800_000_000.0, last_step_at=1_799_999_995.0,
                    groups=group_states(doc))
    return json.loads(json.dumps(hang_json(analyze([view], "gpucheck", now=1_800_000_000.0))))


def test_the_hang_report_must_name_an_nccl_all_reduce_from_the_flight_recorder() -> None:
    text = verify.check_hang_report(hang_report("nccl:all_reduce", "nccl"))
    assert text.startswith("Every rank entered nccl:all_reduce (pg 0 default_pg, seq 12) and none completed it")
    assert text.endswith("[nccl:all_reduce, nccl:0, seq 12, waited 4.0 s from the flight recorder]"), text
    with pytest.raises(CheckFailed, match="the collective named is gloo:all_reduce on cpu:0, not an NCCL all-reduce"):
        verify.check_hang_report(hang_report("gloo:all_reduce", "cpu"))
    no_fr = analyze([RankView(0, host="h", step=40, groups=None, fr_error="no process group")], "gpucheck")
    with pytest.raises(CheckFailed, match="no flight recorder data: no flight recorder data: no process group"):
        verify.check_hang_report(json.loads(json.dumps(hang_json(no_fr))))
    assert verify.flight_recorders({"recorders": {"nccl": {"entries": [{}, {}]}, "cpu": {}}}) == "cpu 0 entries, nccl 2 entries"


def bench_result(path: Path, stall_s: float, forked: bool, **extra) -> dict:
    return {"trace_path": str(path), "active": 2, "stall_s": stall_s, "slowdown": 0.05, "forked": forked,
            "fork_fell_back": 0, "raw_bytes": 20_400_000, "stop_s": 0.4, "steps_on": 28, "sidecar_error": None,
            **extra}


def test_the_writers_side_by_side_and_the_stall_ratio(tmp_path: Path) -> None:
    path = cuda_trace(tmp_path / "t.json.gz")
    writers = {"fork": bench_result(path, 0.21, True), "auto": bench_result(path, 0.25, False),
               "thread": bench_result(path, 0.61, False)}
    text, numbers = verify.writers_check(writers)
    assert text == ("20.4 MB JSON, 2 steps: fork stall 210 ms, slowdown +5% (forked) | auto stall 250 ms, slowdown "
                    "+5% (not forked) | thread stall 610 ms, slowdown +5% (not forked)")
    assert numbers["thread"]["stall_s"] == 0.61
    with pytest.raises(CheckFailed, match="writer fork: the JSON was not written by a forked child"):
        verify.writers_check({**writers, "fork": bench_result(path, 0.2, True, fork_fell_back=1)})
    with pytest.raises(CheckFailed, match="writer thread: a child was forked"):
        verify.writers_check({**writers, "thread": bench_result(path, 0.2, True)})
    with pytest.raises(CheckFailed, match="writer auto: no deviceProperties"):
        verify.writers_check({**writers, "auto": bench_result(cuda_trace(tmp_path / "n.json.gz", properties=False),
                                                          0.2, False)})
    text, _ = verify.fork_writer_check(bench_result(path, 0.2, True))
    assert text.startswith("the first save of a CUDA + NCCL process, JSON written in a forked child: 2 steps")
    with pytest.raises(CheckFailed, match="the forked child failed and the saver thread wrote it"):
        verify.fork_writer_check(bench_result(path, 0.2, False, fork_fell_back=1))
    sync, ours = bench_result(path, 12.5, False), bench_result(path, 2.5, True)
    assert verify.stall_ratio(sync, ours) == (
        "20 MB JSON (2 steps): ours 2.50 s vs synchronous export_chrome_trace 12.50 s: 5.0x below (stop 0.40 s "
        "paid by both; JSON forked; slowdown while saving +5%)")
    with pytest.raises(CheckFailed, match="ours stalls training 12.50 s, no less than the synchronous"):
        verify.stall_ratio(ours, sync)
    text, numbers = verify.big_check({"requested_mb": 200, "sync": sync, "ours": ours})
    assert text.endswith("+5%) (asked for 200 MB; smaller to fit the time or the 1000-step bound)"), text
    assert numbers["ours"]["stall_s"] == 2.5
    assert verify.big_check({"requested_mb": 20, "sync": sync, "ours": ours})[0].endswith("+5%)")
    with pytest.raises(CheckFailed, match="the sidecar recorded an error: disk full"):
        verify.big_check({"requested_mb": 20, "sync": sync, "ours": {**ours, "sidecar_error": "disk full"}})
    # A trace with no kernels (on CPU) fails for what it lacks, whatever the stalls of a loaded machine
    cpu = bench_result(cuda_trace(tmp_path / "cpu.json.gz", kernels=[]), 12.5, True)
    with pytest.raises(CheckFailed, match="no CUDA kernel events in"):
        verify.big_check({"requested_mb": 20, "sync": sync, "ours": cpu})
