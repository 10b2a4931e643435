"""The service's limits, each refused with a problem that quotes the value and the limit in force.

* Body size: refused before it is read when ``Content-Length`` is too large, and while it is read
  otherwise (chunked bodies), with 413.
* Sequences, iterations, GPUs per request and the time budget: 422 naming the field.
* Long-poll waits: 422 naming ``wait``.
* Request bodies (``JsonBody``): 415 unless the ``Content-Type`` is JSON; hostile JSON (nesting deeper
  than ``MAX_JSON_DEPTH``, NaN/Infinity, integers beyond 2^53, duplicate keys) 422 naming the JSON path,
  checked by the one JSON reader of the planning library before anything else sees the body. The body is
  parsed once, in a worker thread (a 7 MB body takes about 2 s to read safely; on the event loop it
  would stall every other request meanwhile), and the parsed document is handed to the route
  (``parsed_body``), which validates it against its model in a worker thread too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skrull.api.errors import ApiProblem, from_request_error, invalid_field, problem_response
from skrull.api.schemas import PlanRequestIn
from skrull.api.settings import Settings
from skrull.solver.budget import check_budget, smallest_budget_s
from skrull.solver.errors import RequestError
from skrull.solver.jsonsafe import MalformedJsonError, loads_json
from skrull.solver.types import Parallel, defers

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: Where ``JsonBody`` leaves the parsed document for the route (``scope["state"]``).
PARSED_BODY_STATE = "skrull_json_body"
_NO_BODY = object()
ModelT = TypeVar("ModelT", bound=BaseModel)


def _too_large(max_bytes: int, got: int | None) -> str:
    got_text = f"{got} bytes" if got is not None else "more"
    return f"the request body has {got_text}; at most {max_bytes} bytes are accepted (SKRULL_MAX_BODY_BYTES)"


class BodySizeLimit:
    """ASGI middleware refusing bodies over ``max_bytes`` with 413 problem+json."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, on_problem: Callable[[int, str], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_problem = on_problem

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    problem = ApiProblem(
                        status=413,
                        slug="body-too-large",
                        title="body too large",
                        detail=_too_large(self.max_bytes, declared),
                        limit_bytes=self.max_bytes,
                    )
                    if self.on_problem is not None:
                        self.on_problem(413, problem.slug)
                    await problem_response(problem, instance=scope.get("path"))(scope, receive, send)
                    return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, detail=_too_large(self.max_bytes, None))
            return message

        await self.app(scope, counting_receive, send)


