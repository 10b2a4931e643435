"""The model builder: the warm start is a feasible point, constraint families are labelled, decoding
returns what was encoded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import Layout, build_joint_model
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


@settings(max_examples=80, deadline=None)
@given(
    num_gpus=st.integers(1, 24),
    groups=st.lists(st.lists(st.integers(0, 23), min_size=1, max_size=8), min_size=1, max_size=10),
)
def test_a_layout_of_groups_lists_each_gpus_groups_in_order(num_gpus: int, groups: list[list[int]]) -> None:
    """``Layout.of_groups`` is one pass over the groups' ranks (it asked every GPU about every group: minutes
    at 65,536 GPUs, so ilp-flex with a 5 s budget ran past 90 s); each GPU's load is still the groups
    holding it, in group order."""
    layout = Layout.of_groups(groups, num_gpus)
    assert layout.sizes == tuple(len(g) for g in groups)
    assert layout.loads == tuple(tuple(g for g, ranks in enumerate(groups) if gpu in ranks) for gpu in range(num_gpus))


def test_a_layout_of_65536_gpus_is_built_in_one_pass() -> None:
    groups = [tuple(range(k * 4096, (k + 1) * 4096)) for k in range(16)] + [tuple(range(65_536))]
    layout = Layout.of_groups(groups, 65_536)
    assert layout.loads[0] == (0, 16) and layout.loads[65_535] == (15, 16)
