"""Import hygiene: the CLI process never imports torch (nor watchdog), so it starts fast on a login node."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.launch import PYTHON, ROOT, base_env
from support.records import remote_record

HEAVY = ("torch", "watchdog")

# The trace analysis the CLI runs on login nodes.
TRACES_MODULES = ["sidecar.traces", "sidecar.traces.reader", "sidecar.traces.summary", "sidecar.traces.merge",
                  "sidecar.traces.catalog", "sidecar.traces.export", "sidecar.fleet.stackgroups",
                  "sidecar.traces.straggler", "sidecar.traces.htmlreport", "sidecar.traces.diff"]


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=60, env=base_env(), cwd=ROOT)


@pytest.mark.parametrize("module", ["sidecar.cli", "cosmos_rl.cli.cli"])
def test_cli_module_does_not_import_torch(module):
    proc = _python("-c", f"import {module}, sys; assert 'torch' not in sys.modules")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "module",
    ["sidecar.cli", "sidecar.cli.app", "sidecar.cli.params", "sidecar.cli.render", "cosmos_rl.cli.cli",
     "sidecar.common.registry", "sidecar.fleet", "sidecar.fleet.answers", "sidecar.fleet.control", "sidecar.fleet.follow",
     "sidecar.fleet.controller", "sidecar.fleet.hang", "sidecar.cli.render_hang", "sidecar.rank.fr_env", *TRACES_MODULES],
)
def test_no_heavy_imports(module):
    code = f"import sys, {module}; loaded = [m for m in {HEAVY!r} if m in sys.modules]; assert not loaded, loaded"
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("module", ["sidecar", "cosmos_rl.cli.cli"])
def test_help_runs_without_torch(module):
    code = (
        "import sys, runpy; sys.argv = ['cosmos-profiler', '--help']\n"
        f"try:\n    runpy.run_module({module!r}, run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "replica" in proc.stdout and "profile" in proc.stdout


@pytest.mark.parametrize(("module", "prog"), [("sidecar", "cosmos-profiler"), ("cosmos_rl.cli.cli", "python -m cosmos_rl.cli.cli")])
def test_python_dash_m_help(module, prog):
    proc = _python("-m", module, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout and "profile" in proc.stdout and "replica" in proc.stdout
    assert proc.stdout.startswith(f"Usage: {prog} "), proc.stdout[:80]


def test_console_script_help():
    script = Path(PYTHON).parent / "cosmos-profiler"
    assert script.exists(), "the cosmos-profiler console script is not installed in this venv"
    proc = subprocess.run([str(script), "profile", "set", "--help"], capture_output=True, text=True, timeout=60,
                          env=base_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "-rf, --rank-filter RANKS" in proc.stdout


def test_traces_module_imports_only_the_standard_library():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import sidecar.traces\n"
        "added = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(added - set(sys.stdlib_module_names) - {'sidecar'}))\n"
    )
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=base_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", "sidecar.traces must import only the standard library (no torch)"


def test_the_hang_analysis_imports_only_the_standard_library():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import sidecar.fleet.hang, sidecar.cli.render_hang\n"
        "added = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(added - set(sys.stdlib_module_names) - {'sidecar', 'click'}))\n"
    )
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=base_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


# What `profile set` (and the CLI's other fleet commands) must start without: the trace
# merge and export, the controller's HTTP client (only with -ch/-cp), torch and watchdog.
# (`profile summary --top`'s default still brings in traces.summary and its reader.)
PROFILE_SET_NEVER = ("torch", "watchdog", "ctypes", "http.client", "urllib.request", "email.parser",
                     "sidecar.traces.merge", "sidecar.traces.export")


def test_profile_set_imports_only_what_it_needs(tmp_path):
    registry = tmp_path / "reg"
    remote_record(registry, "r1", 0, heartbeat_age=0.0, world_size=1)
    code = (
        "import sys\n"
        "from sidecar.cli import cosmos\n"  # the group: main() would end the process (its fast exit)
        f"sys.argv = ['cosmos-profiler', 'profile', 'set', 'r1', '--registry', {str(registry)!r}, '--no-wait']\n"
        "try:\n    cosmos(prog_name='cosmos-profiler')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(sorted(m for m in {PROFILE_SET_NEVER!r} if m in sys.modules))\n"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
    assert (registry / "control" / "r1.json").exists()  # it did write the request


def test_the_cli_loads_no_trace_reading_module_and_no_secrets_until_a_command_needs_them():
    heavy = ("sidecar.traces.summary", "sidecar.traces.reader", "sidecar.traces.catalog", "statistics", "secrets",
             "hmac")
    probe = (
        "import sys\n"
        "import sidecar.cli.app\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    run = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT, env=base_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
    from sidecar.cli import app
    from sidecar.traces.summary import TOP_K

    assert app.TOP_K == TOP_K, "the CLI's --top default is the summary's"


def test_the_state_machine_imports_no_torch_and_no_threading():
    code = "import sys, sidecar.rank.capture; bad = [m for m in ('torch', 'watchdog') if m in sys.modules]; assert not bad, bad"
    done = _python("-c", code)
    assert done.returncode == 0, done.stderr
