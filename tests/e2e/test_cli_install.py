"""A login node's install: our wheel in a venv with no torch (`pip install cosmos-profiler-sidecar`).

The CLI works there in full; the rank side says in one line what to install
(`pip install 'cosmos-profiler-sidecar[rank]'`) instead of a traceback, and
`COSMOS_PROFILER_SIDECAR=1` breaks no process. The venv (not `--system-site-packages`, so a torch
of the base Python stays out) is kept under .cache/, one per pyproject.toml, and pip installs the
wheel built from this checkout into it, with its dependencies, resolved by pip from the package
registry: what a user's pip would do. Skipped, saying why, only where pip cannot reach the registry.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.launch import PYTHON, ROOT, base_env
from support.records import remote_record
from support.traces import step_trace

CACHE = ROOT / ".cache" / "cli-install"
RANK_INSTALL = "pip install 'cosmos-profiler-sidecar[rank]'"
# What pip prints when the package registry cannot be reached (the only reason to skip).
OFFLINE = ("Failed to establish a new connection", "Temporary failure in name resolution", "Network is unreachable",
           "ProxyError", "Read timed out")


def run(cmd: list, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd or "/")


def pip(python: Path | str, args: list, what: str) -> None:
    """Run `python -m pip`; skip where the registry cannot be reached, fail on anything else."""
    done = run([python, "-m", "pip", "--disable-pip-version-check", "-q", *args], env=venv_env(), timeout=600)
    if done.returncode == 0:
        return
    output = done.stdout[-1500:] + done.stderr[-3000:]
    offline = [line.strip() for line in output.splitlines() if any(sign in line for sign in OFFLINE)]
    if offline:
        pytest.skip(f"pip cannot reach the package registry to {what}: {offline[0]}")
    pytest.fail(f"pip could not {what} (exit {done.returncode}):\n{output}")


def venv_env(venv: Path | None = None, **extra: str) -> dict[str, str]:
    """Our test environment without the checkout on PYTHONPATH (it would shadow the wheel), the venv's
    bin/ first on PATH."""
    env = base_env(**extra)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pip(PYTHON, ["wheel", "--no-deps", "-w", out, ROOT], "build the wheel")
    (path,) = out.glob("cosmos_profiler_sidecar-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel) -> Path:
    """A venv without torch holding the wheel and what pip resolves for it; built once per pyproject.toml
    (and base Python), the wheel reinstalled into it on every run."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + sys.version.encode()).hexdigest()[:12]
    path = CACHE / f"venv-{key}"
    ready = path / ".ready"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run of this test on the same checkout
        python = path / "bin" / "python"
        if not ready.exists():
            done = run([PYTHON, "-m", "venv", "--clear", path], env=venv_env())
            assert done.returncode == 0, done.stderr
            pip(python, ["install", wheel], "install the wheel and its dependencies")  # pip resolves no torch
            ready.touch()
        else:
            pip(python, ["install", "--no-deps", "--force-reinstall", wheel], "reinstall the wheel")
    return path


