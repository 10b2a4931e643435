"""The published OpenAPI document: what FastAPI derives from the routes and models, plus what this server
enforces and the models cannot know, so generated clients and fuzzers agree with the server.

FastAPI writes the document from the pydantic models, which check shape and JSON types only; meaning is
checked by the one request reader of the planning library (``solver.io.request_from_dict``) and the
limits by ``api.limits`` from the server's settings. Both are declared here, in the document alone, so
the checks themselves stay in one place each:

* the library's fixed ranges (``solver.io``): token lengths in ``1..MAX_TOKENS``, ``dp`` and ``cp`` in
  ``1..MAX_DEGREE``, ``time_budget_s`` in ``(0, MAX_TIME_BUDGET_S]``, ``seed >= 0``, ``bucket_tokens >= 1``,
  non-empty ``batches`` and non-empty batches, ``backend`` one of ``BACKENDS``, ``solver`` a registered
  planner;
* the settings in force (``SKRULL_MAX_*``): ``wait`` at most ``max_wait_s``, ``batches`` at most
  ``max_iterations`` items and ``max_sequences`` lengths per batch, ``time_budget_s`` at most
  ``max_time_budget_s``, ``dp`` and ``cp`` at most ``max_gpus`` each (their product is checked too, which
  JSON Schema cannot say), ``solvers`` of a compare 1..``max_compare_solvers`` registered names;
* bearer authentication only when the server runs with tokens (``SKRULL_SUBMIT_TOKENS`` /
  ``SKRULL_READ_TOKENS``): without them the API is open, and declaring a security requirement would
  promise a 401 that never comes.

What a schema cannot express stays a documented 422: a sequence longer than ``cp * bucket_tokens``,
less the gathered K/V where only all-gather can run it (no planner can place it; solver/io.py), a time
budget too small for the planner and the request, an unknown
profile name or a malformed inline profile, ``dp * cp`` over the GPU limit.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from skrull.api.schemas import CompareRequestIn, PlanRequestIn
from skrull.api.settings import Settings
from skrull.solver.io import BACKENDS, MAX_DEGREE, MAX_TIME_BUDGET_S, MAX_TOKENS
from skrull.solver.planners.registry import planner_names

#: Request-body models whose fields carry a planning request (``PlanRequestIn`` and its subclass).
REQUEST_MODELS = ("PlanRequestIn", "CompareRequestIn")
#: Query parameters that long-poll (``api.limits.check_wait``).
WAIT_PARAMETER = "wait"
SECURITY_SCHEME = "HTTPBearer"


def _request_constraints(props: dict[str, Any], settings: Settings) -> None:
    batches = props["batches"]
    lengths = batches["items"]
    lengths["items"].update({"minimum": 1, "maximum": MAX_TOKENS})
    lengths.update({"minItems": 1, "maxItems": settings.max_sequences})
    batches.update({"minItems": 1, "maxItems": settings.max_iterations})
    max_budget_s = min(settings.max_time_budget_s, MAX_TIME_BUDGET_S)
    budget = props["time_budget_s"]
    for branch in budget.get("anyOf", [budget]):
        if branch.get("type") != "null":  # null or left out: the planner's default
            branch.update({"exclusiveMinimum": 0, "maximum": max_budget_s})
    props["solver"]["enum"] = list(planner_names())
    props["seed"].update({"minimum": 0, "maximum": 2**63 - 1})
    for name, extra in (
        ("bucket_tokens", {"minimum": 1, "maximum": MAX_TOKENS}),
        ("backend", {"enum": list(BACKENDS)}),
    ):
        prop = props[name]
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") != "null":
                branch.update(extra)
    if "solvers" in props:
        names = {"type": "string", "enum": list(planner_names())}
        props["solvers"]["anyOf"] = [
            {"type": "array", "items": names, "minItems": 1, "maxItems": settings.max_compare_solvers},
            {"type": "null"},
        ]


def published_openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """The document served at ``/openapi.json`` for a server running with ``settings`` (built once)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
        servers=app.servers,
    )
    schemas = doc["components"]["schemas"]
    for body_model in (PlanRequestIn, CompareRequestIn):  # read by the routes themselves (api.limits)
        body_doc = body_model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in body_doc.pop("$defs", {}).items():
            schemas.setdefault(name, sub)
        schemas.setdefault(body_model.__name__, body_doc)
    for model in REQUEST_MODELS:
        if model in schemas:
            _request_constraints(schemas[model]["properties"], settings)
    max_degree = min(settings.max_gpus, MAX_DEGREE)
    for degree in ("dp", "cp"):
        schemas["ParallelModel"]["properties"][degree]["maximum"] = max_degree
    for path in doc["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", ()):
                if parameter["in"] == "query" and parameter["name"] == WAIT_PARAMETER:
                    parameter["schema"]["maximum"] = settings.max_wait_s
            open_metrics = settings.metrics_open and operation.get("operationId") == "metrics"
            if not (settings.submit_token_set or settings.read_token_set) or open_metrics:
                operation.pop("security", None)
                for code in ("401", "403"):
                    operation.get("responses", {}).pop(code, None)
    if not (settings.submit_token_set or settings.read_token_set):
        doc["components"].pop("securitySchemes", None)
    app.openapi_schema = doc
    return doc
