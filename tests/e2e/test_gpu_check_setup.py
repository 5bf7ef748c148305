"""bin/gpu-check where there is no GPU, run as a script: it sets up (bin/test's venv) and says
`no GPU: skipped` in one line; where a GPU is reported but no CUDA torch is importable, it installs
nothing with --no-install and says so in one FAIL line; with `--device cpu` it runs every check's
plumbing on CPU, and each check fails saying what a CPU run lacks. The verifiers are
tests/unit/test_gpu_check.py's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.launch import PYTHON, ROOT, base_env

GPU_CHECK = ROOT / "bin" / "gpu-check"
NO_GPU = not Path("/dev/nvidia0").exists()


def _script_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """bin/gpu-check's environment: this venv (so _venv.sh reuses it), a PATH without nvidia-smi."""
    env = base_env(COSMOS_PROFILER_VENV=sys.prefix, **extra)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not (Path(p) / "nvidia-smi").exists())
    return env


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: bin/gpu-check would run its checks")
def test_without_a_gpu_it_sets_up_and_says_skipped_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([str(GPU_CHECK), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600, env=_script_env(tmp_path), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "no GPU: skipped\n"), done.stderr[-3000:]
    assert not any(word in done.stderr for word in ("Traceback", "FAIL", "Error")), done.stderr[-3000:]
    # bin/test's venv, whose install (with the test extras) holds the project: nothing is installed again
    assert "[setup] installing" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out" / "work" / "children").exists()  # nothing was started


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_a_gpu_without_a_cuda_torch_installs_nothing_with_no_install(tmp_path: Path) -> None:
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = _script_env(tmp_path, PYTHON=PYTHON)  # this venv's torch: a CPU build
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    done = subprocess.run([str(GPU_CHECK), "--out", str(tmp_path / "out"), "--no-install"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(lines) == 2 and lines[0].startswith("FAIL setup: a GPU is here, but no Python 3.10+ with a CUDA "
                                                   "build of torch"), done.stdout
    assert "CUDA None" in lines[0] and "--no-install: nothing installed" in lines[0], lines[0]
    assert lines[1].startswith("gpu-check: 0 of 1 checks ok, 1 FAILED"), lines[1]
    assert not (ROOT / ".venv-gpu").exists() and not (tmp_path / "out" / "site").exists()


# The order the checks end in: the CLI's on the training job, then the CUDA bench's.
RUN_ORDER = ("kernels", "ondemand", "summary", "profile-memory", "memory-snapshot", "hang", "fork-writer", "writers", "save-stall")
# What each check's FAIL line says on CPU and gloo: the CUDA it lacks.
CPU_LACKS = {
    "kernels": "no CUDA kernel events (cat 'kernel') in the trace",
    "ondemand": "no capture with CUDA kernels to check (the kernels check failed)",
    "summary": "the summary reports no kernel time",
    "profile-memory": "no CUDA [memory] events (Device Type 1) in the trace",
    "memory-snapshot": "kind 'memory' needs CUDA",
    "hang": "the report names no collective in flight",
    "fork-writer": "no CUDA kernel events in",
    "writers": "writer fork: no CUDA kernel events in",
    "save-stall": "no CUDA kernel events in",
}


@pytest.mark.timeout(600)
@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: a CPU run would leave it idle")
def test_device_cpu_runs_every_check_on_cpu_and_each_says_what_cpu_lacks(tmp_path: Path) -> None:
    """`bin/gpu-check --device cpu`: the training job, the CLI calls, the bench process, the
    deadlines and the cleanup, for real, on CPU and gloo (1.5 to 3 minutes on 2 cores)."""
    out = tmp_path / "out"
    env = _script_env(tmp_path, GPU_CHECK_BUDGET_S="480")  # a loaded machine still gets to every check
    done = subprocess.run([str(GPU_CHECK), "--device", "cpu", "--writers-mb", "1", "--big-mb", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=560, env=env, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert [line.split(":")[0] for line in lines[:-1]] == [f"FAIL {name}" for name in RUN_ORDER], done.stdout
    for name, line in zip(RUN_ORDER, lines, strict=False):
        assert CPU_LACKS[name] in line, line
    assert re.fullmatch(r"gpu-check: 0 of 9 checks ok, 9 FAILED \(CPU \(--device cpu\); \d+ s\)", lines[-1]), lines[-1]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (out / "report.txt").read_text().splitlines() == lines
    results = json.loads((out / "results.json").read_text())
    assert results["device"]["name"] == "CPU (--device cpu)" and sorted(results["checks"]) == sorted(RUN_ORDER)
    assert (out / "work" / "train.err").exists() and (out / "work" / "bench.err").exists()


def test_the_checks_call_a_cpu_only_torch_a_setup_failure_where_a_gpu_was_seen(tmp_path: Path) -> None:
    import torch

    if torch.version.cuda:
        pytest.skip("this venv's torch is a CUDA build")
    done = subprocess.run([PYTHON, "-m", "gpu_check", "--out", str(tmp_path), "--gpu-expected"],
                          capture_output=True, text=True, timeout=300, env=base_env(), cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("FAIL setup: a GPU is here but CUDA is not usable from Python: "
                                                  "torch "), done.stdout
    assert "is not a CUDA build" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["checks"]["setup"]["ok"] is False
    assert (tmp_path / "report.txt").read_text().splitlines() == done.stdout.splitlines()


# --- the verifiers --------------------------------------------------------------------------------
