"""``skrull profile --check`` arithmetic: per-rank compute predictions and agreement statistics."""

from __future__ import annotations

from typing import Any

import pytest

from skrull.solver.cost import CostModel
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planning import assemble_plan
from skrull.solver.profile import Profile
from skrull.solver.types import MicrobatchSpec, Problem
from skrull.worker.profiling.check import check_stats, rank_compute_ms
from tests.conftest import make_request


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
