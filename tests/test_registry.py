"""Registry files, identity resolution and liveness, on real files and processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

from sidecar.errors import ConfigError, RequestError
from sidecar.identity import (
    default_registry_root,
    resolve_identity,
    resolve_output_dir,
    resolve_registry_root,
    resolve_replica,
)
from sidecar.registry import (
    RankRecord,
    atomic_write,
    control_path,
    ensure_dir,
    is_alive,
    list_replicas,
    read_control,
    read_records,
    remove_stale_temps,
    write_record,
    write_request,
)


def test_replica_resolution_order():
    assert resolve_replica("given", {"COSMOS_PROFILER_REPLICA": "env"}) == "given"
    assert resolve_replica(None, {"COSMOS_PROFILER_REPLICA": "env", "TORCHELASTIC_RUN_ID": "te"}) == "env"
    assert resolve_replica(None, {"TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "42"}) == "te"
    assert resolve_replica(None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "42"}) == "42"
    assert resolve_replica(None, {"COSMOS_PROFILER_HOST": "node7"}) == f"node7-{os.getpid()}"
    with pytest.raises(ConfigError, match="replica name '../x' is not valid"):
        resolve_replica("../x", {})


def test_identity_from_env():
    ident = resolve_identity(env={"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "COSMOS_PROFILER_HOST": "n1", "COSMOS_PROFILER_REPLICA": "r"})
    assert (ident.rank, ident.local_rank, ident.world_size, ident.host, ident.replica) == (3, 1, 8, "n1", "r")
    assert resolve_identity(env={"SLURM_PROCID": "5", "SLURM_NTASKS": "6"}).rank == 5
    assert resolve_identity(rank=2, env={"RANK": "9"}).rank == 2
    assert resolve_identity(env={}).rank == 0
    with pytest.raises(ConfigError, match="RANK must be an integer"):
        resolve_identity(env={"RANK": "zero"})


def test_registry_root_resolution(tmp_path):
    env = {"COSMOS_PROFILER_DIR": str(tmp_path / "env")}
    assert resolve_registry_root(tmp_path / "arg", env) == (tmp_path / "arg", False)
    assert resolve_registry_root(None, env, configured=str(tmp_path / "cfg")) == (tmp_path / "env", False)
    assert resolve_registry_root(None, {}, configured=str(tmp_path / "cfg")) == (tmp_path / "cfg", False)
    out = tmp_path / "outputs"
    assert resolve_registry_root(None, {}, output_root=str(out)) == (tmp_path / "outputs" / "profile_control", False)
    root, private = resolve_registry_root(None, {})
    assert private and root == default_registry_root({})
    assert default_registry_root({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "cosmos-profiler"
    assert resolve_output_dir(None, {}, output_root=str(out)) == tmp_path / "outputs"


def test_private_root_is_0700(tmp_path):
    root = tmp_path / "private"
    ensure_dir(root, private=True)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_atomic_write_is_not_world_writable_and_leaves_no_temp(tmp_path):
    old = os.umask(0)
    try:
        atomic_write(tmp_path / "f.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["f.json"]


def test_stale_temps_are_removed(tmp_path):
    (tmp_path / ".0_trace.json.gz.tmp-123").write_bytes(b"partial")
    (tmp_path / "0_trace.json.gz").write_bytes(b"done")
    assert remove_stale_temps(tmp_path) == 1
    assert os.listdir(tmp_path) == ["0_trace.json.gz"]


def test_records_round_trip_and_listing(tmp_path):
    for rank in (1, 0):
        write_record(tmp_path, RankRecord(replica="r1", role="policy", rank=rank, step=rank * 10))
    write_request(tmp_path, "r2", None)
    (tmp_path / "replicas" / "r1" / "rank-9.json").write_text("{ torn")
    records = read_records(tmp_path, "r1")
    assert [(r.rank, r.step) for r in records] == [(0, 0), (1, 10)]
    assert list_replicas(tmp_path) == ["r1", "r2"]
    assert read_records(tmp_path, "missing") == []


def test_read_control_refuses_unsafe_files(tmp_path):
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    ctl.write_text('{"active_steps": 1}')
    assert read_control(ctl, 1024).data == b'{"active_steps": 1}'
    with pytest.raises(RequestError, match="is 19 bytes; the limit is 10"):
        read_control(ctl, 10)
    ctl.unlink()
    os.mkfifo(ctl)
    with pytest.raises(RequestError, match="not a regular file"):
        read_control(ctl, 1024)
    ctl.unlink()
    ctl.mkdir()
    with pytest.raises(RequestError, match="is a directory"):
        read_control(ctl, 1024)
    ctl.rmdir()
    ctl.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RequestError, match="is a symlink"):
        read_control(ctl, 1024)
    ctl.unlink()
    with pytest.raises(FileNotFoundError):
        read_control(ctl, 1024)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown a file to another user")
def test_read_control_refuses_foreign_owner_unless_allowed(tmp_path):
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    ctl.write_text("")
    os.chown(ctl, 4242, 4243)
    with pytest.raises(RequestError, match="is owned by uid 4242, not by this job's user 0"):
        read_control(ctl, 1024)
    assert read_control(ctl, 1024, allowed_uids=[4242]).data == b""
    assert read_control(ctl, 1024, allowed_gids=[4243]).data == b""


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
