"""import-linter's contracts (pyproject.toml) hold: `lint-imports` run as a subprocess over sidecar/.
The import cycles and module sizes are tests/unit/test_boundaries.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.launch import PYTHON, ROOT, base_env


def test_import_contracts_are_kept():
    lint_imports = Path(PYTHON).parent / "lint-imports"
    proc = subprocess.run([str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=base_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout
