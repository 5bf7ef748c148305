"""`python -m sidecar ARGS`, the CLI as users run it, plus one line on stderr saying
when it wrote the control file, for the latency benchmark.

    python -m benchmarks.programs.cli_stamped profile set NAME --registry DIR ...

The control file's mtime cannot time the write: the kernel stamps it from a coarse
clock, up to a tick (4-10 ms) before the write. Here `registry.write_temp` is
wrapped to take `time.time()` once the temp file is written and closed, right
before the rename that makes the request visible to the ranks, and
`registry.atomic_write` to print, after that rename,

    CONTROL-WRITTEN <epoch seconds> <CPU seconds of this process so far>

Then `sidecar/__main__.py` runs as `python -m sidecar` would run it (runpy), the
fast exit included.
"""

from __future__ import annotations

import resource
import runpy
import sys
import time
from pathlib import Path

from sidecar.common import registry

MARK = "CONTROL-WRITTEN"
_write_temp, _atomic_write = registry.write_temp, registry.atomic_write
_stamps: list[float] = []


def write_temp(*args, **kwargs):
    out = _write_temp(*args, **kwargs)
    _stamps.append(time.time())
    return out


def atomic_write(path: Path, *args, **kwargs):
    out = _atomic_write(path, *args, **kwargs)
    if Path(path).parent.name == "control":
        usage = resource.getrusage(resource.RUSAGE_SELF)
        sys.stderr.write(f"{MARK} {_stamps[-1]!r} {usage.ru_utime + usage.ru_stime!r}\n")
    return out


def parse(stderr: str) -> tuple[float, float] | None:
    """(write time, CPU seconds at the write) from the CLI's stderr, or None without the line."""
    for line in stderr.splitlines():
        if line.startswith(MARK + " "):
            _, at, cpu = line.split()
            return float(at), float(cpu)
    return None


if __name__ == "__main__":
    registry.write_temp, registry.atomic_write = write_temp, atomic_write
    sys.argv = ["cosmos-profiler", *sys.argv[1:]]
    runpy.run_module("sidecar", run_name="__main__", alter_sys=True)
