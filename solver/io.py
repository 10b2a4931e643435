"""JSON reading and writing of requests and plans in the specification's formats (docs/formats.md).

Parsing validates everything a planner relies on and raises one ``RequestError`` naming the field (as a
JSON path like ``batches[0][2]``) and its value. Unknown request fields are refused (a typo such as
``"solvr"`` would otherwise be planned silently with the default); profiles keep free-form extras.

Hostile JSON (deep nesting, NaN, huge integers, duplicate keys) is refused while it is read
(``solver.jsonsafe.loads_json``), before any arithmetic.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from skrull.solver import budget as budget_defaults
from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import DEFAULT_CP_MODE, DEFAULT_CP_MODES, ULYSSES, read_cp_modes, read_mode
from skrull.solver.errors import MISSING, RequestError, SequenceTooLongError, UnknownSolverError
from skrull.solver.jsonsafe import check_bounded, join_path, loads_json, read_int, read_ints, read_object
from skrull.solver.plan import layout_fields
from skrull.solver.profile import INTER_NODE, INTRA_NODE, Profile, load_profile, profile_from_dict
from skrull.solver.sharding import read_sharding
from skrull.solver.types import (
    DEFAULT_SHARDING,
    PLAN_SCHEMA,
    SOLVE_STATUSES,
    Defer,
    Iteration,
    Microbatch,
    Parallel,
    Plan,
    Request,
    SolveInfo,
)

DEFAULT_PROFILE = "h100-80g/qwen2.5-0.5b"
#: A request without ``time_budget_s`` gets this, raised for its size (``solver.budget.default_budget_s``).
DEFAULT_TIME_BUDGET_S = budget_defaults.DEFAULT_TIME_BUDGET_S
#: The planner a request gets when it names none: the best plan within the budget (docs/auto.md).
DEFAULT_SOLVER = "auto"
#: The layout the command line assumes when none is given (``skrull plan/compare/request --dataset``,
#: ``skrull lengths``): DP4 x CP8, 32 GPUs, as in Skrull's evaluation.
DEFAULT_DP = 4
DEFAULT_CP = 8
BACKENDS = ("scip", "cpsat")

#: Every field of a request; anything else is refused (``deterministic``: same plan for the same request;
#: ``equal_microbatches``: every GPU runs the same number of microbatches per iteration; ``defer``: ``auto``
#: may defer sequences by one iteration, solver/defer.py).
REQUEST_FIELDS = frozenset(
    {
        "batches",
        "parallel",
        "profile",
        "solver",
        "time_budget_s",
        "bucket_tokens",
        "backend",
        "seed",
        "deterministic",
        "equal_microbatches",
        "defer",
        "cp_modes",
    }
)
PARALLEL_FIELDS = frozenset({"dp", "cp"})
DEFER_FIELDS = frozenset({"max_sequences", "carried", "max_wait"})
#: Bounds of request numbers: token lengths and buckets up to 2^40 tokens, degrees up to 2^20 GPUs.
MAX_TOKENS = 2**40
MAX_DEGREE = 2**20
MAX_TIME_BUDGET_S = 1e6
#: The planners that defer on request (``defer``, solver/defer.py), and the most a batch may defer.
DEFER_SOLVERS: tuple[str, ...] = ("auto",)
MAX_DEFER = 2**20
#: The planners whose own queues move work to a later iteration: they refuse even a ``defer`` of 0, whose
#: validation (every sequence in its own batch's iteration) their plans would fail.
MOVES_WORK_SOLVERS: tuple[str, ...] = ("wlb",)


def _refuse_unknown(doc: dict[str, Any], known: frozenset[str], path: str) -> None:
    for key in doc:
        if key not in known:
            raise RequestError(
                join_path(path, str(key)), doc[key], f"unknown field; the fields are {', '.join(sorted(known))}"
            )


def parse_parallel(doc: Any, *, field: str = "parallel") -> Parallel:
    if not isinstance(doc, dict):
        raise RequestError(field, doc, 'must be an object like {"dp": 4, "cp": 8}')
    _refuse_unknown(doc, PARALLEL_FIELDS, field)
    return Parallel(
        dp=read_int(doc.get("dp"), f"{field}.dp", minimum=1, maximum=MAX_DEGREE),
        cp=read_int(doc.get("cp"), f"{field}.cp", minimum=1, maximum=MAX_DEGREE),
    )


def parse_profile(doc: Any, *, field: str = "profile") -> Profile:
    if isinstance(doc, str):
        return load_profile(doc, path=field)
    return profile_from_dict(doc, path=field)


def defer_refusal(solver: str, max_sequences: int) -> str | None:
    """Why ``solver`` cannot honour a ``defer`` of ``max_sequences`` (None: it can). The one rule the reader
    and ``planning.check_defer`` (a ``Request`` built in Python) apply."""
    if solver in DEFER_SOLVERS or (max_sequences == 0 and solver not in MOVES_WORK_SOLVERS):
        return None
    reason = f"only {', '.join(DEFER_SOLVERS)} defers on request; solver {solver!r} cannot honour it"
    if solver == "wlb":
        reason += " (wlb defers by its own outlier queues without being asked: leave defer out)"
    return reason


def parse_defer(doc: Any, *, solver: str, batches: tuple[tuple[int, ...], ...], field: str = "defer") -> Defer | None:
    """The ``defer`` object (null or left out: off). Only ``auto`` defers on request (``DEFER_SOLVERS``);
    ``max_sequences`` 0 (a loader's last chunk, a config written for several planners) defers nothing, so
    every planner that keeps each batch in its iteration takes it (not ``wlb``, whose queues move work the
    validator would then refuse). ``carried`` counts sequences at the head of the first batch, so it is at
    most that batch's size."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise RequestError(field, doc, 'must be an object like {"max_sequences": 4}, or null (no deferral)')
    _refuse_unknown(doc, DEFER_FIELDS, field)
    if "max_sequences" not in doc:
        raise RequestError(f"{field}.max_sequences", None, "is required: how many sequences a batch may defer")
    max_sequences = read_int(doc["max_sequences"], f"{field}.max_sequences", minimum=0, maximum=MAX_DEFER)
    if (reason := defer_refusal(solver, max_sequences)) is not None:
        raise RequestError(field, doc, reason)
    first = len(batches[0]) if batches else 0
    carried = read_int(doc.get("carried", 0), f"{field}.carried", minimum=0, maximum=first)
    max_wait = read_int(doc.get("max_wait", 1), f"{field}.max_wait", minimum=1, maximum=MAX_DEFER)
    return Defer(max_sequences=max_sequences, carried=carried, max_wait=max_wait)


def request_from_dict(doc: Any, *, known_solvers: tuple[str, ...] | None = None) -> Request:
    """Validate and convert a request document. ``known_solvers`` defaults to the planner registry."""
    if not isinstance(doc, dict):
        raise RequestError("request", doc, "must be a JSON object")
    check_bounded(doc)
    if isinstance(doc.get("schema"), str):  # a plan or a view given where a request belongs
        raise RequestError(
            "schema",
            doc["schema"],
            "a request has no schema field; this looks like a plan or a rank view (give the request "
            "that produced it, or `skrull validate` to check a plan)",
        )
    _refuse_unknown(doc, REQUEST_FIELDS, "")
    batches_doc = doc.get("batches")
    if not isinstance(batches_doc, list) or not batches_doc:
        raise RequestError("batches", batches_doc, "must be a non-empty list of batches (lists of token lengths)")
    batches: list[tuple[int, ...]] = []
    for b, batch in enumerate(batches_doc):
        if not isinstance(batch, list) or not batch:
            raise RequestError(f"batches[{b}]", batch, "must be a non-empty list of token lengths")
        for k, length in enumerate(batch):
            if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_TOKENS:
                raise RequestError(f"batches[{b}][{k}]", length, f"token lengths must be integers in 1..{MAX_TOKENS}")
        batches.append(tuple(batch))
    parallel = parse_parallel(doc.get("parallel"))
    profile = parse_profile(doc.get("profile", DEFAULT_PROFILE))

    solver = doc.get("solver", DEFAULT_SOLVER)
    if known_solvers is None:
        from skrull.solver.planners.registry import planner_names

        known_solvers = planner_names()
    if not isinstance(solver, str) or solver not in known_solvers:
        raise UnknownSolverError("solver", solver, f"unknown solver; known: {', '.join(known_solvers)}")

    budget = doc.get("time_budget_s")
    if budget is None:
        pass  # left out or null: the planner's default for the request's size (Request.resolved_time_budget_s)
    elif (
        isinstance(budget, bool)
        or not isinstance(budget, (int, float))
        or not 0 < budget <= MAX_TIME_BUDGET_S  # compared before any conversion: a huge int never meets float()
    ):
        raise RequestError("time_budget_s", budget, f"must be a number of seconds in (0, {MAX_TIME_BUDGET_S:g}]")

    bucket = doc.get("bucket_tokens")
    if bucket is not None:
        bucket = read_int(bucket, "bucket_tokens", minimum=1, maximum=MAX_TOKENS)

    backend = doc.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise RequestError("backend", backend, f"must be one of {', '.join(BACKENDS)}")

    seed = read_int(doc.get("seed", 0), "seed", minimum=0, maximum=2**63 - 1)
    deterministic = doc.get("deterministic", False)
    if not isinstance(deterministic, bool):
        raise RequestError("deterministic", deterministic, "must be true or false")
    equal = doc.get("equal_microbatches", False)
    if not isinstance(equal, bool):
        raise RequestError("equal_microbatches", equal, "must be true or false")
    defer = parse_defer(doc.get("defer"), solver=solver, batches=tuple(batches))
    cp_modes = read_cp_modes(doc.get("cp_modes"))
    check_cp_modes_profile(cp_modes, profile)

    request = Request(
        batches=tuple(batches),
        parallel=parallel,
        profile=profile,
        solver=solver,
        time_budget_s=None if budget is None else float(budget),
        bucket_tokens_override=bucket,
        backend=backend,
        seed=seed,
        deterministic=deterministic,
        equal_microbatches=equal,
        defer=defer,
        cp_modes=cp_modes,
    )
    check_placeable(request)
    return request


def check_cp_modes_profile(cp_modes: tuple[str, ...], profile: Profile) -> None:
    """A request allowing ``ulysses`` needs a profile that can price it (``heads`` and ``comm_a2a``)."""
    if ULYSSES not in cp_modes:
        return
    if profile.heads is None:
        raise RequestError(
            "profile.heads",
            None,
            "is required when cp_modes lists ulysses (attention and kv head counts; skrull derive-profile fills it)",
        )
    if profile.comm_a2a is None:
        raise RequestError(
            "profile.comm_a2a",
            None,
            "is required when cp_modes lists ulysses (the all-to-all coefficients; skrull derive-profile fills it)",
        )


def placeable_tokens(request: Request) -> int:
    """The longest sequence one CP group holds: ``cp * bucket_tokens``, less, where only all-gather can run
    it, the gathered K/V each GPU keeps (``CostModel.max_sequence_tokens``; CONTRACT.md)."""
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    cp = request.parallel.cp
    modes = [m for m in request.cp_modes if m != ULYSSES or model.mode_fits(cp, ULYSSES)]
    return max(model.max_sequence_tokens(cp, m) for m in modes or [DEFAULT_CP_MODE])


def check_placeable(request: Request) -> None:
    """Refuse a sequence longer than one CP group holds (``placeable_tokens``): no planner can place it."""
    limit = placeable_tokens(request)
    seq_id = 0
    for b, batch in enumerate(request.batches):
        for k, length in enumerate(batch):
            if length > limit:
                raise SequenceTooLongError(
                    field=f"batches[{b}][{k}]",
                    seq_id=seq_id,
                    num_tokens=length,
                    limit_tokens=limit,
                    gathered_kv=limit < request.parallel.cp * request.bucket_tokens,
                )
            seq_id += 1


def _given(**fields: Any) -> dict[str, Any]:
    """A document's optional fields that are set: one left None is left out, and its reader takes the default."""
    return {key: value for key, value in fields.items() if value is not None}


def request_to_dict(request: Request, *, inline_profile: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "batches": [list(b) for b in request.batches],
        "parallel": {"dp": request.parallel.dp, "cp": request.parallel.cp},
        "profile": request.profile.to_dict() if inline_profile else request.profile.name,
        "solver": request.solver,
        # a budget left out is the planner's default (Request.resolved_time_budget_s)
        **_given(time_budget_s=request.time_budget_s, bucket_tokens=request.bucket_tokens_override),
        **_given(backend=request.backend),
    }
    if request.seed:
        doc["seed"] = request.seed
    if request.deterministic:
        doc["deterministic"] = True
    if request.equal_microbatches:
        doc["equal_microbatches"] = True
    if request.cp_modes != DEFAULT_CP_MODES:
        doc["cp_modes"] = list(request.cp_modes)
    if request.defer is not None:
        doc["defer"] = {"max_sequences": request.defer.max_sequences}
        if request.defer.carried:
            doc["defer"]["carried"] = request.defer.carried
        if request.defer.max_wait != 1:
            doc["defer"]["max_wait"] = request.defer.max_wait
    return doc


# -- plans: the one writer and the one reader of the plan document (docs/formats.md "Plan") ----------------
#
# Numbers are written as they are (JSON keeps a float exactly), so ``plan_from_dict(plan_to_dict(p)) == p``
# for every plan: what the service stores, serves and views is the plan the planner made.


def microbatch_to_dict(mb: Microbatch) -> dict[str, Any]:
    """A microbatch in the specification's shape; ``sharding`` and ``mode`` appear only when not the default,
    ``link`` only when the profile has a ``topology``."""
    return {
        "step": mb.step,
        "ranks": list(mb.ranks),
        "local": [list(ids) for ids in mb.local],
        "sharded": list(mb.sharded),
        "estimated_ms": mb.estimated_ms,
        **layout_fields(mb.sharding, mb.mode),
        **_given(link=mb.link),
    }


def iteration_to_dict(it: Iteration) -> dict[str, Any]:
    """One iteration of a plan document (also what the service stores per published iteration)."""
    return {
        "index": it.index,
        "microbatches": [microbatch_to_dict(mb) for mb in it.microbatches],
        "estimated_ms": it.estimated_ms,
        "lower_bound_ms": it.lower_bound_ms,
        **_given(static_bound_ms=it.static_bound_ms),
    }


def _solve_to_dict(solve: SolveInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "wall_ms": solve.wall_ms,
        "status": solve.status,
        "objective_ms": solve.objective_ms,
        "bound_ms": solve.bound_ms,
        "gap": solve.gap,
    }
    if solve.model_bound_ms is not None:
        doc["model_bound_ms"] = solve.model_bound_ms
        doc["model_gap"] = solve.model_gap
    if solve.stats:
        doc["stats"] = dict(solve.stats)
    return doc


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "schema": plan.schema,
        "solver": plan.solver,
        "parallel": {"dp": plan.parallel.dp, "cp": plan.parallel.cp},
        "bucket_tokens": plan.bucket_tokens,
        "iterations": [iteration_to_dict(it) for it in plan.iterations],
        "pending": list(plan.pending),
        "solve": _solve_to_dict(plan.solve),
    }


