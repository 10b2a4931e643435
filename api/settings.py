"""Service settings: defaults, then environment variables ``SKRULL_<NAME>``, then command-line flags.

Every limit the service enforces lives here, so a refusal can quote the number in force.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from skrull.api.sizes import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_ITERATION_TOKENS,
    DEFAULT_MAX_PICTURE_BARS,
    DEFAULT_MAX_PLAN_BYTES,
    DEFAULT_MAX_PLAN_TOKENS,
    DEFAULT_MAX_VIEW_TOKENS,
)
from skrull.api.tenants import parse_tokens


def _default_solver_processes() -> int:
    """One solver process per CPU but one, which is left to the HTTP server (at least one)."""
    return max(1, (os.cpu_count() or 2) - 1)


class Settings(BaseSettings):
    """The service's configuration (environment prefix ``SKRULL_``, e.g. ``SKRULL_DB=/data/skrull.db``)."""

    model_config = SettingsConfigDict(env_prefix="SKRULL_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on")
    db: str = Field(
        "skrull.db",
        description="job store: a SQLite file (WAL mode; created if missing), or a postgresql:// URL shared by "
        "API replicas and solver workers on many machines",
    )
    pg_pool_size: int = Field(10, ge=1, description="PostgreSQL connections per server process")
    sqlite_synchronous: str = Field(
        "NORMAL",
        pattern="^(NORMAL|FULL)$",
        description="SQLite synchronous mode: NORMAL survives any process crash; FULL also a power loss",
    )

    solver_processes: int = Field(
        default_factory=_default_solver_processes, ge=0, description="solver processes (0: accept, never solve)"
    )
    short_solver_processes: int = Field(
        1,
        ge=0,
        description="solver processes kept for short work, besides solver_processes (none when that is 0): they "
        "take only jobs whose time_budget_s is at most short_job_budget_s, so a short job of any tenant starts "
        "while long solves hold every other process",
    )
    short_job_budget_s: float = Field(
        10.0, gt=0, description="the largest time_budget_s a solver process kept for short work takes"
    )
    lease_s: float = Field(15.0, gt=0, description="a claimed job's lease; renewed every lease_s/3 while solving")
    max_attempts: int = Field(2, ge=1, description="claims per job: 2 means a job whose process dies is retried once")
    solve_timeout_factor: float = Field(3.0, ge=1, description="hard limit = factor * time_budget_s + grace")
    solve_timeout_grace_s: float = Field(10.0, ge=0, description="hard limit = factor * time_budget_s + grace")
    supervise_interval_s: float = Field(0.5, gt=0, description="how often leases and deadlines are checked")
    idle_poll_s: float = Field(1.0, gt=0, description="an idle solver process re-checks the queue this often")
    plugins: str = Field("", description="comma-separated modules imported at start (they may register planners)")

    max_body_bytes: int = Field(8 * 2**20, ge=1024, description="largest request body accepted")
    max_profile_bytes: int = Field(
        65_536,
        ge=1024,
        description="stored size of an uploaded profile (canonical JSON); larger: 422 limit-exceeded",
    )
    max_sequences: int = Field(1_000_000, ge=1, description="sequences per request, over all batches")
    max_iterations: int = Field(1024, ge=1, description="batches (iterations) per request")
    max_gpus: int = Field(65_536, ge=1, description="dp * cp of a request")
    max_time_budget_s: float = Field(600.0, gt=0, description="largest time_budget_s a request may ask for")
    max_wait_s: float = Field(60.0, ge=0, description="longest long-poll (?wait=S) a request may ask for")
    max_queued_jobs: int = Field(100_000, ge=1, description="queued jobs beyond which submissions get 503")
    tenant_max_queued_jobs: int = Field(
        10_000,
        ge=1,
        description="queued jobs one tenant may hold (each tenant its own; beyond: 429 quota-exceeded), so one "
        "team cannot fill the shared queue",
    )
    tenant_max_solver_s: float = Field(
        7_200.0,
        gt=0,
        description="solver seconds one tenant may hold: the time budgets of its queued and solving jobs together "
        "(beyond: 429 quota-exceeded)",
    )
    tenant_max_compares: int = Field(
        2, ge=1, description="compares one tenant may have running or waiting at once (beyond: 429 quota-exceeded)"
    )
    tenant_queue_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the share of max_queued_jobs one tenant may hold (beyond: 429 quota-exceeded), so another "
        "tenant's submission finds room in the shared queue",
    )
    tenant_max_profiles: int = Field(100, ge=1, description="uploaded profiles one tenant may hold (beyond: 429)")
    tenant_max_idempotency_keys: int = Field(
        10_000,
        ge=1,
        description="Idempotency-Keys kept per tenant; past it the tenant's oldest keys are forgotten (a resubmission "
        "of the same request still answers the same plan: ids are content addresses)",
    )
    tenant_max_long_polls: int = Field(
        1_000,
        ge=1,
        description="long-polls (?wait=S) one tenant may have waiting on one server at once (beyond: 429 "
        "quota-exceeded with Retry-After), its share of limit_concurrency",
    )
    max_compare_solvers: int = Field(16, ge=1, description="solvers per POST /v1/compare")
    compare_processes: int = Field(
        2,
        ge=1,
        description="processes that run POST /v1/compare; one tenant runs at most half of them at once (at least "
        "one), so another tenant's compare does not wait behind it",
    )
    rank_view_cache_entries: int = Field(65_536, ge=0, description="rendered rank views kept in memory")
    cache_bytes: int = Field(
        DEFAULT_CACHE_BYTES,
        ge=0,
        description="memory for cached rank views, parsed iterations and request lengths together (bytes)",
    )
    max_view_tokens: int = Field(
        DEFAULT_MAX_VIEW_TOKENS,
        ge=1024,
        description="JSON tokens (values) per rank-view answer; a longer view is served in pages (?page=k)",
    )
    max_plan_tokens: int = Field(
        DEFAULT_MAX_PLAN_TOKENS,
        ge=1024,
        description="JSON tokens (values) of a whole plan document; a larger plan fails (422)",
    )
    max_plan_bytes: int = Field(
        DEFAULT_MAX_PLAN_BYTES,
        ge=65_536,
        description="bytes of a whole plan document (and of each iteration); a larger plan fails (422). It bounds "
        "the memory one envelope reader costs",
    )
    max_iteration_tokens: int = Field(
        DEFAULT_MAX_ITERATION_TOKENS,
        ge=1024,
        description="JSON tokens of one iteration (what rank views are rendered from); a larger one fails (422)",
    )
    max_queued_compares: int = Field(
        4, ge=0, description="POST /v1/compare requests waiting for a compare process; beyond: 503"
    )
    max_compare_sequences: int = Field(
        20_000, ge=1, description="sequences per POST /v1/compare (it runs every planner, the exact ones included)"
    )
    plan_retention_s: float = Field(
        0.0, ge=0, description="delete solved and failed plans this long after they finished; 0 keeps them forever"
    )
    retention_sweep_s: float = Field(60.0, gt=0, description="how often expired plans are deleted")
    limit_concurrency: int = Field(
        8192,
        ge=1,
        description="open connections and running requests beyond which new ones get 503 (uvicorn); the "
        "server raises its open-files limit to fit it where the hard limit allows",
    )
    write_timeout_s: float = Field(
        30.0, gt=0, description="an answer must drain to the client within this; a client that stops reading is cut off"
    )
    timeout_keep_alive_s: float = Field(5.0, gt=0, description="idle keep-alive connections are closed after this")
    request_read_timeout_s: float = Field(
        15.0, gt=0, description="a request's headers and body must arrive within this; slower connections are closed"
    )
    max_header_bytes: int = Field(
        65_536, ge=4096, description="largest request line plus headers (h11_max_incomplete_event_size)"
    )
    log_level: str = Field("info", description="uvicorn log level")

    submit_tokens: str = Field(
        "",
        description="comma-separated bearer tokens that may submit, upload profiles, compare and read, each "
        "optionally named by its tenant (team-a=tokA; unnamed tokens form the default tenant: plans are "
        "visible only inside their tenant); when this or read_tokens is set, every /v1 and /metrics request "
        "needs a token (401 without, 403 for a read-only token that writes)",
        repr=False,
    )
    read_tokens: str = Field(
        "",
        description="comma-separated read-only bearer tokens (GPU workers fetching plans), optionally named by "
        "tenant like submit_tokens (team-a=tokAr)",
        repr=False,
    )
    rate_limit_per_s: float = Field(
        0.0, ge=0, description="requests per second per token (per client address without tokens); 0: unlimited"
    )
    max_picture_bars: int = Field(
        DEFAULT_MAX_PICTURE_BARS,
        ge=1,
        description="bars (one per GPU per microbatch) a timeline picture may draw; more: 413",
    )
    max_picture_bytes: int = Field(
        8 * 2**20,
        ge=65_536,
        description="bytes a timeline picture (and the /view page's picture) may have; more: 413 (estimated before "
        "drawing)",
    )
    rate_limit_burst: int = Field(50, ge=1, description="requests a token may make at once before the rate applies")
    auth_failures_per_s: float = Field(
        1.0,
        ge=0,
        description="failed authentications (no or unknown token) refilled per second per client address; once "
        "auth_failure_burst are used up, the address gets 429 before its token is checked; 0: unlimited",
    )
    auth_failure_burst: int = Field(20, ge=1, description="failed authentications an address may make at once")
    forwarded_allow_ips: str = Field(
        "",
        description="comma-separated addresses of the reverse proxies whose X-Forwarded-For / X-Forwarded-Proto "
        "are believed (uvicorn forwarded_allow_ips; '*' believes anyone); empty (default): forwarded headers "
        "are ignored and the client address is the TCP peer's, so a made-up header cannot dodge per-address "
        "limits",
    )
    metrics_open: bool = Field(
        False, description="serve /metrics without a token even when tokens are configured (for scrapers)"
    )

    @field_validator("db", mode="before")
    @classmethod
    def _db_text(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value

    @property
    def submit_token_tenants(self) -> dict[str, str]:
        """``{token: tenant}`` of ``submit_tokens`` (``team-a=tokA``; unnamed tokens: the default tenant)."""
        return parse_tokens(self.submit_tokens, field="SKRULL_SUBMIT_TOKENS")

    @property
    def read_token_tenants(self) -> dict[str, str]:
        return parse_tokens(self.read_tokens, field="SKRULL_READ_TOKENS")

    @property
    def submit_token_set(self) -> frozenset[str]:
        return frozenset(self.submit_token_tenants)

    @property
    def read_token_set(self) -> frozenset[str]:
        return frozenset(self.read_token_tenants)

    @property
    def plugin_modules(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.plugins.split(",") if m.strip())

    def hard_limit_s(self, time_budget_s: float) -> float:
        """Wall-clock limit after which a solve is killed: ``factor * time_budget_s + grace``."""
        return self.solve_timeout_factor * time_budget_s + self.solve_timeout_grace_s
