"""The one place where failures become ``application/problem+json`` answers (RFC 9457).

Every refusal names what was wrong: request errors carry ``field`` (a JSON path such as
``batches[0][2]``, or a query/path parameter name) and ``value``, with the reason in ``detail``.
Problem ``type`` values are stable URNs (``urn:skrull:problem:<slug>``) that clients can switch on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from skrull.api.store.base import (
    DamagedRecordError,
    IdempotencyConflictError,
    ProfileConflictError,
    ProfileQuotaError,
    is_store_unavailable,
)
from skrull.solver.errors import InfeasibleError, InvalidPlanError, PlannerBugError, RequestError, SkrullError

if TYPE_CHECKING:  # the web framework is imported where answers are rendered, so solver processes stay light
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.responses import Response

PROBLEM_MEDIA_TYPE = "application/problem+json"
_VALUE_LIMIT_CHARS = 200
#: Violations listed in an invalid-plan problem: enough to debug from, bounded so a broken plan of a
#: huge request does not make a huge answer.
PROBLEMS_LISTED = 20
_TYPE_TAGS = frozenset({"int", "float", "str", "bool", "none", "list", "dict"})

log = logging.getLogger("skrull.api")


def problem_type(slug: str) -> str:
    return f"urn:skrull:problem:{slug}"


def _json_value(value: Any) -> tuple[Any, str]:
    """The offending value for the problem document, and as JSON text for ``detail``; a large value (a whole
    batch list) is cut to a string of its first characters."""
    if isinstance(value, (bytes, bytearray)):  # a raw body: shown as text, never as a Python bytes literal
        value = bytes(value[:_VALUE_LIMIT_CHARS]).decode("utf-8", "replace")
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        value = repr(value)
        text = json.dumps(value)
    if len(text) <= _VALUE_LIMIT_CHARS:
        return value, text
    short = text[: _VALUE_LIMIT_CHARS - 3] + "..."
    return short, short


class ApiProblem(Exception):
    """An answer that is not a success, raised anywhere in a handler and rendered by ``problem_response``."""

    def __init__(
        self,
        *,
        status: int,
        slug: str,
        title: str,
        detail: str,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = headers or {}
        self.extensions = extensions

    def document(self, *, instance: str | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "type": problem_type(self.slug),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance is not None:
            doc["instance"] = instance
        doc.update(self.extensions)
        return doc


def invalid_field(
    field: str, value: Any, reason: str, *, status: int = 422, slug: str = "invalid-request"
) -> ApiProblem:
    """A refusal naming one field and its value (the service's form of ``solver.errors.RequestError``)."""
    title = {422: "invalid request", 404: "not found"}.get(status, "invalid request")
    shown, text = _json_value(value)
    return ApiProblem(
        status=status, slug=slug, title=title, detail=f"{field}: {text}: {reason}", field=field, value=shown
    )


def from_request_error(exc: RequestError, *, status: int = 422, slug: str = "invalid-request") -> ApiProblem:
    return invalid_field(exc.field, exc.value, exc.reason, status=status, slug=slug)


def from_skrull_error(exc: SkrullError) -> ApiProblem:
    """Map the planning library's user errors: request errors name the field; planner failures are 422
    too (the request cannot be planned); a plan given to the service that breaks the specification is 422."""
    if isinstance(exc, RequestError):
        return from_request_error(exc)
    if isinstance(exc, InvalidPlanError):
        return ApiProblem(
            status=422,
            slug="invalid-plan",
            title="the plan breaks the specification",
            detail=str(exc),
            problems=exc.problems[:PROBLEMS_LISTED],
        )
    if isinstance(exc, InfeasibleError):
        return ApiProblem(status=422, slug="infeasible", title="no plan found", detail=str(exc))
    return ApiProblem(status=422, slug="invalid-request", title="invalid request", detail=str(exc))


def from_planner_bug(exc: PlannerBugError) -> ApiProblem:
    """A planner made a plan the validator refuses: the service's own fault, 500, never a user error."""
    return ApiProblem(
        status=500,
        slug="planner-bug",
        title="the planner produced an invalid plan",
        detail=str(exc),
        solver=exc.solver,
        problems=exc.problems[:PROBLEMS_LISTED],
    )


def from_failure(exc: BaseException) -> ApiProblem:
    """Any failure of a solve as the problem stored with its job: user errors as their 4xx answer, a
    planner bug or any other exception as a 500."""
    if isinstance(exc, SkrullError):
        return from_skrull_error(exc)
    if isinstance(exc, PlannerBugError):
        return from_planner_bug(exc)
    return ApiProblem(
        status=500,
        slug="solver-error",
        title="the solver failed",
        detail=f"the solver raised {type(exc).__name__}: {exc}",
    )


def _loc_to_field(loc: Sequence[Any]) -> str:
    """FastAPI's error location (``("body", "batches", 0, 2)``) as a JSON path (``batches[0][2]``)."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    # a union member's error carries the member's type as a location part ("time_budget_s", "float")
    parts = [p for p in parts if isinstance(p, int) or (p not in _TYPE_TAGS and "[" not in str(p))]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out or str(loc[0] if loc else "body")


def from_validation_error(exc: RequestValidationError) -> ApiProblem:
    """One 422 naming the first mistake, every mistake under ``errors``. Unknown fields lead: a misspelt
    field (``paralel``) also makes the field it meant missing, and the cause is the misspelling."""
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    details = []
    for err in errors:
        loc = err.get("loc", ())
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            return ApiProblem(
                status=422,
                slug="malformed-json",
                title="malformed JSON",
                detail=f"body: malformed JSON at position {loc[-1] if loc else '?'}: {ctx.get('error', 'invalid')}",
                field="body",
                value=None,
            )
        missing = err.get("type") == "missing"  # pydantic's input is then the enclosing object
        value = None if missing else err.get("input")
        reason = "required field is missing" if missing else str(err.get("msg"))
        if err.get("type") == "extra_forbidden":  # the CLI's wording for the same mistake (solver.io)
            reason = "unknown field (a typo?); docs/formats.md lists the fields"
        details.append({"field": _loc_to_field(loc), "value": _json_value(value)[0], "reason": reason, "raw": value})
    first = details[0] if details else {"field": "body", "value": None, "reason": "invalid", "raw": None}
    problem = invalid_field(str(first["field"]), first["raw"], str(first["reason"]))
    for d in details:
        d.pop("raw")
    problem.extensions["errors"] = details
    return problem


def problem_response(problem: ApiProblem, *, instance: str | None = None) -> Response:
    from starlette.responses import Response

    body = json.dumps(problem.document(instance=instance)).encode()
    return Response(body, status_code=problem.status, media_type=PROBLEM_MEDIA_TYPE, headers=problem.headers)


def _documented_methods(request: Request) -> set[str]:
    """The methods the OpenAPI document lists for the request's path: path parameters match one segment;
    only where no template matches so do they match any text (``{name:path}`` profile names hold '/')."""
    import re

    paths = request.app.openapi().get("paths", {})
    for param in ("[^/]+", ".+"):
        methods: set[str] = set()
        for template, operations in paths.items():
            pattern = "".join(
                param if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]+\})", template)
            )
            if re.fullmatch(pattern, request.url.path):
                methods |= {m.upper() for m in operations if m.lower() in ("get", "post", "put", "patch", "delete")}
        if methods:
            return methods
    return set()


def _idempotency_problem(exc: IdempotencyConflictError) -> ApiProblem:
    return ApiProblem(
        status=409,
        slug="idempotency-key-reused",
        title="Idempotency-Key reused",
        detail=str(exc),
        field="Idempotency-Key",
        value=exc.key,
        plan_id=exc.job_id,
    )


def _profile_conflict_problem(exc: ProfileConflictError) -> ApiProblem:
    return ApiProblem(
        status=409, slug="profile-exists", title="profile exists", detail=str(exc), field="name", value=exc.name
    )


def _http_problem(request: Request, exc: StarletteHTTPException) -> ApiProblem:
    """The framework's own refusals (no route, wrong method, undecodable body) as problems."""
    if exc.status_code == 400:  # the body could not be decoded at all: the same answer as malformed JSON
        return ApiProblem(
            status=422,
            slug="malformed-json",
            title="malformed JSON",
            field="body",
            value=None,
            detail=f"body: malformed JSON: {exc.detail}",
        )
    slug = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}.get(exc.status_code, "http-error")
    detail = str(exc.detail)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method the API documents on this path, not only the first route's
        allowed = _documented_methods(request)
        if allowed:
            headers["Allow"] = ", ".join(sorted(allowed))
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route for {request.method} {request.url.path}"
    return ApiProblem(status=exc.status_code, slug=slug, title=slug.replace("-", " "), detail=detail, headers=headers)


