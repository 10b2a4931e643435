"""DACP (Alg. 1 + Alg. 3) and round-robin (B.2) placement, pinned on hand-checked cases."""

from __future__ import annotations

from skrull.solver.planners.dacp import SHARDED, dacp_place, round_robin_place


def flops(s: int) -> float:
    return 1e9 * s + 1e5 * s * s


def test_short_sequences_stay_local_on_least_loaded_rank_and_long_one_is_sharded() -> None:
    # ascending: 1 -> rank 0; 2 -> rank 1 (less load); 3 -> rank 0 (FLOPs(1) < FLOPs(2));
    # 9 fits nowhere whole (remaining 6 and 8 tokens) and is sharded: 4.5 tokens on each rank.
    assert dacp_place([1, 2, 3, 9], group_size=2, bucket_tokens=10, flops=flops) == [0, 1, 0, SHARDED]


def test_placement_follows_input_positions_not_sorted_order() -> None:
    assert dacp_place([9, 3, 1, 2], group_size=2, bucket_tokens=10, flops=flops) == [SHARDED, 0, 0, 1]


def test_least_loaded_rank_takes_the_sequence_when_it_fits() -> None:
    # 4 -> rank 0, 5 -> rank 1; 6: least-loaded rank 0 has exactly 6 tokens left
    assert dacp_place([4, 5, 6], group_size=2, bucket_tokens=10, flops=flops) == [0, 1, 0]
    # 1 -> r0, 1 -> r1, 2 -> r0 (equal loads: lowest rank), 8: r1 is least loaded with 9 left
    assert dacp_place([1, 1, 2, 8], group_size=2, bucket_tokens=10, flops=flops) == [0, 1, 0, 1]


def test_rollback_makes_a_full_microbatch_fit() -> None:
    # 6 -> r0, 7 -> r1; the last 7 fits nowhere and cannot be sharded (r1 has 3 < 3.5 left):
    # rollback shards r1's 7, then r0's 6, and the last 7 is sharded: 10 tokens on each rank.
    assert dacp_place([6, 7, 7], group_size=2, bucket_tokens=10, flops=flops) == [SHARDED] * 3


def test_without_rollback_the_same_microbatch_fails() -> None:
    assert dacp_place([6, 7, 7], group_size=2, bucket_tokens=10, flops=flops, rollback=False) is None


def test_fails_when_the_group_cannot_hold_the_microbatch() -> None:
    assert dacp_place([6, 7, 8], group_size=2, bucket_tokens=10, flops=flops) is None


def test_round_robin_places_by_remaining_bucket_in_given_order() -> None:
    # 5 -> r0 (tie), 1 -> r1 (more left), 1 -> r1 (9 > 5 left), 4 -> r1 (8 > 5 left)
    assert round_robin_place([5, 1, 1, 4], group_size=2, bucket_tokens=10) == [0, 1, 1, 1]
    assert round_robin_place([6, 7, 7], group_size=2, bucket_tokens=10) == [SHARDED] * 3
    assert round_robin_place([6, 7, 7], group_size=2, bucket_tokens=10, rollback=False) is None


def test_one_gpu_group_keeps_everything_that_fits() -> None:
    assert dacp_place([3, 4], group_size=1, bucket_tokens=7, flops=flops) == [0, 0]
    assert dacp_place([3, 5], group_size=1, bucket_tokens=7, flops=flops) is None
