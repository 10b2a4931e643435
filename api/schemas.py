"""Pydantic models of the wire formats (docs/formats.md) and the explicit converters to and from the solver's
types. Pydantic stays at this edge: the planning library sees only its own frozen dataclasses.

Request bodies are checked here for shape and JSON types (strict: ``"5"`` and ``true`` are not token
lengths), then converted with ``solver.io.request_from_dict``, which checks meaning (lengths >= 1,
known solver and profile, every sequence placeable) and names the field and the value of any mistake.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from skrull.api.profiles import NAME_PATTERN
from skrull.api.store.base import JobRecord
from skrull.api.tenants import DEFAULT_TENANT, plan_id_for
from skrull.solver.cp_modes import CP_MODES, DEFAULT_CP_MODE
from skrull.solver.io import (
    DEFAULT_PROFILE,
    DEFAULT_SOLVER,
    DEFAULT_TIME_BUDGET_S,
    request_from_dict,
    request_to_dict,
)
from skrull.solver.profile import MAX_BUCKET_TOKENS, MAX_COEFFICIENT
from skrull.solver.sharding import DEFAULT_SHARDING, SHARDING_MODES
from skrull.solver.types import Request

JobStatusName = Literal["queued", "solving", "solved", "failed"]
CpModeName = Literal[CP_MODES]  # type: ignore[valid-type]  # the one vocabulary, solver.cp_modes


def _integral(value: Any) -> Any:
    """A JSON number with an integral value (``114.0``) is the integer JSON Schema says it is; anything else
    is left for the strict integer check (a fraction, a string or a bool is refused)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


#: A JSON Schema ``integer``: ints, and floats with an integral value; never strings or bools.
Integer = Annotated[StrictInt, BeforeValidator(_integral)]


class ParallelModel(BaseModel):
    """``dp * cp`` GPUs; GPU ``g = dp_rank * cp + cp_rank``."""

    model_config = ConfigDict(extra="forbid")
    dp: Integer = Field(ge=1, description="data-parallel degree")
    cp: Integer = Field(ge=1, description="context-parallel degree")


class DeferModel(BaseModel):
    """``auto`` may defer up to ``max_sequences`` sequences of each batch by up to ``max_wait`` iterations
    (solver/defer.py)."""

    model_config = ConfigDict(extra="forbid")
    max_sequences: Integer = Field(
        ge=0,
        description="how many sequences of each batch may wait (one iteration unless max_wait says more): into a "
        "later batch, or into the plan's pending (for the next request); 0 defers nothing",
    )
    carried: Integer = Field(
        0,
        ge=0,
        description="the first this many sequences of the first batch were deferred by the previous request: "
        "they run in iteration 0 and never wait again",
    )
    max_wait: Integer = Field(
        1,
        ge=1,
        le=2**20,
        description="how many iterations a deferred sequence may wait (pending from batch b waits the request's "
        "batches from b on); auto's own choice waits one, a longer wait lets it keep WLB-LLM's whole-request plan",
    )


class PlanRequestIn(BaseModel):
    """The body of ``POST /v1/plans``: the lengths of upcoming global batches and how to plan them."""

    model_config = ConfigDict(
        extra="forbid",  # a typo ("solvr", "time_budget") must not be planned silently with the default
        json_schema_extra={
            "examples": [
                {
                    "batches": [[1024, 530, 31000], [77, 12000]],
                    "parallel": {"dp": 4, "cp": 8},
                    "profile": DEFAULT_PROFILE,
                    "solver": DEFAULT_SOLVER,
                    "time_budget_s": 1.0,
                }
            ]
        },
    )
    batches: list[list[Integer]] = Field(
        description="one list of token lengths per global batch (iteration), in loader order; sequence ids are "
        "global indices over the concatenated batches"
    )
    parallel: ParallelModel
    profile: str | dict[str, Any] = Field(
        DEFAULT_PROFILE, description="a bundled or uploaded profile name, or an inline profile object"
    )
    solver: str = Field(
        DEFAULT_SOLVER,
        description="planner name: auto (default: the best plan within the budget), skrull, ilp, ilp-flex, the "
        "baselines deepspeed, packed, sorted, round-robin, the peers wlb, dynamic-cp, hydraulis, verl-kk, and any "
        "planner registered",
    )
    time_budget_s: StrictFloat | StrictInt | None = Field(
        None,
        description="wall-clock solve budget in seconds; left out, the planner's default for the request's size: "
        f"{DEFAULT_TIME_BUDGET_S:g} s (60 s for ilp and ilp-flex), raised to what the planner needs, at most "
        "the server's SKRULL_MAX_TIME_BUDGET_S",
    )
    bucket_tokens: Integer | None = Field(None, description="override of profile.memory.bucket_tokens")
    backend: str | None = Field(None, description="exact solver backend (scip or cpsat), where the solver has one")
    seed: Integer = Field(0, description="seed of planners that shuffle")
    deterministic: StrictBool = Field(False, description="the same plan for the same request (exact solvers)")
    equal_microbatches: StrictBool = Field(
        False,
        description="every GPU runs the same number of microbatches in every iteration (empty ones where needed, "
        "each costing microbatch_ms): what FSDP and ZeRO-3 need, whose every forward gathers parameters over all ranks",
    )
    defer: DeferModel | None = Field(
        None,
        description="auto only (other planners refuse it but for max_sequences 0, which defers nothing; wlb "
        "refuses even that, it defers by its own queues): let sequences wait one iteration (up to max_wait) "
        "when that lowers the estimated time per unit of work; left out or null, nothing waits",
    )
    cp_modes: Annotated[list[CpModeName], Field(min_length=1, json_schema_extra={"uniqueItems": True})] | None = Field(
        None,
        description="how a sharded sequence's attention may run: allgather (DACP, the default) and/or ulysses "
        "(all-to-all over heads; needs the profile's heads and comm_a2a, and the group size to divide the attention "
        "heads); with both, the planner picks per microbatch; planners that cannot honour it refuse with 422",
    )


