"""``skrull profile --check`` arithmetic: per-rank compute predictions and agreement statistics."""

from __future__ import annotations

from typing import Any

import pytest

from skrull.solver.cost import CostModel
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planning import assemble_plan
from skrull.solver.profile import Profile, profile_from_dict
from skrull.solver.types import MicrobatchSpec, Problem
from skrull.worker.profiling.check import (
    check_measure,
    check_stats,
    rank_compute_ms,
    rank_microbatch_ms,
    rank_predicted_ms,
)
from tests.conftest import HAND_PROFILE, make_request


def test_rank_compute_is_local_plus_sharded_share_per_microbatch(hand_profile: Profile) -> None:
    # hand profile: FLOPs(S) = 1e9 S + 1e5 S^2; T_comp(F) = 2 ms per TFLOP + 0.5 ms
    request = make_request([[10, 20, 40, 30]], dp=1, cp=2, bucket=100)
    problem = Problem.from_request(request)
    specs = (
        MicrobatchSpec(step=0, ranks=(0, 1), local=((0,), (1,)), sharded=(2,)),
        MicrobatchSpec(step=1, ranks=(1,), local=((3,),), sharded=()),
    )
    plan = assemble_plan(problem, PlannerOutput(iterations=(specs,)), solver="skrull", wall_ms=0.0)

    def t(flops: float) -> float:
        return 2.0 * flops / 1e12 + 0.5

    def f(s: int) -> float:
        return 1e9 * s + 1e5 * s * s

    got = rank_compute_ms(plan, problem.lengths, CostModel(hand_profile, bucket_tokens=100), iteration=0)
    share = t(f(40) / 2)
    assert got == pytest.approx([t(f(10)) + share, t(f(20)) + share + t(f(30))])


def test_perfect_predictions_have_no_error_and_r2_one() -> None:
    stats = check_stats([1.0, 2.0, 4.0], [1.0, 2.0, 4.0])
    assert stats.median_abs_rel_error == 0.0 and stats.r2 == 1.0 and stats.n == 3


def test_errors_are_relative_to_the_measurement_and_idle_ranks_are_skipped() -> None:
    stats = check_stats([11.0, 18.0, 33.0, 0.0], [10.0, 20.0, 30.0, 0.0])
    assert stats.median_abs_rel_error == pytest.approx(0.1)
    assert stats.max_abs_rel_error == pytest.approx(0.1)
    assert stats.median_abs_error_ms == pytest.approx(1.5)
    assert 0.95 < stats.r2 < 1.0
    with pytest.raises(ValueError, match="as many"):
        check_stats([1.0], [1.0, 2.0])


def test_check_block_is_read_back_as_written() -> None:
    from skrull.worker.profiling.check import check_block, read_check

    block = check_block(median_abs_rel_error=0.08, limit=0.15, what="w", report="r.md")
    assert block == {"median_abs_rel_error": 0.08, "limit": 0.15, "passed": True, "what": "w", "report": "r.md"}
    assert read_check({"check": block}) == (0.08, True)
    assert read_check({"check": check_block(median_abs_rel_error=0.2, limit=0.15, what="w")}) == (0.2, False)


@pytest.mark.parametrize(
    "check",
    [None, "fine", [], {}, {"median_abs_rel_error": float("nan"), "limit": 0.15},
     {"median_abs_rel_error": True, "limit": 0.15}, {"median_abs_rel_error": "0.1", "limit": 0.15},
     {"median_abs_rel_error": 0.1, "limit": float("inf")}, {"median_abs_rel_error": 10**400, "limit": 0.15},
     {"median_abs_rel_error": {"a": {"b": 1}}, "limit": 0.15}],
)  # fmt: skip
def test_an_unreadable_check_block_reads_as_none(check: Any) -> None:
    from skrull.worker.profiling.check import read_check

    assert read_check({"check": check}) is None


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b"])
def test_bundled_check_blocks_are_what_the_writer_makes(model: str) -> None:
    from skrull.solver.profile import load_profile
    from skrull.worker.profiling.check import check_block, check_what

    block = load_profile(f"h100-80g-measured/{model}").extra["check"]
    datasets, solvers = ["chatqa2-long-sft", "llama3-sft-mix"], ["skrull", "deepspeed"]
    what = check_what(datasets=datasets, solvers=solvers, dp=1, cp=8, sequences_per_rank=16)
    error, report = block["median_abs_rel_error"], f"docs/gpu-check/{model}.check.md"
    expected = check_block(median_abs_rel_error=error, limit=0.15, what=what, report=report)
    assert block == expected


