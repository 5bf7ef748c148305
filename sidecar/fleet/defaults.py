"""The operator side's defaults that the CLI's options show: cheap to import, so that a command's
`--help` and its options are built without `follow` and `control`, which only the commands that
write or follow a request import.
"""

from __future__ import annotations

DEFAULT_WAIT_TIMEOUT_S = 600.0
DEFAULT_CANCEL_TIMEOUT_S = 60.0
# A rank answers stacks from its watcher thread at once (inotify), or within one
# poll interval on shared storage; its record follows at once.
DEFAULT_STACKS_TIMEOUT_S = 30.0
# Every rank: the point of stacks is to find the one that differs.
DEFAULT_STACKS_RANK_FILTER = "all"
