"""Shared pieces: the result row, statistics, child environments, record polling.

A benchmark module exposes `run(quick: bool) -> list[Row]` and ends with
`main(run)`, so `python -m benchmarks.<name> [--quick] [--rows-out F]` runs it
alone. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
PYTHON = sys.executable
CLI_MODULE = "sidecar"
CLI_MISSING = "n/a (CLI missing)"


@dataclass
class Row:
    """One line of the table. `value` is the median of `samples`."""

    benchmark: str
    case: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_unit: str | None = None  # defaults to `unit`
    baseline_label: str = ""
    delta: str = ""  # the "overhead / ratio" column, already formatted
    samples: list[float] = field(default_factory=list)
    target: str = ""
    met: bool | None = None
    note: str = ""
    status: str = ""  # set when the row could not be measured (e.g. CLI missing)
    extra: dict[str, Any] = field(default_factory=dict)
    spread_q: float = 0.0  # 0: min-max of the samples; 5: their 5th-95th percentiles

    @property
    def spread(self) -> str:
        if len(self.samples) < 2:
            return ""
        if self.spread_q:
            lo, hi = percentile(self.samples, self.spread_q), percentile(self.samples, 100 - self.spread_q)
            kind = f"p{self.spread_q:g}-p{100 - self.spread_q:g}, "
        else:
            lo, hi, kind = min(self.samples), max(self.samples), ""
        return f"{fmt(lo, self.unit)} – {fmt(hi, self.unit)} ({kind}n={len(self.samples)})"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["spread"] = self.spread
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def missing_row(benchmark: str, case: str, target: str = "", status: str = CLI_MISSING, note: str = "") -> Row:
    return Row(benchmark, case, None, "", target=target, status=status, note=note)


# --- statistics ---------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    data = sorted(values)
    if not data:
        raise ValueError("no values")
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


# --- formatting -----------------------------------------------------------------


def fmt(value: float | None, unit: str) -> str:
    """A compact number with its unit: 3 significant digits, no exponent."""
    if value is None:
        return ""
    if unit in ("x",):
        return f"{value:.2f}x" if abs(value) < 100 else f"{value:.0f}x"
    mag = abs(value)
    if mag == 0:
        text = "0"
    elif mag >= 100:
        text = f"{value:.0f}"
    elif mag >= 10:
        text = f"{value:.1f}"
    elif mag >= 1:
        text = f"{value:.2f}"
    elif mag >= 0.01:
        text = f"{value:.3f}"
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}" if unit else text


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


def run_cli(args: Sequence[str], timeout: float = 120.0) -> tuple[float, subprocess.CompletedProcess]:
    """Run the CLI as a user would (a new interpreter); return (wall seconds, result)."""
    cmd = [PYTHON, "-m", CLI_MODULE, *args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout)
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
    from sidecar.identity import host_name
    from sidecar.records import RankRecord
    from sidecar.registry import RECORD_TEMPLATE, replica_dir

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
