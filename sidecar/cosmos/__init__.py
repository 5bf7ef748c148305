"""The Cosmos-RL integration: `CosmosProfiler` (cosmos-rl 0.4.7's API, sidecar-driven) in
`profiler`, and the import hook that puts it into a real cosmos-rl's workers in `integration`.

It runs in the training process, on top of the rank side (`sidecar.rank`).
"""

from __future__ import annotations

from sidecar.cosmos.profiler import CosmosProfiler, checkpoint_signals

# Its public home: cosmos-rl's own module and our tests name the class by where users import it.
CosmosProfiler.__module__ = __name__

__all__ = ["CosmosProfiler", "checkpoint_signals"]