class CompareRequestIn(PlanRequestIn):
    """A request plus the solvers to run it through (default: every registered planner)."""

    solvers: list[str] | None = Field(None, description="planner names; default every registered planner")


class Progress(BaseModel):
    iterations_solved: int
    iterations_total: int


class ProblemModel(BaseModel):
    """RFC 9457 problem details, with ``field``/``value`` for request errors."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    field: str | None = None
    value: Any = None


ShardingName = Literal[SHARDING_MODES]  # type: ignore[valid-type]  # the one vocabulary, solver.sharding


class MicrobatchModel(BaseModel):
    step: int
    ranks: list[int]
    local: list[list[int]]
    sharded: list[int]
    estimated_ms: float
    sharding: ShardingName = Field(
        DEFAULT_SHARDING, description="how the sharded sequences are cut over the group (absent: zigzag)"
    )
    mode: CpModeName = Field(
        DEFAULT_CP_MODE, description="how the sharded sequences' attention runs (absent: allgather)"
    )
    link: Literal["intra_node", "inter_node"] | None = Field(
        None,
        description="the link the group's ranks use, which estimated_ms is priced on (present only when the "
        "profile has a topology)",
    )


class IterationModel(BaseModel):
    index: int
    microbatches: list[MicrobatchModel]
    estimated_ms: float
    lower_bound_ms: float = Field(description="no plan of this iteration's sequences, with any groups, is faster")
    static_bound_ms: float | None = Field(
        None,
        description="no plan in Skrull's static layout (one CP group per microbatch) is faster; plans with wider "
        "groups may be",
    )


class SolveModel(BaseModel):
    wall_ms: float
    status: Literal["heuristic", "optimal", "feasible", "timeout"]
    objective_ms: float
    bound_ms: float | None = Field(description="a lower bound of objective_ms valid for every layout")
    gap: float | None
    model_bound_ms: float | None = Field(
        None,
        description="exact planners: the solver's bound over the plans its model expresses (ilp: the static "
        "layout; ilp-flex: its groups); status optimal is proven against it",
    )
    model_gap: float | None = Field(None, description="(objective_ms - model_bound_ms) / objective_ms")
    stats: dict[str, float] | None = Field(None, description="planner-specific figures (absent for most planners)")
    cpu_ms: float | None = Field(
        None,
        description="service only: CPU time the solving process and its children received for this solve (this "
        "attempt); compare with wall_ms and the budget",
    )
    cpu_starved: bool | None = Field(
        None,
        description="service only: true when the solve received less than half the CPU time of min(wall, budget): "
        "the machine was loaded, so a searching planner's plan and gap fall short of what its budget buys",
    )


class PlanModel(BaseModel):
    """A ``skrull.plan/v1`` plan (docs/formats.md "Plan")."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    schema_: Literal["skrull.plan/v1"] = Field(alias="schema")
    solver: str
    parallel: ParallelModel
    bucket_tokens: int
    iterations: list[IterationModel]
    pending: list[int]
    solve: SolveModel


class PlanEnvelope(BaseModel):
    """``GET /v1/plans/{id}``: the job's state; ``plan`` once solved, ``error`` once failed."""

    id: str
    status: JobStatusName
    progress: Progress
    plan: PlanModel | None
    error: ProblemModel | None
    solver: str
    num_sequences: int
    attempts: int = Field(description="solver claims so far (a job whose process died is retried once)")
    last_error: ProblemModel | None = Field(None, description="why an earlier attempt did not finish")
    created_at: float
    updated_at: float
    finished_at: float | None
    links: dict[str, str]


class NotReady(BaseModel):
    """A rank view asked for before its iteration is solved (202, with ``Retry-After``)."""

    plan_id: str
    iteration: int
    status: JobStatusName
    progress: Progress


class ShardModel(BaseModel):
    id: int
    length: int
    ranges: list[list[int]]