def _two_microbatch_plan() -> tuple[Any, list[int]]:
    request = make_request([[10, 20, 40, 30]], dp=1, cp=2, bucket=100)
    problem = Problem.from_request(request)
    specs = (
        MicrobatchSpec(step=0, ranks=(0, 1), local=((0,), (1,)), sharded=(2,)),
        MicrobatchSpec(step=1, ranks=(1,), local=((3,),), sharded=()),
    )
    return assemble_plan(problem, PlannerOutput(iterations=(specs,)), solver="skrull", wall_ms=0.0), problem.lengths


def test_whole_microbatches_are_priced_with_microbatch_ms_and_without_communication(hand_profile: Profile) -> None:
    # hand profile: microbatch_ms 3; rank 0 takes part in one microbatch, rank 1 in two
    plan, lengths = _two_microbatch_plan()
    model = CostModel(hand_profile, bucket_tokens=100)
    compute = rank_compute_ms(plan, lengths, model, iteration=0)
    whole = rank_microbatch_ms(plan, lengths, model, iteration=0)
    assert whole == pytest.approx([compute[0] + 3.0, compute[1] + 2 * 3.0])
    assert rank_predicted_ms(plan, lengths, model, iteration=0, measure="layers") == compute
    assert rank_predicted_ms(plan, lengths, model, iteration=0, measure="microbatches") == whole


def test_a_calibrated_profile_is_checked_on_what_it_was_fitted_on() -> None:
    """A calibrated profile whose per-microbatch constant dominates (a host-bound step): a device whose
    microbatches cost exactly what it says checks at 0% on whole microbatches, while compute alone, the
    check's other measure, would read the constant as a large error."""
    calibrated = {
        **HAND_PROFILE,
        "compute": {**HAND_PROFILE["compute"], "fixed_ms": 0.0},
        "microbatch_ms": 40.0,
        "calibrated": {"from": "hand", "microbatches": 24},
    }
    assert check_measure(calibrated) == "microbatches" and check_measure(HAND_PROFILE) == "layers"
    assert check_measure(calibrated, "layers") == "layers"
    with pytest.raises(ValueError, match="measure"):
        check_measure(calibrated, "kernels")
    plan, lengths = _two_microbatch_plan()
    model = CostModel(profile_from_dict(calibrated), bucket_tokens=100)

    def device_ms(rank: int) -> float:  # the machine the fit describes: 40 ms + compute per microbatch
        total = 0.0
        for mb in plan.iterations[0].microbatches:
            if rank in mb.ranks:
                ids = mb.local[mb.ranks.index(rank)]
                share = sum(model.flops(lengths[i]) for i in mb.sharded) / len(mb.ranks)
                total += 40.0 + model.coefficients.ms_per_flop * (sum(model.flops(lengths[i]) for i in ids) + share)
        return total

    measured = [device_ms(r) for r in range(plan.parallel.num_gpus)]
    like = rank_predicted_ms(plan, lengths, model, iteration=0, measure=check_measure(calibrated))
    assert check_stats(like, measured).median_abs_rel_error == pytest.approx(0.0, abs=1e-12)
    unlike = rank_compute_ms(plan, lengths, model, iteration=0)
    assert check_stats(unlike, measured).median_abs_rel_error > 0.9
