"""torch's debug server (`torch.distributed.debug.start_debug_server`) and our sidecar in one real gloo job
(torchrun, 2 ranks): its pages answer over 127.0.0.1 while our CLI takes stacks and a trace, our
capture page on its frontend (`sidecar.debugserver`) requests an aligned trace of every rank, and
the job stops cleanly: no port, signal or thread of one taken by the other."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from sidecar.common.recordscan import read_records
from support.launch import PYTHON, ROOT, Spawner, base_env, free_port, torchrun_cmd
from support.wait import wait_for

pytest.importorskip("tabulate", reason="torch's debug server needs tabulate (pip install tabulate)")
pytest.importorskip("jinja2", reason="torch's debug server needs jinja2")

FR_JOB = ROOT / "tests" / "programs" / "fr_job.py"


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
        assert resp.status == 200
        return resp.read().decode()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("dbg")
    spawner = Spawner(root)
    registry, port = root / "registry", free_port()
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(root / "out"), OMP_NUM_THREADS="1")
    proc = spawner("dbg", ["--debug-server", str(port)], env, program=torchrun_cmd(2, "dbg", str(FR_JOB)))
    try:
        wait_for(lambda: proc.stdout().count("READY") == 2, timeout=120, what="both ranks ready")
        wait_for(lambda: len(r := read_records(registry, "dbg")) == 2 and all(x.step > 2 for x in r), timeout=60,
                 what="both ranks stepping")
        wait_for(lambda: _get(port, "/"), timeout=60, interval=0.2, what="the debug server's frontend")
    except BaseException:
        spawner.close()
        raise
    yield registry, port, proc
    spawner.close()


def _cli(registry: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", *args, "--registry", str(registry)], capture_output=True,
                          text=True, timeout=120, env=base_env())


def test_both_answer_in_one_job_and_the_job_stops_cleanly(job):
    registry, port, proc = job
    stacks = _get(port, "/stacks")  # theirs: every rank's worker server, through the frontend
    assert "Rank 0" in stacks and "Rank 1" in stacks and "fr_job.py" in stacks
    assert "gloo:all_reduce" in _get(port, "/fr_trace_json")
    ours = _cli(registry, "profile", "stacks", "dbg")  # ours: files, while theirs serves
    assert ours.returncode == 0 and "2 of 2 ranks answered" in ours.stdout, ours.stdout + ours.stderr
    done = _cli(registry, "profile", "set", "dbg", "-rf", "all", "-as", "2", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    traces = [r.trace_path for r in read_records(registry, "dbg")]
    assert all(t and Path(t).is_file() for t in traces)
    assert all(r.signal == "SIGUSR1" and not r.error for r in read_records(registry, "dbg"))
    assert "cosmos-profiler capture" in _get(port, "/")  # our page sits in its navigation


def test_the_capture_page_requests_an_aligned_trace_of_every_rank(job):
    registry, port, proc = job
    assert '<form action="/cosmos_capture">' in _get(port, "/cosmos_capture")
    page = _get(port, "/cosmos_capture?steps=2")
    request_id = re.search(r"Requested capture <code>([^<]+)</code> of replica dbg: ranks \[0, 1\]", page).group(1)

    def traced():
        records = read_records(registry, "dbg")
        return all(r.request_id == request_id and r.trace_path and r.state == "idle" for r in records) and records

    records = wait_for(traced, timeout=60, what="both ranks' traces of the page's request")
    assert len({Path(r.trace_path).name for r in records}) == 1  # the same capture number on each rank
    proc.stop_file.touch()
    assert proc.proc.wait(timeout=60) == 0, proc.stderr()[-3000:]
    assert proc.stdout().count("DONE") == 2