class RankMicrobatchModel(BaseModel):
    step: int
    ranks: list[int]
    position: int
    local: list[int]
    shards: list[ShardModel]
    cu_seqlens: list[int]
    max_seqlen: int
    sharding: ShardingName = Field(DEFAULT_SHARDING, description="the microbatch's sharding mode (absent: zigzag)")
    mode: CpModeName = Field(DEFAULT_CP_MODE, description="how the shards' attention runs (absent: allgather)")


class RankViewModel(BaseModel):
    """One GPU's part of one iteration (docs/formats.md "Rank view")."""

    plan_id: str
    iteration: int
    rank: int
    num_tokens_in_iteration: int
    microbatches: list[RankMicrobatchModel]


class CompareTable(BaseModel):
    """``POST /v1/compare``: one row per solver, cells in ``columns`` order (``null`` where a solver failed)."""

    reference: str
    num_sequences: int
    num_iterations: int
    parallel: ParallelModel
    profile: str
    bucket_tokens: int
    columns: list[str]
    rows: list[list[Any]]


class ProfileSummary(BaseModel):
    name: str
    source: Literal["bundled", "uploaded"]


class ProfileList(BaseModel):
    profiles: list[ProfileSummary]


#: A profile coefficient as the planning library's profile reader accepts it (``solver.profile``): finite,
#: at least 0, at most ``MAX_COEFFICIENT``; the published schema says so, so no schema-valid profile is refused.
Coefficient = Annotated[float, Field(ge=0, le=MAX_COEFFICIENT)]


class ComputeModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    flops_per_token: Coefficient
    flops_per_token_sq: Coefficient
    ms_per_tflop: Annotated[float, Field(gt=0, le=MAX_COEFFICIENT)]
    fixed_ms: Coefficient


class CommModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    bytes_per_token: Coefficient
    ms_per_mib: Coefficient
    fixed_ms: Coefficient


class MemoryModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    bucket_tokens: int = Field(ge=1, le=MAX_BUCKET_TOKENS)


class ProfileModel(BaseModel):
    """A profile (docs/formats.md "Profile"); extra fields (sources, model config) are kept."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(
        pattern=NAME_PATTERN.pattern,
        description="1-128 letters, digits, '.', '_', '-', '/', starting with a letter or digit",
    )
    compute: ComputeModel
    comm: CommModel
    memory: MemoryModel
    microbatch_ms: Coefficient


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    store: str
    solver_processes: dict[str, int]
    jobs: dict[str, int]


# -- converters -------------------------------------------------------------------------------------------


def request_document(body: PlanRequestIn) -> dict[str, Any]:
    """The request as the specification's JSON document (``solvers`` of compare dropped)."""
    doc = body.model_dump(exclude={"solvers"}, exclude_none=True)
    return doc


def request_from_document(doc: dict[str, Any]) -> Request:
    """Validate meaning with the planning library; raises ``RequestError`` naming field and value."""
    return request_from_dict(doc)


def canonical_request_json(request: Request) -> str:
    """The request with its profile inlined, as canonical JSON: what a job stores and what its id hashes.

    Inlining makes a stored job self-contained (a later profile upload cannot change it) and makes two
    submissions of the same planning problem share one id. A request without ``time_budget_s`` stores its
    planner's default (``Request.resolved_time_budget_s``): the job's hard limit needs the figure, and the
    same problem asked with and without naming that default is one plan.
    """
    if request.time_budget_s is None:
        request = dataclasses.replace(request, time_budget_s=request.resolved_time_budget_s)
    return json.dumps(request_to_dict(request, inline_profile=True), sort_keys=True, separators=(",", ":"))


def job_id_for(canonical_json: str, tenant: str = DEFAULT_TENANT) -> str:
    """Content address of a request within its tenant: the first 128 bits of SHA-256 of its canonical JSON,
    in hex, behind the tenant's prefix for a named tenant (``api.tenants.plan_id_for``)."""
    return plan_id_for(tenant, canonical_json)


def envelope_json(job: JobRecord) -> bytes:
    """``PlanEnvelope`` of a job as JSON; the stored plan text is spliced in, not re-parsed."""
    meta = {
        "id": job.job_id,
        "status": job.status,
        "progress": {"iterations_solved": job.iterations_solved, "iterations_total": job.num_iterations},
        "error": None,
        "solver": job.solver,
        "num_sequences": job.num_sequences,
        "attempts": job.attempts,
        "last_error": None,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "finished_at": job.finished_at,
        "links": {
            "self": f"/v1/plans/{job.job_id}",
            "rank_view": f"/v1/plans/{job.job_id}/ranks/{{rank}}?iteration={{iteration}}",
        },
    }
    text = json.dumps(meta, separators=(",", ":"))
    text = text.replace('"error":null', '"error":' + (job.error_json or "null"), 1)
    text = text.replace('"last_error":null', '"last_error":' + (job.last_error_json or "null"), 1)
    return (text[:-1] + ',"plan":' + (job.plan_json or "null") + "}").encode()
