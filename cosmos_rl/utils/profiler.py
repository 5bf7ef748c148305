"""cosmos-rl's profiler module path, for environments without the real cosmos-rl.

`CosmosProfiler` is `sidecar.cosmos.CosmosProfiler`: cosmos-rl 0.4.7's API, sidecar-driven.
"""

from sidecar.cosmos import CosmosProfiler

__all__ = ["CosmosProfiler"]
