"""Liveness by pid, process create time and heartbeat, against a real child process."""

from __future__ import annotations

import subprocess
import sys
import time

from sidecar.common.records import RankRecord, is_alive


def test_liveness_by_pid_create_time_and_heartbeat():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import psutil

        rec = RankRecord(replica="r", role="policy", rank=0, host="here", pid=proc.pid,
                         create_time=psutil.Process(proc.pid).create_time(), heartbeat_at=time.time())
        assert is_alive(rec, this_host="here")
        reused = RankRecord(**{**rec.__dict__, "create_time": rec.create_time - 100})
        assert not is_alive(reused, this_host="here"), "a reused pid is not the same rank"
    finally:
        proc.kill()
        proc.wait()
    assert not is_alive(rec, this_host="here")
    remote = RankRecord(replica="r", role="policy", rank=0, host="elsewhere", pid=1, heartbeat_at=time.time())
    assert is_alive(remote, this_host="here")
    old = RankRecord(**{**remote.__dict__, "heartbeat_at": time.time() - 3600})
    assert not is_alive(old, this_host="here")
    future = RankRecord(**{**remote.__dict__, "heartbeat_at": time.time() + 3600})
    assert not is_alive(future, this_host="here"), "a heartbeat from the future (clock jump) is not trusted"
