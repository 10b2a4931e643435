"""The picture that opens docs/index.md is what the documented commands draw from the current code, and
the figures its caption gives are the picture's and the planners' own."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from skrull.cli.main import main as skrull_main
from skrull.solver.io import request_from_dict
from skrull.solver.reports.compare import compare
from tests.docs.test_links import ROOT

DOCS = ROOT / "docs"


def documented(command: str) -> list[str]:
    """The arguments of the one documented ``skrull <command> ... docs/plan-timeline...`` line."""
    text = (DOCS / "planners.md").read_text(encoding="utf-8")
    (line,) = [x for x in text.splitlines() if x.startswith(f"skrull {command} ") and "docs/plan-timeline" in x]
    return shlex.split(line.split("#")[0])[1:]


def run(argv: list[str], tmp: Path) -> None:
    """The CLI in this process, its outputs under ``tmp`` instead of docs/."""
    argv = [a.replace("docs/plan-timeline", str(tmp / "plan-timeline")) if a.startswith("docs/plan-timeline")
            and argv[argv.index(a) - 1] in ("-o", "--output") else str(ROOT / a) if a.startswith("docs/") else a
            for a in argv]  # fmt: skip
    assert skrull_main(argv) in (0, None)


def test_the_opening_picture_is_what_the_documented_commands_draw_now(tmp_path: Path) -> None:
    run(documented("request"), tmp_path)
    assert json.loads((tmp_path / "plan-timeline.request.json").read_text()) == json.loads(
        (DOCS / "plan-timeline.request.json").read_text()
    ), "docs/plan-timeline.request.json: run the skrull request line of docs/planners.md"
    run(documented("show"), tmp_path)
    drawn = (tmp_path / "plan-timeline.svg").read_text(encoding="utf-8")
    assert drawn == (DOCS / "plan-timeline.svg").read_text(encoding="utf-8"), (
        "docs/plan-timeline.svg is not what the code draws now: run the skrull show line of docs/planners.md"
    )


def test_the_caption_gives_the_pictures_estimate_and_true_speedups() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    svg = (DOCS / "plan-timeline.svg").read_text(encoding="utf-8")
    (shown,) = re.findall(r"estimated ([\d.]+) ms, \d+ microbatch", svg)
    assert f"estimated at {float(shown):.1f} ms" in index
    request = request_from_dict(json.loads((DOCS / "plan-timeline.request.json").read_text()))
    rows = {row.solver: row for row in compare(request, ["auto", "skrull", "deepspeed"])[0]}
    auto, skrull, deepspeed = rows["auto"], rows["skrull"], rows["deepspeed"]
    assert auto.iteration_ms is not None and f"{auto.iteration_ms:.1f}" == shown
    assert f"{auto.speedup:.2f}x DeepSpeed's {deepspeed.iteration_ms:.1f} ms" in index
    assert f"gives {skrull.iteration_ms:.1f} ms ({skrull.speedup:.2f}x)" in index
