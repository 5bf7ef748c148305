"""The one CLI of the project (`cosmos-profiler`, `python -m sidecar`).

The Cosmos-RL stand-in's `cosmos_rl/cli/cli.py` is a face over this same
`cosmos` group. Importing this package never imports torch.
"""

from sidecar.cli.app import cosmos, format_table, main

__all__ = ["cosmos", "format_table", "main"]
