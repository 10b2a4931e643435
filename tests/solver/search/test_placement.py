"""Placements: every candidate fits its bucket and is timed exactly as the reference model times it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.profile import load_profile
from skrull.solver.search.placement import Placer, mb_ids

COST = CostModel(load_profile("h100-80g/qwen2.5-0.5b"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.integers(1, 4000), st.integers(1, 60000)), min_size=1, max_size=30),
    st.sampled_from([1, 2, 8, 16]),
)
def test_candidates_fit_and_are_timed_by_the_reference_model(lengths: list[int], group_size: int) -> None:
    placer = Placer(lengths, COST, group_size)
    ids = tuple(range(len(lengths)))
    for candidate in placer._candidates(ids):
        if candidate is None:
            continue
        mb, time_ms = candidate
        assert placer.fits(mb)
        assert sorted(mb_ids(mb)) == list(ids)
        assert abs(placer.time(mb) - time_ms) <= 1e-9 * max(1.0, time_ms)
    best = placer.best(ids)
    if best is not None:
        assert best[1] >= placer.lower_ms(ids) - 1e-9
        assert all(c is None or best[1] <= c[1] + 1e-9 for c in placer._candidates(ids))
    else:
        assert sum(lengths) > group_size * COST.bucket_tokens or all(c is None for c in placer._candidates(ids))
