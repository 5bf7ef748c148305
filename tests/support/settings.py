"""A bad value for every COSMOS_PROFILER_* variable that can have one (`sidecar.common.envvars.TABLE`)."""

from __future__ import annotations

from sidecar.common import envvars

BAD_VALUES = {
    "COSMOS_PROFILER_WATCH": "bogus",
    "COSMOS_PROFILER_NODE_AGENT": "sometimes",
    "COSMOS_PROFILER_POLL_INTERVAL": "fast",
    "COSMOS_PROFILER_SIGNAL": "SIGKILL",
    "COSMOS_PROFILER_STACKS_SIGNAL": "SIGKILL",
    "COSMOS_PROFILER_STALL_AFTER_S": "-5",
    "COSMOS_PROFILER_SLOWDOWN_FACTOR": "0.5",
    "COSMOS_PROFILER_SLOWDOWN_MIN_INTERVAL_S": "-1",
    "COSMOS_PROFILER_SLOWDOWN_MIN_FREE_PCT": "101",
    "COSMOS_PROFILER_CONTROLLER": "ftp://controller",
    "COSMOS_PROFILER_SAVE_WRITER": "disk",
    "COSMOS_PROFILER_ONDEMAND": "sometimes",
    "COSMOS_PROFILER_FORK_STALL_S": "never",
    "COSMOS_PROFILER_STACKS_FALLBACK_S": "soon",
    "COSMOS_PROFILER_STALL_WARN_S": "-1",
}

# The variables a training process reads (sidecar.run refuses them at launch; a running job warns).
SIDECAR_VARS = [v.name for v in envvars.TABLE if envvars.SIDECAR in v.readers and v.convert is not None]
