"""The lines the folders draw hold: no import cycle in sidecar/ or benchmarks/ (lazy imports inside
functions count), no module grown past a size a reader can hold, and torch imported at module level
only by the driver and the flight recorder. import-linter's contracts (pyproject.toml) run in
tests/e2e/test_boundaries_contracts.py."""

from __future__ import annotations

import grimp
import pytest

from support.launch import ROOT

MAX_MODULE_LINES = 650

# Modules allowed over MAX_MODULE_LINES for now, each with why; an entry whose module has shrunk
# under the limit (or is gone) fails the test, so the list only ever empties.
OVERSIZE: dict[str, str] = {}


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


@pytest.mark.parametrize("package", ["sidecar", "benchmarks"])
def test_no_import_cycle(package):
    cycles = import_cycles(package)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_over_the_size_limit():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for path in sorted((ROOT / "sidecar").rglob("*.py"))}
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
