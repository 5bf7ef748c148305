"""Files a running sidecar may be writing at the same moment: read them, remove them."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None while it is absent or half-written."""
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def remove_tree(path: Path, timeout: float = 10.0) -> None:
    """rm -rf a directory a running sidecar may be writing into (retry while it races us)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