def test_the_wheel_needs_torch_only_for_the_rank_extra(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in zf.read(name).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    assert [r for r in requires if r.startswith("torch")] == ["torch>=2.1; extra == 'rank'"], requires


def test_the_venv_has_our_wheel_and_no_torch(venv):
    python = venv / "bin" / "python"
    done = run([python, "-c", "import torch"], env=venv_env(venv))
    assert done.returncode == 1 and "No module named 'torch'" in done.stderr, done.stderr
    where = run([python, "-c", "import sidecar; print(sidecar.__file__)"], env=venv_env(venv))
    assert where.stdout.startswith(str(venv / "lib")), f"not the installed wheel: {where.stdout}{where.stderr}"


def test_the_cli_works_without_torch(venv, tmp_path):
    registry = tmp_path / "registry"
    remote_record(registry, "r1", 0, heartbeat_age=0.0, world_size=1)
    trace = step_trace(tmp_path / "traces" / "r1_0" / "0_trace.json.gz", 0, [1000.0, 1100.0, 900.0])
    env = venv_env(venv)
    cli = venv / "bin" / "cosmos-profiler"
    for args, shows in [
        (["--help"], "replica"),
        (["replica", "ls", "--registry", registry], "r1"),
        (["replica", "ls", "--json", "--registry", registry], '"r1"'),
        (["replica", "lsr", "r1", "--registry", registry], "node-elsewhere"),
        (["profile", "set", "r1", "--no-wait", "--registry", registry], "r1"),
        (["profile", "status", "r1", "--registry", registry], "r1"),
        (["profile", "summary", trace], "trace summary: replica r1"),
        (["profile", "report", trace, "-o", tmp_path / "report.html"], "report.html"),
    ]:
        done = run([cli, *args], env=env, cwd=tmp_path)
        assert done.returncode == 0, f"cosmos-profiler {args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        assert shows in done.stdout, f"cosmos-profiler {args}:\n{done.stdout}"
    assert (registry / "control" / "r1.json").exists(), "profile set wrote no request"
    module = run([venv / "bin" / "python", "-m", "sidecar", "replica", "ls", "--registry", registry], env=env)
    assert module.returncode == 0 and "r1" in module.stdout, module.stderr


def test_sidecar_run_says_in_one_line_what_to_install(venv, tmp_path):
    python = venv / "bin" / "python"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    done = run([python, "-m", "sidecar.run", "--replica", "nt", script], env=venv_env(venv),
               cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"python -m sidecar.run: error: torch is not installed in this Python ({python}); "
                           f"the rank side of cosmos-profiler-sidecar needs it: {RANK_INSTALL}\n")
    assert not (tmp_path / "ran").exists(), "the script ran without the sidecar"
    usage = run([python, "-m", "sidecar.run", "--help"], env=venv_env(venv))
    assert usage.returncode == 0 and "--replica" in usage.stdout, usage.stderr


INSTALL = """
import sys
import sidecar
try:
    sidecar.install(output_dir=sys.argv[1], replica="nt")
except ImportError as exc:
    print(type(exc).__name__, isinstance(exc, sidecar.SidecarError), exc.name)
    print(exc)
else:
    print("installed")
"""


def test_install_raises_an_import_error_naming_the_fix(venv, tmp_path):
    python = venv / "bin" / "python"
    registry = tmp_path / "registry"
    done = run([python, "-c", INSTALL, tmp_path / "out"], env=venv_env(venv, COSMOS_PROFILER_DIR=str(registry)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "TorchMissing True torch",
        f"torch is not installed in this Python ({python}); the rank side of cosmos-profiler-sidecar needs it: "
        f"{RANK_INSTALL}",
    ]
    assert not registry.exists(), "a rank without torch registered itself"


WORKER = """
import sys
from cosmos_rl.utils.profiler import CosmosProfiler
profiler = CosmosProfiler(sys.argv[1], 0, "nt", None)
print("training goes on; sidecar:", profiler.sidecar)
"""


def test_cosmos_profiler_sidecar_env_breaks_no_process(venv, tmp_path):
    python = venv / "bin" / "python"
    env = venv_env(venv, COSMOS_PROFILER_SIDECAR="1", COSMOS_PROFILER_DIR=str(tmp_path / "registry"))
    plain = run([python, "-c", "print('ok')"], env=env)
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "ok\n", "")
    config = tmp_path / "job.toml"
    config.write_text(f"[train]\noutput_dir = '{tmp_path / 'out'}'\n")
    worker = run([python, "-c", WORKER, config], env=env, cwd=tmp_path)
    assert worker.returncode == 0 and worker.stdout == "training goes on; sidecar: None\n", worker.stderr
    lines = worker.stderr.splitlines()
    assert len(lines) == 1, worker.stderr
    assert "the profiler sidecar is off for replica 'nt' rank 0: torch is not installed" in lines[0], lines
    assert RANK_INSTALL in lines[0], lines
