"""The README's quick start (the fenced blocks after `<!-- quickstart: ... -->`) runs for real:
`train.py` is written, the `start` block launches the training job, the `run` block profiles it
through the CLI, and the trace it names holds the steps it asked for. The rest of the docs'
checks are tests/unit/test_docs.py's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from support.launch import PYTHON, ROOT, base_env
from support.records import wait_record
from support.traces import load_trace, profiler_steps

README = ROOT / "README.md"

QUICKSTART_RE = re.compile(r"<!-- quickstart: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)


def quickstart_blocks() -> dict[str, str]:
    blocks = dict(QUICKSTART_RE.findall(README.read_text()))
    assert set(blocks) == {"train.py", "start", "run"}, f"README quickstart blocks: {sorted(blocks)}"
    return blocks


def test_readme_quickstart_runs(tmp_path: Path) -> None:
    blocks = quickstart_blocks()
    (tmp_path / "train.py").write_text(blocks["train.py"])
    registry = tmp_path / "registry"
    env = base_env(registry)  # the README's `export` names this same directory ($PWD/registry)
    env["PATH"] = os.path.dirname(PYTHON) + os.pathsep + env["PATH"]  # `cosmos-profiler` is the venv's script
    # The start block backgrounds the job; `wait` keeps its shell, whose session we kill at the end.
    job = subprocess.Popen(["bash", "-euo", "pipefail", "-c", blocks["start"] + "\nwait\n"], cwd=tmp_path, env=env,
                           start_new_session=True)
    try:
        # The README's reader profiles a job that trains, and its record shows the pace it trains at. Right
        # after its start it shows none (a job that has not stepped: `profile set` warns), or the slow first
        # step's: a plan from that pace can come too soon for the fast steps after it, and the rank traces
        # from the step it read the request at (misaligned). A record is rewritten when the rank runs
        # ahead of its pace, so one that shows 20 steps shows the fast ones.
        wait_record(registry, lambda r: r.get("state") == "idle" and r.get("step", 0) >= 20, "demo", 0, 120,
                    what="the quick start's training job to train, its pace in its record")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", blocks["run"]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        assert "Warning" not in done.stderr, done.stderr
        out = done.stdout
        assert re.search(r"^demo\s+policy\s+1/1\s", out, re.MULTILINE), out
        trace = tmp_path / "outputs" / "profile_trace" / "demo_0" / "0_trace.json.gz"
        assert f"rank 0: saved {trace}" in out, out
        assert "trace summary: replica demo, capture 0, 1 rank" in out, out
        start = int(re.search(r"the schedule starts at step (\d+)", out).group(1))
        # Cosmos-RL's default schedule: wait 1, warmup 1, then the `-as 2` active steps.
        assert profiler_steps(load_trace(trace)) == [start + 2, start + 3], out
        assert "[Profiler] save trace for rank: 0 to file:" in (tmp_path / "train.log").read_text()
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(timeout=30)
