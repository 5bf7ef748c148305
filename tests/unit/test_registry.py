"""Registry files, identity resolution and liveness, on real files. Liveness of a real child process:
tests/e2e/test_registry_liveness.py."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading

import pytest

from sidecar.common.exceptions import ConfigError, RegistryError, RequestError
from sidecar.common.identity import (
    default_registry_root,
    job_identity,
    resolve_identity,
    resolve_output_dir,
    resolve_registry_root,
    resolve_replica,
)
from sidecar.common.layout import control_path, record_path
from sidecar.common.records import MAX_RECORD_BYTES, RankRecord, write_record
from sidecar.common.recordscan import read_records, scan_records
from sidecar.common.registry import (
    atomic_write,
    check_root,
    ensure_dir,
    list_replicas,
    publish_numbered,
    read_control,
    remove_stale_temps,
    write_request,
)


def test_replica_resolution_order():
    rdzv = {"MASTER_ADDR": "node1.cluster", "MASTER_PORT": "29500"}
    assert resolve_replica("given", {"COSMOS_PROFILER_REPLICA": "env"}) == "given"
    assert resolve_replica(None, {"COSMOS_PROFILER_REPLICA": "env", "TORCHELASTIC_RUN_ID": "te"}) == "env"
    assert resolve_replica(None, {"TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "42", **rdzv}) == "te"
    assert resolve_replica(None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "42", **rdzv}) == "42"
    # torchrun without --rdzv-id: what every rank of the job shares, the store endpoint
    assert resolve_replica(None, {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "3", **rdzv}) == (
        "rdzv-node1.cluster-29500")
    assert resolve_replica(None, {"MASTER_ADDR": "::1", "MASTER_PORT": "7"}) == "rdzv-1-7"
    assert resolve_replica(None, {"COSMOS_PROFILER_HOST": "node7", "MASTER_ADDR": "a"}) == f"node7-{os.getpid()}"
    assert resolve_replica(None, {"COSMOS_PROFILER_HOST": "node7"}) == f"node7-{os.getpid()}"
    with pytest.raises(ConfigError, match="replica name '../x' is not valid"):
        resolve_replica("../x", {})


@pytest.mark.parametrize("key", ["COSMOS_PROFILER_REPLICA", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"])
def test_a_replica_name_from_the_environment_is_made_safe_and_named(key, caplog):
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        assert resolve_replica(None, {key: "exp/42"}) == "exp-42"
        assert resolve_replica(None, {key: " ../my run #3\n"}) == "my-run-3"
        assert resolve_replica(None, {key: "x" * 300}) == "x" * 200
        # nothing usable left: the next source is used
        assert resolve_replica(None, {key: "///", "COSMOS_PROFILER_HOST": "n1"}) == f"n1-{os.getpid()}"
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == (f"[Profiler] {key}='exp/42' is not a valid replica name "
                           "(1-200 letters, digits and ._- , starting with a letter or digit); using replica name 'exp-42'")
    assert messages[-1].startswith(f"[Profiler] {key}='///' is not a valid replica name") and "ignoring it" in messages[-1]


def test_job_identity_is_what_the_ranks_of_one_job_share():
    assert job_identity({"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "SLURM_JOB_ID": "7"}, "h", 1) == "rdzv:n1:29500"
    assert job_identity({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}, "h", 1) == "rdzv:localhost@h:29500"
    assert job_identity({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, "h", 1) == "slurm:7.0"
    assert job_identity({}, "h", 12) == "pid:h:12"
    assert resolve_identity(env={"COSMOS_PROFILER_HOST": "n1"}).job == f"pid:n1:{os.getpid()}"


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


def test_atomic_write_streams_a_writer_with_the_umask_mode_and_leaves_nothing_when_it_fails(tmp_path):
    """What the trace writers (merge, export, report) use: content streamed into the temp file,
    the mode `open()` would give (mode=None), and on a failure no file at all."""
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "out.json", lambda f: [f.write(b"[1,"), f.write(b"2]")], mode=None)
    finally:
        os.umask(old)
    assert (tmp_path / "out.json").read_bytes() == b"[1,2]"
    assert stat.S_IMODE((tmp_path / "out.json").stat().st_mode) == 0o640

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(tmp_path / "other.json", fail)
    assert os.listdir(tmp_path) == ["out.json"]


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


GOOD = {"replica": "r1", "role": "policy", "rank": 0}


@pytest.mark.parametrize("fields, message", [
    ({"rank": "zero"}, "field 'rank' must be an integer, got string"),
    ({"step": []}, "field 'step' must be an integer, got array"),
    ({"heartbeat_at": "x"}, "field 'heartbeat_at' must be a number, got string"),
    ({"heartbeat_at": float("nan")}, "field 'heartbeat_at' must be a finite number, got nan"),
    ({"pid": True}, "field 'pid' must be an integer, got boolean"),
    ({"rank": -1}, "field 'rank' must be between 0 and 9007199254740991, got -1"),
    ({"world_size": 10**12}, "field 'world_size' must be at most 1048576, got 1000000000000"),
    ({"step": 2**64}, "field 'step' must be between 0 and 9007199254740991, got 18446744073709551616"),
    ({"history": [{"state": "idle"}, "x"]}, "field 'history' item 1 must be an object, got string"),
    ({"trace_path": 3}, "field 'trace_path' must be a string, got int"),
    ({"selected": "yes"}, "field 'selected' must be true or false, got string"),
    ({"request": []}, "field 'request' must be an object, got array"),
    ({"conflict": {"pid": 1, "host": "h", "job": "j"}}, "field 'conflict' has no 'seen_at'"),
    ({"conflict": {"pid": "1", "host": "h", "job": "j", "seen_at": 1.0}}, "field 'conflict' key 'pid' must be an integer"),
])
def test_record_fields_are_checked_one_by_one(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RankRecord.from_json(json.dumps({**GOOD, **fields}).encode())


def test_a_record_without_a_required_field_or_not_an_object_is_refused():
    with pytest.raises(ValueError, match="field 'rank' is missing"):
        RankRecord.from_json(b'{"replica": "r1", "role": "policy"}')
    with pytest.raises(ValueError, match="holds a JSON list, not an object"):
        RankRecord.from_json(b"[1]")
    with pytest.raises(ValueError, match="nested too deeply"):
        RankRecord.from_json(b"[" * 100000 + b"]" * 100000)
    # unknown keys (a newer sidecar's) are dropped, not refused
    assert RankRecord.from_json(json.dumps({**GOOD, "future": 1}).encode()).rank == 0


def test_bad_files_named_like_records_are_problems_not_records(tmp_path):
    write_record(tmp_path, RankRecord(replica="r1", role="policy", rank=0, step=5))
    directory = tmp_path / "replicas" / "r1"
    (directory / "rank-1.json").write_text(json.dumps({**GOOD, "rank": "zero"}))
    (directory / "rank-2.json").write_text(json.dumps({**GOOD, "rank": 0}))  # claims another rank
    os.mkfifo(directory / "rank-3.json")
    (directory / "rank-4.json").symlink_to(directory / "rank-0.json")
    (directory / "rank-5.json").write_bytes(b" " * (MAX_RECORD_BYTES + 1))
    (directory / "rank-6.json").write_bytes(b"\xff{")
    (directory / "rank-7.json").mkdir()
    (directory / "notes.txt").write_text("not a record")
    done = threading.Event()
    result = {}

    def scan():
        result["scan"] = scan_records(tmp_path, "r1")
        done.set()

    reader = threading.Thread(target=scan, daemon=True)
    reader.start()
    assert done.wait(30), "scan_records hung (on the FIFO?)"
    reader.join()
    found = result["scan"]
    assert [(r.rank, r.step) for r in found.records] == [(0, 5)]
    problems = {p.rank: p.error for p in found.problems}
    path = f"{directory}/rank-{{}}.json"
    assert problems == {
        1: f"rank record {path.format(1)}: field 'rank' must be an integer, got string",
        2: f"rank record {path.format(2)} holds rank 0",
        3: f"rank record {path.format(3)} is not a regular file (a FIFO, socket, device or directory)",
        4: f"rank record {path.format(4)} is a symlink; refusing to follow it",
        5: f"rank record {path.format(5)} is {MAX_RECORD_BYTES + 1} bytes; the limit is {MAX_RECORD_BYTES}",
        6: problems[6],
        7: f"rank record {path.format(7)} is not a regular file (a FIFO, socket, device or directory)",
    }
    assert problems[6].startswith(f"rank record {path.format(6)}: is not JSON (")
    assert [r.rank for r in read_records(tmp_path, "r1")] == [0]


def test_registry_root_must_exist_and_be_a_directory(tmp_path):
    with pytest.raises(RegistryError, match=f"registry {tmp_path / 'nope'} does not exist"):
        list_replicas(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(RegistryError, match=f"registry {tmp_path / 'file'} is not a directory"):
        check_root(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert list_replicas(tmp_path / "empty") == []
    # names no sidecar writes are not replicas; neither is a symlinked directory
    write_request(tmp_path / "empty", "ok", None)
    (tmp_path / "empty" / "control" / "bad name!.json").write_text("")
    (tmp_path / "empty" / "replicas").mkdir()
    (tmp_path / "empty" / "replicas" / "linked").symlink_to(tmp_path)
    assert list_replicas(tmp_path / "empty") == ["ok"]


def _temp(directory, data: bytes):
    tmp = directory / f".x.tmp-{len(data)}"
    tmp.write_bytes(data)
    return tmp


def test_publish_numbered_never_replaces_a_file(tmp_path):
    (tmp_path / "0_trace.json.gz").write_bytes(b"first")
    (tmp_path / "3_trace.json.gz").write_bytes(b"fourth")
    got = publish_numbered(_temp(tmp_path, b"new"), tmp_path, "{n}_trace.json.gz")
    assert got == tmp_path / "4_trace.json.gz" and got.read_bytes() == b"new"
    # `first` is only a lower bound; a name taken meanwhile is skipped
    (tmp_path / "6_trace.json.gz").write_bytes(b"other job")
    got = publish_numbered(_temp(tmp_path, b"again"), tmp_path, "{n}_trace.json.gz", first=5)
    assert got == tmp_path / "7_trace.json.gz"
    assert (tmp_path / "6_trace.json.gz").read_bytes() == b"other job"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{n}_trace.json.gz" for n in (0, 3, 4, 6, 7)]


def test_publish_numbered_claims_by_o_excl_where_there_are_no_hard_links(tmp_path, monkeypatch):
    def no_link(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    (tmp_path / "0_stacks.txt").write_bytes(b"kept")
    got = publish_numbered(_temp(tmp_path, b"mine"), tmp_path, "{n}_stacks.txt")
    assert got == tmp_path / "1_stacks.txt" and got.read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0_stacks.txt", "1_stacks.txt"]


def test_concurrent_publishers_get_distinct_numbers(tmp_path):
    barrier = threading.Barrier(8)

    def publish(k: int) -> None:
        tmp = _temp(tmp_path, b"%d" % k * (k + 1))
        barrier.wait()
        publish_numbered(tmp, tmp_path, "{n}_trace.json.gz")

    threads = [threading.Thread(target=publish, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == [f"{n}_trace.json.gz" for n in range(8)]
    assert sorted(p.read_bytes() for p in files) == sorted(b"%d" % k * (k + 1) for k in range(8))


def test_record_path_is_where_write_record_writes(tmp_path):
    assert write_record(tmp_path, RankRecord(replica="r", role="p", rank=3)) == record_path(tmp_path, "r", 3)
