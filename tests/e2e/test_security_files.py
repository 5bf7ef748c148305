"""Security in a real training process, on real files (root can chown, so foreign owners are real
here): unsafe control files are refused, a symlink swapped in never reads through the link, the CLI
refuses replica names that are paths, and the default registry is private. The request model's
checks are tests/unit/test_security.py's."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from sidecar.common.layout import control_path
from sidecar.common.registry import write_request
from support.cli import run_cli
from support.launch import PYTHON, base_env
from support.records import record, wait_record
from support.traces import load_trace
from support.wait import wait_for

ALLOWED_UID, ALLOWED_GID, STRANGER = 4242, 4343, 5555

SECURITY_CONFIG = f"""\
[profiler]
enable_profiler = true
[profiler.sub_profiler_config]
active_steps = 1
warmup_steps = 0
wait_steps = 0
[sidecar]
allowed_uids = [{ALLOWED_UID}]
allowed_gids = [{ALLOWED_GID}]
"""


def _put(ctl: Path, data: bytes, uid: int | None = None, gid: int | None = None) -> None:
    """Replace the control file atomically with a regular file (owned by uid:gid)."""
    tmp = ctl.with_name(f".{ctl.name}.new")
    tmp.write_bytes(data)
    if uid is not None or gid is not None:
        os.chown(tmp, uid if uid is not None else -1, gid if gid is not None else -1)
    os.replace(tmp, ctl)


def _clear(ctl: Path) -> None:
    if ctl.is_dir() and not ctl.is_symlink():
        ctl.rmdir()
    elif ctl.exists() or ctl.is_symlink():
        ctl.unlink()


def _expect_error(registry: Path, text: str) -> dict:
    return wait_record(registry, lambda r: text in (r.get("error") or ""), what=f"an error saying {text!r}")


@pytest.fixture
def secured_rank(spawn, tmp_path, registry):
    if os.geteuid() != 0:
        pytest.skip("needs root to make files owned by other users (chown)")
    config = tmp_path / "secure.toml"
    config.write_text(SECURITY_CONFIG)
    return spawn.rank(registry, "--config", str(config), env_extra={"RANK": "0", "WORLD_SIZE": "4"})


# Proves: a symlink, FIFO, dir, oversized or foreign-owned control file, or ranks past the world size, is refused with why; listed uid/gid accepted.
def test_unsafe_control_files_are_refused(secured_rank, tmp_path, registry):
    proc = secured_rank
    ctl = control_path(registry, "r1")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"id": "via-symlink"}')

    _clear(ctl)
    ctl.symlink_to(elsewhere)
    _expect_error(registry, f"control file {ctl} is a symlink; refusing to follow it")
    _clear(ctl)
    os.mkfifo(ctl)
    _expect_error(registry, f"control file {ctl} is not a regular file (a FIFO, socket or device); refusing it")
    _clear(ctl)
    ctl.mkdir()
    _expect_error(registry, f"control file {ctl} is a directory, not a file")
    _clear(ctl)
    _put(ctl, b" " * (64 * 1024 + 1))
    _expect_error(registry, f"control file {ctl} is 65537 bytes; the limit is 65536")
    _put(ctl, b'{"id": "stranger"}', uid=STRANGER, gid=STRANGER)
    _expect_error(registry, f"control file {ctl} is owned by uid {STRANGER}, not by this job's user 0; "
                            "list that uid in [sidecar] allowed_uids")
    _put(ctl, b'{"id": "too-wide", "rank_filter": "0-4"}')
    _expect_error(registry, "rank_filter 0-4 names rank 4, but world size is 4")
    rec = record(registry)
    assert rec["num_captures"] == 0 and rec["trace_path"] is None and rec["state"] == "idle"
    assert rec["num_refused"] == rec["num_requests"] == 6

    trace_dir = tmp_path / "out" / "profile_trace" / "r1_0"
    for n, (uid, gid) in enumerate(((ALLOWED_UID, STRANGER), (STRANGER, ALLOWED_GID))):
        _put(ctl, f'{{"id": "listed-{n}"}}'.encode(), uid=uid, gid=gid)
        rec = wait_record(registry, lambda r, n=n: r["num_captures"] == n + 1 and r["state"] == "idle")
        assert rec["request_id"] == f"listed-{n}" and rec["error"] is None
        assert Path(rec["trace_path"]) == trace_dir / f"{n}_trace.json.gz"
        assert load_trace(rec["trace_path"])["cosmos_profiler"]["request_id"] == f"listed-{n}"
    assert proc.stop() == 0
    assert "via-symlink" not in proc.stderr() and "armed request stranger" not in proc.stderr()


# Proves: the checks run on the opened file: thousands of regular/symlink swaps never get the symlink's target read.
def test_symlink_swap_race_never_reads_through_the_link(secured_rank, tmp_path, registry):
    proc = secured_rank
    ctl = control_path(registry, "r1")
    evil = tmp_path / "evil.json"
    evil.write_text('{"id": "evil"}')
    link, regular = ctl.with_name(".swap-link"), ctl.with_name(".swap-file")
    for i in range(2000):
        regular.write_text(f'{{"id": "good-{i}"}}')
        os.replace(regular, ctl)
        os.symlink(evil, link)
        os.replace(link, ctl)  # ends on a symlink: at least one refusal is certain
    _expect_error(registry, "is a symlink; refusing to follow it")
    rec = wait_record(registry, lambda r: r["state"] == "idle")
    err = proc.stderr()
    assert "request evil" not in err and '"evil"' not in err
    assert rec["request_id"] != "evil"
    for trace in (tmp_path / "out" / "profile_trace" / "r1_0").glob("*_trace.json.gz"):
        assert load_trace(trace)["cosmos_profiler"]["request_id"].startswith("good-")
    assert proc.stop() == 0
    print(f"swaps: {err.count('is a symlink')} symlink refusals, {err.count('armed request good-')} good requests armed")


# Proves: a replica name with path characters is a CLI usage error and nothing is written anywhere.
@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "-rf", "r1\n", "x" * 201])
def test_cli_refuses_replica_names_that_are_paths(tmp_path, name):
    reg = tmp_path / "reg"
    code, out, err, _ = run_cli("profile", "set", "--registry", str(reg), "--", name)
    assert code == 2 and "is not valid" in err and "Traceback" not in err, (code, out, err)
    assert not reg.exists() and not (tmp_path / "escape.json").exists()


def _world_writable(root: Path) -> list[str]:
    """Files and directories under `root` that anyone may write."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if stat.S_IMODE(path.lstat().st_mode) & stat.S_IWOTH:
                bad.append(str(path))
    return bad