def _float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(field, value, "must be a finite number")
    return float(value)


def _optional_float(value: Any, field: str) -> float | None:
    return None if value is None else _float(value, field)


def microbatch_from_dict(
    doc: Any, *, field: str = "microbatch", groups: dict[tuple[int, ...], tuple[int, ...]] | None = None
) -> Microbatch:
    """Read one microbatch. ``groups`` (one per iteration) makes equal ``ranks`` one shared tuple: a plan
    reuses few groups, and at CP 16,384 each copy would hold 16,384 ints."""
    mb = read_object(doc, field)
    local = mb.get("local")
    if not isinstance(local, list):
        raise RequestError(f"{field}.local", local, "must be a list of id lists")
    sharding = read_sharding(mb.get("sharding", DEFAULT_SHARDING), f"{field}.sharding")
    ranks = read_ints(mb.get("ranks"), f"{field}.ranks")
    if groups is not None:
        ranks = groups.setdefault(ranks, ranks)
    return Microbatch(
        step=read_int(mb.get("step"), f"{field}.step", minimum=0),
        ranks=ranks,
        local=tuple(() if ids == [] else read_ints(ids, f"{field}.local[{j}]") for j, ids in enumerate(local)),
        sharded=read_ints(mb.get("sharded"), f"{field}.sharded"),
        estimated_ms=_float(mb.get("estimated_ms"), f"{field}.estimated_ms"),
        sharding=sharding,
        mode=read_mode(mb.get("mode"), f"{field}.mode"),
        link=_read_link(mb.get("link"), f"{field}.link"),
    )


