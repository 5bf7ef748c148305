"""The shared floor: what both sides of a job stand on, and nothing above it.

The rank side (`sidecar.rank`), the operator side (`sidecar.fleet`, `sidecar.cli`), trace
analysis (`sidecar.traces`) and the Cosmos-RL integration (`sidecar.cosmos`) all import from
here; nothing here imports any of them (an import-linter contract in pyproject.toml holds it).
No torch: identity, layout, configuration and environment variables, the request and its
wire form, rank records and their checks, the registry's files, clocks, the start-step rule,
stack dumps, signal names and the exceptions.
"""
