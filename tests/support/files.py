"""Files a running sidecar may be writing at the same moment: read them, remove them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .wait import wait_for


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None while it is absent or half-written."""
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def remove_tree(path: Path, timeout: float = 10.0) -> None:
    """rm -rf a directory a running sidecar may be writing into (again while it races us)."""
    errors: list[OSError] = []

    def removed() -> bool:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            errors.append(exc)
            return False
        return True

    wait_for(removed, timeout, interval=0.01, what=f"{path} to be removed",
             describe=lambda: f"last error: {errors[-1]!r}" if errors else "")