def _read_link(value: Any, field: str) -> str | None:
    """A microbatch's optional ``link``: ``intra_node`` or ``inter_node`` (absent: the profile has no topology)."""
    if value is None or value in (INTRA_NODE, INTER_NODE):
        return value  # type: ignore[no-any-return]
    raise RequestError(field, value, f"must be {INTRA_NODE} or {INTER_NODE}")


def iteration_from_dict(doc: Any, *, field: str = "iteration") -> Iteration:
    """Read one iteration of a plan document (``iteration_to_dict``'s inverse); checks shape, not content."""
    it = read_object(doc, field)
    microbatches = it.get("microbatches")
    if not isinstance(microbatches, list):
        raise RequestError(f"{field}.microbatches", microbatches, "must be a list of microbatches")
    groups: dict[tuple[int, ...], tuple[int, ...]] = {}
    return Iteration(
        index=read_int(it.get("index"), f"{field}.index", minimum=0),
        microbatches=tuple(
            microbatch_from_dict(mb, field=f"{field}.microbatches[{m}]", groups=groups)
            for m, mb in enumerate(microbatches)
        ),
        estimated_ms=_float(it.get("estimated_ms"), f"{field}.estimated_ms"),
        lower_bound_ms=_float(it.get("lower_bound_ms"), f"{field}.lower_bound_ms"),
        static_bound_ms=_optional_float(it.get("static_bound_ms"), f"{field}.static_bound_ms"),
    )


