"""Cosmos-RL's CLI module path, for environments without the real cosmos-rl.

    python -m cosmos_rl.cli.cli replica ls -cp 8000 -ch localhost
    python -m cosmos_rl.cli.cli profile set REPLICA -cp 8000 -ch localhost

The commands are `sidecar.cli`'s (the `cosmos-profiler` CLI); this file holds no logic.
"""

from sidecar.cli import cosmos, main

__all__ = ["cosmos", "main"]

if __name__ == "__main__":
    main(prog_name="python -m cosmos_rl.cli.cli")