# Proves: the per-user default registry is 0700, and under umask 000 no file or directory the sidecar or CLI writes is world-writable.
def test_default_registry_is_private_and_no_file_is_world_writable(spawn, tmp_path):
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o755)
    env_extra = {"XDG_RUNTIME_DIR": str(runtime)}
    default_root = runtime / "cosmos-profiler"
    out = tmp_path / "out"
    proc = spawn("r1", ["--replica", "r1", "--output", str(out), "--umask", "000"], base_env(None, **env_extra))
    proc.wait_ready()
    wait_record(default_root, lambda r: r["state"] == "idle")
    assert stat.S_IMODE(default_root.stat().st_mode) == 0o700

    env = base_env(None, **env_extra)
    cli = ["sh", "-c", 'umask 000 && exec "$0" -m sidecar profile set r1 --wait --timeout 60', PYTHON]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 0, done.stderr
    write_request(default_root, "r1", {"id": "stacks-1", "kind": "stacks"})
    wait_for(lambda: list(out.glob("profile_trace/r1_0/*_stacks.txt")), 30, what="the stacks dump")
    assert proc.stop() == 0

    files = [p for p in (*default_root.rglob("*"), *out.rglob("*")) if p.is_file()]
    assert {p.name for p in files} >= {"r1.json", "rank-0.json", "0_trace.json.gz", "0_stacks.txt"}, files
    assert _world_writable(default_root) == [] and _world_writable(out) == []
