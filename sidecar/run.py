"""Zero code change: install the sidecar, then run a training script unmodified.

    python -m sidecar.run [--replica R] [--config train.toml] script.py args...
    python -m sidecar.run -m package.module args...
    torchrun --nproc-per-node 8 -m sidecar.run train.py args...

Steps are counted through torch's global optimizer step hook (see
`Sidecar.enable_auto_step` for the rule when several optimizers step per
iteration); a script that calls `sidecar.current().step()` itself takes over.

A cosmos-rl worker needs nothing more: the import hook of `sidecar.integration`
makes its `CosmosProfiler` sidecar-driven, and that profiler (which knows the
worker's replica and rank) replaces the process-wide sidecar installed here.

Before the script runs, the flight recorder's buffer size gets a default where the
user set none (`sidecar.fr_env`: TORCH_FR_BUFFER_SIZE, or TORCH_NCCL_TRACE_BUFFER_SIZE
on torch < 2.8), so `profile hang` can line the ranks' collectives up.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

import sidecar
from sidecar import fr_env
from sidecar.integration import install_import_hook


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sidecar.run",
        description="Run a training script with the profiler sidecar installed.",
    )
    p.add_argument("--replica", help="replica name (default: COSMOS_PROFILER_REPLICA, TORCHELASTIC_RUN_ID, ...)")
    p.add_argument("--rank", type=int, help="global rank (default: RANK, SLURM_PROCID, else 0)")
    p.add_argument("--role", default="policy", help="policy, rollout, or any label")
    p.add_argument("--config", help="Cosmos-RL style TOML config ([profiler], [sidecar], [train] output_dir)")
    p.add_argument("--output", help="trace root: <output>/profile_trace/<replica>_<rank>/")
    p.add_argument("--registry", help="registry root (default: COSMOS_PROFILER_DIR, ...)")
    p.add_argument("-m", dest="module", help="run a module as a script, like python -m")
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    ns = p.parse_args(argv)
    if ns.module and ns.script:
        ns.args = [ns.script, *ns.args]
        ns.script = None
    if not ns.module and not ns.script:
        p.error("give a script to run (or -m module)")
    return ns


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    install_import_hook()
    # Before the script creates its process group: the flight recorder reads its buffer size then.
    fr_env.ensure_default()
    sc = sidecar.install(
        output_dir=ns.output, replica=ns.replica, rank=ns.rank, role=ns.role, config=ns.config, registry=ns.registry
    )
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


if __name__ == "__main__":
    main()
