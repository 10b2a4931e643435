"""``skrull show`` and ``skrull compare --plot``: pictures written as asked, one clear line for mistakes."""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.cli.test_main import EXAMPLES, skrull

SVG_NS = "{http://www.w3.org/2000/svg}"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def lanes(svg: Path) -> list[ET.Element]:
    root = ET.parse(svg).getroot()
    return [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "lane"]


def test_show_draws_a_plan_file_with_its_request(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    request = EXAMPLES / "tiny-cpu-dp2-cp2.json"
    assert skrull("plan", "-r", str(request), "-o", str(plan)).returncode == 0
    out = skrull("show", str(plan), "--request", str(request), "-o", str(tmp_path / "plan.svg"))
    assert out.returncode == 0, out.stderr
    svg = tmp_path / "plan.svg"
    num_iterations = len(json.loads(plan.read_text())["iterations"])
    assert num_iterations >= 1 and len(lanes(svg)) == 4 * num_iterations  # DP2 x CP2: 4 lanes per iteration
    assert "overlap" in svg.read_text()


def test_show_plans_a_request_and_writes_png(tmp_path: Path) -> None:
    target = tmp_path / "plan.png"
    out = skrull(
        "show", "--request", str(EXAMPLES / "default.json"), "--solver", "deepspeed", "-i", "1", "-o", str(target)
    )
    assert out.returncode == 0, out.stderr
    width, height = png_size(target.read_bytes())
    assert width == 1000 and height > 32 * 20  # 32 GPUs of one iteration


def test_compare_plot_draws_one_panel_per_planner(tmp_path: Path) -> None:
    target = tmp_path / "cmp.svg"
    out = skrull(
        "compare",
        "-r",
        str(EXAMPLES / "tiny-cpu-dp2-cp2.json"),
        "--solvers",
        "skrull,deepspeed,packed",
        "--plot",
        str(target),
    )
    assert out.returncode == 0, out.stderr
    root = ET.parse(target).getroot()
    titles = [t.text for t in root.iter(f"{SVG_NS}text") if t.get("class") == "title"]
    assert titles == ["skrull: iteration 0", "deepspeed: iteration 0", "packed: iteration 0"]
    assert len(lanes(target)) == 3 * 4


def test_rejects_an_unknown_picture_format(tmp_path: Path) -> None:
    out = skrull("show", "--request", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"), "-o", str(tmp_path / "plan.gif"))
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("skrull: error: --output: ") and line.endswith("plan.gif': must end in .svg or .png")


def test_rejects_a_plan_drawn_with_another_request(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert skrull("plan", "-r", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"), "-o", str(plan)).returncode == 0
    out = skrull("show", str(plan), "--request", str(EXAMPLES / "default.json"), "-o", str(tmp_path / "x.svg"))
    assert out.returncode == 2 and out.stderr.startswith("skrull: error:")
    assert "Traceback" not in out.stderr and not (tmp_path / "x.svg").exists()


def test_rejects_show_with_nothing_to_draw() -> None:
    out = skrull("show")
    assert out.returncode == 2 and "PLAN" in out.stderr and len(out.stderr.strip().splitlines()) == 1
