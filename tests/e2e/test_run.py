"""Zero code change: `python -m sidecar.run script.py` profiles an unmodified script."""

from __future__ import annotations

import re

import pytest

from sidecar.common import envvars
from sidecar.common.layout import record_path
from sidecar.common.registry import write_request
from support.cli import run_cli
from support.files import read_json
from support.launch import PYTHON, ROOT, base_env
from support.settings import BAD_VALUES, SIDECAR_VARS
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

PLAIN = str(ROOT / "tests" / "programs" / "plain_train.py")


def _run(spawn, tmp_path, registry, name, *script_args):
    cmd = [PYTHON, "-m", "sidecar.run", "--replica", name, "--output", str(tmp_path / "out"), PLAIN]
    proc = spawn(name, list(script_args), base_env(registry), program=cmd)
    proc.wait_ready()
    wait_for(lambda: read_json(record_path(registry, name, 0)), what="record")
    return proc


@pytest.mark.parametrize("flags", [[], ["--two-optimizers"], ["--explicit"], ["--two-optimizers", "--explicit"]])
def test_steps_are_iterations_whatever_steps_the_optimizers(spawn, tmp_path, registry, flags):
    proc = _run(spawn, tmp_path, registry, "z", "--steps", "60", *flags)
    assert proc.proc.wait(timeout=60) == 0
    done = int(re.search(r"DONE (\d+)", proc.stdout()).group(1))
    record = read_json(record_path(registry, "z", 0))
    assert done == 60
    assert record["step"] == 60, f"counted {record['step']} steps for 60 iterations with {flags}"
    assert record["exited_at"] is not None


def test_unmodified_script_is_profiled_on_request(spawn, tmp_path, registry):
    proc = _run(spawn, tmp_path, registry, "z", "--two-optimizers")
    write_request(registry, "z", {"id": "auto", "active_steps": 2})
    rec = wait_for(lambda: (r := read_json(record_path(registry, "z", 0))) and r.get("trace_path") and r, what="trace")
    start = rec["capture_start_step"]
    assert profiler_steps(load_trace(rec["trace_path"])) == [start + 2, start + 3]
    assert proc.stop() == 0
    assert "[Profiler] start to trace for rank: 0" in proc.stderr()


def test_run_needs_a_script(tmp_path):
    import subprocess

    out = subprocess.run([PYTHON, "-m", "sidecar.run"], capture_output=True, text=True, env=base_env(tmp_path), timeout=60)
    assert out.returncode == 2 and "give a script to run" in out.stderr


# --- the script's own arguments, and a bad config --------------------------------------------

ECHO_ARGV = "import json, sys\nprint('ARGV ' + json.dumps(sys.argv))\n"


