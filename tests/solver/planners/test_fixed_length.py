"""WLB-LLM's fixed-length packing baselines: loader order, greedy by d^2, and the eq. (1) ILP."""

from __future__ import annotations

from skrull.solver.planners.fixed_length import fixed_length_greedy, fixed_length_ilp, original_packing


def max_attention(lengths: list[int], packs: list[list[int]]) -> int:
    return max(sum(lengths[k] ** 2 for k in p) for p in packs)


def test_original_packing_starts_a_sequence_when_the_next_document_overflows() -> None:
    assert original_packing([60, 30, 20, 90, 10], 100) == [[0, 1], [2], [3, 4]]


def test_greedy_balances_squares_within_the_window() -> None:
    lengths = [60, 50, 40, 30, 20]
    # 60 -> s0; 50 -> s1; 40 -> s1 (2500 < 3600, 90 tokens); 30 -> s0 (3600 < 4100, 90 tokens);
    # 20 fits neither sequence of a 100-token window (110 > 100), but with 110 goes to the lighter s1
    assert fixed_length_greedy(lengths, 2, 100) is None
    assert fixed_length_greedy(lengths, 2, 110) == [[0, 3], [1, 2, 4]]


def test_ilp_finds_the_optimum_greedy_misses() -> None:
    # squares 289, 289, 196, 196, 196: greedy (LPT) 289+196+196 = 681 | 485; optimum 578 | 588
    lengths = [17, 17, 14, 14, 14]
    greedy = fixed_length_greedy(lengths, 2, 100)
    packs, status, bound = fixed_length_ilp(lengths, 2, 100, time_limit_s=10.0)
    assert greedy is not None and max_attention(lengths, greedy) == 681
    assert status == "OPTIMAL" and packs is not None
    assert max_attention(lengths, packs) == 588 and bound == 588
    assert sorted(k for p in packs for k in p) == list(range(len(lengths)))


def test_ilp_respects_the_window() -> None:
    packs, _, _ = fixed_length_ilp([17, 17, 14, 14, 14], 2, 42, time_limit_s=10.0)
    assert packs is not None and all(sum([17, 17, 14, 14, 14][k] for k in p) <= 42 for p in packs)
