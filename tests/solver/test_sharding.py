"""Per-sequence and per-document CP layouts (WLB-LLM sec. 5): exact cover, balance, the hand cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.sharding import layout, per_document_layout, per_sequence_layout


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