def _damaged_problem(plan_id: str | None, reason: str) -> ApiProblem:
    what = f"the stored plan {plan_id}" if plan_id else "a stored record"
    return ApiProblem(
        status=410,
        slug="plan-damaged",
        title="stored plan damaged",
        detail=f"{what} is damaged and cannot be served ({reason}); DELETE it and submit the request again, "
        "or recover the store (docs/service-hardening.md)",
        plan_id=plan_id,
    )


#: Retry-After of a 503 ``store-unavailable``: a pooled connection is replaced, a lock released or a
#: server back within seconds, or the next try finds it still down and waits again.
STORE_RETRY_AFTER_S = 2


def store_unavailable(exc: BaseException) -> ApiProblem:
    """503 ``store-unavailable`` with ``Retry-After``: the store cannot answer now (``is_store_unavailable``)."""
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return ApiProblem(
        status=503,
        slug="store-unavailable",
        title="store unavailable",
        detail=f"the job store could not answer ({reason}); nothing was lost, retry after Retry-After",
        headers={"Retry-After": str(STORE_RETRY_AFTER_S)},
        retry_after_s=STORE_RETRY_AFTER_S,
    )


def _store_problem(request: Request, exc: Exception) -> ApiProblem:
    """The store failed underneath a request: unavailable (retry) or damaged pages (named, not internal)."""
    if is_store_unavailable(exc):
        log.warning("store unavailable on %s %s: %s", request.method, request.url.path, exc)
        return store_unavailable(exc)
    log.error("damaged store read on %s %s: %s", request.method, request.url.path, exc)
    plan_id = request.path_params.get("plan_id")
    return _damaged_problem(None if plan_id is None else str(plan_id), str(exc))


