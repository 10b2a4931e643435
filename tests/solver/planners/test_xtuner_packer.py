"""XTuner as it runs: its Packer cuts the shuffled stream into exact packs carrying the remainder, and its
all-to-all carries the K/V heads repeated to the query heads, in twice the collectives."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skrull.solver.errors import RequestError
from skrull.solver.planners.xtuner_packer import packer_packs, xtuner_packed_run, xtuner_profile
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel, Request


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=60),
    max_length=st.integers(1, 200),
    map_batch=st.integers(1, 25),
    seed=st.integers(0, 5),
)
def test_packs_are_exact_cuts_of_the_shuffled_stream_with_the_remainder_carried(
    lengths: list[int], max_length: int, map_batch: int, seed: int
) -> None:
    packs, split = packer_packs(lengths, max_length, seed=seed, map_batch=map_batch)
    truncated = [min(s, max_length) for s in lengths]  # each sample first cut to max_length
    assert sum(map(sum, packs)) == sum(truncated)  # every token packed once (the last residual kept)
    assert all(0 < sum(p) <= max_length and all(piece > 0 for piece in p) for p in packs)
    short = [p for p in packs if sum(p) < max_length]
    # a short pack only where a map batch's stream was short, or the final residual
    assert len(short) <= -(-len(lengths) // map_batch) + 1
    pieces = sum(len(p) for p in packs)
    assert (split > 0) == (pieces > len(lengths)) and split <= pieces - len(lengths)
    assert packer_packs(lengths, max_length, seed=seed, map_batch=map_batch) == (packs, split)


def test_a_sample_spans_packs_and_its_remainder_starts_the_next() -> None:
    packs, split = packer_packs([3, 3, 3], 4, seed=0)
    # 3+1 | 2+2 | 1: the second sample's remainder opens the second pack, the third's is carried to the end
    assert packs == [[3, 1], [2, 2], [1]] and split == 2


def test_the_kv_heads_go_out_repeated_in_twice_the_collectives() -> None:
    profile = load_profile("h100-80g/qwen2.5-7b")
    assert profile.heads is not None and profile.comm_a2a is not None
    a2a = profile.comm_a2a
    got = xtuner_profile(profile).comm_a2a
    assert got is not None
    ratio = profile.heads.attention / profile.heads.kv
    assert got.bytes_per_token == pytest.approx(a2a.bytes_per_token + a2a.kv_bytes_per_token * (ratio - 1))
    assert got.fixed_ms == pytest.approx(2 * a2a.fixed_ms) and got.kv_bytes_per_token == 0


def test_xtuners_run_costs_more_with_its_repeat_and_is_refused_where_cp_does_not_divide_the_heads() -> None:
    profile = load_profile("h100-80g/qwen2.5-7b")  # 28 heads, 4 K/V
    request = Request(batches=((30000, 900, 4000, 12000, 700, 2500),), parallel=Parallel(dp=2, cp=4), profile=profile)
    faithful = xtuner_packed_run(request)
    plain = xtuner_packed_run(request, repeat_kv=False)
    assert faithful.packs == plain.packs and faithful.total_ms > plain.total_ms
    assert sum(map(sum, faithful.packs)) == sum(request.batches[0])
    with pytest.raises(RequestError, match=r"parallel\.cp"):
        xtuner_packed_run(dataclasses.replace(request, parallel=Parallel(dp=1, cp=8)))
