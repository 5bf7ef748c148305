"""The post-import hook (sidecar.cosmos.integration) and the stand-in's finder, against a fake "real"
cosmos-rl laid out in a temp dir: fast, torch-free, in subprocesses so sys.modules stays clean.
The real cosmos-rl 0.4.7 is exercised in tests/e2e/test_cosmos_rl.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.launch import PYTHON, ROOT, base_env

STARTUP = ROOT / "sitehook" / "_cosmos_profiler_startup.py"


def fake_cosmos_rl(root: Path, profiler_body: str = "class CosmosProfiler:\n    pass\n") -> Path:
    """A package named cosmos_rl with a profiler module and a worker that imports its class."""
    pkg = root / "cosmos_rl"
    for sub in ("", "utils", "policy", "policy/worker"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "utils" / "profiler.py").write_text(profiler_body)
    (pkg / "policy" / "worker" / "base.py").write_text("from cosmos_rl.utils.profiler import CosmosProfiler\n")
    return root


def python(code: str, *path: Path) -> subprocess.CompletedProcess:
    env = base_env()
    env["PYTHONPATH"] = ":".join(str(p) for p in (*path, ROOT))
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          env=env, cwd="/")


def test_hook_replaces_the_class_before_workers_import_it(tmp_path):
    fake = fake_cosmos_rl(tmp_path)
    done = python("""
        import logging
        from sidecar.cosmos.integration import install_import_hook
        install_import_hook()
        import cosmos_rl.utils.profiler as p
        from cosmos_rl.policy.worker import base
        from sidecar.cosmos import CosmosProfiler
        assert p.CosmosProfiler is CosmosProfiler and base.CosmosProfiler is CosmosProfiler
        assert type(p.__loader__).__name__ == "_PatchingLoader"
        logging.getLogger("sidecar").info("[Profiler] hello")
        print("ok", [type(h).__name__ for h in logging.getLogger("sidecar").handlers])
    """, fake)
    assert done.returncode == 0, done.stderr
    assert "ok ['_Forward']" in done.stdout


def test_hook_installed_late_patches_modules_already_imported(tmp_path):
    fake = fake_cosmos_rl(tmp_path)
    done = python("""
        from cosmos_rl.policy.worker import base
        from sidecar.cosmos.integration import install_import_hook
        install_import_hook()
        from sidecar.cosmos import CosmosProfiler
        import cosmos_rl.utils.profiler as p
        assert p.CosmosProfiler is CosmosProfiler and base.CosmosProfiler is CosmosProfiler
        print("ok")
    """, fake)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_a_failing_hook_leaves_cosmos_rl_alone_and_says_so(tmp_path):
    # A module whose attributes cannot be set: the hook must not raise into cosmos-rl's import.
    fake = fake_cosmos_rl(tmp_path, textwrap.dedent("""
        import sys, types
        class CosmosProfiler:
            pass
        class Frozen(types.ModuleType):
            def __setattr__(self, name, value):
                if name == "CosmosProfiler":
                    raise AttributeError("read-only")
                super().__setattr__(name, value)
        sys.modules[__name__].__class__ = Frozen
    """))
    done = python("""
        from sidecar.cosmos.integration import install_import_hook
        install_import_hook()
        import cosmos_rl.utils.profiler as p
        assert p.CosmosProfiler.__module__ == "cosmos_rl.utils.profiler"
        print("trained on")
    """, fake)
    assert done.returncode == 0 and "trained on" in done.stdout, done.stderr
    assert done.stderr.count("cosmos-rl's CosmosProfiler stays as it is: the sidecar hook failed") == 1


def test_stand_in_serves_cosmos_rl_only_where_no_real_one_exists(tmp_path):
    # The finder of the installed .pth file, with the stand-in laid out as the wheel lays it.
    site = tmp_path / "site"
    (site / "cosmos_profiler_standin").mkdir(parents=True)
    (site / "cosmos_profiler_standin" / "cosmos_rl").symlink_to(ROOT / "cosmos_rl")
    (site / "_cosmos_profiler_startup.py").write_text(STARTUP.read_text())
    code = """
        import os, sys
        # not a checkout's own cosmos_rl: this one's, nor the one an editable install points at (a worktree
        # may run with another checkout's venv)
        sys.path[:] = [p for p in sys.path if p != {root!r}
                       and not all(os.path.isdir(os.path.join(p, d)) for d in ("sidecar", "cosmos_rl"))]
        {extra}
        import _cosmos_profiler_startup, cosmos_rl
        print(cosmos_rl.__file__)
    """
    env = base_env()
    env.pop("PYTHONPATH")

    def where(extra: str = "") -> str:
        src = textwrap.dedent(code.format(root=str(ROOT), extra=extra))
        done = subprocess.run([PYTHON, "-c", f"import sys; sys.path[:0] = [{str(site)!r}]\n{src}"],
                              capture_output=True, text=True, timeout=60, env=env, cwd="/")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert where().startswith(str(site / "cosmos_profiler_standin" / "cosmos_rl"))
    real = fake_cosmos_rl(tmp_path / "real")
    assert where(f"sys.path.append({str(real)!r})").startswith(str(real / "cosmos_rl"))  # a later path entry
    # A real cosmos-rl behind a finder placed after ours (as an editable install's is) wins too.
    finder = f"""
        import importlib.machinery
        class Editable:
            @classmethod
            def find_spec(cls, name, path=None, target=None):
                return importlib.machinery.PathFinder.find_spec(name, [{str(real)!r}]) if name == "cosmos_rl" else None
        import _cosmos_profiler_startup
        sys.meta_path.append(Editable)
    """
    assert where(textwrap.dedent(finder).replace("\n", "\n        ")).startswith(str(real / "cosmos_rl"))


@pytest.mark.skipif(sys.platform != "linux", reason="the .pth startup is tested on Linux")
def test_env_var_turns_the_hook_on_at_interpreter_start(tmp_path):
    fake = fake_cosmos_rl(tmp_path)
    done = subprocess.run(
        [PYTHON, "-c", "import _cosmos_profiler_startup, cosmos_rl.utils.profiler as p; print(p.CosmosProfiler.__module__)"],
        capture_output=True, text=True, timeout=60, cwd="/",
        env={**base_env(COSMOS_PROFILER_SIDECAR="1"), "PYTHONPATH": f"{fake}:{ROOT / 'sitehook'}:{ROOT}"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sidecar.cosmos"
