"""12. A redis:// registry against files, in one run: request-to-armed latency and idle CPU.

One training child (benchmarks/programs/train.py, 50 ms of sleep after each step: a job at rest
between requests) per registry:
  files, inotify        a local registry (the default on one machine): each rank watches the
                        control file by inotify
  files, node agent     the registry as on shared storage (`node_agent = "on"`, polling every
                        1 s): the node's agent polls the control file and relays
  redis                 a `redis://` registry on a real redis-server on 127.0.0.1: the agent holds a
                        subscription; the request is pushed

Latency: t0 just before the request is written (`registry.write_request`, or `RedisStore.send_request`,
what the CLI calls), to the `armed` transition in the rank (the `at` of that history entry in its
record: same clock, same machine); a random pause before each trial puts the write at a random
phase of the poll. Idle CPU: the training child's CPU (user + system, psutil) over a window with no
request, as % of one core, and redis-server's over the same window. Nothing is asserted.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import PYTHON, Row, child_env, median, read_json, wait_for, wait_ready, write_toml
from benchmarks.common import main as bench_main

BENCH = "12 redis registry vs files"
REPLICA = "bench-redis"
REQUEST = {"active_steps": 1, "warmup_steps": 0, "wait_steps": 0}
TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    def __init__(self, base: Path, registry: str, settings: dict, env: dict[str, str]) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.registry = registry
        self.stop_file = base / "stop"
        self.out = base / "stdout"
        self._log = open(self.out, "wb")
        config = write_toml(base / "job.toml", {"heartbeat_interval": 5.0, **settings})
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "benchmarks.programs.train", "--registry", registry, "--output", str(base / "out"),
             "--replica", REPLICA, "--config", str(config), "--stop-file", str(self.stop_file),
             "--step-sleep", "0.05"], stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_ready(self.proc, self.out)

    def record(self) -> dict:
        for path in [*self.base.glob("node/*/records/rank-0.json"),
                     *self.base.glob(f"reg/replicas/{REPLICA}/rank-0.json")]:
            rec = read_json(path)
            if rec:
                return rec
        return {}

    def idle(self) -> dict:
        return wait_for(lambda: (r := self.record()) and r.get("state") == "idle" and r, TIMEOUT_S, 0.005,
                        "the rank idle")

    def cpu_s(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _latencies(child: Child, send, n: int, phase_s: float) -> list[float]:
    out = []
    for i in range(n):
        before = child.idle()
        time.sleep(random.uniform(0.0, phase_s))
        t0 = time.time()
        send({"id": f"bench-{i}", **REQUEST})
        asked, saved = before.get("num_requests", 0), before.get("num_captures", 0)
        rec = wait_for(lambda: (r := child.record()) and r.get("num_requests", 0) > asked  # noqa: B023 - waited here
                       and r, TIMEOUT_S, 0.002, "the request taken")
        armed = [h["at"] for h in rec.get("history", []) if h.get("state") == "armed" and h.get("at", 0) >= t0 - 0.5]
        if armed:
            out.append((armed[-1] - t0) * 1000)
        wait_for(lambda: (r := child.record()).get("num_captures", 0) > saved  # noqa: B023 - waited here
                 and r.get("state") == "idle", TIMEOUT_S, 0.01, "the capture saved")
    return out


def run(quick: bool) -> list[Row]:
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    n = 5 if quick else 20
    window = 10.0 if quick else 30.0
    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    redis_proc = None
    try:
        from sidecar.common import registry
        from sidecar.common.redisstore import RedisStore
        from sidecar.common.request import ControlRequest

        cases: list[tuple[str, str, dict, dict[str, str]]] = [
            ("files, inotify", str(tmp / "a" / "reg"), {"node_agent": "off", "watch": "inotify"}, {}),
            ("files, node agent polling 1 s", str(tmp / "b" / "reg"),
             {"node_agent": "on", "watch": "poll", "poll_interval": 1.0}, {"COSMOS_PROFILER_NODE_DIR": str(tmp / "b" / "node")}),
        ]
        have_redis = os.path.exists(server)
        if have_redis:
            port = _free_port()
            redis_proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                           "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
            url = f"redis://127.0.0.1:{port}/0"
            store = RedisStore.open(url)
            wait_for(lambda: _answers(store), 30, 0.05, "redis-server")
            cases.append(("redis, pushed", url, {}, {"COSMOS_PROFILER_NODE_DIR": str(tmp / "c" / "node")}))
        for label, reg, settings, extra in cases:
            base = Path(reg).parent if "://" not in reg else tmp / "c"
            child = Child(base, reg, settings, child_env(**extra))
            try:
                child.idle()
                if "://" in reg:
                    def send(req: dict) -> None:
                        store.send_request(REPLICA, ControlRequest.from_json(req).to_wire())
                else:
                    def send(req: dict, reg: str = reg) -> None:
                        registry.write_request(Path(reg), REPLICA, req)
                _latencies(child, send, 1, 0.0)  # the first, with its imports
                ms = _latencies(child, send, n, float(settings.get("poll_interval", 0.1)))
                rows.append(Row(BENCH, f"request to armed: {label}", median(ms) if ms else None, "ms", samples=ms,
                                note="50 ms steps; t0 before the write, armed in the rank"))
                child.idle()
                c0, r0, t0 = child.cpu_s(), _cpu(redis_proc), time.monotonic()
                time.sleep(window)
                dt = time.monotonic() - t0
                cpu = (child.cpu_s() - c0) / dt * 100
                note = f"the rank's process over {window:g}s at rest (training 50 ms sleeps included)"
                if "://" in reg and redis_proc is not None:
                    note += f"; redis-server {(_cpu(redis_proc) - r0) / dt * 100:.3f}%"
                rows.append(Row(BENCH, f"idle CPU: {label}", cpu, "% of a core", note=note))
                if "://" in reg and redis_proc is not None:
                    redis_proc = _restart_empty(redis_proc, server, port, tmp, down_s=5.0)
                    t_up = time.monotonic()
                    wait_for(lambda: _answers(store) and store.read_files(f"replicas/{REPLICA}/")[0], 120, 0.05,
                             "the node record put again")
                    rows.append(Row(BENCH, "redis SIGKILLed, down 5 s, restarted empty: back to republished",
                                    (time.monotonic() - t_up) * 1000, "ms",
                                    note="from the server answering again to the node record in it again "
                                         "(the agent's backoff: 0.5 s doubling, at most 10 s)"))
            finally:
                child.close()
        if not have_redis:
            rows.append(Row(BENCH, "redis", None, "", status="redis-server missing (apt-get install redis-server)"))
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _restart_empty(proc, server: str, port: int, tmp: Path, down_s: float):  # type: ignore[no-untyped-def]
    proc.kill()
    proc.wait()
    time.sleep(down_s)  # the outage itself: what is measured starts when the server is back
    new = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return new


def _answers(store) -> bool:  # type: ignore[no-untyped-def]
    try:
        store.ping()
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _cpu(proc) -> float:  # type: ignore[no-untyped-def]
    if proc is None:
        return 0.0
    import psutil

    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


if __name__ == "__main__":
    bench_main(run)
