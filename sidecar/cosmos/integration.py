"""Make the real cosmos-rl's workers sidecar-driven, with no code change and no file of it edited.

`install_import_hook()` puts a finder first on `sys.meta_path` that wraps the
loader of `cosmos_rl.utils.profiler`: right after cosmos-rl's module has run, its
`CosmosProfiler` is replaced by `sidecar.cosmos.CosmosProfiler` (the 0.4.7 API,
sidecar-driven), before any worker module can `from ... import CosmosProfiler`.
The sidecar's log lines then go to cosmos-rl's `cosmos` logger.

Turned on by `python -m sidecar.run ...` and, for launch lines users do not
control (cosmos-rl's launcher), by `COSMOS_PROFILER_SIDECAR=1` in the
environment (read at interpreter start by the installed `.pth` file).

Nothing here raises into cosmos-rl: a failure leaves cosmos-rl's own class in
place and says so once on stderr.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from typing import Any

TARGET = "cosmos_rl.utils.profiler"
# cosmos-rl 0.4.7's rollout workers live here; they build no CosmosProfiler and step no optimizer.
ROLLOUT = "cosmos_rl.rollout"
COSMOS_LOGGER = "cosmos"
ROLLOUT_REASON = ("this process runs cosmos-rl 0.4.7's rollout code, whose workers build no CosmosProfiler "
                  "and step no optimizer, so no training step can be counted here; profile a policy replica, "
                  "or use `profile stacks` / `profile hang` here")


class _PatchingLoader(importlib.abc.Loader):
    """Runs cosmos-rl's module as its own loader would, then patches it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        if module.__name__ == ROLLOUT:
            mark_rollout_process()
        else:
            patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...: the real loader's
        return getattr(self._loader, name)


class ProfilerHookFinder:
    """Finds `cosmos_rl.utils.profiler` with the other finders and wraps its loader."""

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in (TARGET, ROLLOUT):
            return None
        for finder in sys.meta_path:
            if finder is cls:
                continue
            find = getattr(finder, "find_spec", None)
            try:
                spec = find(name, path, target) if find is not None else None
            except Exception:  # noqa: BLE001 - another finder's problem
                continue
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def patch(module: Any) -> bool:
    """Replace `module.CosmosProfiler` (cosmos-rl's) with the sidecar's. Returns whether it did."""
    try:
        from sidecar.cosmos import CosmosProfiler

        original = getattr(module, "CosmosProfiler", None)
        if original is None or original is CosmosProfiler:
            return False  # not cosmos-rl's module, or our stand-in's
        module.CosmosProfiler = CosmosProfiler
        # Worker modules imported before the hook was installed hold the old name.
        holders: list[Any] = [other for name, other in list(sys.modules.items())
                               if name.startswith("cosmos_rl.") and getattr(other, "CosmosProfiler", None) is original]
        for other in holders:
            other.CosmosProfiler = CosmosProfiler
        from sidecar.common.log import forward_to

        forward_to(logging.getLogger(COSMOS_LOGGER))
        return True
    except Exception as exc:  # noqa: BLE001 - never into cosmos-rl's import
        sys.stderr.write(f"[Profiler] cosmos-rl's CosmosProfiler stays as it is: the sidecar hook failed: {exc!r}\n")
        return False


def mark_rollout_process() -> None:
    """A process that imports cosmos-rl's rollout package under `sidecar.run`: its process-wide
    sidecar (counting at optimizer.step(), which a rollout never calls) refuses traces, saying why,
    and calls itself a rollout. A CosmosProfiler built later (a colocated policy worker) replaces it."""
    try:
        import dataclasses

        import sidecar

        current = sidecar.current()
        if current is None or current.cosmos_owned or current.cannot_trace:
            return
        current.identity = dataclasses.replace(current.identity, role="rollout")
        current.mark_cannot_trace(ROLLOUT_REASON)
    except Exception as exc:  # noqa: BLE001 - never into cosmos-rl's import
        sys.stderr.write(f"[Profiler] could not mark this rollout process: {exc!r}\n")


def install_import_hook() -> None:
    """Make every `CosmosProfiler` that cosmos-rl's workers construct from now on sidecar-driven."""
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
    if ROLLOUT in sys.modules:
        mark_rollout_process()
    if module is not None and ROLLOUT in sys.modules:
        return
    if ProfilerHookFinder not in sys.meta_path:
        sys.meta_path.insert(0, ProfilerHookFinder)
