"""Imbalance degree, peak bucket use and the synchronized makespan on hand-built plans."""

from __future__ import annotations

from skrull.solver.metrics import imbalance_degree, peak_bucket_use, synchronized_makespan_ms, tokens_run
from skrull.solver.types import Iteration, Microbatch, Parallel, Plan, SolveInfo


def mb(
    step: int,
    ranks: tuple[int, ...],
    ms: float,
    *,
    local: tuple[tuple[int, ...], ...] = (),
    sharded: tuple[int, ...] = (),
) -> Microbatch:
    return Microbatch(step=step, ranks=ranks, local=local or tuple(() for _ in ranks), sharded=sharded, estimated_ms=ms)


def plan_of(*microbatches: Microbatch, dp: int = 1, cp: int = 2) -> Plan:
    it = Iteration(index=0, microbatches=microbatches, estimated_ms=0.0, lower_bound_ms=0.0)
    return Plan(
        solver="x",
        parallel=Parallel(dp=dp, cp=cp),
        bucket_tokens=100,
        iterations=(it,),
        pending=(),
        solve=SolveInfo(wall_ms=0.0, status="heuristic", objective_ms=0.0),
    )


def test_imbalance_degree_is_max_times_count_over_total() -> None:
    plan = plan_of(mb(0, (0, 1), 30.0, sharded=(0,)), mb(1, (0, 1), 10.0, sharded=(1,)))
    assert imbalance_degree(plan) == 30.0 * 2 / 40.0


def test_peak_bucket_use_takes_the_fullest_gpu() -> None:
    plan = plan_of(mb(0, (0, 1), 1.0, local=((0,), ()), sharded=(1,)))
    assert peak_bucket_use(plan, [60, 40]) == (60 + 40 / 2) / 100
    assert tokens_run(plan, [60, 40]) == 100


def test_makespan_waits_for_every_gpu_of_a_group() -> None:
    # GPU 0: 10 then the shared 5; GPU 1: 50 then the shared 5 -> the shared microbatch starts at 50.
    # The reference per-GPU sum says max(15, 55) = 55; GPU 0's third microbatch (20, alone) then ends at
    # 75 although GPU 0's own sum is 35.
    plan = plan_of(
        mb(0, (0,), 10.0, local=((0,),)),
        mb(0, (1,), 50.0, local=((1,),)),
        mb(1, (0, 1), 5.0, sharded=(2,)),
        mb(2, (0,), 20.0, local=((3,),)),
        dp=2,
        cp=1,
    )
    assert synchronized_makespan_ms(plan) == 75.0


def test_makespan_equals_the_per_gpu_sum_for_static_groups() -> None:
    plan = plan_of(
        mb(0, (0, 1), 7.0, sharded=(0,)), mb(1, (0, 1), 3.0, sharded=(1,)), mb(0, (2, 3), 4.0, sharded=(2,)), dp=2, cp=2
    )
    assert synchronized_makespan_ms(plan) == 10.0


def test_delay_is_wlbs_own_figure_and_counts_autos_deferral() -> None:
    """One delay for every planner that moves work later: on ``wlb``'s plans it equals the figure ``wlb``
    reports of itself; on ``auto``'s with ``defer`` it counts the sequence it let wait."""
    import dataclasses

    from skrull.solver.lengths.datasets import synthesize_request
    from skrull.solver.metrics import delay_iterations
    from skrull.solver.planning import solve
    from skrull.solver.profile import load_profile
    from skrull.solver.reports.compare import compare
    from skrull.solver.types import Defer
    from tests.conftest import make_request

    for seed in (1, 2, 3):
        request = synthesize_request(
            dataset="arxiv", parallel=Parallel(dp=2, cp=4), profile=load_profile("h100-80g/qwen2.5-7b"),
            sequences_per_rank=12, num_batches=3, seed=seed,
        )  # fmt: skip
        plan = solve(dataclasses.replace(request, solver="wlb"))
        lengths = [n for b in request.batches for n in b]
        own = plan.solve.stats_dict["avg_delay_iterations"]
        assert abs(delay_iterations(plan, [len(b) for b in request.batches], lengths) - own) <= 1e-12
    # nine equal sequences on two GPUs: auto defers the ninth (tests/solver/test_defer.py)
    odd = make_request([[90] * 9, [90] * 8], dp=2, cp=1, solver="auto", deterministic=True, time_budget_s=0.05)
    odd = dataclasses.replace(odd, defer=Defer(max_sequences=1))
    plan = solve(odd)
    ran = {i: k for k, it in enumerate(plan.iterations) for mb in it.microbatches for i in mb.seq_ids}
    waits = sum(k - (i >= 9) for i, k in ran.items()) + sum(2 - (i >= 9) for i in plan.pending)
    assert waits > 0  # equal lengths: the token-weighted mean is the mean over sequences
    assert delay_iterations(plan, [9, 8], [90] * 17) == waits / 17
    row = next(r for r in compare(odd, solvers=["auto"])[0] if r.solver == "auto")
    assert row.avg_delay_iterations == waits / 17