def is_json_media_type(content_type: str) -> bool:
    """``application/json`` or any ``application/<x>+json``, parameters (charset) ignored."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class JsonBody:
    """ASGI middleware: a request body must be JSON (else 415) and pass ``solver.jsonsafe.loads_json``
    (else 422 naming the JSON path) before any handler parses it. The body is read here (its size is
    bounded by ``BodySizeLimit`` outside) and handed on unchanged."""

    def __init__(self, app: ASGIApp, *, on_problem: Callable[[int, str], None] | None = None) -> None:
        self.app = app
        self.on_problem = on_problem

    async def _refuse(self, problem: ApiProblem, scope: Scope, receive: Receive, send: Send) -> None:
        if self.on_problem is not None:
            self.on_problem(problem.status, problem.slug)
        await problem_response(problem, instance=scope.get("path"))(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except HTTPException as exc:  # the size limit, raised while reading (outside the routes' handlers)
            problem = ApiProblem(
                status=exc.status_code, slug="body-too-large", title="body too large", detail=str(exc.detail)
            )
            await self._refuse(problem, scope, receive, send)
            return
        body = b"".join(chunks)
        if body:
            content_type = ""
            for name, value in scope.get("headers", ()):
                if name == b"content-type":
                    content_type = value.decode("latin-1")
            if not is_json_media_type(content_type):
                problem = ApiProblem(
                    status=415,
                    slug="unsupported-media-type",
                    title="unsupported media type",
                    detail=f"Content-Type: {content_type or '(none)'}: the body must be JSON (application/json)",
                    field="Content-Type",
                    value=content_type or None,
                )
                await self._refuse(problem, scope, receive, send)
                return
            try:
                parsed = await run_in_threadpool(loads_json, body)
            except RequestError as exc:
                slug = "malformed-json" if isinstance(exc, MalformedJsonError) else "invalid-request"
                await self._refuse(from_request_error(exc, slug=slug), scope, receive, send)
                return
            scope.setdefault("state", {})[PARSED_BODY_STATE] = parsed
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def parsed_body(request: Request) -> Any:
    """The request's JSON document as ``JsonBody`` parsed it (off the event loop); read and parsed here, in a
    worker thread, where no ``JsonBody`` ran. An empty body is ``_NO_BODY``."""
    state = request.scope.get("state", {})
    if PARSED_BODY_STATE in state:
        return state[PARSED_BODY_STATE]
    raw = await request.body()
    if not raw:
        return _NO_BODY
    try:
        return await run_in_threadpool(loads_json, raw)
    except RequestError as exc:
        slug = "malformed-json" if isinstance(exc, MalformedJsonError) else "invalid-request"
        raise from_request_error(exc, slug=slug) from None


async def validated_body(request: Request, model: type[ModelT]) -> ModelT:
    """The body as ``model``, validated in a worker thread; mistakes are the same 422 FastAPI gives for a
    body parameter (``RequestValidationError``, locations under ``body``)."""
    from fastapi.exceptions import RequestValidationError

    doc = await parsed_body(request)
    if doc is _NO_BODY:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return await run_in_threadpool(model.model_validate, doc)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=doc) from None


def check_request_limits(body: PlanRequestIn, settings: Settings) -> None:
    """Refuse requests over the configured size limits (422 naming the field and the value)."""
    if len(body.batches) > settings.max_iterations:
        raise invalid_field(
            "batches",
            len(body.batches),
            f"a request may hold at most {settings.max_iterations} batches (iterations) (SKRULL_MAX_ITERATIONS)",
            slug="limit-exceeded",
        )
    num_sequences = sum(len(b) for b in body.batches)
    if num_sequences > settings.max_sequences:
        raise invalid_field(
            "batches",
            num_sequences,
            f"a request may hold at most {settings.max_sequences} sequences over all batches (SKRULL_MAX_SEQUENCES)",
            slug="limit-exceeded",
        )
    num_gpus = body.parallel.dp * body.parallel.cp
    if num_gpus > settings.max_gpus:
        raise invalid_field(
            "parallel",
            body.parallel.model_dump(),
            f"dp * cp = {num_gpus} GPUs; at most {settings.max_gpus} are accepted (SKRULL_MAX_GPUS)",
            slug="limit-exceeded",
        )
    parallel = Parallel(dp=body.parallel.dp, cp=body.parallel.cp)
    batch_sizes = [len(b) for b in body.batches]
    deferring = defers(None if body.defer is None else body.defer.max_sequences)
    if body.time_budget_s is None:  # the planner's default for this size; more than the server allows is refused
        need_s = smallest_budget_s(body.solver, batch_sizes, parallel, deferring=deferring)
        if need_s > settings.max_time_budget_s:
            raise invalid_field(
                "time_budget_s",
                None,
                f"not given; {body.solver!r} needs at least {need_s:.2g} s for {sum(batch_sizes)} sequences, "
                f"more than the {settings.max_time_budget_s:g} s this server allows (SKRULL_MAX_TIME_BUDGET_S); "
                "split the request or choose a faster solver",
                slug="limit-exceeded",
            )
        return
    if body.time_budget_s > settings.max_time_budget_s:
        raise invalid_field(
            "time_budget_s",
            body.time_budget_s,
            f"at most {settings.max_time_budget_s} s may be asked for (SKRULL_MAX_TIME_BUDGET_S)",
            slug="limit-exceeded",
        )
    try:  # a budget the planner cannot keep is refused now, not after a hard timeout
        check_budget(body.solver, batch_sizes, float(body.time_budget_s), parallel, deferring=deferring)
    except RequestError as exc:
        raise from_request_error(exc, slug="budget-too-small") from None


def check_wait(wait_s: float, settings: Settings) -> float:
    if wait_s > settings.max_wait_s:
        raise invalid_field(
            "wait",
            wait_s,
            f"a long-poll may wait at most {settings.max_wait_s} s (SKRULL_MAX_WAIT_S)",
            slug="limit-exceeded",
        )
    return wait_s
