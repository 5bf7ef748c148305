"""Runs at interpreter start, from `cosmos_profiler_sidecar.pth` (standard library only, and tiny).

Two things, neither of which touches a file of the real cosmos-rl:

1. The stand-in. Our `cosmos_rl/` is installed as `cosmos_profiler_standin/cosmos_rl/`, not as a
   top-level package, and `StandInFinder` (last on `sys.meta_path`) serves it only when no other
   finder knows a `cosmos_rl`: a real cosmos-rl in site-packages, on PYTHONPATH, or behind an
   editable install's finder (which a plain `.pth` path entry would shadow) always wins.
2. `COSMOS_PROFILER_SIDECAR=1`: the post-import hook that makes every `CosmosProfiler` of a
   cosmos-rl worker sidecar-driven (`sidecar.cosmos.integration`), for launch lines users do not control,
   and, before torch is imported, kineto's on-demand environment (`sidecar.rank.ondemand_env`).
"""

import os
import sys

STANDIN_NAME = "cosmos_rl"
ENV_SIDECAR = "COSMOS_PROFILER_SIDECAR"
_HERE = os.path.dirname(os.path.abspath(__file__))
# Installed wheel: beside this module. Source checkout (sitehook/ here): the repository root.
STANDIN_DIRS = (os.path.join(_HERE, "cosmos_profiler_standin"), os.path.dirname(_HERE))


class StandInFinder:
    """Finds the `cosmos_rl` stand-in, and only where no real cosmos-rl can be found."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != STANDIN_NAME:
            return None
        later = sys.meta_path[sys.meta_path.index(cls) + 1:] if cls in sys.meta_path else []
        for finder in later:
            find = getattr(finder, "find_spec", None)
            try:
                if find is not None and find(name, path, target) is not None:
                    return None  # a real cosmos_rl: let the import system take it
            except Exception:  # noqa: BLE001 - someone else's finder; not our business
                continue
        from importlib.machinery import PathFinder

        for where in STANDIN_DIRS:
            if os.path.isfile(os.path.join(where, STANDIN_NAME, "cli", "cli.py")):
                return PathFinder.find_spec(name, [where])
        return None


def is_enabled(value):
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def install():
    if StandInFinder not in sys.meta_path:
        sys.meta_path.append(StandInFinder)
    if is_enabled(os.environ.get(ENV_SIDECAR, "")):
        try:  # before torch is imported: kineto's on-demand environment (sidecar.rank.ondemand_env)
            from sidecar.rank.ondemand_env import prepare

            prepare()
        except Exception as exc:  # noqa: BLE001 - never break interpreter start; the Python path remains
            sys.stderr.write(f"[Profiler] kineto's on-demand environment could not be set: {exc}\n")
        try:
            from sidecar.cosmos.integration import install_import_hook

            install_import_hook()
        except Exception as exc:  # noqa: BLE001 - never break interpreter start
            sys.stderr.write(f"[Profiler] {ENV_SIDECAR} is set, but the sidecar hook could not be installed: {exc}\n")


install()
