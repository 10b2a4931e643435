"""No circle of imports, of any length, at load time or lazily inside a function (tools that read imports
see both as a circle): the architecture reads one way (solver <- api, corpus <- worker <- cli; inside
solver/, the request -> the budget rule -> the planner registry -> the planners -> the problem types).
Imports for type checking only (``if TYPE_CHECKING:``) do not count.

Every ``import`` and ``from ... import`` statement counts, wherever it stands (module level, a function's
body, a class's, a ``try``), and ``from package import name`` counts as an import of ``package.name`` where
that is a module. A circle is found by Tarjan's strongly connected components over the whole graph."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("solver", "api", "cli", "worker", "corpus")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("skrull", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path, *, package: bool = False) -> set[tuple[str, str]]:
    """Every ``skrull`` module the file imports, anywhere but under ``if TYPE_CHECKING:``, as pairs
    (``module.name``, ``module``): the first where it is a module (``from skrull.solver import budget``), else
    the second; relative imports are resolved against the file's own module."""
    own = module_name(path).split(".")
    base = own if package else own[:-1]
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                module = ".".join([*parent, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.update((f"{module}.{alias.name}", module) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update((alias.name, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {pair for pair in found if pair[1].startswith("skrull.")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the library's modules it imports."""
    files = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    raw = {module_name(path): imports(path, package=is_package(path)) for path in files}
    return {
        module: {name if name in raw else fallback for name, fallback in found} & raw.keys() - {module}
        for module, found in raw.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    found.append(sorted(component))
    return found


def test_the_finder_sees_a_circle_of_any_length_and_through_a_function() -> None:
    """The finder itself: a three-module circle closed by a lazy import, and a chain that is no circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    lazy = ast.parse("def f():\n    from skrull.solver import budget\n")
    assert any(isinstance(node, ast.ImportFrom) for node in ast.walk(lazy))


def test_no_modules_import_each_other_round_a_circle() -> None:
    assert circles(import_graph()) == []
