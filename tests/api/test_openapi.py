"""The published OpenAPI document under the default settings and with tokens (api/openapi.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skrull.api.app import create_app
from skrull.api.settings import Settings
from skrull.solver.planners.registry import planner_names


def published(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    doc: dict[str, Any] = create_app(Settings(db=str(tmp_path / "s.db"), solver_processes=0, **settings)).openapi()
    return doc


def operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{method.upper()} {path}": op for path, item in doc["paths"].items() for method, op in item.items()}


def test_the_default_server_publishes_its_default_limits_and_no_security(tmp_path: Path) -> None:
    doc = published(tmp_path)
    request = doc["components"]["schemas"]["PlanRequestIn"]["properties"]
    assert (request["batches"]["minItems"], request["batches"]["maxItems"]) == (1, 1024)
    assert request["batches"]["items"]["maxItems"] == 1_000_000
    assert [b.get("maximum") for b in request["time_budget_s"]["anyOf"]] == [600.0, 600.0, None]
    assert request["time_budget_s"]["anyOf"][2] == {"type": "null"}  # null or left out: the planner's default
    assert request["solver"]["enum"] == list(planner_names())
    for name in ("getPlan", "getRankView"):
        (op,) = [op for op in operations(doc).values() if op["operationId"] == name]
        (wait,) = [p for p in op["parameters"] if p["name"] == "wait"]
        assert (wait["schema"]["minimum"], wait["schema"]["maximum"]) == (0, 60.0)
    assert all("security" not in op and "401" not in op["responses"] for op in operations(doc).values())
    assert "securitySchemes" not in doc["components"]


def test_with_tokens_every_v1_operation_and_metrics_declare_bearer_security(tmp_path: Path) -> None:
    doc = published(tmp_path, submit_tokens="s3cret", read_tokens="r3ad")
    ops = operations(doc)
    guarded = {key for key, op in ops.items() if op.get("security") == [{"HTTPBearer": []}]}
    assert guarded == {key for key in ops if " /v1/" in key or key.endswith(" /metrics")}
    opened = operations(published(tmp_path, submit_tokens="s3cret", metrics_open=True))
    assert not any(key.endswith(" /metrics") and "security" in op for key, op in opened.items())
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert all("401" in ops[key]["responses"] for key in guarded)


def test_the_schema_says_what_the_readers_refuse_so_no_schema_valid_request_is_refused(tmp_path: Path) -> None:
    """``cp_modes`` is a non-empty list of distinct modes, and profile coefficients have the profile reader's
    bounds (a negative fixed cost, a zero ms_per_tflop, a bucket of 0 tokens are refused by it)."""
    schemas = published(tmp_path)["components"]["schemas"]
    (modes,) = [s for s in schemas["PlanRequestIn"]["properties"]["cp_modes"]["anyOf"] if s.get("type") == "array"]
    assert modes["minItems"] == 1 and modes["uniqueItems"] is True
    compute = schemas["ComputeModel"]["properties"]
    assert compute["fixed_ms"]["minimum"] == 0 and compute["ms_per_tflop"]["exclusiveMinimum"] == 0
    assert schemas["CommModel"]["properties"]["ms_per_mib"]["minimum"] == 0
    assert schemas["MemoryModel"]["properties"]["bucket_tokens"]["minimum"] == 1
    assert schemas["ProfileModel"]["properties"]["microbatch_ms"]["minimum"] == 0