def _problem_for(request: Request, exc: Exception) -> ApiProblem:
    """The one mapping from an exception raised while answering a request to its problem."""
    import sqlite3

    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    if isinstance(exc, ApiProblem):
        return exc
    if isinstance(exc, (SkrullError, PlannerBugError)):
        return from_failure(exc)
    if isinstance(exc, RequestValidationError):
        return from_validation_error(exc)
    if isinstance(exc, IdempotencyConflictError):
        return _idempotency_problem(exc)
    if isinstance(exc, ProfileConflictError):
        return _profile_conflict_problem(exc)
    if isinstance(exc, ProfileQuotaError):
        return ApiProblem(
            status=429,
            slug="quota-exceeded",
            title="tenant quota exceeded",
            detail=str(exc),
            headers={"Retry-After": "60"},
            field="SKRULL_TENANT_MAX_PROFILES",
            limit=exc.limit,
            retry_after_s=60,
        )
    if isinstance(exc, StarletteHTTPException):
        return _http_problem(request, exc)
    if isinstance(exc, DamagedRecordError):
        return _damaged_problem(exc.job_id, exc.reason)
    if isinstance(exc, sqlite3.DatabaseError) or is_store_unavailable(exc):
        return _store_problem(request, exc)
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return ApiProblem(
        status=500, slug="internal-error", title="internal error", detail=f"the service failed: {type(exc).__name__}"
    )


def install_error_handlers(app: FastAPI, *, on_problem: Any = None) -> None:
    """Route every failure through ``problem_response``; ``on_problem(status, slug)`` counts them."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def handle(request: Request, exc: Exception) -> Response:
        problem = _problem_for(request, exc)
        if on_problem is not None:
            on_problem(problem.status, problem.slug)
        return problem_response(problem, instance=request.url.path)

    import sqlite3

    for kind in (
        ApiProblem,
        SkrullError,
        PlannerBugError,
        RequestValidationError,
        IdempotencyConflictError,
        ProfileConflictError,
        ProfileQuotaError,
        DamagedRecordError,
        sqlite3.DatabaseError,
        StarletteHTTPException,
        Exception,
    ):
        app.add_exception_handler(kind, handle)
