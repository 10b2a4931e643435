"""JSON reading and writing of requests and plans in the contract's formats (CONTRACT.md).

Parsing validates everything a planner relies on and raises one ``RequestError`` naming the field (as a
JSON path like ``batches[0][2]``) and its value. Unknown extra fields are allowed, as the contract says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError, SequenceTooLongError, UnknownSolverError
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.solver.types import (
    DEFAULT_SHARDING,
    PLAN_SCHEMA,
    SHARDING_MODES,
    SOLVE_STATUSES,
    Iteration,
    Microbatch,
    Parallel,
    Plan,
    Request,
    SolveInfo,
)

DEFAULT_PROFILE = "h100-80g/qwen2.5-0.5b"
DEFAULT_TIME_BUDGET_S = 1.0
#: The planner a request gets when it names none: the best plan within the budget (docs/auto.md).
DEFAULT_SOLVER = "auto"
BACKENDS = ("scip", "cpsat")


def _int(value: Any, field: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(field, value, f"must be an integer >= {minimum}")
    if value < minimum:
        raise RequestError(field, value, f"must be an integer >= {minimum}")
    return value


def parse_parallel(doc: Any, *, field: str = "parallel") -> Parallel:
    if not isinstance(doc, dict):
        raise RequestError(field, doc, 'must be an object like {"dp": 4, "cp": 8}')
    return Parallel(
        dp=_int(doc.get("dp"), f"{field}.dp", minimum=1),
        cp=_int(doc.get("cp"), f"{field}.cp", minimum=1),
    )


def parse_profile(doc: Any, *, field: str = "profile") -> Profile:
    if isinstance(doc, str):
        return load_profile(doc, path=field)
    return profile_from_dict(doc, path=field)


def request_from_dict(doc: Any, *, known_solvers: tuple[str, ...] | None = None) -> Request:
    """Validate and convert a request document. ``known_solvers`` defaults to the planner registry."""
    if not isinstance(doc, dict):
        raise RequestError("request", doc, "must be a JSON object")
    batches_doc = doc.get("batches")
    if not isinstance(batches_doc, list) or not batches_doc:
        raise RequestError("batches", batches_doc, "must be a non-empty list of batches (lists of token lengths)")
    batches: list[tuple[int, ...]] = []
    for b, batch in enumerate(batches_doc):
        if not isinstance(batch, list) or not batch:
            raise RequestError(f"batches[{b}]", batch, "must be a non-empty list of token lengths")
        for k, length in enumerate(batch):
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise RequestError(f"batches[{b}][{k}]", length, "token lengths must be integers >= 1")
        batches.append(tuple(batch))
    parallel = parse_parallel(doc.get("parallel"))
    profile = parse_profile(doc.get("profile", DEFAULT_PROFILE))

    solver = doc.get("solver", DEFAULT_SOLVER)
    if known_solvers is None:
        from skrull.solver.planners.registry import planner_names

        known_solvers = planner_names()
    if not isinstance(solver, str) or solver not in known_solvers:
        raise UnknownSolverError("solver", solver, f"unknown solver; known: {', '.join(known_solvers)}")

    budget = doc.get("time_budget_s", DEFAULT_TIME_BUDGET_S)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise RequestError("time_budget_s", budget, "must be a number of seconds > 0")

    bucket = doc.get("bucket_tokens")
    if bucket is not None:
        bucket = _int(bucket, "bucket_tokens", minimum=1)

    backend = doc.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise RequestError("backend", backend, f"must be one of {', '.join(BACKENDS)}")

    seed = _int(doc.get("seed", 0), "seed", minimum=0)
    deterministic = doc.get("deterministic", False)
    if not isinstance(deterministic, bool):
        raise RequestError("deterministic", deterministic, "must be true or false")

    request = Request(
        batches=tuple(batches),
        parallel=parallel,
        profile=profile,
        solver=solver,
        time_budget_s=float(budget),
        bucket_tokens_override=bucket,
        backend=backend,
        seed=seed,
        deterministic=deterministic,
    )
    check_placeable(request)
    return request


def check_placeable(request: Request) -> None:
    """Refuse a sequence longer than ``cp * bucket_tokens``: no planner can place it."""
    limit = request.parallel.cp * request.bucket_tokens
    seq_id = 0
    for b, batch in enumerate(request.batches):
        for k, length in enumerate(batch):
            if length > limit:
                raise SequenceTooLongError(
                    field=f"batches[{b}][{k}]", seq_id=seq_id, num_tokens=length, limit_tokens=limit
                )
            seq_id += 1


def request_to_dict(request: Request, *, inline_profile: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "batches": [list(b) for b in request.batches],
        "parallel": {"dp": request.parallel.dp, "cp": request.parallel.cp},
        "profile": request.profile.to_dict() if inline_profile else request.profile.name,
        "solver": request.solver,
        "time_budget_s": request.time_budget_s,
    }
    if request.bucket_tokens_override is not None:
        doc["bucket_tokens"] = request.bucket_tokens_override
    if request.backend is not None:
        doc["backend"] = request.backend
    if request.seed:
        doc["seed"] = request.seed
    if request.deterministic:
        doc["deterministic"] = True
    return doc


def _round(x: float) -> float:
    return round(x, 6)


def _microbatch_to_dict(mb: Microbatch) -> dict[str, Any]:
    """A microbatch in the contract's shape; ``sharding`` appears only when it is not the default."""
    doc: dict[str, Any] = {
        "step": mb.step,
        "ranks": list(mb.ranks),
        "local": [list(ids) for ids in mb.local],
        "sharded": list(mb.sharded),
        "estimated_ms": _round(mb.estimated_ms),
    }
    if mb.sharding != DEFAULT_SHARDING:
        doc["sharding"] = mb.sharding
    return doc


