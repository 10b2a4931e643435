"""No two modules import each other, at load time or lazily inside a function (tools that read imports see
both as a circle): the architecture reads one way (solver/types.py -> solver/search/budget.py; the store
opener -> the PostgreSQL store). Imports for type checking only (``if TYPE_CHECKING:``) do not count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("solver", "api", "cli", "worker", "corpus")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("skrull", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imports(path: Path) -> set[str]:
    """Every ``skrull`` module the file imports, anywhere but under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m.startswith("skrull.")}


def test_no_two_modules_import_each_other() -> None:
    graph = {module_name(path): imports(path) for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    pairs = sorted((a, b) for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, set()))
    assert pairs == []
