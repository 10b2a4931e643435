"""The one cut of sharded sequences over a group (zigzag, contiguous, WLB-LLM's per-sequence and
per-document): exact cover, every position within one token of the average over the whole microbatch
(so a bucket is never exceeded where the average fits), the hand cases, cost independent of group size."""

from __future__ import annotations

import itertools
import timeit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.sharding import (
    SHARDING_MODES,
    group_ranges,
    layout,
    max_position_tokens,
    per_document_layout,
    per_sequence_layout,
    position_ranges,
    position_token_counts,
)


def test_per_document_hand_case_deals_the_remainder_round_robin() -> None:
    # doc 10 over 2 GPUs: chunks of 2, position 0 takes [0,2) and [6,8), 1 takes [2,6); the 2 tail tokens
    # go to positions 0 and 1. doc 7: chunks of 1, tail of 3 dealt from position 0 again: 2 then 1.
    assert per_document_layout([10, 7], 2) == [
        [((0, 2), (6, 9)), ((2, 6), (9, 10))],
        [((0, 1), (3, 6)), ((1, 3), (6, 7))],
    ]


def test_per_document_continues_the_deal_across_documents() -> None:
    # three 5-token documents over 2 GPUs: e = 1, one tail token each, to positions 0, 1, 0
    cuts = per_document_layout([5, 5, 5], 2)
    tails = [next(p for p in range(2) if any(end == 5 for _, end in cuts[k][p])) for k in range(3)]
    assert tails == [0, 1, 0]


def test_per_sequence_cuts_the_packed_buffer_zigzag() -> None:
    # [6, 2] packed into 8 tokens, 4 chunks of 2: position 0 holds buffer [0,2) and [6,8), i.e. doc 0
    # [0,2) and all of doc 1; position 1 holds buffer [2,6) = doc 0 [2,6).
    assert per_sequence_layout([6, 2], 2) == [[((0, 2),), ((2, 6),)], [((0, 2),), ()]]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["per-sequence", "per-document"]),
    st.lists(st.integers(1, 300), min_size=1, max_size=12),
    st.integers(1, 8),
)
def test_layouts_cover_every_token_once_and_balance_tokens(mode: str, lengths: list[int], n: int) -> None:
    cuts = layout(mode, lengths, n)
    per_position = [0] * n
    for k, s in enumerate(lengths):
        tokens = sorted(t for p in range(n) for a, b in cuts[k][p] for t in range(a, b))
        assert tokens == list(range(s))
        for p in range(n):
            per_position[p] += sum(b - a for a, b in cuts[k][p])
    # per-document deals remainders round-robin: exact balance within one token (WLB-LLM sec. 5.1)
    assert max(per_position) - min(per_position) <= (1 if mode == "per-document" else 2)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sharding mode"):
        layout("striped", [10], 2)


# -- bucket-exact: one cut, remainders dealt over the whole microbatch -----------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(SHARDING_MODES),
    st.lists(st.integers(1, 400), min_size=1, max_size=10),
    st.integers(1, 12),
)
def test_every_mode_covers_each_token_once_and_deals_floor_or_ceil(mode: str, lengths: list[int], n: int) -> None:
    by_position = [position_ranges(mode, lengths, n, p) for p in range(n)]
    for k, s in enumerate(lengths):
        tokens = sorted(t for p in range(n) for a, b in by_position[p][k] for t in range(a, b))
        assert tokens == list(range(s))
        for p in range(n):  # ascending, merged, no empty range
            ranges = by_position[p][k]
            assert all(a < b for a, b in ranges)
            assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(ranges))
    held = [sum(b - a for ranges in by_position[p] for a, b in ranges) for p in range(n)]
    assert list(position_token_counts(mode, lengths, n)) == held
    total = sum(lengths)
    assert set(held) <= {total // n, -(-total // n)}
    assert max(held) == max_position_tokens(total, n)
    assert group_ranges(mode, lengths, n) == [tuple(by_position[p][k] for p in range(n)) for k in range(len(lengths))]


def test_zigzag_puts_no_gpu_over_the_bucket_where_the_average_fits() -> None:
    # three sequences averaging exactly 26,000 tokens per GPU of 8: the leading-chunk rule gave GPU 0 26,001
    counts = position_token_counts("zigzag", [69345, 69345, 69310], 8)
    assert counts == (26000,) * 8


def test_zigzag_hand_case_deals_early_then_late_chunks() -> None:
    # 11 tokens over 2 GPUs: 4 chunks of 2, 3 dealt: position 0 gets two (early and late chunk), 1 gets one.
    # Early chunks: p0 [0,3), p1 [3,6); late chunks in order p1, p0: p1 [6,8), p0 [8,11).
    assert position_ranges("zigzag", [11], 2, 0) == (((0, 3), (8, 11)),)
    assert position_ranges("zigzag", [11], 2, 1) == (((3, 8),),)
    # 3 tokens were dealt (to 0, 1, 0), so the next sequence's deal starts at position 1: 5 = 4*1 + 1, its one
    # dealt token lengthens position 1's early chunk [1,3); late chunks p1 [3,4), p0 [4,5)
    assert position_ranges("zigzag", [11, 5], 2, 1)[1] == ((1, 4),)
    assert position_ranges("zigzag", [11, 5], 2, 0)[1] == ((0, 1), (4, 5))


def test_contiguous_deals_the_remainder_on_from_the_previous_sequence() -> None:
    # [5, 5] over 3: 5 = 3 + 2, the first sequence's extras go to positions 0, 1, the second's to 2, 0
    assert position_token_counts("contiguous", [5, 5], 3) == (4, 3, 3)
    assert position_ranges("contiguous", [5, 5], 3, 2) == (((4, 5),), ((3, 5),))


def test_one_position_costs_the_same_at_any_group_size() -> None:
    lengths = [70_000, 3_000, 900_001]
    small = timeit.timeit(lambda: position_ranges("zigzag", lengths, 8, 5), number=200)
    huge = timeit.timeit(lambda: position_ranges("zigzag", lengths, 16_384, 9_999), number=200)
    assert huge < 5 * small + 0.01
