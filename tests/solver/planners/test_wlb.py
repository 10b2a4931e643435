"""WLB-LLM: outlier queues pop when they hold one document per microbatch, greedy placement, delays,
and the adaptive per-sequence / per-document sharding choice."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings

from skrull.solver.attention_model import AttentionKernelModel
from skrull.solver.planners.wlb import PENDING, WlbPlanner, choose_sharding, delay_stats, wlb_pack
from skrull.solver.planning import solve
from skrull.solver.profile import profile_from_dict
from skrull.solver.types import Request
from skrull.solver.worker_view import plan_rank_view
from tests.conftest import HAND_PROFILE, make_request
from tests.solver.planners.peer_requests import planned, requests


def square(d: int) -> float:
    return float(d * d)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_plans_are_valid_and_account_for_every_sequence(request: Request) -> None:
    plan = solve(dataclasses.replace(request, solver="wlb"))  # validated inside solve
    ran = [i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids]
    assert sorted(ran + list(plan.pending)) == list(range(request.num_sequences))
    stats = plan.solve.stats_dict
    assert stats["pending_sequences"] == len(plan.pending)
    assert stats["avg_delay_iterations"] >= 0.0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_fixed_thresholds_and_count_stay_valid(request: Request) -> None:
    bucket = request.bucket_tokens
    planned(WlbPlanner(thresholds=(max(1, bucket // 2), bucket), microbatches_per_rank=1), request)


def test_queue_pops_once_it_holds_one_document_per_microbatch() -> None:
    # M = 2 microbatches, threshold 50: doc 0 (60) waits in iteration 0; doc 3 (70) makes two -> both run
    # in iteration 1, one per microbatch.
    lengths = [60, 10, 10, 70, 10, 10, 10, 10]
    packing = wlb_pack(
        lengths=lengths,
        batch_ids=[(0, 1, 2), (3, 4, 5), (6, 7)],
        num_microbatches=2,
        s_max=100,
        workload=square,
        thresholds=(50,),
    )
    assert packing.placed_in[0] == 1 and packing.placed_in[3] == 1
    assert sorted(mb.count(0) + mb.count(3) for mb in packing.iterations[1]) == [1, 1]
    assert all(0 not in mb and 3 not in mb for mb in packing.iterations[0])
    assert packing.pending == ()
    stats = delay_stats(packing, lengths, [(0, 1, 2), (3, 4, 5), (6, 7)])
    assert stats["avg_delay_iterations"] == 60 / sum(lengths)  # only doc 0 waits, one iteration
    assert stats["delayed_sequences"] == 1


def test_queue_that_never_fills_leaves_its_documents_pending() -> None:
    packing = wlb_pack(
        lengths=[60, 10, 10, 10],
        batch_ids=[(0, 1), (2, 3)],
        num_microbatches=2,
        s_max=100,
        workload=square,
        thresholds=(50,),
    )
    assert packing.pending == (0,)
    assert packing.placed_in[0] == PENDING
    # a pending sequence counts as delayed to just past the last iteration: 2 - 0 = 2 iterations
    assert delay_stats(packing, [60, 10, 10, 10], [(0, 1), (2, 3)])["avg_delay_iterations"] == 2 * 60 / 90


def test_two_level_queues_pop_independently() -> None:
    # thresholds 40 and 70: 45 and 50 go to queue 1, 80 to queue 2; with M = 2 only queue 1 pops.
    packing = wlb_pack(
        lengths=[45, 80, 50, 5],
        batch_ids=[(0, 1, 2, 3)],
        num_microbatches=2,
        s_max=100,
        workload=square,
        thresholds=(40, 70),
    )
    assert packing.placed_in[:3] == (0, PENDING, 0)
    assert packing.pending == (1,)


def test_greedy_takes_least_workload_then_shortest_then_defers() -> None:
    # workload d^2, descending: 80 -> mb0; 45 -> mb1; 40 -> mb1 (least workload, 85 tokens fit);
    # 30 -> least-workload mb1 would hold 115 > 100, the shortest (mb0, 80) 110 > 100: it waits;
    # 20 -> mb1 would hold 105, so the shortest, mb0, takes it (exactly 100).
    # Next iteration the leftover 30 goes first (mb0), then the new document (mb1).
    lengths = [80, 45, 40, 20, 30, 1]
    packing = wlb_pack(
        lengths=lengths,
        batch_ids=[(0, 1, 2, 3, 4), (5,)],
        num_microbatches=2,
        s_max=100,
        workload=square,
        thresholds=(),
    )
    assert packing.iterations[0] == ((0, 3), (1, 2))
    assert packing.placed_in[4] == 1
    assert packing.iterations[1] == ((4,), (5,))


def test_adaptive_sharding_prefers_per_sequence_for_many_short_documents() -> None:
    # 64 documents of 100 tokens over 4 GPUs: per-document cuts each into 8 chunks of 12-13 rows, every
    # one padded to a 128-row tile; per-sequence keeps most documents whole inside 800-token chunks.
    kernel = AttentionKernelModel(profile_from_dict(HAND_PROFILE))
    mode, per_seq, per_doc = choose_sharding([100] * 64, 4, kernel)
    assert mode == "per-sequence" and per_seq < per_doc


def test_adaptive_sharding_prefers_per_document_when_a_long_document_skews_positions() -> None:
    # 6000 + 10 x 200 over 2 GPUs, per-sequence: 4 chunks of 2000; position 1 holds rows 2000-6000 of the
    # long document (the heavy ones), position 0 rows 0-2000 and the short ones. Per-document splits
    # every document evenly, so both positions do about the same work.
    kernel = AttentionKernelModel(profile_from_dict(HAND_PROFILE))
    mode, per_seq, per_doc = choose_sharding([6000] + [200] * 10, 2, kernel)
    assert mode == "per-document" and per_doc < per_seq


def test_plan_and_worker_view_carry_the_chosen_sharding() -> None:
    request = make_request([[3000] + [100] * 10], dp=1, cp=2, bucket=3000)
    plan = planned(WlbPlanner(thresholds=(), microbatches_per_rank=1), request)
    lengths = [s for b in request.batches for s in b]
    modes = {mb.sharding for it in plan.iterations for mb in it.microbatches}
    assert modes == {"per-document"}
    covered: dict[int, int] = {}
    for rank in (0, 1):
        view = plan_rank_view(plan, lengths, iteration=0, rank=rank)
        for mb in view.microbatches:
            assert view.to_dict()["microbatches"][0]["sharding"] == "per-document"
            for shard in mb.shards:
                covered[shard.seq_id] = covered.get(shard.seq_id, 0) + shard.num_local_tokens
    assert covered == {i: lengths[i] for i in range(len(lengths))}
