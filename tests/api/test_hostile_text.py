"""Strings that are not text (NUL, lone UTF-16 surrogates) in every string field of every request, against
a real server on SQLite and on PostgreSQL: one 422 naming the field, never a 5xx, nothing stored."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.conftest import LiveServer, plan_request

NOT_TEXT = ["\x00", "\ud800", "\udfff", "ab\x00cd", "x\udc80y"]
#: Text with NUL or a lone surrogate somewhere, and text without (which must never be refused for it).
hostile = st.builds(
    lambda head, bad, tail: head + bad + tail, st.text(max_size=8), st.sampled_from(NOT_TEXT), st.text(max_size=8)
)
#: (JSON path the error must name, a function putting a string there).
PLACES: list[tuple[str, Callable[[dict[str, Any], str], None]]] = [
    ("profile", lambda d, s: d.__setitem__("profile", s)),
    ("solver", lambda d, s: d.__setitem__("solver", s)),
    ("backend", lambda d, s: d.__setitem__("backend", s)),
    ("profile.name", lambda d, s: d["profile"].__setitem__("name", s)),
]


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()  # ensure_ascii: surrogates and NUL travel as \u escapes, as JSON allows


@pytest.fixture
def server(live_server_factory: Callable[..., LiveServer], store_location: str) -> Iterator[httpx.Client]:
    live = live_server_factory(store_location, solver_processes=0).start()
    with httpx.Client(base_url=live.url, timeout=30) as client:
        yield client


def test_not_text_anywhere_is_one_422_naming_the_field(server: httpx.Client) -> None:
    counts = {"sent": 0, "refused_naming_the_field": 0}

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(PLACES), hostile)
    def one(place: tuple[str, Callable[[dict[str, Any], str], None]], text: str) -> None:
        field, put = place
        doc = copy.deepcopy(plan_request([[10, 20]]))  # the hand profile is shared: never change it in place
        put(doc, text)
        r = server.post("/v1/plans", content=_dumps(doc), headers={"content-type": "application/json"})
        counts["sent"] += 1
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field
        counts["refused_naming_the_field"] += 1

    one()
    # a hostile key, and the same in an uploaded profile and a comparison
    for path, body in (
        ("/v1/plans", {**plan_request([[10]]), "x\x00": 1}),
        ("/v1/profiles", {**plan_request([[10]])["profile"], "name": "mine\ud800"}),
        ("/v1/compare", {**plan_request([[10]]), "solvers": ["skrull", "\x00"]}),
    ):
        r = server.post(path, content=_dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 422, (path, r.text)
        assert "\\u0000" in r.json()["detail"] or "surrogate" in r.json()["detail"]
    assert counts["sent"] == counts["refused_naming_the_field"] >= 80
    print(f"hostile strings: {counts}")


def test_not_text_in_a_path_is_a_422_not_a_500(server: httpx.Client) -> None:
    for path, field in (
        ("/v1/plans/ab%00cd", "plan_id"),
        ("/v1/plans/ab%00cd/ranks/0?iteration=0", "plan_id"),
        ("/v1/plans/ab%00cd/timeline.svg", "plan_id"),
        ("/v1/profiles/h100%00", "name"),
    ):
        r = server.get(path)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["field"] == field
    # nothing was stored by any of it
    assert server.get("/healthz").json()["jobs"] == {}