def _sidecar_run(tmp_path, *args: str, **env: str):
    import subprocess

    return subprocess.run([PYTHON, "-m", "sidecar.run", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=base_env(tmp_path / "registry", **env), timeout=120)


def _argv(stdout: str) -> list[str]:
    import json

    (line,) = [line for line in stdout.splitlines() if line.startswith("ARGV ")]
    return json.loads(line[len("ARGV "):])


# Its own flags, even those sidecar.run has too, and a `--` of its own: all the script's.
SCRIPT_FLAGS = ["--config", "mine.toml", "--replica", "theirs", "-m", "x", "-h", "--", "--lr=0.1"]


def test_a_script_and_a_module_get_their_own_flags_untouched(tmp_path):
    # `-m mod --flag` failed ("unrecognized arguments") unless `--` was added.
    (tmp_path / "echo_argv.py").write_text(ECHO_ARGV)
    (tmp_path / "echopkg").mkdir()
    (tmp_path / "echopkg" / "__init__.py").write_text("")
    (tmp_path / "echopkg" / "echo.py").write_text(ECHO_ARGV)

    script = _sidecar_run(tmp_path, "--replica", "z", "echo_argv.py", *SCRIPT_FLAGS)
    assert script.returncode == 0, script.stderr
    assert _argv(script.stdout) == ["echo_argv.py", *SCRIPT_FLAGS]
    module = _sidecar_run(tmp_path, "--replica", "z", "-m", "echopkg.echo", *SCRIPT_FLAGS)
    assert module.returncode == 0, module.stderr
    assert _argv(module.stdout) == [str(tmp_path / "echopkg" / "echo.py"), *SCRIPT_FLAGS]
    joined = _sidecar_run(tmp_path, "--replica=z", "-mechopkg.echo", "--lr", "1")
    assert _argv(joined.stdout)[1:] == ["--lr", "1"]
    dashed = _sidecar_run(tmp_path, "--replica", "z", "--", "echo_argv.py", "--rank", "7")
    assert _argv(dashed.stdout) == ["echo_argv.py", "--rank", "7"]
    # and sidecar.run's options before the script were its own: the replica is z
    assert read_json(record_path(tmp_path / "registry", "z", 0))["replica"] == "z"


def test_a_bad_config_or_variable_is_one_line_naming_it(tmp_path):
    # A bad --config was a 23-line traceback; a bad variable was named by the config key it sets.
    (tmp_path / "echo_argv.py").write_text(ECHO_ARGV)
    (tmp_path / "bad.toml").write_text('[profiler]\nenable_profiler = "maybe"\n')
    bad = _sidecar_run(tmp_path, "--config", "bad.toml", "echo_argv.py")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == ("python -m sidecar.run: error: config bad.toml: profiler.enable_profiler must be true or "
                          "false, got 'maybe'\n")
    var = _sidecar_run(tmp_path, "echo_argv.py", COSMOS_PROFILER_POLL_INTERVAL="0")
    assert (var.returncode, var.stdout) == (2, "")
    assert var.stderr == ("python -m sidecar.run: error: COSMOS_PROFILER_POLL_INTERVAL must be between 0.01 and "
                          "3600.0, got 0.0\n")


# --- a bad COSMOS_PROFILER_* variable: refused at launch; in a running job, only its piece is off ---------


@pytest.mark.parametrize("var", SIDECAR_VARS)
def test_sidecar_run_refuses_a_bad_variable_before_the_script_runs(tmp_path, var):
    # COSMOS_PROFILER_STALL_AFTER_S=-5 (or _STACKS_SIGNAL=SIGKILL) died with KeyError: 'stall_after_s';
    # a bad COSMOS_PROFILER_SAVE_WRITER or _FORK_STALL_S was not looked at.
    (tmp_path / "echo_argv.py").write_text(ECHO_ARGV)
    out = _sidecar_run(tmp_path, "echo_argv.py", **{var: BAD_VALUES[var]})
    assert (out.returncode, out.stdout) == (2, ""), out.stderr  # the script never ran
    assert out.stderr.startswith(f"python -m sidecar.run: error: {var}") and out.stderr.count("\n") == 1, out.stderr
    assert BAD_VALUES[var] in out.stderr


@pytest.fixture(scope="module")
def bad_env_job(tmp_path_factory):
    """One real training process that calls sidecar.install() with every variable it reads set badly."""
    import subprocess

    tmp = tmp_path_factory.mktemp("badenv")
    env = base_env(tmp / "registry", **{var: BAD_VALUES[var] for var in SIDECAR_VARS})
    done = subprocess.run([PYTHON, str(ROOT / "tests" / "programs" / "train.py"), "--replica", "bad", "--output",
                           str(tmp / "out"), "--steps", "30", "--step-sleep", "0.005"],
                          capture_output=True, text=True, env=env, timeout=180)
    return done, read_json(record_path(tmp / "registry", "bad", 0))


def test_a_running_job_with_bad_variables_trains_on(bad_env_job):
    done, record = bad_env_job
    assert done.returncode == 0 and "DONE 30" in done.stdout, done.stderr[-3000:]
    assert record["step"] == 30 and record["exited_at"] is not None
    # what the bad values configured is off; the rest of the sidecar runs
    assert (record["fault_stacks"], record["stall_after_s"], record["poll_interval"]) == (None, 0.0, 1.0)


@pytest.mark.parametrize("var", SIDECAR_VARS)
def test_a_bad_variable_in_a_running_job_is_one_warning_naming_it(bad_env_job, var):
    done, _ = bad_env_job
    lines = [line for line in done.stderr.splitlines() if var in line]
    assert len(lines) == 1, lines
    assert BAD_VALUES[var] in lines[0] and envvars.BY_NAME[var].if_bad in lines[0], lines[0]


def test_a_config_cosmos_rl_accepts_leaves_the_job_profileable(spawn, tmp_path, registry):
    # [profiler.sub_profiler_config] active_steps = 1500 (cosmos-rl takes it) refused the whole TOML,
    # here and in the CLI's --config.
    config = tmp_path / "job.toml"
    config.write_text(f"[sidecar]\nregistry = '{registry}'\n[profiler]\nenable_profiler = true\nfuture_key = 1\n"
                      "[profiler.sub_profiler_config]\nactive_steps = 1500\nwarmup_steps = '1'\n")
    cmd = [PYTHON, "-m", "sidecar.run", "--replica", "big", "--config", str(config), "--output",
           str(tmp_path / "out"), PLAIN]
    proc = spawn("big", [], base_env(), program=cmd)
    proc.wait_ready()
    wait_for(lambda: read_json(record_path(registry, "big", 0)), what="record")
    code, out, err, _ = run_cli("profile", "set", "big", "--config", str(config), "-as", "2", "--wait",
                                "--timeout", "60", timeout=120, env=base_env())
    assert code == 0, out + err
    record = read_json(record_path(registry, "big", 0))
    assert len(profiler_steps(load_trace(record["trace_path"]))) == 2
    assert proc.stop() == 0
    assert ("profiler.sub_profiler_config.active_steps = 1500 is above the sidecar's limit of 1000; 1000 is used"
            in proc.stderr())
