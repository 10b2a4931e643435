"""Access control: optional bearer tokens with two roles, and a per-token rate limit.

* No tokens configured (``SKRULL_SUBMIT_TOKENS`` and ``SKRULL_READ_TOKENS`` empty): the API is open, as
  on a trusted network.
* Tokens configured: every ``/v1`` request needs ``Authorization: Bearer <token>``. A token belongs to a
  tenant (``team-a=tokA``; ``api.tenants``), and a tenant sees only its own plans. ``/metrics`` needs a
  token too unless ``SKRULL_METRICS_OPEN=1``; ``/healthz`` stays open for probes.
* Failed authentications (no token, unknown token) are rate-limited per client address by default: after
  ``auth_failure_burst`` (20) failures, refilled at ``auth_failures_per_s`` (1/s), every authenticated
  request from that address answers 429 with ``Retry-After``, so tokens cannot be guessed at full speed
  (0 turns this off). A token that authenticated from that address before the lockout began keeps
  working: 20 bad tokens from one address (a shared NAT) cannot lock a team's valid token out, and a
  guesser still learns nothing of a token it never got right. The client address is the TCP peer's;
  ``X-Forwarded-For`` is believed only from the proxies ``SKRULL_FORWARDED_ALLOW_IPS`` names (none by
  default), so a made-up header cannot open a fresh bucket per request. A missing or unknown
  token answers 401 (with ``WWW-Authenticate: Bearer``); a read-only token (a GPU worker's) that tries
  to write (any method but GET/HEAD/OPTIONS: submit, upload a profile, compare) answers 403. Submit
  tokens may do everything.
* Rate limit (``SKRULL_RATE_LIMIT_PER_S`` > 0): a token bucket per token (per client address when no
  tokens are configured) holding ``rate_limit_burst`` requests and refilled at ``rate_limit_per_s``;
  an empty bucket answers 429 with ``Retry-After`` = the whole seconds until one request is allowed,
  ``ceil((1 - tokens) / rate)``. Buckets live in each server process: with N replicas behind a load
  balancer a token may make up to N times the rate.

Authentication runs before anything reads the body: ``Authenticate`` (ASGI middleware, outside the body
size limit and the JSON reader) checks every ``/v1`` request that carries a body from its headers alone,
and refuses one it does not accept without reading the body (``Connection: close``), so a client without
a token cannot make the server read, let alone parse, megabytes.

Every refusal is an ``ApiProblem``, rendered by the one error mapping (``api.errors``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skrull.api.errors import ApiProblem, invalid_field, problem_response
from skrull.api.settings import Settings
from skrull.api.tenants import DEFAULT_TENANT, owns
from skrull.solver.jsonsafe import check_text

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Buckets idle this long are forgotten (a full bucket is the same as none).
_FORGET_AFTER_S = 300.0
#: A token that authenticated from an address stays exempt from that address's lockout this long after
#: its last success; at most this many tokens are remembered per address.
_GOOD_TOKEN_S = 3600.0
_GOOD_TOKENS_PER_ADDRESS = 64
#: Where ``Authenticate`` leaves the caller's tenant for the route (``scope["state"]``).
TENANT_STATE = "skrull_tenant"

bearer = HTTPBearer(auto_error=False, description="a submit token, or a read-only worker token")


def _tenant_of(token: str, tokens: dict[str, str]) -> str | None:
    """The tenant of ``token`` among ``tokens`` ({token: tenant}), or None; constant-time comparisons, no
    early exit on the first match."""
    found: str | None = None
    for candidate, tenant in tokens.items():
        if hmac.compare_digest(token.encode(), candidate.encode()):
            found = tenant
    return found


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets by key; used from the event loop only (no locking needed)."""

    def __init__(self, *, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._buckets: dict[str, _Bucket] = {}
        self._last_sweep = time.monotonic()

    def _refilled(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), updated=now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate_per_s)
        bucket.updated = now
        if now - self._last_sweep > _FORGET_AFTER_S:
            self._sweep(now)
        return bucket

    def take(self, key: str, *, now: float | None = None) -> float:
        """0 when the request may go ahead, else the seconds until it may."""
        bucket = self._refilled(key, time.monotonic() if now is None else now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_s

    def wait_s(self, key: str, *, now: float | None = None) -> float:
        """What ``take`` would answer, without taking anything."""
        bucket = self._refilled(key, time.monotonic() if now is None else now)
        return 0.0 if bucket.tokens >= 1.0 else (1.0 - bucket.tokens) / self.rate_per_s

    def _sweep(self, now: float) -> None:
        self._last_sweep = now
        for key in [k for k, b in self._buckets.items() if now - b.updated > _FORGET_AFTER_S]:
            del self._buckets[key]


class AccessControl:
    """The settings' tokens and rate limit, checked by ``require_access`` on every /v1 route."""

    def __init__(self, settings: Settings) -> None:
        self.submit_tokens = settings.submit_token_tenants
        self.read_tokens = settings.read_token_tenants
        self.limiter = (
            RateLimiter(rate_per_s=settings.rate_limit_per_s, burst=settings.rate_limit_burst)
            if settings.rate_limit_per_s > 0
            else None
        )
        self.failures = (
            RateLimiter(rate_per_s=settings.auth_failures_per_s, burst=settings.auth_failure_burst)
            if settings.auth_failures_per_s > 0
            else None
        )
        self.metrics_open = settings.metrics_open
        #: {address key: {token fingerprint: monotonic time of its last success}}
        self._good: dict[str, dict[str, float]] = {}
        self._good_swept = time.monotonic()

    @property
    def enabled(self) -> bool:
        return bool(self.submit_tokens or self.read_tokens)

    def check(self, *, method: str, token: str | None, client: str) -> str:
        """Raise the 401/403/429 problem for this request, or return the caller's tenant
        (``api.tenants``; the default tenant when no tokens are configured)."""
        key = f"address:{client}"
        tenant = DEFAULT_TENANT
        if self.enabled:
            if not self._remembered(key, token):
                self._refuse_guessing(key)
            if token is None:
                self._failed(key)
                raise ApiProblem(
                    status=401,
                    slug="unauthorized",
                    title="authentication required",
                    detail="this service needs Authorization: Bearer <token> (a submit token or a read-only token)",
                    headers={"WWW-Authenticate": 'Bearer realm="skrull"'},
                )
            submit_tenant = _tenant_of(token, self.submit_tokens)
            read_tenant = _tenant_of(token, self.read_tokens)
            if submit_tenant is not None:
                role, tenant = "submit", submit_tenant
            elif read_tenant is not None:
                role, tenant = "read", read_tenant
            else:
                self._failed(key)
                raise ApiProblem(
                    status=401,
                    slug="unauthorized",
                    title="unknown token",
                    detail="the bearer token is not one this service accepts",
                    headers={"WWW-Authenticate": 'Bearer realm="skrull", error="invalid_token"'},
                )
            if role == "read" and method not in READ_METHODS:
                raise ApiProblem(
                    status=403,
                    slug="forbidden",
                    title="read-only token",
                    detail=f"{method} needs a submit token; this token may only read plans, rank views and profiles",
                )
            self._remember(key, token)
            key = f"token:{_fingerprint(token)}"
        if self.limiter is not None:
            wait_s = self.limiter.take(key)
            if wait_s > 0:
                retry_after = max(1, math.ceil(wait_s))
                raise ApiProblem(
                    status=429,
                    slug="rate-limited",
                    title="too many requests",
                    detail=f"more than {self.limiter.rate_per_s:g} requests per second (burst "
                    f"{self.limiter.burst}) for this {'token' if self.enabled else 'client'} "
                    "(SKRULL_RATE_LIMIT_PER_S); retry after Retry-After",
                    headers={"Retry-After": str(retry_after)},
                    retry_after_s=retry_after,
                )
        return tenant

    def _refuse_guessing(self, address_key: str) -> None:
        """429 for every authenticated request from an address whose failed authentications used up their
        bucket, before its token is looked at: a guesser learns nothing more until the bucket refills."""
        if self.failures is None:
            return
        wait_s = self.failures.wait_s(address_key)
        if wait_s > 0:
            retry_after = max(1, math.ceil(wait_s))
            raise ApiProblem(
                status=429,
                slug="rate-limited",
                title="too many failed authentications",
                detail=f"more than {self.failures.burst} failed authentications from this address, refilled at "
                f"{self.failures.rate_per_s:g} per second (SKRULL_AUTH_FAILURES_PER_S); retry after Retry-After",
                headers={"Retry-After": str(retry_after)},
                retry_after_s=retry_after,
            )

    def _failed(self, address_key: str) -> None:
        if self.failures is not None:
            self.failures.take(address_key)

    def _remember(self, address_key: str, token: str) -> None:
        """Note that ``token`` authenticated from this address (only while a failure limit is in force)."""
        if self.failures is None:
            return
        now = time.monotonic()
        good = self._good.setdefault(address_key, {})
        good[_fingerprint(token)] = now
        if len(good) > _GOOD_TOKENS_PER_ADDRESS:
            del good[min(good, key=good.__getitem__)]
        if len(self._good) > 4 * _GOOD_TOKENS_PER_ADDRESS and now - self._good_swept > _FORGET_AFTER_S:
            self._good_swept = now
            for address in [a for a, g in self._good.items() if now - max(g.values()) > _GOOD_TOKEN_S]:
                del self._good[address]

    def _remembered(self, address_key: str, token: str | None) -> bool:
        """Whether ``token`` authenticated from this address within ``_GOOD_TOKEN_S`` (its fingerprint is
        looked up; the token itself is compared in constant time afterwards as for any request)."""
        if token is None or self.failures is None:
            return False
        seen = self._good.get(address_key, {}).get(_fingerprint(token))
        return seen is not None and time.monotonic() - seen <= _GOOD_TOKEN_S

    def tenant_for(self, *, method: str, headers: list[tuple[bytes, bytes]], client: str) -> str:
        """``check`` from raw ASGI headers (``Authenticate``)."""
        return self.check(method=method, token=bearer_token(headers), client=client)


def _fingerprint(token: str) -> str:
    """A stable digest naming a token in buckets (``hash()`` is salted per process and collides more)."""
    return hashlib.sha256(b"skrull-token\0" + token.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The credentials of ``Authorization: Bearer <token>`` as ``HTTPBearer(auto_error=False)`` reads
    them: the scheme case-insensitive, anything else none."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
            credentials = credentials.strip()
            if scheme.lower() == "bearer" and credentials:
                return credentials
            return None
    return None


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


#: The routes that read a request body (method, path); any other request that brings one is answered without
#: reading it (``Authenticate``).
BODY_ROUTES = frozenset({("POST", "/v1/plans"), ("POST", "/v1/compare"), ("POST", "/v1/profiles")})


def declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request says a body follows (a ``Content-Length`` other than 0, or chunked)."""
    for name, value in headers:
        if name == b"transfer-encoding":
            return True
        if name == b"content-length" and value.strip() not in (b"0", b""):
            return True
    return False


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class Authenticate:
    """ASGI middleware, first to see a request after the connection's bookkeeping.

    * A request that brings a body to a route that takes none (``/healthz``, ``/metrics``, an unknown path or
      method, ``//v1/plans``, a GET with a body) is answered as if it had none: its body is never read, let
      alone parsed, and the connection is closed after the answer (``Connection: close``, the unread bytes
      go with it). Only ``BODY_ROUTES`` read bodies.
    * A ``/v1`` request with a body is authenticated from its headers before the body
    size limit and the JSON reader see it. A refusal (401, 403, 429) is answered at once with
    ``Connection: close``, its body never read; an accepted caller's tenant is left in the request state
    for ``require_access``. Requests without a body are checked by ``require_access`` as before."""

    def __init__(
        self, app: ASGIApp, *, access: AccessControl, on_problem: Callable[[int, str], None] | None = None
    ) -> None:
        self.app = app
        self.access = access
        self.on_problem = on_problem

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["method"], scope.get("path")) not in BODY_ROUTES:
            headers = list(scope.get("headers") or ())
            if declares_body(headers):
                scope["headers"] = [(n, v) for n, v in headers if n not in (b"content-length", b"transfer-encoding")]
                await self.app(scope, _no_body, _closing(send))
                return
        if (
            scope["type"] != "http"
            or scope["method"] in READ_METHODS
            or not str(scope.get("path", "")).startswith("/v1/")
        ):
            await self.app(scope, receive, send)
            return
        try:
            tenant = self.access.tenant_for(
                method=scope["method"], headers=list(scope.get("headers") or ()), client=client_address(scope)
            )
        except ApiProblem as problem:
            if self.on_problem is not None:
                self.on_problem(problem.status, problem.slug)
            problem.headers["Connection"] = "close"
            await problem_response(problem, instance=scope.get("path"))(scope, receive, send)
            return
        scope.setdefault("state", {})[TENANT_STATE] = tenant
        await self.app(scope, receive, send)


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` added to the answer's headers."""

    async def send_closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(n, v) for n, v in message.get("headers", []) if n.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return send_closing


async def require_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """FastAPI dependency of every /v1 router (a request ``Authenticate`` checked already is not counted
    twice)."""
    tenant = request.scope.get("state", {}).get(TENANT_STATE)
    if tenant is not None:
        request.state.tenant = tenant
        return
    access: AccessControl = request.app.state.access
    token = credentials.credentials if credentials is not None else None
    client = request.client.host if request.client is not None else "unknown"
    request.state.tenant = access.check(method=request.method, token=token, client=client)


def caller_tenant(request: Request) -> str:
    """The tenant ``require_access`` found for this request."""
    tenant: str = getattr(request.state, "tenant", DEFAULT_TENANT)
    return tenant


async def require_metrics_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """``/metrics`` needs a token (any tenant's, submit or read) when the service has tokens, unless
    ``SKRULL_METRICS_OPEN`` says scrapers may read it without one."""
    access: AccessControl = request.app.state.access
    if access.enabled and not access.metrics_open:
        await require_access(request, credentials)


async def require_plan_of_tenant(request: Request, plan_id: str) -> None:
    """FastAPI dependency of every route naming a plan: 404, as for an unknown id, unless ``plan_id`` is
    one of the caller's tenant's plans. A plan id holding NUL or a lone surrogate is a 422 naming it."""
    check_text(plan_id, "plan_id")
    if not owns(caller_tenant(request), plan_id):
        raise invalid_field("plan_id", plan_id, "no such plan", status=404, slug="unknown-plan")