def _solve_to_dict(solve: SolveInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "wall_ms": _round(solve.wall_ms),
        "status": solve.status,
        "objective_ms": _round(solve.objective_ms),
        "bound_ms": None if solve.bound_ms is None else _round(solve.bound_ms),
        "gap": None if solve.gap is None else _round(solve.gap),
    }
    if solve.stats:
        doc["stats"] = {name: _round(value) for name, value in solve.stats}
    return doc


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "schema": plan.schema,
        "solver": plan.solver,
        "parallel": {"dp": plan.parallel.dp, "cp": plan.parallel.cp},
        "bucket_tokens": plan.bucket_tokens,
        "iterations": [
            {
                "index": it.index,
                "microbatches": [_microbatch_to_dict(mb) for mb in it.microbatches],
                "estimated_ms": _round(it.estimated_ms),
                "lower_bound_ms": _round(it.lower_bound_ms),
            }
            for it in plan.iterations
        ],
        "pending": list(plan.pending),
        "solve": _solve_to_dict(plan.solve),
    }


def _ids(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise RequestError(field, value, "must be a list of sequence ids")
    for k, v in enumerate(value):
        _int(v, f"{field}[{k}]", minimum=0)
    return tuple(value)


def _float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(field, value, "must be a number")
    return float(value)


def plan_from_dict(doc: Any) -> Plan:
    """Read a plan document (for validating plans produced elsewhere). Checks shape, not content."""
    if not isinstance(doc, dict):
        raise RequestError("plan", doc, "must be a JSON object")
    if doc.get("schema") != PLAN_SCHEMA:
        raise RequestError("schema", doc.get("schema"), f"must be {PLAN_SCHEMA!r}")
    iterations = []
    for i, it in enumerate(doc.get("iterations") or []):
        path = f"iterations[{i}]"
        mbs = []
        for m, mb in enumerate(it.get("microbatches") or []):
            mpath = f"{path}.microbatches[{m}]"
            local = mb.get("local")
            if not isinstance(local, list):
                raise RequestError(f"{mpath}.local", local, "must be a list of id lists")
            sharding = mb.get("sharding", DEFAULT_SHARDING)
            if sharding not in SHARDING_MODES:
                raise RequestError(f"{mpath}.sharding", sharding, f"must be one of {', '.join(SHARDING_MODES)}")
            mbs.append(
                Microbatch(
                    step=_int(mb.get("step"), f"{mpath}.step", minimum=0),
                    ranks=_ids(mb.get("ranks"), f"{mpath}.ranks"),
                    local=tuple(_ids(ids, f"{mpath}.local[{j}]") for j, ids in enumerate(local)),
                    sharded=_ids(mb.get("sharded"), f"{mpath}.sharded"),
                    estimated_ms=_float(mb.get("estimated_ms"), f"{mpath}.estimated_ms"),
                    sharding=sharding,
                )
            )
        iterations.append(
            Iteration(
                index=_int(it.get("index"), f"{path}.index", minimum=0),
                microbatches=tuple(mbs),
                estimated_ms=_float(it.get("estimated_ms"), f"{path}.estimated_ms"),
                lower_bound_ms=_float(it.get("lower_bound_ms"), f"{path}.lower_bound_ms"),
            )
        )
    solve = doc.get("solve") or {}
    status = solve.get("status")
    if status not in SOLVE_STATUSES:
        raise RequestError("solve.status", status, f"must be one of {', '.join(SOLVE_STATUSES)}")
    bound = solve.get("bound_ms")
    gap = solve.get("gap")
    stats = solve.get("stats", {})
    if not isinstance(stats, dict):
        raise RequestError("solve.stats", stats, "must be an object of named numbers")
    stats_t = tuple((str(k), _float(v, f"solve.stats.{k}")) for k, v in stats.items())
    return Plan(
        solver=str(doc.get("solver")),
        parallel=parse_parallel(doc.get("parallel")),
        bucket_tokens=_int(doc.get("bucket_tokens"), "bucket_tokens", minimum=1),
        iterations=tuple(iterations),
        pending=_ids(doc.get("pending", []), "pending"),
        solve=SolveInfo(
            wall_ms=_float(solve.get("wall_ms"), "solve.wall_ms"),
            status=status,
            objective_ms=_float(solve.get("objective_ms"), "solve.objective_ms"),
            bound_ms=None if bound is None else _float(bound, "solve.bound_ms"),
            gap=None if gap is None else _float(gap, "solve.gap"),
            stats=stats_t,
        ),
    )


def read_json(path: str | Path, *, field: str = "file") -> Any:
    """Read a JSON file; a missing file or malformed JSON is a ``RequestError`` with the position."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise RequestError(field, str(path), "no such file") from None
    except json.JSONDecodeError as exc:
        raise RequestError(
            field, str(path), f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


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
