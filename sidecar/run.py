"""Zero code change: install the sidecar, then run a training script unmodified.

    python -m sidecar.run [--replica R] [--config train.toml] script.py args...
    python -m sidecar.run -m package.module args...
    torchrun --nproc-per-node 8 -m sidecar.run train.py args...

As with `python` and `torchrun`, the options of sidecar.run come first and end
at the script (or `-m module`): everything after it is the script's own, passed
through untouched, even a flag that sidecar.run also has (`--config`). `--`
before the script is accepted, never needed.

Steps are counted through torch's global optimizer step hook (see
`Sidecar.enable_auto_step` for the rule when several optimizers step per
iteration); a script that calls `sidecar.current().step()` itself takes over.

A cosmos-rl worker needs nothing more: the import hook of `sidecar.cosmos.integration`
makes its `CosmosProfiler` sidecar-driven, and that profiler (which knows the
worker's replica and rank) replaces the process-wide sidecar installed here.

Before torch is imported, kineto's on-demand environment is set (`sidecar.rank.ondemand_env`:
the save then runs on kineto's threads; COSMOS_PROFILER_ONDEMAND=off keeps the Python path).

Before the script runs, the flight recorder's buffer size gets a default where the
user set none (`sidecar.rank.fr_env`: TORCH_FR_BUFFER_SIZE, or TORCH_NCCL_TRACE_BUFFER_SIZE
on torch < 2.8), so `profile hang` can line the ranks' collectives up.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

import sidecar
from sidecar.common import envvars
from sidecar.common.exceptions import SidecarError
from sidecar.cosmos.integration import install_import_hook
from sidecar.rank import fr_env, ondemand_env
from sidecar.rank.torchcheck import require_torch

PROG = "python -m sidecar.run"
# sidecar.run's own options that take a value; with -h they are all it has.
VALUE_OPTIONS = ("--replica", "--rank", "--role", "--config", "--output", "--registry")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [options] (script.py | -m module) [args...]",
        description="Run a training script with the profiler sidecar installed. The script's own "
                    "arguments follow it (or -m module) and are passed through untouched.",
    )
    p.add_argument("--replica", help="replica name (default: COSMOS_PROFILER_REPLICA, TORCHELASTIC_RUN_ID, ...)")
    p.add_argument("--rank", type=int, help="global rank (default: RANK, SLURM_PROCID, else 0)")
    p.add_argument("--role", default="policy", help="policy, rollout, or any label")
    p.add_argument("--config", help="Cosmos-RL style TOML config ([profiler], [sidecar], [train] output_dir)")
    p.add_argument("--output", help="trace root: <output>/profile_trace/<replica>_<rank>/")
    p.add_argument("--registry", help="registry root (default: COSMOS_PROFILER_DIR, ...)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module as a script, like python -m")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], str | None, str | None, list[str]]:
    """(sidecar.run's own arguments, module, script, the script's arguments).

    Ours end at the first argument that is not one of our options (the script),
    at `-m MODULE` / `-mMODULE`, or at `--`; the rest is the script's, untouched.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest = argv[i + 1:]
            return argv[:i], None, (rest[0] if rest else None), rest[1:]
        if arg == "-m":
            if i + 1 >= len(argv):
                return argv[:i + 1], None, None, []  # argparse says -m needs a value
            return argv[:i], argv[i + 1], None, argv[i + 2:]
        if arg.startswith("-m") and not arg.startswith("--"):
            return argv[:i], arg[2:], None, argv[i + 1:]
        if arg in VALUE_OPTIONS:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1  # --opt=value, -h, or an unknown option argparse will name
            continue
        return argv[:i], None, arg, argv[i + 1:]
    return argv, None, None, []


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _parser()
    ours, module, script, args = split_argv(argv)
    ns = p.parse_args(ours)
    ns.module, ns.script, ns.args = module or ns.module, script, args
    if not ns.module and not ns.script:
        p.error("give a script to run (or -m module)")
    return ns


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        require_torch()  # a login node's install has none: one line naming the fix, not a traceback
        # Every COSMOS_PROFILER_* variable the sidecar reads, before anything of the job runs
        # (inside a running job a bad one only turns off what it configures).
        envvars.check()
    except SidecarError as exc:
        _refuse(exc)
    # Before anything imports torch: kineto reads its on-demand variables as torch starts (sidecar.rank.ondemand_env).
    ondemand_env.prepare()
    install_import_hook()
    # Before the script creates its process group: the flight recorder reads its buffer size then.
    fr_env.ensure_default()
    try:
        sc = sidecar.install(
            output_dir=ns.output, replica=ns.replica, rank=ns.rank, role=ns.role, config=ns.config,
            registry=ns.registry,
        )
    except SidecarError as exc:
        _refuse(exc)
    sc.enable_auto_step()
    try:
        if ns.module:
            sys.argv = [ns.module, *ns.args]
            runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [ns.script, *ns.args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
            runpy.run_path(ns.script, run_name="__main__")
    finally:
        sc.close()


def _refuse(exc: SidecarError) -> None:
    """One line naming the file and the key (or the variable, or the missing torch), not a traceback; exit 2."""
    sys.stderr.write(f"{PROG}: error: {exc}\n")
    raise SystemExit(2) from None


if __name__ == "__main__":
    main()