def _solve_from_dict(doc: Any) -> SolveInfo:
    solve = read_object(doc, "solve")
    status = solve.get("status")
    if status not in SOLVE_STATUSES:
        raise RequestError("solve.status", status, f"must be one of {', '.join(SOLVE_STATUSES)}")
    stats = solve.get("stats", {})
    if not isinstance(stats, dict):
        raise RequestError("solve.stats", stats, "must be an object of named numbers")
    return SolveInfo(
        wall_ms=_float(solve.get("wall_ms"), "solve.wall_ms"),
        status=status,
        objective_ms=_float(solve.get("objective_ms"), "solve.objective_ms"),
        bound_ms=_optional_float(solve.get("bound_ms"), "solve.bound_ms"),
        gap=_optional_float(solve.get("gap"), "solve.gap"),
        model_bound_ms=_optional_float(solve.get("model_bound_ms"), "solve.model_bound_ms"),
        model_gap=_optional_float(solve.get("model_gap"), "solve.model_gap"),
        stats=tuple((str(k), _float(v, f"solve.stats.{k}")) for k, v in stats.items()),
    )


def plan_from_dict(doc: Any) -> Plan:
    """Read a plan document (``plan_to_dict``'s inverse): the service's stored plans, plans produced
    elsewhere. Checks shape and JSON types and names the field of any mistake; content is the
    validator's (``solver.validate``)."""
    plan = read_object(doc, "plan")
    if "schema" not in plan and "batches" in plan:
        raise RequestError("schema", MISSING, "this is a request (it has batches and no schema), not a plan")
    if plan.get("schema") != PLAN_SCHEMA:
        raise RequestError("schema", plan.get("schema"), f"must be {PLAN_SCHEMA!r}")
    solver = plan.get("solver")
    if not isinstance(solver, str):
        raise RequestError("solver", solver, "must be the planner's name")
    iterations = plan.get("iterations")
    if not isinstance(iterations, list):
        raise RequestError("iterations", iterations, "must be a list of iterations")
    return Plan(
        solver=solver,
        parallel=parse_parallel(plan.get("parallel")),
        bucket_tokens=read_int(plan.get("bucket_tokens"), "bucket_tokens", minimum=1),
        iterations=tuple(iteration_from_dict(it, field=f"iterations[{i}]") for i, it in enumerate(iterations)),
        pending=read_ints(plan.get("pending", []), "pending"),
        solve=_solve_from_dict(plan.get("solve")),
    )


