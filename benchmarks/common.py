"""Shared pieces: the result row, statistics, child environments, record polling.

A benchmark module exposes `run(quick: bool) -> list[Row]` and ends with
`main(run)`, so `python -m benchmarks.<name> [--quick] [--rows-out F]` runs it
alone. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.row import CLI_MISSING, Row, fmt, missing_row, percentile  # noqa: E402,F401 - every benchmark module takes them from here

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
PYTHON = sys.executable
CLI_MODULE = "sidecar"



# --- statistics ---------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# --- formatting -----------------------------------------------------------------


def pct(ratio: float) -> str:
    """1.0123 -> '+1.23%'."""
    return f"{(ratio - 1.0) * 100:+.2f}%"


# --- environments and children ----------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: ours, without anything that would point a
    sidecar at a real job's registry or identity."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSMOS_PROFILER_", "TORCHELASTIC_", "SLURM_"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def write_toml(path: Path, sidecar: dict[str, Any], enable_profiler: bool = True) -> Path:
    """A job config with `[profiler] enable_profiler` and a `[sidecar]` table."""
    lines = ["[profiler]", f"enable_profiler = {'true' if enable_profiler else 'false'}", "", "[sidecar]"]
    for key, value in sidecar.items():
        lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.0005, what: str = "") -> Any:
    """Poll `predicate` until truthy; raise TimeoutError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what or predicate}")
        if interval:
            time.sleep(interval)


def wait_ready(proc: subprocess.Popen, out_path: Path, timeout: float = 120.0, marker: str = "READY") -> str:
    """Wait for `marker` in a child's stdout file; return that line."""

    def ready() -> str | None:
        if proc.poll() is not None:
            raise RuntimeError(f"child exited early ({proc.returncode}):\n{_tail(out_path)}")
        for line in out_path.read_text(errors="replace").splitlines():
            if line.startswith(marker):
                return line
        return None

    return wait_for(ready, timeout, interval=0.05, what=f"{marker} from {proc.args}")


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def stop_child(proc: subprocess.Popen, stop_file: Path | None = None, timeout: float = 30.0) -> None:
    """Ask a child to stop (stop file), then SIGKILL its process group if it will not."""
    if proc.poll() is None and stop_file is not None:
        stop_file.touch()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)


def cli_available() -> bool:
    """Whether `python -m sidecar` exists and starts."""
    try:
        done = subprocess.run([PYTHON, "-m", CLI_MODULE, "--help"], env=child_env(), capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def run_cli(args: Sequence[str], timeout: float = 120.0, tree: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run the CLI as a user would (a new interpreter); return (wall seconds, result). `tree`: a
    directory holding another version's `sidecar/` package, run instead of this checkout's."""
    cmd = [PYTHON, "-m", CLI_MODULE, *args]
    env = child_env()
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, done


def python_start_wall(repeats: int) -> list[float]:
    """Wall seconds of `python -c pass`: the floor under any CLI command."""
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([PYTHON, "-c", "pass"], env=child_env(), check=True)
        walls.append(time.perf_counter() - t0)
    return walls


def fresh_dir(base: Path, name: str) -> Path:
    path = base / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def write_fake_records(root: Path, replica: str, ranks: range, *, world_size: int | None = None,
                       same_host: bool = False, heartbeat_interval: float = 600.0) -> None:
    """Rank records of simulated ranks, written directly (no processes).

    Remote ranks (`host` node-<rank // 8>) are alive to the CLI by a fresh
    heartbeat; `heartbeat_interval` keeps them fresh for the whole benchmark.
    Same-host ranks all name this process, so the CLI checks a live pid and
    its create time for each.
    """
    from sidecar.common.identity import host_name
    from sidecar.common.layout import RECORD_TEMPLATE, replica_dir
    from sidecar.common.records import RankRecord

    directory = replica_dir(root, replica)
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    pid, create_time, host = 0, 0.0, ""
    if same_host:
        import psutil

        pid, create_time, host = os.getpid(), psutil.Process().create_time(), host_name()
    world = world_size if world_size is not None else max(ranks) + 1
    for k in ranks:
        record = RankRecord(
            replica=replica, role="policy", rank=k, local_rank=k % 8, world_size=world,
            host=host or f"node-{k // 8}", pid=pid or 10_000 + k, create_time=create_time, started_at=now - 600,
            heartbeat_at=now, heartbeat_interval=heartbeat_interval, step=6000, watch="poll", version="bench",
        )
        (directory / RECORD_TEMPLATE.format(rank=k)).write_bytes(record.to_json())


# --- the entry point of every module ------------------------------------------------


def main(run: Callable[[bool], list[Row]]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter windows, smaller sizes")
    parser.add_argument("--rows-out", help="write the rows as JSON here (else print them)")
    args = parser.parse_args()
    rows = run(args.quick)
    data = json.dumps([r.to_json() for r in rows], indent=1)
    if args.rows_out:
        Path(args.rows_out).write_text(data)
    else:
        from benchmarks.table import render_markdown

        print(render_markdown(rows))
