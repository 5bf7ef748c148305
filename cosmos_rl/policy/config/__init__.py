"""Cosmos-RL's profiler config classes, as `cosmos_rl.policy.config` exposes them.

Thin re-export of `sidecar.common.config`: same field names and defaults as Cosmos-RL.
"""

from sidecar.common.config import ProfilerConfig, SubProfilerConfig, load_config

__all__ = ["ProfilerConfig", "SubProfilerConfig", "load_config"]
