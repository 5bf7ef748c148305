"""The Cosmos-RL drop-in: CosmosProfiler behaves as Cosmos-RL's and also listens to the control file."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ROOT, base_env, load_trace, profiler_steps, read_json, wait_for
from sidecar.registry import control_path, record_path

WORKER = ROOT / "tests" / "programs" / "cosmos_worker.py"


@pytest.fixture
def controller():
    """A Cosmos-RL controller stand-in on 127.0.0.1 that records POST /api/set_trace_path."""
    posts: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/api/set_trace_path":
                posts.append(json.loads(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="test-controller")
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posts
    server.shutdown()
    server.server_close()
    thread.join()


def _config(tmp_path: Path, enable: bool = True, active: int = 1, rank_filter=(0,)) -> Path:
    path = tmp_path / "cosmos.toml"
    path.write_text(
        f"[train]\noutput_dir = '{tmp_path / 'outputs' / '20250101120000'}'\nepoch = 1\n"
        f"[profiler]\nenable_profiler = {str(enable).lower()}\n"
        f"[profiler.sub_profiler_config]\nactive_steps = {active}\nrank_filter = {list(rank_filter)}\n"
    )
    return path


def test_static_profile_then_control_file_then_controller_report(spawn, tmp_path, controller):
    url, posts = controller
    cfg = _config(tmp_path, active=2)
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-0", "--controller", url], base_env(), program=WORKER)
    proc.wait_ready()
    registry = tmp_path / "outputs" / "profile_control"  # dirname(train.output_dir)/profile_control
    trace_dir = tmp_path / "outputs" / "profile_trace" / "pol-0_0"
    first = wait_for(lambda: (trace_dir / "0_trace.json.gz").exists(), what="static capture")
    assert first
    # Cosmos-RL's profiler.start() begins at once: wait at step 0, warmup 1, active 2-3.
    assert profiler_steps(load_trace(trace_dir / "0_trace.json.gz")) == [2, 3]
    wait_for(lambda: "FINISHED" in proc.stdout(), what="check_finished() to report the capture")

    control_path(registry, "pol-0").touch()
    rec = wait_for(lambda: (r := read_json(record_path(registry, "pol-0", 0))) and r["num_captures"] == 2 and r)
    assert rec["trace_path"] == str(trace_dir / "1_trace.json.gz")
    wait_for(lambda: len(posts) == 2, what="two trace-path reports")
    assert posts[0] == {"replica_name": "pol-0", "trace_path": str(trace_dir), "global_rank": 0}
    wait_for(lambda: proc.stdout().count("FINISHED") == 2, what="check_finished() once per capture")
    assert proc.stop() == 0
    assert proc.stdout().count("FINISHED") == 2
    err = proc.stderr()
    assert "[Profiler] init profiler for rank 0" in err
    assert f"[Profiler] save trace for rank: 0 to file: {trace_dir / '0_trace.json.gz'} after 4 steps." in err


def test_start_dynamic_and_rollout_role(spawn, tmp_path):
    cfg = _config(tmp_path, rank_filter=(5,))  # static start() does not select rank 1
    proc = spawn("w", ["--config", str(cfg), "--replica", "roll-0", "--rank", "1", "--role", "rollout",
                       "--dynamic-at", "10"], base_env(), program=WORKER)
    proc.wait_ready()
    registry = tmp_path / "outputs" / "profile_control"
    rec = wait_for(lambda: (r := read_json(record_path(registry, "roll-0", 1))) and r.get("trace_path") and r)
    assert rec["role"] == "rollout" and rec["capture_start_step"] == 10
    trace = load_trace(rec["trace_path"])
    assert profiler_steps(trace) == [12, 13]
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"]), "record_shape was not applied"
    assert proc.stop() == 0


def test_disabled_profiler_does_nothing_and_refuses_requests(spawn, tmp_path):
    cfg = _config(tmp_path, enable=False)
    proc = spawn("w", ["--config", str(cfg), "--replica", "pol-1"], base_env(), program=WORKER)
    proc.wait_ready()
    registry = tmp_path / "outputs" / "profile_control"
    wait_for(lambda: read_json(record_path(registry, "pol-1", 0)), what="record")
    control_path(registry, "pol-1").touch()
    rec = wait_for(lambda: (r := read_json(record_path(registry, "pol-1", 0))) and r.get("refused") and r)
    assert "enable_profiler = false" in rec["refused"]
    assert proc.stop() == 0
    assert not (tmp_path / "outputs" / "profile_trace").exists()
