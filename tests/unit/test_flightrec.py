"""The flight recorder: its environment names follow the running torch (`sidecar.rank.fr_env`). What
`sidecar.run` and `flightrec.dump` do in real processes: tests/e2e/test_flightrec_jobs.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sidecar.rank import fr_env


@pytest.mark.parametrize(("version", "name"), [
    ((2, 13), "TORCH_FR_BUFFER_SIZE"), ((2, 8), "TORCH_FR_BUFFER_SIZE"), ((2, 7), "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ((2, 4), "TORCH_NCCL_TRACE_BUFFER_SIZE"), ((3, 0), "TORCH_FR_BUFFER_SIZE"),
])
def test_the_buffer_size_name_follows_the_torch_version(version, name):
    assert fr_env.buffer_env_name(version) == name


def test_the_running_torch_reads_the_name_we_set():
    assert fr_env.parse_version("2.13.0+cu128") == (2, 13) and fr_env.parse_version("nightly") is None
    import torch.distributed.distributed_c10d as c10d

    name = fr_env.buffer_env_name()
    assert fr_env.torch_version() == fr_env.parse_version(__import__("torch").__version__)
    # what this torch build references: its process-group code reads the name first
    assert f'"{name}"' in Path(c10d.__file__).read_text()


def test_ensure_default_sets_it_keeps_the_users_and_is_too_late_after_the_process_group(monkeypatch, caplog):
    env: dict[str, str] = {}
    assert fr_env.ensure_default(env, (2, 13)) == "set" and env == {"TORCH_FR_BUFFER_SIZE": "2000"}
    env = {}
    assert fr_env.ensure_default(env, (2, 6)) == "set" and env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    for user in ({"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}):
        env = dict(user)
        assert fr_env.ensure_default(env, (2, 13)) == "user" and env == user
    monkeypatch.setattr(fr_env, "process_group_exists", lambda: True)
    monkeypatch.setattr(fr_env, "_logged_too_late", False)
    env = {}
    with caplog.at_level(logging.INFO, logger="sidecar"):
        assert fr_env.ensure_default(env, (2, 13)) == "too late"
        assert fr_env.ensure_default(env, (2, 13)) == "too late"
    assert env == {}
    too_late = [r.getMessage() for r in caplog.records if "too late" in r.getMessage() or "cannot set" in r.getMessage()]
    assert len(too_late) == 1 and "TORCH_FR_BUFFER_SIZE" in too_late[0], too_late


def test_dump_never_raises(tmp_path):
    from sidecar.rank import flightrec

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ok, reason = flightrec.dump(blocker / "fr.json")
    assert ok is False and reason.startswith(f"writing the flight recorder dump {blocker / 'fr.json'} failed: ")
