"""What every router needs: the service object and the OpenAPI description of problem answers."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from skrull.api.errors import PROBLEM_MEDIA_TYPE
from skrull.api.schemas import ProblemModel
from skrull.api.service import Service

JSON = "application/json"


def service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for problem+json answers."""
    descriptions = {
        404: "unknown plan, rank, iteration or profile (the detail names the valid range)",
        409: "conflict (Idempotency-Key reused, profile exists, plan failed)",
        413: "request body too large (or a rank view page over SKRULL_MAX_VIEW_TOKENS)",
        415: "the body is not JSON (Content-Type must be application/json)",
        422: "invalid request: names the field and the value",
        503: "queue full or service unavailable; retry after Retry-After",
        504: "timed out",
    }
    return {
        code: {
            "model": ProblemModel,
            "description": descriptions.get(code, "problem"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemModel"}}},
        }
        for code in codes
    }


def body_schema(model: str) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON request body of the named model: routes read their bodies
    themselves (``api.limits.validated_body``, off the event loop), so FastAPI does not see the model and
    ``api.openapi`` adds its schema to the components."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
        }
    }
