"""fltune's import graph has no cycle, and every import points down the layers of docs/architecture.md.

The graph is built from the source with ``ast``: an import inside a function counts as much as one at the
top of a module (it runs the first time the function does, and a reader untangles a cycle through it all
the same), as does ``importlib.import_module("literal")``; imports under ``if TYPE_CHECKING:`` do not,
as they never run. ``FLTUNE_SOURCE=<checkout>`` checks that checkout's ``fltune/`` against this tree's
layers (how the test was shown to fail on the tree before issue 58).
"""

from __future__ import annotations

import ast
import os
import re
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("FLTUNE_SOURCE", ROOT)) / "fltune"


def read_layers(text: str) -> list[tuple[str, list[str]]]:
    """The ``layers`` block of the ``## Layers`` section, top layer first: (name, module prefixes)."""
    found = re.search(r"^## Layers\n.*?^```layers\n(.*?)^```", text, re.S | re.M)
    assert found, "docs/architecture.md: no ```layers block under ## Layers"
    return [(line.split()[0], line.split()[1:]) for line in found.group(1).splitlines() if line.strip()]


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Imports(ast.NodeVisitor):
    """The modules one module imports when it runs, as written: (module, names imported from it)."""

    def __init__(self, package: str) -> None:
        self.package, self.found = package, []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(alias.name, []) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        self.found.append((module, [alias.name for alias in node.names]))

    def visit_Call(self, node: ast.Call) -> None:
        called = getattr(node.func, "attr", getattr(node.func, "id", None))
        if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            self.found.append((node.args[0].value, []))
        self.generic_visit(node)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports (``from a import b`` names the submodule ``a.b`` when
    there is one). Importing ``a.b.c`` runs the ``__init__`` of ``a.b`` first, so that counts as imported too,
    unless ``a.b`` holds the importing module: its ``__init__`` began before the module did (the root's always)."""
    paths = {module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        visitor = Imports(name if path.name == "__init__.py" else name.rpartition(".")[0])
        visitor.visit(ast.parse(path.read_text(), str(path)))
        targets = {f"{module}.{n}" if f"{module}.{n}" in paths else module
                   for module, names in visitor.found for n in names or [""]}
        targets = {target.rstrip(".") for target in targets}
        parents = {target.rsplit(".", depth)[0] for target in targets for depth in range(1, target.count("."))}
        graph[name] = {target for target in targets | parents - ancestors(name) if target in paths} - {name}
    return graph


def ancestors(module: str) -> set[str]:
    """The packages holding ``module``: ``a.b.c`` → {a, a.b}."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Shortest cycles that together pass through every module on a cycle (each strongly connected
    component of more than one module, found with Tarjan's algorithm, covered cycle by cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    found = []
    for component in components:
        left = list(component)
        while left:
            cycle = shortest_cycle(graph, left[0], set(component))
            found.append(cycle)
            left = [node for node in left if node not in cycle]
    return found


def shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """``start`` → … → ``start`` through the fewest modules of ``within`` (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & within):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{start} is on no cycle")


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The position of the layer holding ``module`` (0: the top one), by its longest matching prefix."""
    matches = [(len(prefix), rank) for rank, (_, prefixes) in enumerate(layers) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


LAYERS = read_layers((ROOT / "docs" / "architecture.md").read_text())
GRAPH = import_graph(SOURCE)


def test_fltune_has_no_import_cycle() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" → ".join(cycle) for cycle in found)


def test_every_module_is_in_a_layer() -> None:
    placed = [module for module in GRAPH if module != "fltune" and layer_of(module, LAYERS) is None]
    assert not placed, f"modules in no layer of docs/architecture.md: {', '.join(placed)}"


def test_imports_point_down_the_layers() -> None:
    names = [name for name, _ in LAYERS]
    upward = [f"{module} ({names[low]}) → {target} ({names[high]})"
              for module, targets in sorted(GRAPH.items()) for target in sorted(targets)
              if (low := layer_of(module, LAYERS)) is not None and (high := layer_of(target, LAYERS)) is not None
              and high < low]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A package of three modules: ``a`` imports ``b`` at the top, ``b`` imports ``c`` in a function,
    ``c`` imports ``a`` for type hints only and ``b`` through importlib."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from toy import b\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nimport importlib\n"
                                  "if TYPE_CHECKING:\n    import toy.a\nelse:\n    import os\n"
                                  "importlib.import_module('toy.b')\n")
    return package


def test_the_graph_counts_imports_that_run_and_only_those(toy: Path) -> None:
    graph = import_graph(toy)
    assert graph == {"toy": set(), "toy.a": {"toy.b"}, "toy.b": {"toy.c"}, "toy.c": {"toy.b"}}
    assert cycles(graph) == [["toy.b", "toy.c", "toy.b"]]


def test_a_subpackages_init_counts_as_imported(tmp_path: Path) -> None:
    """``toy.a`` imports ``toy.sub.b``, so ``toy.sub``'s ``__init__`` runs, and it imports ``toy.a``: a cycle."""
    (tmp_path / "toy" / "sub").mkdir(parents=True)
    for path, text in (("__init__.py", "import toy.a\n"), ("a.py", "def f():\n    from toy.sub.b import x\n"),
                       ("sub/__init__.py", "from toy import a\n"), ("sub/b.py", "import toy.sub.c\n"),
                       ("sub/c.py", "")):
        (tmp_path / "toy" / path).write_text(text)
    graph = import_graph(tmp_path / "toy")
    assert graph["toy.a"] == {"toy.sub", "toy.sub.b"} and graph["toy.sub.b"] == {"toy.sub.c"}  # toy.sub began first
    assert cycles(graph) == [["toy.a", "toy.sub", "toy.a"]]


def test_a_module_belongs_to_the_layer_of_its_longest_prefix() -> None:
    layers = [("top", ["p.cli"]), ("bottom", ["p", "p.cli_args"])]
    assert [layer_of(m, layers) for m in ("p.cli", "p.cli.x", "p.cli_args", "p.other", "q")] == [0, 0, 1, 1, None]
