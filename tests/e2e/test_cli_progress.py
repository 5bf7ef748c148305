"""Live progress: on stderr when it is a terminal (a real pseudo-terminal here), nowhere otherwise.
The stall warning's rules are tests/unit/test_cli_progress_stall.py's."""

from __future__ import annotations

import json
import subprocess

import pytest

from support.cli import run_cli_tty
from support.launch import PYTHON, Spawner, base_env
from support.records import wait_record


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Replica r1 steps on; replica stuck stops stepping at step 40 (its main thread blocks)."""
    tmp = tmp_path_factory.mktemp("progress")
    registry = tmp / "registry"
    spawner = Spawner(tmp)
    try:
        procs = [spawner.rank(registry, "--width", "16", wait=False),
                 spawner.rank(registry, "--width", "16", "--hang-at", "40", replica="stuck", wait=False)]
        for proc, name in zip(procs, ("r1", "stuck"), strict=True):
            proc.wait_ready()
            proc.wait_idle(registry, name)
        wait_record(registry, lambda r: r["step"] == 40, "stuck", what="the stuck rank at step 40")
        yield tmp, registry
    finally:
        spawner.close()


def _plain(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", *args], capture_output=True, text=True, timeout=120,
                          env=env or base_env())


def test_wait_shows_each_ranks_phase_and_step_on_a_terminal_only(ranks):
    tmp, registry = ranks
    reg = ["--registry", str(registry)]
    code, out, tty = run_cli_tty("profile", "set", "r1", "-as", "1", "--wait", "--timeout", "60", *reg)
    assert code == 0, out + tty
    assert "rank 0: saved " in out  # stdout as ever
    assert "\r\x1b[Kr1: rank 0 armed @" in tty or "\r\x1b[Kr1: rank 0 pending @" in tty, tty
    assert "\x1b[K" in tty and "Warning" not in tty

    plain = _plain("profile", "set", "r1", "-as", "1", "--wait", "--timeout", "60", *reg)
    assert (plain.returncode, plain.stderr) == (0, ""), plain.stderr
    as_json = _plain("profile", "set", "r1", "-as", "1", "--wait", "--timeout", "60", "--json", *reg)
    assert (as_json.returncode, as_json.stderr) == (0, "")
    assert [r["phase"] for r in json.loads(as_json.stdout)["ranks"]] == ["saved"]  # stdout is the one object


def test_a_rank_that_stopped_stepping_is_named_with_what_to_run(ranks):
    tmp, registry = ranks
    env = base_env(COSMOS_PROFILER_STALL_WARN_S="1")
    code, out, tty = run_cli_tty("profile", "set", "stuck", "--wait", "--timeout", "8", "--registry", str(registry),
                                 env=env)
    assert code == 1  # it never reaches its start step
    warning = [line for line in tty.replace("\r\x1b[K", "\n").splitlines() if line.startswith("Warning: rank 0")]
    assert len(warning) == 1, tty
    assert warning[0].startswith("Warning: rank 0 has not stepped for ")
    assert warning[0].endswith(" s (step 40): `cosmos-profiler profile hang stuck` shows where it is")
    plain = _plain("profile", "cancel", "stuck", "--no-wait", "--registry", str(registry))
    assert plain.returncode == 0 and plain.stderr == ""


def test_merge_summary_and_export_name_each_file_as_they_read_it(ranks):
    tmp, registry = ranks
    reg = ["--registry", str(registry)]
    for args in (["summary", "r1"], ["merge", "r1", "-o", str(tmp / "m.json.gz")], ["export", "r1", str(tmp / "x")]):
        code, out, tty = run_cli_tty("profile", *args, *reg)
        assert code == 0, tty
        assert "\r\x1b[Kreading trace 1: r1_0/" in tty and "_trace.json.gz (" in tty, (args, tty)
        plain = _plain("profile", *args, *reg, "--json")
        assert (plain.returncode, plain.stderr) == (0, ""), (args, plain.stderr)
        json.loads(plain.stdout)
