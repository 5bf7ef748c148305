"""The frameworks people train with, unchanged under `python -m sidecar.run` (docs/frameworks.md).

A Hugging Face `Trainer` and a PyTorch Lightning `Trainer.fit`, both with gradient
accumulation 2 (tests/programs/hf_train.py, lightning_train.py), each profiled once
through the CLI (`profile set NAME -as 2 --wait`). The trace's `ProfilerStep#N` is
the framework's step N counted from 0: its `global_step` is N while the step runs
and N+1 once it ends, and the window spans both micro-batches of that step and its
one optimizer step. bin/test installs the frameworks (COSMOS_SKIP_FRAMEWORKS=1 skips
that); where one is missing its tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from sidecar.common.layout import record_path
from support.cli import run_cli
from support.files import read_json
from support.launch import PYTHON, ROOT, Spawner, base_env
from support.records import wait_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

PROGRAMS = ROOT / "tests" / "programs"
FRAMEWORKS = {
    # name: (program, the modules it needs (any one of a tuple), what to install)
    "hf": ("hf_train.py", ("transformers", "accelerate"), "transformers and accelerate"),
    "lightning": ("lightning_train.py", (("lightning", "pytorch_lightning"),), "lightning or pytorch-lightning"),
}
MARK = re.compile(r"train_forward global_step=(\d+)")


def _missing(modules) -> bool:
    return any(not any(importlib.util.find_spec(m) for m in (alts if isinstance(alts, tuple) else (alts,)))
               for alts in modules)


@pytest.fixture(scope="module", params=sorted(FRAMEWORKS))
def captured(request, tmp_path_factory):
    """One framework's job under sidecar.run, profiled for 2 steps through the CLI, then stopped.
    Returns (trace, the program's step-end records, the rank record)."""
    program, modules, install = FRAMEWORKS[request.param]
    if _missing(modules):
        pytest.skip(f"{request.param}: {install} not installed (bin/test installs them unless COSMOS_SKIP_FRAMEWORKS=1)")
    tmp = tmp_path_factory.mktemp(request.param)
    registry, steps_file = tmp / "registry", tmp / "steps.jsonl"
    spawner = Spawner(tmp)
    try:
        cmd = [PYTHON, "-m", "sidecar.run", "--replica", request.param, "--output", str(tmp / "out"),
               str(PROGRAMS / program)]
        proc = spawner(request.param, ["--steps-file", str(steps_file)], base_env(registry), program=cmd)
        proc.wait_ready(timeout=180)  # the frameworks take long to import on a busy machine
        proc.wait_idle(registry, request.param)
        # Training has begun (the first record is written before the framework sets up): the CLI
        # picks a start step from the job's pace.
        wait_record(registry, lambda r: r.get("step", 0) > 0, request.param, 0, 120, what="the first steps")
        code, out, err, _ = run_cli("profile", "set", request.param, "-as", "2", "--wait", timeout=180,
                                    env=base_env(registry))
        assert code == 0, f"{out}\n{err}\n{proc.stderr()[-3000:]}"
        rec = wait_for(lambda: (r := read_json(record_path(registry, request.param, 0))) and r.get("trace_path") and r,
                       what="the trace in the rank record")
        assert proc.stop() == 0, proc.stderr()[-3000:]
        assert "Traceback" not in proc.stderr(), proc.stderr()[-3000:]
        ends = [json.loads(line) for line in steps_file.read_text().splitlines()]
        return load_trace(rec["trace_path"]), ends, rec
    finally:
        spawner.close()


def _windows(trace: dict) -> dict[int, tuple[float, float, object]]:
    """ProfilerStep#N -> (start, end, thread) of its span."""
    out = {}
    for e in trace["traceEvents"]:
        m = re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", "")))
        if m and e.get("ph") == "X":
            out[int(m.group(1))] = (e["ts"], e["ts"] + e["dur"], e["tid"])
    return out


def _starts_in(trace: dict, window, match) -> list[dict]:
    """The complete events on the window's thread that start inside it and whose name `match`es."""
    start, end, tid = window
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == tid
            and start <= e["ts"] < end and match(str(e.get("name", "")))]


def test_the_sidecar_counts_the_frameworks_global_step(captured):
    trace, ends, rec = captured
    # At every step end, the sidecar's step count is the framework's global_step: it counts from 0,
    # one per optimizer step, not one per micro-batch.
    assert len(ends) >= 4
    assert [e["sidecar_step"] for e in ends] == [e["global_step"] for e in ends] == list(range(1, len(ends) + 1))
    steps = profiler_steps(trace)
    assert len(steps) == 2 and steps[1] == steps[0] + 1, steps
    assert steps[-1] + 1 <= ends[-1]["global_step"], "the job stopped before the traced steps ended"


def test_profiler_step_n_is_the_frameworks_step_n_and_spans_both_micro_batches(captured):
    trace, _, _ = captured
    windows = _windows(trace)
    assert sorted(windows) == profiler_steps(trace)
    for n, window in windows.items():
        # Every forward pass in ProfilerStep#N ran while global_step was N (it is N+1 once the step ends):
        # two of them, the two micro-batches of gradient accumulation 2 ...
        marks = [int(MARK.fullmatch(e["name"]).group(1)) for e in _starts_in(trace, window, MARK.fullmatch)]
        assert marks == [n, n], f"ProfilerStep#{n} holds the forward passes of global steps {marks}"
        losses = _starts_in(trace, window, lambda name: name == "aten::cross_entropy_loss")
        assert len(losses) == 2, f"ProfilerStep#{n} holds {len(losses)} losses"
        # ... and the one optimizer step that ends it.
        opt = _starts_in(trace, window, lambda name: name.startswith("Optimizer.step#"))
        assert len(opt) == 1, f"ProfilerStep#{n} holds {[e['name'] for e in opt]}"
