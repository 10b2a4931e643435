"""The model builder: the warm start is a feasible point, constraint families are labelled, decoding
returns what was encoded."""

from __future__ import annotations

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import build_joint_model
from skrull.solver.planners.exact import specs_to_groups
from skrull.solver.planning import solve
from tests.conftest import make_request


def _built(symmetry: bool = True):  # type: ignore[no-untyped-def]
    request = make_request([[30, 45, 7, 90, 12, 3, 60, 150]], dp=2, cp=3, bucket=60)
    plan = solve(request)
    specs = plan.iterations[0].microbatches
    groups = specs_to_groups(specs, request.parallel)  # type: ignore[arg-type]
    cost = CostModel(request.profile, bucket_tokens=60)
    built = build_joint_model(
        seq_ids=range(8),
        lengths=[30, 45, 7, 90, 12, 3, 60, 150],
        num_groups=2,
        group_size=3,
        cost=cost,
        hint=groups,
        lower_bound_ms=plan.iterations[0].lower_bound_ms,
        symmetry_breaking=symmetry,
    )
    return built, groups, plan


def test_warm_start_satisfies_every_constraint() -> None:
    for symmetry in (True, False):
        built, _, _ = _built(symmetry)
        values = [built.model.hint[v] for v in range(built.model.num_vars)]
        assert built.model.violated(values) == []


def test_warm_start_objective_is_the_heuristic_time_floored() -> None:
    built, _, plan = _built()
    values = [built.model.hint[v] for v in range(built.model.num_vars)]
    objective_ms = built.model.objective_value(values) / 10_000
    assert plan.estimated_ms - 8 * 1e-4 <= objective_ms <= plan.estimated_ms


def test_every_constraint_family_is_named_and_redundant_ones_are_labelled() -> None:
    built, _, _ = _built()
    families = built.model.families()
    for name in (
        "assign",
        "memory",
        "time-local",
        "time-comm",
        "group-time",
        "objective",
        "symmetry-groups",
        "symmetry-microbatches",
        "symmetry-cp-ranks",
    ):
        assert families.get(name, 0) > 0, name
    assert any(f.startswith("redundant-") for f in families)


def test_decoding_the_warm_start_returns_the_same_microbatches() -> None:
    built, groups, _ = _built()
    values = [built.model.hint[v] for v in range(built.model.num_vars)]
    decoded = built.decode(values)

    def canonical(gs: list) -> list:  # type: ignore[type-arg]
        return sorted(sorted(tuple(sorted(i for part in (*mb[0], mb[1]) for i in part)) for mb in g) for g in gs)

    assert canonical(decoded) == canonical(groups)
