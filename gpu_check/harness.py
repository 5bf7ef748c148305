"""The gpu check's harness: lines as checks end, children in sessions of their own that are killed
at the end, one deadline over everything, and the GPU probed in a child (nothing here imports torch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, child_env, wait_for
from gpu_check.verify import CheckFailed


class Run:
    """Lines as checks end, children killed at the end, one deadline over everything."""

    def __init__(self, out: Path, budget_s: float, device: str = "cuda") -> None:
        self.device = device
        self.out, self.work = out, out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.lines: list[str] = []
        self.results: dict[str, Any] = {"checks": {}}
        self.failed = 0
        self.procs: list[subprocess.Popen] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def report(self, name: str, ok: bool, text: str, data: Any = None) -> None:
        line = f"{'ok  ' if ok else 'FAIL'} {name}: {' '.join(text.split())}"
        self.lines.append(line)
        print(line, flush=True)
        self.results["checks"][name] = {"ok": ok, "text": text, "data": data}
        self.failed += not ok

    def check(self, name: str, fn: Callable[[], str | tuple[str, Any]]) -> bool:
        """Run one check; its CheckFailed (or any error) is its FAIL line."""
        if self.left() <= 0:
            self.report(name, False, "not run: the time budget is spent")
            return False
        try:
            out = fn()
        except CheckFailed as exc:
            self.report(name, False, str(exc))
            return False
        except subprocess.TimeoutExpired as exc:
            self.report(name, False, f"timed out after {exc.timeout:.0f} s: {_cmd(exc.cmd)}")
            return False
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a FAIL line, never a traceback
            self.report(name, False, f"{type(exc).__name__}: {exc}")
            return False
        text, data = out if isinstance(out, tuple) else (out, None)
        self.report(name, True, text, data)
        return True

    def fail_all(self, names: Sequence[str], reason: str) -> None:
        for name in names:
            if name not in self.results["checks"]:
                self.report(name, False, reason)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(self.work, name, cmd, env)
        self.procs.append(proc.popen)
        with open(self.work / "children", "a") as f:  # bin/gpu-check kills these sessions on exit
            f.write(f"{proc.popen.pid}\n")
        return proc

    def kill_children(self) -> None:
        for popen in self.procs:
            kill_session(popen)

    def timeout(self, limit: float) -> float:
        """A step's timeout: `limit`, or what is left of the budget."""
        left = self.left()
        if left <= 1:
            raise CheckFailed("not run: the time budget is spent")
        return min(limit, left)


class Proc:
    """A child in a session of its own, stdout and stderr to files under work/."""

    def __init__(self, work: Path, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.out_path, self.err_path = work / f"{name}.out", work / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          cwd=ROOT, start_new_session=True)

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def tail(self, chars: int = 400) -> str:
        err = self.err_path.read_text(errors="replace").strip()
        return " ".join(err[-chars:].split()) or "(no output on stderr)"


def kill_session(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def _cmd(cmd: Any) -> str:
    return " ".join(str(c) for c in cmd) if isinstance(cmd, (list, tuple)) else str(cmd)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `predicate` until it is truthy; CheckFailed naming `what` at the deadline."""
    try:
        return wait_for(predicate, timeout, interval, what)
    except TimeoutError:
        raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}") from None


# --- the GPU ----------------------------------------------------------------------------------

PROBE = """
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": False}
try:
    info["available"] = torch.cuda.is_available()
    if info["available"]:
        import torch.distributed as dist
        info.update(name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
                    nccl=dist.is_available() and dist.is_nccl_available())
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(info))
"""


def probe_gpu(timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=ROOT)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"available": False, "error": f"python -c 'import torch' failed ({done.returncode}): "
                                              f"{' '.join(done.stderr.split())[-300:]}"}


