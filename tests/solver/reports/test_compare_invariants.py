"""``compare``'s table holds no contradiction a reader could point at, on every row: its bounds are never
above any plan of the layout they claim that runs every sequence of its batch, a deferring row is marked and
kept out of the bound columns, totals and per-iteration figures agree, an exact planner's own model bound is
never below the any-layout bound, and an exact planner is never worse than any heuristic of its layout (it
starts from the best of them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.io import read_json, request_from_dict
from skrull.solver.reports.compare import CompareRow, compare, format_table
from skrull.solver.types import Plan, Request
from tests.conftest import HAND_PROFILE, make_request

#: The hand profile with 8 attention heads (2 K/V) and an all-to-all, so Ulysses rows (``xtuner``) run too.
ULYSSES_PROFILE = {
    **HAND_PROFILE,
    "heads": {"attention": 8, "kv": 2},
    "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.0004, "fixed_ms": 0.3},
}

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "requests"
EPS = 1e-9
EXACT = ("ilp", "ilp(scip)", "ilp(cpsat)", "ilp-flex")


def _ge(a: float, b: float) -> bool:
    return a >= b - 1e-6 * max(1.0, abs(b))


def assert_invariants(request: Request, rows: list[CompareRow], plans: dict[str, Plan]) -> None:
    ok = [r for r in rows if r.error is None]
    assert ok, [r.error for r in rows]
    bound = ok[0].bound_ms
    static = ok[0].bound_static_ms
    assert bound is not None and static is not None and bound > 0
    assert _ge(static, bound)  # every static plan is a plan of some layout
    for row in ok:
        assert row.total_ms is not None and row.ms_per_iteration is not None
        # one bound per meaning: every row carries the same two
        assert (row.bound_ms, row.bound_static_ms) == (bound, static), row.solver
        assert row.iteration_ms == row.total_ms
        assert row.ms_per_iteration * len(plans[row.solver].iterations) == pytest.approx(row.total_ms)
        if row.defers:
            # a deferring row is compared to the bound of the work it runs, in its own column only
            assert row.ratio_to_bound is None and row.gap is None and row.layout_gap is None, row.solver
            assert row.ratio_to_own_work_bound is not None and _ge(row.ratio_to_own_work_bound, 1.0), row.solver
            assert row.solver + " *" in format_table(rows)
            continue
        assert row.ratio_to_own_work_bound is None
        assert _ge(row.total_ms, bound), (row.solver, row.total_ms, bound)
        assert row.ratio_to_bound is not None and _ge(row.ratio_to_bound, 1.0)
        if row.layout == "static":
            assert _ge(row.total_ms, static), (row.solver, row.total_ms, static)
        assert row.layout_gap is not None and row.layout_gap >= -1e-6, row.solver
        if row.model_bound_ms is not None:
            own = plans[row.solver].solve.bound_ms
            assert own is not None and _ge(row.model_bound_ms, own), row.solver
            assert _ge(row.total_ms, row.model_bound_ms)
    # the exact planners start from the best heuristic plan of their layout: never worse than any of them
    heuristics = [r for r in ok if r.solver not in EXACT and not r.defers]
    for row in ok:
        if row.solver not in EXACT:
            continue
        static_only = row.solver != "ilp-flex"
        rivals = [r for r in heuristics if r.layout == "static" or not static_only]
        for rival in rivals:
            assert row.total_ms is not None and rival.total_ms is not None
            assert row.total_ms <= rival.total_ms * (1 + 1e-9) + EPS, (row.solver, rival.solver)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_every_row_of_every_bundled_request_is_consistent_and_exact_rows_beat_their_layouts_heuristics(
    name: str,
) -> None:
    request = request_from_dict(read_json(EXAMPLES / name))
    if request.time_budget_s is None:  # what compare gives it is 60 s for the exact planners: a test keeps 1 s
        request = dataclasses.replace(request, time_budget_s=1.0)
    rows, plans = compare(request)
    assert all(r.error is None for r in rows), [(r.solver, r.error) for r in rows if r.error]
    assert_invariants(request, rows, plans)


@pytest.mark.slow  # every planner on 15 requests: tens of seconds on 2 cores
@settings(max_examples=15)
@given(
    batches=st.lists(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=8), min_size=1, max_size=2),
    dp=st.sampled_from([1, 2]),
    cp=st.sampled_from([1, 2, 4]),
    bucket=st.sampled_from([100, 150, 400]),
    modes=st.sampled_from([["allgather"], ["allgather", "ulysses"]]),
)
def test_every_row_of_a_fresh_request_is_consistent(
    batches: list[list[int]], dp: int, cp: int, bucket: int, modes: list[str]
) -> None:
    fits = cp * bucket  # what one CP group holds: longer sequences are refused before any planner runs
    request = request_from_dict(
        {
            "batches": [[min(length, fits) for length in batch] for batch in batches],
            "parallel": {"dp": dp, "cp": cp},
            "profile": {**ULYSSES_PROFILE, "memory": {"bucket_tokens": bucket}},
            "cp_modes": modes,
            "time_budget_s": 0.4,
        }
    )
    rows, plans = compare(request)
    assert_invariants(request, rows, plans)


def test_a_deferring_row_is_marked_and_kept_out_of_the_bound_columns() -> None:
    # WLB-LLM moves an outlier to the next iteration: its row runs other work than the request's batches
    batches = [[10, 10, 10, 10, 10, 10, 390, 395], [5, 5, 5]]
    request = make_request(batches, dp=2, cp=2, bucket=200, time_budget_s=0.5)
    rows, plans = compare(request, ["skrull", "wlb", "deepspeed"])
    wlb = next(r for r in rows if r.solver == "wlb")
    assert wlb.defers and wlb.avg_delay_iterations is not None and wlb.avg_delay_iterations > 0
    assert wlb.total_ms is not None and wlb.bound_ms is not None
    assert wlb.total_ms < wlb.bound_ms  # below the request's bound: why it may not sit in that column
    assert_invariants(request, rows, plans)
    table = format_table(rows)
    assert "x own-work" in table and "ms/iteration" in table and "total ms" in table


def test_the_legend_is_printed_by_help_and_in_the_docs() -> None:
    import contextlib
    import io

    from skrull.cli.main import main as skrull_main
    from skrull.solver.reports.compare import LEGEND

    docs = (Path(__file__).resolve().parents[3] / "docs" / "planners.md").read_text(encoding="utf-8")
    assert LEGEND in docs
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        skrull_main(["compare", "--help"])
    assert all(line.split()[0] in out.getvalue() for line in LEGEND.splitlines() if line.strip())
    assert "60 s for ilp and ilp-flex" in " ".join(out.getvalue().split())
