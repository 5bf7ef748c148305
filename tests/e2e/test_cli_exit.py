"""The console entry point's exit (`sidecar.cli.exit`): `python -m sidecar` ends right after
its command, with the command's status and all of its output, and a reader that went
away early (`| head`) costs no traceback."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from sidecar.common.layout import control_path
from support.cli import invoke, run_cli
from support.files import read_json
from support.launch import PYTHON, base_env
from support.records import alive_record

# As a user runs it: stdout block-buffered when it is not a terminal (base_env sets PYTHONUNBUFFERED).
ENV = {k: v for k, v in base_env().items() if k != "PYTHONUNBUFFERED"}


def run_with_closed_stdout(*args: str) -> tuple[int, str]:
    """`python -m sidecar ARGS` writing to a pipe whose reader has gone. Returns (status, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([PYTHON, "-m", "sidecar", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=ENV)
    finally:
        os.close(write_end)
    return done.returncode, done.stderr


def test_set_ends_with_its_status_and_all_its_output_in_text_and_json(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0)
    alive_record(reg, "r1", 1)
    code, out, err, _ = run_cli("profile", "set", "r1", "-rf", "all", "--registry", str(reg), "--no-wait", env=ENV)
    assert code == 0, err
    request = read_json(control_path(reg, "r1"))
    assert out.startswith("Requested a profile of replica r1 through its control file.\n") and out.endswith("\n")
    assert f"Request {request['id']} for ranks 0-1" in out
    assert err == ""

    code, out, err, _ = run_cli("profile", "set", "r1", "--registry", str(reg), "--no-wait", "--json", env=ENV)
    assert code == 0, err
    data = json.loads(out)  # the whole object: nothing left in a buffer
    assert data["request"] == read_json(control_path(reg, "r1")) and data["replica"] == "r1"


def test_errors_keep_their_status_and_message_in_text_and_json(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0)
    expected = invoke("profile", "set", "nope", "--registry", str(reg))
    code, out, err, _ = run_cli("profile", "set", "nope", "--registry", str(reg), env=ENV)
    assert (code, out, err) == (1, "", expected.stderr)
    assert err.startswith("Replica nope not found.\n")

    code, out, err, _ = run_cli("profile", "set", "nope", "--registry", str(reg), "--json", env=ENV)
    assert code == 1 and json.loads(out)["code"] == "not_found"

    code, out, err, _ = run_cli("profile", "set", "r1", "--registry", str(reg), "--active-steps", "0", env=ENV)
    assert code == 2 and "Invalid value for '--active-steps'" in err


def test_output_larger_than_the_stdout_buffer_is_all_written(tmp_path):
    reg = tmp_path / "reg"
    for rank in range(300):
        alive_record(reg, "r1", rank, world_size=300)
    code, out, err, _ = run_cli("replica", "lsr", "r1", "--registry", str(reg), "--json", env=ENV)
    assert code == 0, err
    assert len(out) > 64 * 1024  # past any buffer and the pipe's capacity
    assert [r["rank"] for r in json.loads(out)["ranks"]] == list(range(300))


@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["text", "json"])
def test_a_closed_pipe_is_status_1_without_a_traceback(tmp_path, json_flag):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0)
    # An answer (stdout) and an error (stdout with --json, else stderr, which stays open).
    code, err = run_with_closed_stdout("replica", "ls", "--registry", str(reg), *json_flag)
    assert (code, err) == (1, "")
    code, err = run_with_closed_stdout("replica", "ls", "--registry", str(tmp_path / "missing"), *json_flag)
    assert code == 1
    assert "Traceback" not in err and "Exception ignored" not in err
    assert err == ("" if json_flag else f"Error: registry {tmp_path / 'missing'} does not exist: no sidecar has "
                   "registered there (pass --registry DIR or set COSMOS_PROFILER_DIR to the registry your job "
                   "uses)\nThe registry came from --registry.\n")


def test_the_entry_point_skips_the_interpreter_teardown():
    """What the fast exit is for: nothing runs after the command (an atexit handler stands for
    the teardown), and the status and output are the command's."""
    script = ("import atexit, sys; atexit.register(lambda: print('teardown ran', file=sys.stderr)); "
              "sys.argv = ['cosmos-profiler', '--version']; from sidecar.cli import main; main()")
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, env=ENV)
    assert (done.returncode, done.stdout, done.stderr) == (0, "cosmos-profiler-sidecar, version "
                                                           f"{__import__('sidecar').__version__}\n", "")


@pytest.mark.parametrize(("code", "status", "stderr"), [(None, 0, ""), (3, 3, ""), ("bye", 1, "bye\n")])
def test_exit_now_gives_the_status_sys_exit_would(code, status, stderr):
    script = f"import sys; from sidecar.cli.exit import exit_now; sys.stdout.write('kept'); exit_now({code!r})"
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, env=ENV)
    assert (done.returncode, done.stdout, done.stderr) == (status, "kept", stderr)
