"""Uploaded profiles belong to their tenant, on a real server: a name another tenant uploaded is free for
each tenant, requests are priced with the caller's own profile, listings and unknown-profile errors show
only the bundled profiles and the caller's own, and each tenant's uploads are bounded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from skrull.solver.profile import bundled_profile_names
from tests.api.conftest import HAND_PROFILE, LiveServer, plan_request

TOKENS = {"team-a": "tokA", "team-b": "tokB"}
MAX_PROFILES = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder: Path = tmp_path_factory.mktemp("profiles")
    env = {
        "SKRULL_SUBMIT_TOKENS": ",".join(f"{t}={k}" for t, k in TOKENS.items()),
        "SKRULL_TENANT_MAX_PROFILES": str(MAX_PROFILES),
    }
    live = LiveServer(folder / "jobs.db", solver_processes=0, env=env).start()
    try:
        yield live
    finally:
        live.close()


def call(server: LiveServer, tenant: str, method: str, path: str, body: Any = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
    return httpx.request(method, f"{server.url}{path}", json=body, headers=headers, timeout=60)


def profile(name: str, ms_per_tflop: float) -> dict[str, Any]:
    return {**HAND_PROFILE, "name": name, "compute": {**HAND_PROFILE["compute"], "ms_per_tflop": ms_per_tflop}}


def test_a_name_another_tenant_took_is_still_the_callers_own(server: LiveServer) -> None:
    squatted = call(server, "team-b", "POST", "/v1/profiles", profile("team-a/next-h100", 100.0))
    assert squatted.status_code == 201
    own = call(server, "team-a", "POST", "/v1/profiles", profile("team-a/next-h100", 2.0))
    assert own.status_code == 201, own.text
    a_doc = call(server, "team-a", "GET", "/v1/profiles/team-a/next-h100").json()
    b_doc = call(server, "team-b", "GET", "/v1/profiles/team-a/next-h100").json()
    assert a_doc["compute"]["ms_per_tflop"] == 2.0 and b_doc["compute"]["ms_per_tflop"] == 100.0
    # a request naming it is stored with the caller's coefficients (what the planner prices): the same plan
    # as the request with team-a's profile inline, not team-b's
    named = call(server, "team-a", "POST", "/v1/plans", {**plan_request([[10, 20]]), "profile": "team-a/next-h100"})
    assert named.status_code == 202, named.text
    mine = {**plan_request([[10, 20]]), "profile": profile("team-a/next-h100", 2.0)}
    theirs = {**plan_request([[10, 20]]), "profile": profile("team-a/next-h100", 100.0)}
    assert call(server, "team-a", "POST", "/v1/plans", mine).json()["id"] == named.json()["id"]
    assert call(server, "team-a", "POST", "/v1/plans", theirs).json()["id"] != named.json()["id"]


def test_listings_and_unknown_profile_errors_show_only_what_the_caller_may_name(server: LiveServer) -> None:
    call(server, "team-b", "POST", "/v1/profiles", profile("team-b/secret-cluster", 3.0))
    call(server, "team-a", "POST", "/v1/profiles", profile("team-a/mine", 3.0))
    names = {p["name"] for p in call(server, "team-a", "GET", "/v1/profiles").json()["profiles"]}
    assert "team-b/secret-cluster" not in names and set(bundled_profile_names()) <= names
    missing = call(server, "team-a", "GET", "/v1/profiles/team-b/secret-cluster")
    assert missing.status_code == 404 and "secret-cluster" not in missing.json()["detail"].split("known:")[1]
    refused = call(server, "team-a", "POST", "/v1/plans", {**plan_request([[5]]), "profile": "nope"})
    assert refused.status_code == 422 and refused.json()["field"] == "profile"
    assert "secret-cluster" not in refused.text and "team-a/mine" in refused.text


def test_a_tenant_s_uploads_are_bounded_and_another_tenant_s_are_not(server: LiveServer) -> None:
    codes = [
        call(server, "team-a", "POST", "/v1/profiles", profile(f"team-a/p{k}", 1.0 + k)).status_code for k in range(5)
    ]
    held = len(
        [p for p in call(server, "team-a", "GET", "/v1/profiles").json()["profiles"] if p["source"] == "uploaded"]
    )
    assert held == MAX_PROFILES and codes.count(429) >= 1
    refusal = call(server, "team-a", "POST", "/v1/profiles", profile("team-a/one-more", 9.0))
    assert refusal.status_code == 429 and refusal.json()["type"] == "urn:skrull:problem:quota-exceeded"
    assert call(server, "team-b", "POST", "/v1/profiles", profile("team-b/more", 9.0)).status_code == 201
