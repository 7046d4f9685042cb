"""The layer table of `gateway/`, enforced: who may import whom (README, "Design").

Every `import gateway...` in the package is read from the source (ast, no import side effects) and checked
against the table below. A new package must be placed in the table before it can import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gateway"

# Layer of each top-level unit of the package (a module or a sub-package). Lower layers never import higher ones.
LEAVES = {
    "settings", "errors", "log", "tasks", "metrics", "keys", "salts", "outcomes", "isotime", "tables", "__init__",
}
LAYERS: dict[str, int] = {
    **dict.fromkeys(LEAVES, 0),
    "policy": 1, "routes": 1, "asgi": 1, "storage": 1,
    "proxy": 2, "kvevents": 2, "connectors": 2, "strict": 2, "epochs": 2,
    "shadow": 3, "ledger": 3, "reuse": 3, "plan": 3, "limits": 3, "canary": 3,
    "http": 4,
    "cli": 5, "devtools": 5, "__main__": 5,
    "sim": 9,  # the simulator stands alone
}
# Same-layer imports between different units are forbidden unless listed here (importer -> allowed imports).
SAME_LAYER_ALLOWED: dict[str, set[str]] = {
    "routes": {"policy"},  # a route names the key scope it needs
    "proxy": {"connectors", "strict"},  # LMCache pools get the tenant tag; the rewrite checks body fields first
    "ledger": {"reuse"},  # `tenant forget` erases the tenant's reuse trace with its ledger records
    "plan": {"reuse", "ledger"},
    "canary": {"reuse"},
    "cli": {"devtools"},
    "__main__": {"cli"},
}
COMPOSITION_ROOTS = {"http", "cli", "__main__"}
FORBIDDEN_ROOTS = {"loadtests", "tests"}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        yield ".".join(("gateway", *relative.parts)), path


def _imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module == "gateway":
                yield from (f"gateway.{alias.name}" for alias in node.names)
            else:
                yield node.module


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges() -> set[tuple[str, str]]:
    edges = set()
    for module, path in _modules():
        for imported in _imports(path):
            root = imported.split(".")[0]
            if root in FORBIDDEN_ROOTS:
                edges.add((_unit(module), root))
            elif root == "gateway":
                edges.add((_unit(module), _unit(imported)))
    return {(a, b) for a, b in edges if a != b}


def test_every_unit_has_a_layer() -> None:
    units = {_unit(module) for module, _ in _modules()}
    assert units - set(LAYERS) == set(), "place new packages in the layer table of tests/test_architecture.py"


def test_no_package_imports_loadtests_or_tests() -> None:
    assert {(a, b) for a, b in _edges() if b in FORBIDDEN_ROOTS} == set()


def test_leaves_import_nothing_from_the_package() -> None:
    assert {(a, b) for a, b in _edges() if a in LEAVES} == set()


def test_imports_follow_the_layer_table() -> None:
    wrong = []
    for importer, imported in _edges():
        if imported in FORBIDDEN_ROOTS:
            continue
        low, high = LAYERS[imported], LAYERS[importer]
        same_layer_ok = low == high and imported in SAME_LAYER_ALLOWED.get(importer, set())
        if importer == "sim" or imported == "sim":
            ok = importer in {"cli", "devtools"} and imported == "sim"
        else:
            ok = low < high or same_layer_ok
        if not ok:
            wrong.append(f"{importer} (layer {high}) imports {imported} (layer {low})")
    assert sorted(wrong) == []


def test_only_composition_roots_import_the_http_and_cli_layers() -> None:
    importers = {a for a, b in _edges() if b in {"http", "cli"}}
    assert importers <= COMPOSITION_ROOTS


def test_the_unit_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in _edges():
        graph.setdefault(a, set()).add(b)
    seen: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> None:
        if node in stack:
            pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(node):], node]))
        if node in seen:
            return
        stack.append(node)
        for following in sorted(graph.get(node, ())):
            visit(following)
        stack.pop()
        seen.add(node)

    for start in sorted(graph):
        visit(start)
