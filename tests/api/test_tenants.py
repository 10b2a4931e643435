"""Tenants against real servers: a token belongs to the team named before ``=``; a plan, its views, its
pictures, DELETE and Idempotency-Keys are visible only inside its team (404 elsewhere, like an unknown id);
the same request from two teams gets two plans; unnamed tokens keep working as one default team. On SQLite
and PostgreSQL, and across two API replicas sharing one PostgreSQL database."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.api.tenants import DEFAULT_TENANT, owns, parse_tokens, plan_id_for, scoped_key
from skrull.solver.errors import RequestError
from tests.api.conftest import LiveServer, plan_request
from tests.api.pg import temporary_database

TOKENS = {
    "SKRULL_SUBMIT_TOKENS": "team-a=tokA,team-b=tokB,plainC",
    "SKRULL_READ_TOKENS": "team-a=tokAr,plainR",
}
A, B, C = ({"Authorization": f"Bearer {t}"} for t in ("tokA", "tokB", "plainC"))
A_READ, C_READ = ({"Authorization": f"Bearer {t}"} for t in ("tokAr", "plainR"))


def _solved(client: httpx.Client, headers: dict[str, str], doc: dict[str, Any], key: str | None = None) -> str:
    extra = {"Idempotency-Key": key} if key else {}
    r = client.post("/v1/plans", json=doc, headers={**headers, **extra})
    assert r.status_code == 202, r.text
    plan_id: str = r.json()["id"]
    final = client.get(f"/v1/plans/{plan_id}", params={"wait": 20, "until": "final"}, headers=headers)
    assert final.json()["status"] == "solved", final.text
    return plan_id


def _plan_routes(plan_id: str) -> list[str]:
    return [
        f"/v1/plans/{plan_id}",
        f"/v1/plans/{plan_id}/ranks/0?iteration=0",
        f"/v1/plans/{plan_id}/timeline.svg?iteration=0",
        f"/v1/plans/{plan_id}/view",
    ]


def check_isolation(a: httpx.Client, b: httpx.Client) -> None:
    """``a`` and ``b`` may be clients of one server or of two replicas on one store."""
    doc = plan_request([[10, 20, 150, 30]], dp=1, cp=2)
    id_a = _solved(a, A, doc)
    id_b = _solved(b, B, doc)
    id_c = _solved(a, C, doc)
    assert len({id_a, id_b, id_c}) == 3  # one request, three teams, three plans
    assert _solved(b, A, doc) == id_a  # the same request within a team is the same plan, on any replica
    for route in _plan_routes(id_a):
        assert a.get(route, headers=A).status_code == 200, route
        assert b.get(route, headers=A_READ).status_code == 200, route
        for outsider in (B, C, C_READ):
            refused = b.get(route, headers=outsider)
            assert refused.status_code == 404, (route, refused.text)
            assert refused.json()["type"] == "urn:skrull:problem:unknown-plan"
    assert a.get(f"/v1/plans/{id_c}", headers=C_READ).status_code == 200  # unnamed tokens: one default team
    assert a.get(f"/v1/plans/{id_c}", headers=A).status_code == 404
    # DELETE from another team is a 404 and deletes nothing
    assert b.delete(f"/v1/plans/{id_a}", headers=B).status_code == 404
    assert a.get(f"/v1/plans/{id_a}", headers=A).json()["status"] == "solved"
    assert b.delete(f"/v1/plans/{id_a}", headers=A).status_code == 204
    assert a.get(f"/v1/plans/{id_a}", headers=A).status_code == 404
    assert a.get(f"/v1/plans/{id_b}", headers=B).json()["status"] == "solved"


def check_idempotency_keys(a: httpx.Client, b: httpx.Client) -> None:
    first = plan_request([[11, 21]], dp=1, cp=2)
    other = plan_request([[12, 22]], dp=1, cp=2)
    id_a = _solved(a, A, first, key="nightly-1")
    id_b = _solved(b, B, other, key="nightly-1")  # the same key in another team is another key
    assert id_a != id_b
    replay = b.post("/v1/plans", json=first, headers={**A, "Idempotency-Key": "nightly-1"})
    assert replay.status_code == 202 and replay.json()["id"] == id_a
    assert replay.headers["idempotent-replayed"] == "true"
    clash = a.post("/v1/plans", json=other, headers={**A, "Idempotency-Key": "nightly-1"})
    assert clash.status_code == 409
    assert "'nightly-1'" in clash.json()["detail"]  # the team's own key, not its stored form


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def two_clients(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """(client, client) of two servers on one store, shared by the module's tests on that store (their plans
    and keys never overlap): one server on a SQLite file, two API replicas on one PostgreSQL database."""
    root = tmp_path_factory.mktemp("tenants")
    with contextlib.ExitStack() as stack:
        location = str(root / "skrull.db") if request.param == "sqlite" else stack.enter_context(temporary_database())
        first = LiveServer(location, solver_processes=1, env=TOKENS, log_dir=root)
        stack.callback(first.close)
        first.start()
        second = first
        if request.param == "postgres":
            second = LiveServer(location, solver_processes=1, env=TOKENS, log_dir=root)
            stack.callback(second.close)
            second.start()
        a = stack.enter_context(httpx.Client(base_url=first.url, timeout=30))
        b = stack.enter_context(httpx.Client(base_url=second.url, timeout=30))
        yield a, b


def test_plans_are_visible_only_inside_their_tenant(two_clients: tuple[httpx.Client, httpx.Client]) -> None:
    check_isolation(*two_clients)


def test_idempotency_keys_belong_to_their_tenant(two_clients: tuple[httpx.Client, httpx.Client]) -> None:
    check_idempotency_keys(*two_clients)


# -- the rules themselves --------------------------------------------------------------------------------


def test_token_settings_name_tenants_and_keep_unnamed_and_padded_tokens() -> None:
    assert parse_tokens("team-a=tokA, team-b=tokB,plain,dG9rZW4=,x==", field="f") == {
        "tokA": "team-a",
        "tokB": "team-b",
        "plain": DEFAULT_TENANT,
        "dG9rZW4=": DEFAULT_TENANT,  # base64 padding is not a tenant name
        "x==": DEFAULT_TENANT,
    }
    with pytest.raises(RequestError, match="one tenant only"):
        parse_tokens("team-a=tok,team-b=tok", field="SKRULL_SUBMIT_TOKENS")


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="abcdefgh-_.0123456789", min_size=1, max_size=12).filter(lambda t: t[0].isalnum()),
    st.text(alphabet="abcdefgh-_.0123456789", min_size=1, max_size=12).filter(lambda t: t[0].isalnum()),
    st.text(min_size=1, max_size=40),
)
def test_a_plan_id_is_owned_by_its_tenant_alone(t1: str, t2: str, canonical: str) -> None:
    for tenant in (t1, t2, DEFAULT_TENANT):
        assert owns(tenant, plan_id_for(tenant, canonical))
    if t1 != t2:
        assert plan_id_for(t1, canonical) != plan_id_for(t2, canonical)
        assert not owns(t2, plan_id_for(t1, canonical))
        assert scoped_key(t1, "k") != scoped_key(t2, "k")
    assert not owns(DEFAULT_TENANT, plan_id_for(t1, canonical))
    assert not owns(t1, plan_id_for(DEFAULT_TENANT, canonical))
