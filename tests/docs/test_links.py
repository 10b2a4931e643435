"""The README stays a short entry point and every link in README.md and docs/ leads somewhere inside the
repository: an existing file, and for a ``#fragment`` into Markdown, an existing heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MAX_README_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: Words that would send a reader to documents the repository does not hold.
OUTSIDE = ("CONTRACT.md", "PEERS.md", "../shared", "/work/", "the contract")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens; an underscore inside a
    word stays (`cp_modes` -> cp_modes), one that marks emphasis (_word_) goes with the markup."""
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def test_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    found = links(page)
    assert found or page.name != "index.md"
    broken = []
    for target in found:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http(s), mailto: not a file of this repository
            continue
        path_part, _, fragment = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading #{fragment} in {path.relative_to(ROOT)}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_text_sends_the_reader_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert [word for word in OUTSIDE if word in text] == []


def test_docs_index_lists_every_document() -> None:
    listed = {(ROOT / "docs" / target.partition("#")[0]).resolve() for target in links(ROOT / "docs" / "index.md")}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"}
    assert pages <= listed


def test_slugs_follow_github() -> None:
    assert slug("Exact model: gap by size and backend") == "exact-model-gap-by-size-and-backend"
    assert slug("`make demo`") == "make-demo"
    assert slug("`auto` against skrull and the peers") == "auto-against-skrull-and-the-peers"


def test_the_endpoint_table_lists_every_operation_of_the_service() -> None:
    import re as _re

    from skrull.api.app import create_app
    from skrull.api.settings import Settings

    spec = create_app(Settings(db=":memory:", solver_processes=0)).openapi()
    operations = {op["operationId"] for path in spec["paths"].values() for op in path.values() if "operationId" in op}
    table = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    listed = set(_re.findall(r"`(\w+)`", table))
    assert operations and operations - listed == set()


def test_anchors_keep_an_underscore_inside_a_word_as_github_does() -> None:
    assert slug("Context-parallel modes (`cp_modes`)") == "context-parallel-modes-cp_modes"
    assert slug("## `bench/cp_modes.py`".lstrip("# ")) == "benchcp_modespy"
    assert slug("_Why_ it *matters*") == "why-it-matters"
