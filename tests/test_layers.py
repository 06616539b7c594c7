"""The import graph of ``spawnkit/``: no cycle, and no import that runs up a layer.

The layers are the table "Module map and layers" in ``docs/design.md``; this test reads
that table, so the document and the code cannot drift apart. Every ``import`` and
``from ... import`` counts: at module level, under ``if TYPE_CHECKING:`` and inside
functions alike. A package's implicit import of its own ``__init__`` is not an edge (a
package's ``__init__`` runs before its modules, whatever it imports).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "spawnkit"
DESIGN = REPO / "docs" / "design.md"

Graph = dict[str, set[str]]


def modules_of(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package``."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]
) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    # ``from pkg import name`` imports the module pkg.name when there is one, else pkg.
    return [
        f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
        for alias in node.names
    ]


def import_graph(package: Path) -> Graph:
    """Module -> the modules of ``package`` it imports, anywhere in its code."""
    modules = modules_of(package)
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(name, path.name == "__init__.py", node, modules):
                while target and target not in modules:  # `import a.b.c` of a name in a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module, as one loop through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan, iteratively: no recursion limit to meet
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(_loop(graph, set(component)))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def _loop(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    """One closed path through ``component``, from its first module back to it."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"not a cycle: {sorted(component)}")


def documented_layers(text: str) -> dict[str, tuple[int, str]]:
    """Module (as written in the table) -> (layer number, layer name), from design.md."""
    _, found, rest = text.partition("## Module map and layers")
    assert found, "docs/design.md has no section 'Module map and layers'"
    layers: dict[str, tuple[int, str]] = {}
    for line in rest.split("\n## ", 1)[0].splitlines():
        row = re.match(r"\|\s*(\d+)\s+([^|]+?)\s*\|([^|]*)\|", line)
        if row is None:
            continue
        for module in re.findall(r"`([^`]+)`", row[3]):
            assert module not in layers, f"{module} is in two layers of docs/design.md"
            layers[module] = (int(row[1]), row[2])
    return layers


def layer_of(module: str, layers: Mapping[str, tuple[int, str]]) -> tuple[int, str] | None:
    """A module's layer: its own row, or its package's (``history`` holds ``history.rows``)."""
    relative = module.partition(".")[2] or "__init__"  # without the package's own name
    while relative:
        if relative in layers:
            return layers[relative]
        relative = relative.rpartition(".")[0]
    return None


def upward_imports(
    graph: Mapping[str, set[str]], layers: Mapping[str, tuple[int, str]]
) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module, layers)
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if mine and theirs and theirs[0] > mine[0]:
                problems.append(
                    f"{module} (layer {mine[0]} {mine[1]}) imports {target} "
                    f"(layer {theirs[0]} {theirs[1]})"
                )
    return problems


GRAPH = import_graph(PACKAGE)
LAYERS = documented_layers(DESIGN.read_text(encoding="utf-8"))


def test_the_import_graph_has_no_cycle() -> None:
    loops = [" -> ".join(loop) for loop in cycles(GRAPH)]
    assert not loops, "import cycles in spawnkit/:\n" + "\n".join(loops)


def test_every_module_is_in_one_documented_layer() -> None:
    unplaced = [m for m in sorted(GRAPH) if layer_of(m, LAYERS) is None]
    assert not unplaced, f"add these to the layer table in docs/design.md: {unplaced}"
    stale = [m for m in LAYERS if m != "__init__" and f"spawnkit.{m}" not in GRAPH]
    assert not stale, f"docs/design.md names modules that do not exist: {stale}"


def test_no_import_runs_up_a_layer() -> None:
    problems = upward_imports(GRAPH, LAYERS)
    assert not problems, "imports against the layers of docs/design.md:\n" + "\n".join(problems)


def test_the_configuration_layer_imports_no_runtime() -> None:
    # The cycle this test was written against: roster -> runtimes -> runtimes.base -> roster.
    config = [m for m in GRAPH if (layer_of(m, LAYERS) or (0, ""))[1] == "configuration"]
    expected = {"spawnkit.config.roster", "spawnkit.config.butler_config"}
    assert expected | {"spawnkit.config.runtime_names"} <= set(config)
    for module in config:
        assert not {t for t in GRAPH[module] if t.startswith("spawnkit.runtimes")}, module


# The checker itself, on a package written here: it must see every kind of import.


def _package(root: Path, files: Mapping[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


@pytest.mark.parametrize(
    "back_edge",
    [
        "from .. import a\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import A\n",
        "def later():\n    from ..a import A\n    return A\n",
        "import pkg.a\n",
        "from pkg import a\n",
    ],
    ids=["relative", "TYPE_CHECKING", "function-local", "absolute", "absolute-from"],
)
def test_the_checker_names_a_cycle_made_by_any_kind_of_import(
    tmp_path: Path, back_edge: str
) -> None:
    files = {
        "__init__.py": "",
        "a.py": "from .sub.b import B\nA = 1\n",
        "sub/__init__.py": "",
        "sub/b.py": back_edge + "B = 2\n",
    }
    assert cycles(import_graph(_package(tmp_path, files))) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


def test_the_checker_names_an_upward_import(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {"__init__.py": "", "low.py": "from .high import X\n", "high.py": "X = 1\n"},
    )
    layers = documented_layers(
        "## Module map and layers\n\n| layer | modules | what |\n|---|---|---|\n"
        "| 1 bottom | `low` | |\n| 2 top | `high` `__init__` | |\n"
    )
    assert cycles(import_graph(package)) == []
    assert upward_imports(import_graph(package), layers) == [
        "pkg.low (layer 1 bottom) imports pkg.high (layer 2 top)"
    ]
