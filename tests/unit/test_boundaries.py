"""The lines the folders draw hold: every module of sidecar/ under one of import-linter's contracts
(pyproject.toml; tests/e2e/test_boundaries_contracts.py runs lint-imports itself), no import cycle
in sidecar/, benchmarks/ or gpu_check/ (lazy imports inside functions count), no Python file
outside tests/ grown past a size a reader can hold, and torch imported at module level only by the
driver and the flight recorder."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import grimp
import pytest

from support.launch import ROOT

MAX_MODULE_LINES = 650
# Folders (and their files) that are no module of the project: git's, caches, virtual environments.
NOT_SOURCE = re.compile(r"^\.|^__pycache__$|^build$|^dist$|^outputs$|\.egg-info$")
# Modules allowed over MAX_MODULE_LINES for now, each with why; an entry whose module has shrunk
# under the limit (or is gone) fails the test, so the list only ever empties.
OVERSIZE: dict[str, str] = {}


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def sidecar_modules() -> list[str]:
    """Every module of sidecar/, dotted (a package by its own name)."""
    names = []
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def uncovered(modules: Iterable[str], contracts: Iterable[Mapping[str, Any]], root: str = "sidecar") -> list[str]:
    """The modules that no contract names, as a package prefix or as the module itself. A
    contract covers what it constrains (a forbidden contract's `source_modules`, an independence
    contract's `modules`, a layers contract's layers in its containers); the root package
    counts only for its own __init__, and a contract with `as_packages = false` only for the
    modules it names."""
    prefixes: set[str] = set()
    exact: set[str] = set()
    for contract in contracts:
        named = [*contract.get("source_modules", ()), *contract.get("modules", ())]
        for layer in contract.get("layers", ()):
            named += [f"{container}.{layer}" for container in contract.get("containers", ())] or [layer]
        for name in named:
            (exact if name == root or contract.get("as_packages") is False else prefixes).add(name)
    return [m for m in modules
            if m not in exact and not any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_every_module_of_sidecar_is_under_an_import_contract():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    missing = uncovered(sidecar_modules(), contracts)
    assert not missing, f"no import-linter contract in pyproject.toml covers: {missing}"


def test_a_module_no_contract_names_is_found():
    contracts = [{"source_modules": ["sidecar.rank"]}, {"source_modules": ["sidecar"], "as_packages": False}]
    assert uncovered(["sidecar", "sidecar.rank", "sidecar.rank.core", "sidecar.ranks", "sidecar.new"],
                     contracts) == ["sidecar.ranks", "sidecar.new"]
    assert uncovered(["sidecar.rank.core"], [{"source_modules": ["sidecar"]}]) == ["sidecar.rank.core"]


def import_cycles(package: str) -> list[list[str]]:
    """One cycle (importer first, back to it) for each strongly connected set of modules of
    `package`, counting every import grimp finds: at module level, under TYPE_CHECKING, or inside
    a function."""
    graph = grimp.build_graph(package, cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    cycles = []
    for component in _strongly_connected(imports):
        start = min(component)
        step = min(imports[start] & component)
        back = graph.find_shortest_chain(importer=step, imported=start)
        cycles.append([start, *back] if back else [start, start])
    return cycles


def _strongly_connected(imports: dict[str, set[str]]) -> list[set[str]]:
    """The sets of modules that reach each other (Tarjan), leaving out modules on no cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(imports[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1 or module in imports[module]:
                found.append(component)

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", ["sidecar", "benchmarks", "gpu_check"])
def test_no_import_cycle(package):
    cycles = import_cycles(package)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def project_python_files() -> list[Path]:
    """Every Python file of the project outside tests/: every one under the root but in hidden,
    cache, build and output folders (a unit test starts no `git ls-files`)."""
    paths = [path for path in ROOT.rglob("*.py")
             if not any(NOT_SOURCE.search(part) for part in path.relative_to(ROOT).parts[:-1])]
    return sorted(path for path in paths if path.is_file() and path.relative_to(ROOT).parts[0] != "tests")


def test_no_module_over_the_size_limit():
    files = project_python_files()
    assert ROOT / "sidecar" / "rank" / "core.py" in files and ROOT / "gpu_check" / "checks.py" in files
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in files}
    over = [f"{path}: {lines} lines" for path, lines in sizes.items()
            if lines > MAX_MODULE_LINES and path not in OVERSIZE]
    assert not over, f"over {MAX_MODULE_LINES} lines (split the module, or say why in OVERSIZE): {over}"
    stale = [path for path in OVERSIZE if sizes.get(path, 0) <= MAX_MODULE_LINES]
    assert not stale, f"in OVERSIZE but not over {MAX_MODULE_LINES} lines any more (remove them): {stale}"


# The rank-side modules that import torch: the profiler driver and the flight recorder reader.
# Everything else imports them lazily, where it needs them.
TORCH_IMPORTERS = {"sidecar/rank/driver.py", "sidecar/rank/flightrec.py"}


def test_only_the_driver_and_the_flight_recorder_import_torch():
    import ast

    importers = set()
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "torch" or n.startswith("torch.") for n in names) and node.col_offset == 0:
                importers.add(str(path.relative_to(ROOT)))
    assert importers == TORCH_IMPORTERS
