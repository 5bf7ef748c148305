"""Cosmos-RL's profiler module path; the class lives in `sidecar.cosmos`."""

from sidecar.cosmos import CosmosProfiler

__all__ = ["CosmosProfiler"]
