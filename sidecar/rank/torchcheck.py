"""Whether this Python has torch, asked once at each entry point of the rank side.

The CLI runs without torch (a login node installs `cosmos-profiler-sidecar` alone); what runs
inside a training process needs it. Two entry points ask `require_torch()` before doing anything,
so a missing torch reads as one sentence that names the fix, not as a traceback from deep inside
a capture: `build_sidecar` (under `sidecar.install()`, which raises it, and the `CosmosProfiler`
of a cosmos-rl worker, which logs it once and trains on), and `python -m sidecar.run` (one line,
exit 2). `COSMOS_PROFILER_SIDECAR=1` does not ask at interpreter start: our `.pth` file runs before
a `--system-site-packages` venv has put the base Python's torch on `sys.path`; its hook only
reaches `CosmosProfiler`. Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import sys

from sidecar.common.exceptions import TorchMissing

RANK_INSTALL = "pip install 'cosmos-profiler-sidecar[rank]'"


def has_torch() -> bool:
    """Whether `import torch` would find a torch (imported already, or on the path); never imports it."""
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def missing_torch_message() -> str:
    """The one sentence: what is missing, in which Python, and the install line that fixes it."""
    return (f"torch is not installed in this Python ({sys.executable}); the rank side of "
            f"cosmos-profiler-sidecar needs it: {RANK_INSTALL}")


def require_torch() -> None:
    """Raise `TorchMissing` (an ImportError) where this Python has no torch.

    Raises:
        TorchMissing: with `missing_torch_message()`.
    """
    if not has_torch():
        raise TorchMissing(missing_torch_message(), name="torch")