def read_json(path: str | Path, *, field: str = "file") -> Any:
    """Read a JSON file; a missing file or malformed JSON is a ``RequestError`` with the position."""
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise RequestError(field, str(path), "no such file") from None
    except OSError as exc:
        raise RequestError(field, str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        return loads_json(text, field=field)
    except RequestError as exc:
        where = field if exc.field == field else f"{field} {exc.field}"
        value = str(path) if exc.field == field else exc.value
        raise RequestError(where, value, exc.reason) from None


def dumps(doc: Any, *, compact: bool = False, width: int = 100) -> str:
    """JSON text: one line with ``compact``, else indented with every value that fits in ``width``
    characters kept on one line (so id lists and ``local`` stay readable)."""
    if compact:
        return json.dumps(doc, separators=(",", ":"))
    return _pretty(doc, 0, width)


def _pretty(doc: Any, indent: int, width: int) -> str:
    flat = json.dumps(doc, separators=(", ", ": "))
    if len(flat) + indent <= width or not isinstance(doc, (dict, list)) or not doc:
        return flat
    pad = " " * (indent + 2)
    if isinstance(doc, dict):
        items = [f"{pad}{json.dumps(k)}: {_pretty(v, indent + 2, width)}" for k, v in doc.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if all(not isinstance(v, (dict, list)) for v in doc):  # long scalar lists: wrapped, not one per line
        lines, line = [], ""
        for text in (json.dumps(v) for v in doc):
            if line and len(pad) + len(line) + len(text) + 2 > width:
                lines.append(pad + line.rstrip())
                line = ""
            line += text + ", "
        lines.append(pad + line[:-2])
        return "[\n" + "\n".join(lines) + "\n" + " " * indent + "]"
    items = [pad + _pretty(v, indent + 2, width) for v in doc]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
