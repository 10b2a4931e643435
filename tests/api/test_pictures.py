"""``GET /v1/plans/{id}/timeline.svg`` and ``/view``: the stored plan drawn with its own request."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.api.conftest import LiveServer, plan_request, running_app

SVG_NS = "{http://www.w3.org/2000/svg}"
PROBLEM = "application/problem+json"


def solved(client: TestClient, doc: dict[str, object]) -> dict[str, object]:
    plan_id = client.post("/v1/plans", json=doc).json()["id"]
    envelope: dict[str, object] = client.get(f"/v1/plans/{plan_id}", params={"wait": 30, "until": "final"}).json()
    assert envelope["status"] == "solved", envelope
    return envelope


def test_timeline_has_a_lane_per_gpu_and_every_microbatch(shared_app: TestClient) -> None:
    envelope = solved(shared_app, plan_request([[150, 20, 30, 80, 5], [60, 70]], dp=2, cp=2))
    response = shared_app.get(f"/v1/plans/{envelope['id']}/timeline.svg")
    assert response.status_code == 200 and response.headers["content-type"] == "image/svg+xml"
    root = ET.fromstring(response.text)
    plan = envelope["plan"]
    assert isinstance(plan, dict)
    panels = [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "panel"]
    assert len(panels) == len(plan["iterations"]) == 2
    for panel, it in zip(panels, plan["iterations"], strict=True):
        gpus = sorted(int(g.get("data-gpu", "-1")) for g in panel.iter(f"{SVG_NS}g") if g.get("class") == "lane")
        assert gpus == [0, 1, 2, 3]
        drawn = [g for g in panel.iter(f"{SVG_NS}g") if g.get("class") == "microbatch"]
        assert len(drawn) == sum(len(mb["ranks"]) for mb in it["microbatches"])
        assert any(r.get("class") == "segment overlap" for r in panel.iter(f"{SVG_NS}rect"))


def test_timeline_draws_chosen_iterations_only(shared_app: TestClient) -> None:
    envelope = solved(shared_app, plan_request([[150, 20], [60, 70], [5]], dp=1, cp=2))
    response = shared_app.get(f"/v1/plans/{envelope['id']}/timeline.svg", params={"iteration": [2]})
    root = ET.fromstring(response.text)
    assert [g.get("data-iteration") for g in root.iter(f"{SVG_NS}g") if g.get("class") == "panel"] == ["2"]


def test_unknown_plan_and_iteration_are_404_problems(shared_app: TestClient) -> None:
    response = shared_app.get("/v1/plans/nope/timeline.svg")
    assert response.status_code == 404 and response.headers["content-type"] == PROBLEM
    assert response.json()["field"] == "plan_id"
    assert shared_app.get("/v1/plans/nope/view").status_code == 404
    envelope = solved(shared_app, plan_request([[150, 20]], dp=1, cp=2))
    response = shared_app.get(f"/v1/plans/{envelope['id']}/timeline.svg", params={"iteration": 7})
    assert response.status_code == 404 and response.json()["field"] == "iteration"


def test_unsolved_plan_has_no_timeline_and_its_page_waits(tmp_path: Path) -> None:
    with running_app(tmp_path / "skrull.db", solver_processes=0) as client:  # accepts, never solves
        plan_id = client.post("/v1/plans", json=plan_request([[150, 20]], dp=1, cp=2)).json()["id"]
        response = client.get(f"/v1/plans/{plan_id}/timeline.svg")
        assert response.status_code == 409 and response.json()["type"].endswith("plan-not-solved")
        page = client.get(f"/v1/plans/{plan_id}/view")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'http-equiv="refresh"' in page.text and "<svg" not in page.text and "queued" in page.text


def test_view_page_embeds_the_timeline_and_links_the_plan(shared_app: TestClient) -> None:
    envelope = solved(shared_app, plan_request([[150, 20, 30]], dp=1, cp=2))
    page = shared_app.get(f"/v1/plans/{envelope['id']}/view")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "<svg" in page.text and 'class="lane"' in page.text and "refresh" not in page.text
    assert f'href="/v1/plans/{envelope["id"]}"' in page.text
    # every bound it prints says which one it is, in the words of `skrull compare` and the panels
    facts = page.text.split("<table>")[1].split("</table>")[0]
    assert "no plan beats " in facts and "ms (any layout)" in facts and "none with static CP groups beats" in facts
    figures = page.text.split('class="figures"')[1]
    assert "no plan beats " in figures and "(any layout)" in figures


def test_a_picture_over_its_bar_limit_is_refused_and_the_page_says_why(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    # 4 sequences sharded one per microbatch over 8 GPUs: 32 bars; the limit is set at 20
    server = live_server_factory(tmp_path / "s.db", solver_processes=1, env={"SKRULL_MAX_PICTURE_BARS": "20"}).start()
    doc = plan_request([[150, 160, 170, 180]], dp=1, cp=8, solver="deepspeed")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        plan_id = client.post("/v1/plans", json=doc).json()["id"]
        assert client.get(f"/v1/plans/{plan_id}", params={"wait": 20, "until": "final"}).json()["status"] == "solved"
        refused = client.get(f"/v1/plans/{plan_id}/timeline.svg")
        assert refused.status_code == 413
        problem = refused.json()
        assert problem["type"] == "urn:skrull:problem:picture-too-large"
        assert (problem["bars"], problem["limit"]) == (32, 20)
        assert "SKRULL_MAX_PICTURE_BARS" in problem["detail"]
        page = client.get(f"/v1/plans/{plan_id}/view")
        assert page.status_code == 200 and "SKRULL_MAX_PICTURE_BARS" in page.text and "<svg" not in page.text
