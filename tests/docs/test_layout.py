"""The layout the docs describe is the tree there is: every folder and module that README.md's "Layout" and
docs/layout.md's tree name exists, and every package folder under solver/, api/ and worker/ is named in the
tree, so a folder added, moved or removed shows up here until the docs follow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose every subpackage the tree must name.
NAMED_IN_FULL = ("solver", "api", "worker")
INDENT = 2


def fenced_block(text: str, after: str) -> list[str]:
    """The lines of the first fenced code block after the heading ``after``."""
    section = text[text.index(after) :]
    match = re.search(r"^```[a-z]*\n(.*?)^```", section, re.S | re.M)
    assert match, f"no code block after {after!r}"
    return match.group(1).splitlines()


def tree_paths(lines: list[str]) -> list[str]:
    """The paths a tree names: one entry a line, ``name`` first, indented ``INDENT`` spaces a level below its
    folder (``name/`` for a folder, ``name.py`` for a module)."""
    paths: list[str] = []
    parents: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        depth, rest = divmod(len(line) - len(line.lstrip(" ")), INDENT)
        name = line.split()[0]
        assert rest == 0 and depth <= len(parents), f"line {number}: indented off the tree: {line!r}"
        assert name.endswith(("/", ".py")), f"line {number}: {name!r} is neither a folder/ nor a module.py"
        del parents[depth:]
        path = "".join(parents) + name
        paths.append(path)
        if name.endswith("/"):
            parents.append(name)
    return paths


def readme_folders() -> list[str]:
    """The top-level folders README.md's Layout lists (first column; continuation lines start with spaces)."""
    lines = fenced_block((ROOT / "README.md").read_text(encoding="utf-8"), "## Layout")
    return [line.split()[0] for line in lines if line and not line.startswith(" ")]


def docs_tree() -> list[str]:
    return tree_paths(fenced_block((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"), "## The tree"))


def test_every_folder_the_readme_lists_exists_and_is_in_the_full_tree() -> None:
    folders = readme_folders()
    assert "solver/" in folders and "api/" in folders
    missing = [name for name in folders if not (ROOT / name).is_dir()]
    assert not missing, f"README.md's Layout names folders that do not exist: {missing}"
    tree = set(docs_tree())
    assert not set(folders) - tree, f"docs/layout.md's tree leaves out {sorted(set(folders) - tree)}"


def test_every_path_the_tree_names_exists() -> None:
    paths = docs_tree()
    assert len(paths) > 50
    missing = [p for p in paths if not (ROOT / p).is_dir() if p.endswith("/")]
    missing += [p for p in paths if p.endswith(".py") and not (ROOT / p).is_file()]
    assert not missing, f"docs/layout.md names what is not there: {missing}"


def test_every_package_folder_is_named() -> None:
    named = set(docs_tree())
    packages = sorted(
        f"{init.parent.relative_to(ROOT).as_posix()}/"
        for top in NAMED_IN_FULL
        for init in (ROOT / top).rglob("__init__.py")
    )
    assert f"{NAMED_IN_FULL[0]}/" in packages
    unnamed = [p for p in packages if p not in named]
    assert not unnamed, f"docs/layout.md's tree does not name these packages: {unnamed}"


def test_the_tree_reader_nests_by_indent_and_refuses_a_line_off_the_tree() -> None:
    """The reader itself: nesting by indentation, and a line that is neither a folder nor a module refused."""
    assert tree_paths(["a/  x", "  b.py  y", "  c/", "    d.py", "e.py"]) == [
        "a/",
        "a/b.py",
        "a/c/",
        "a/c/d.py",
        "e.py",
    ]
    for bad in (["a/", "   b.py"], ["a/", "    b.py"], ["Makefile  the build"]):
        with pytest.raises(AssertionError):
            tree_paths(bad)
