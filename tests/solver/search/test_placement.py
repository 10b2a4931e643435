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


def test_a_placement_gives_up_at_its_deadline_and_caches_nothing() -> None:
    # 3,000 short sequences over 1,024 GPUs: one placement is O(K * N) steps (0.52 s seen at CP 1024, begun
    # 0.33 s before the search's deadline); on a work clock it reads the clock as it goes and stops there
    from skrull.solver.search.clock import WorkClock

    lengths = [20 + (7 * i) % 300 for i in range(3000)]
    clock = WorkClock()
    placer = Placer(lengths, COST, 1024, clock=clock)
    ids = list(range(len(lengths)))
    placer.deadline = clock() + 2e-4  # two readings away
    assert placer.best(ids) is None
    readings = round(clock() / clock.tick_s)
    assert readings <= 6  # it stopped at the deadline, not after the whole placement
    placer.deadline = float("inf")  # the give-up was not cached as "does not fit"
    found = placer.best(ids)
    assert found is not None and sorted(mb_ids(found[0])) == ids
