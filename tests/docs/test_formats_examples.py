"""The examples in docs/formats.md are what the code reads and writes: the request is the bundled example,
the profile's coefficients are the bundled profile's, and the plan and rank view are what the planner
and ``plan_rank_view`` produce for that request (all but the wall time, and the plan's other iterations)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from skrull.solver.io import plan_to_dict, read_json, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.worker_view import plan_rank_view
from tests.docs.test_links import ROOT

FORMATS = ROOT / "docs" / "formats.md"
REQUEST = ROOT / "examples" / "requests" / "contract-example.json"


def examples() -> dict[str, Any]:
    """The JSON examples of docs/formats.md by section heading (the first example of each section)."""
    found: dict[str, Any] = {}
    for section in re.split(r"^## ", FORMATS.read_text(encoding="utf-8"), flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        blocks = re.findall(r"^```json\n(.*?)^```", section, re.S | re.M)
        if blocks:
            found[title] = json.loads(blocks[0])
    return found


@pytest.fixture(scope="module")
def docs() -> dict[str, Any]:
    return examples()


def test_the_request_example_is_the_bundled_example_request(docs: dict[str, Any]) -> None:
    assert docs["Request"] == read_json(REQUEST)


def test_the_profile_example_holds_the_bundled_profile_s_coefficients(docs: dict[str, Any]) -> None:
    bundled = load_profile(docs["Profile"]["name"]).to_dict()
    shown = docs["Profile"]
    assert set(shown) == {"name", "compute", "comm", "memory", "microbatch_ms"}
    for section in ("compute", "comm", "memory"):
        assert shown[section] == {key: bundled[section][key] for key in shown[section]}
    assert shown["microbatch_ms"] == bundled["microbatch_ms"]


def test_the_plan_and_rank_view_examples_are_what_the_planner_produces(docs: dict[str, Any]) -> None:
    # the example is the plan of the planner it names (the paper's, whose plan is the same on any machine)
    request = dataclasses.replace(request_from_dict(read_json(REQUEST)), solver=docs["Plan"]["solver"])
    plan = solve(request)
    produced = plan_to_dict(plan)
    shown = docs["Plan"]
    for doc in (shown, produced):
        del doc["solve"]["wall_ms"]
    assert shown == {**produced, "iterations": produced["iterations"][:1]}
    view = docs["Rank view"]
    assert view == plan_rank_view(plan, request.batches[0], iteration=0, rank=view["rank"]).to_dict(
        plan_id=view["plan_id"]
    )
