"""``auto``: valid plans, never worse than its own starts, budgets kept or refused early, large requests."""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver import planning
from skrull.solver.budget import smallest_budget_s
from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.metrics import work_ms
from skrull.solver.planners.auto import AutoPlanner, _keeps_batches
from skrull.solver.planning import assemble_plan, solve
from skrull.solver.profile import Profile, load_profile
from skrull.solver.profiles.derive import MODELS, TrainingSetup, derive_profile
from skrull.solver.profiles.gpus import GPUS
from skrull.solver.search import starts as starts_module
from skrull.solver.types import Parallel, Plan, Problem, Request
from skrull.solver.validate import plan_problems
from tests.conftest import cpu_seconds, make_request


def per_work(plan: Plan, request: Request) -> float:
    lengths = [s for b in request.batches for s in b]
    return plan.estimated_ms / work_ms(plan, lengths, CostModel(request.profile, bucket_tokens=request.bucket_tokens))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    dp = draw(st.integers(1, 3))
    cp = draw(st.sampled_from([1, 2, 4]))
    bucket = draw(st.integers(20, 300))
    limit = cp * bucket
    length = st.one_of(
        st.integers(1, max(1, bucket // 2)), st.integers(1, limit), st.integers(max(1, limit - 3), limit)
    )
    batches = draw(st.lists(st.lists(length, min_size=1, max_size=24), min_size=1, max_size=2))
    return make_request(batches, dp=dp, cp=cp, bucket=bucket, solver="auto", time_budget_s=1.0, deterministic=True)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_plans_are_valid_and_never_worse_than_any_start(request: Request) -> None:
    plan = solve(request)
    assert plan_problems(plan, request) == []
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= plan.estimated_ms + 1e-6
    problem = Problem.from_request(request)
    outputs = starts_module.run_starts(problem, deadline=time.monotonic() + 60.0, keep_s=0.0)
    assert [name for name, _ in outputs] == [
        s.name for s in starts_module.STARTS if starts_module.plans_modes(s, problem)
    ]
    mine = per_work(plan, request)
    assert plan.pending == ()  # auto keeps every batch in its iteration by default
    runs = [sorted(i for mb in it.microbatches for i in mb.seq_ids) for it in plan.iterations]
    assert runs == [list(ids) for ids in problem.batch_ids]
    for name, output in outputs:
        theirs = assemble_plan(problem, output, solver=name, wall_ms=0.0)
        assert plan_problems(theirs, request) == [], name
        if not _keeps_batches(output, problem):  # a deferring start (even one that leaves nothing pending,
            continue  # only moving a sequence to a later iteration) is not a plan auto may return by default
        assert mine <= per_work(theirs, request) * (1 + 1e-9), name


def bimodal_request(profile: Profile, parallel: Parallel, num_batches: int, size: int, *, seed: int) -> Request:
    """Short (sharegpt) lengths with a seeded 10-40% of long-tailed (arxiv) ones in every batch."""
    rng = random.Random(seed)
    batches = []
    for _ in range(num_batches):
        num_long = round(rng.uniform(0.1, 0.4) * size)
        short, long = (
            synthesize_request(dataset=d, parallel=parallel, profile=profile, sequences_per_rank=size // parallel.dp,
                               seed=rng.randrange(2**31)).batches[0]
            for d in ("sharegpt", "arxiv")
        )  # fmt: skip
        batch = list(short[: size - num_long]) + list(long[:num_long])
        rng.shuffle(batch)
        batches.append(tuple(batch))
    return Request(batches=tuple(batches), parallel=parallel, profile=profile)


def derived_7b(*, tp: int) -> Profile:
    """Llama-2-7B on an H100 shape: a profile derived here, not bundled."""
    return derive_profile(MODELS["llama2-7b"], GPUS["h100-80g"], TrainingSetup(tp=tp, dp=8, zero_stage=3))


#: (name, request maker): seeded requests of the shapes users send
REALISTIC: list[tuple[str, Any]] = [
    ("bimodal 7B, DP2 x CP16, 6 x 80", lambda: bimodal_request(derived_7b(tp=1), Parallel(dp=2, cp=16), 6, 80, seed=3)),
    (
        "bimodal 7B TP8, DP4 x CP8, 2 x 128",
        lambda: bimodal_request(derived_7b(tp=8), Parallel(dp=4, cp=8), 2, 128, seed=4),
    ),
    ("github 0.5B, DP4 x CP8, 2 x 64", lambda: qwen_request(2, 16)),
]


@pytest.mark.parametrize(("name", "make"), REALISTIC)
def test_auto_is_never_worse_than_any_of_its_starts_on_realistic_requests(name: str, make: Any) -> None:
    # deterministic: the starts whose prior fits the budget run in process (all of them at these sizes: checked
    # below, hydraulis included), so the starts below are those auto searched from
    request = dataclasses.replace(make(), solver="auto", time_budget_s=0.5, deterministic=True)
    problem = Problem.from_request(request)
    plan = solve(request)
    assert plan_problems(plan, request) == []
    outputs = starts_module.run_starts(problem, deadline=float("inf"), keep_s=0.0, isolate=False)
    kept = [(n, o) for n, o in outputs if _keeps_batches(o, problem)]
    assert {"hydraulis", "skrull", "packed"} <= {n for n, _ in kept}, name
    mine = per_work(plan, request)
    for start, output in kept:
        assert mine <= per_work(assemble_plan(problem, output, solver=start, wall_ms=0.0), request) * (1 + 1e-9), start


def qwen_request(num_batches: int, per_rank: int, dataset: str = "github") -> Request:
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    return synthesize_request(
        dataset=dataset,
        parallel=Parallel(dp=4, cp=8),
        profile=profile,
        sequences_per_rank=per_rank,
        num_batches=num_batches,
        seed=1,
    )


#: Processes that may compute at once while a budgeted planner runs: the planner and one forked child
#: (``auto``'s peers, a solver process); its CPU seconds stay under this many times its budget.
PROCESSES = 2
#: CPU seconds besides the budget's (imports of a solver module in a child, forking).
CPU_SLACK_S = 0.5


@pytest.mark.parametrize("solver", ["auto", "ilp", "skrull", "hydraulis", "wlb", "dynamic-cp"])
def test_budget_is_kept_on_a_modest_request(solver: str) -> None:
    # load-independent: the CPU it burns, not its wall time (bench/budgets.py measures the wall promise,
    # budget + max(20 ms, 5%))
    budget = 0.5
    request = dataclasses.replace(qwen_request(2, 32), solver=solver, time_budget_s=budget)
    plan, cpu_s = cpu_seconds(lambda: solve(request))
    assert cpu_s <= PROCESSES * (budget + max(0.02, 0.05 * budget)) + CPU_SLACK_S
    assert plan_problems(plan, request) == []


def test_a_budget_that_cannot_be_kept_is_refused_early_with_the_smallest_that_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = dataclasses.replace(qwen_request(1, 64), solver="dynamic-cp", time_budget_s=0.01)
    need = smallest_budget_s("dynamic-cp", [256], request.parallel)

    def no_planning(name: str) -> None:
        raise AssertionError(f"planner {name} was asked to plan a budget it cannot keep")

    with monkeypatch.context() as patched:
        patched.setattr(planning, "get_planner", no_planning)  # refused before any planning
        with pytest.raises(RequestError) as caught:
            solve(request)
    assert caught.value.field == "time_budget_s"
    assert caught.value.value == 0.01
    quoted = float(str(caught.value).rsplit(">= ", 1)[1])
    assert need <= quoted <= need * 1.1
    plan = solve(dataclasses.replace(request, time_budget_s=quoted))
    assert plan_problems(plan, request) == []


def test_auto_refuses_a_million_sequences_in_a_tenth_of_a_second() -> None:
    request = make_request([[5] * 1000] * 1000, dp=4, cp=8, bucket=100, solver="auto", time_budget_s=0.1)
    with pytest.raises(RequestError, match="time_budget_s"):
        solve(request)


@pytest.mark.parametrize(("num_batches", "per_rank"), [(256, 64), (1, 16384)])
def test_auto_plans_65536_sequences_within_two_seconds(num_batches: int, per_rank: int) -> None:
    request = qwen_request(num_batches, per_rank, dataset="sharegpt")
    request = dataclasses.replace(request, solver="auto", time_budget_s=2.0)
    assert request.num_sequences == 65_536
    plan, cpu_s = cpu_seconds(lambda: solve(request))
    assert plan_problems(plan, request) == []
    assert cpu_s <= PROCESSES * (2.0 + 0.1) + CPU_SLACK_S
    assert plan.estimated_ms <= solve(dataclasses.replace(request, solver="packed")).estimated_ms + 1e-6


def test_auto_never_defers_by_default_and_a_deferring_start_competes_when_allowed() -> None:
    # WLB-LLM defers outliers out of their global batch; a loader training each batch in its iteration
    # would leave them untrained, so auto keeps every batch whole unless allow_pending is set
    request = dataclasses.replace(qwen_request(3, 32), solver="auto", time_budget_s=1.0, deterministic=True)
    wlb = solve(dataclasses.replace(request, solver="wlb"))
    assert wlb.pending != ()  # the case is one where deferral is on the table
    assert solve(request).pending == ()
    problem = Problem.from_request(request)
    allowed = assemble_plan(problem, AutoPlanner(allow_pending=True).plan(problem), solver="auto", wall_ms=0.0)
    assert plan_problems(allowed, request) == []
    assert per_work(allowed, request) <= per_work(wlb, request) * (1 + 1e-9)
    # auto's own wlb start keeps WLB-LLM's packing and sharding without the outlier queues: no deferral
    keep = next(s for s in starts_module.STARTS if s.name == "wlb-keep").make().plan(problem)
    assert keep.pending == ()


def test_deterministic_requests_give_the_same_plan() -> None:
    request = dataclasses.replace(qwen_request(2, 32, dataset="mooncake"), solver="auto", time_budget_s=0.3)
    request = dataclasses.replace(request, deterministic=True)
    first, second = solve(request), solve(request)
    assert first.iterations == second.iterations and first.pending == second.pending


def test_the_finishing_reserve_counts_the_most_microbatches_of_any_candidate_start() -> None:
    from skrull.solver.planners.auto import finish_reserve_s
    from skrull.solver.search.budget import FINISH_RESERVE_PER_MICROBATCH_S, MICROBATCH_GROWTH
    from skrull.solver.types import MicrobatchSpec

    def specs(count: int) -> tuple[MicrobatchSpec, ...]:
        return tuple(MicrobatchSpec(step=i, ranks=(0,), local=((i,),), sharded=()) for i in range(count))

    # two iterations: the most microbatches among the alternatives the search starts from count (the search
    # may return any of them, improved): 10 + 2; a fifth alternative (40) is never searched from
    pooled = (0.0, [[specs(3), specs(10), specs(1), specs(1), specs(40)], [specs(2)]], [])
    deferring = (0.0, [[specs(9)], [specs(9)]], [7])
    assert finish_reserve_s([pooled]) == pytest.approx(FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH * 12)
    assert finish_reserve_s([pooled, deferring]) == pytest.approx(
        FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH * 18
    )


def test_auto_stops_its_search_earlier_by_the_finishing_time_of_its_best_starts_microbatches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Estimating and validating grows with the plan's microbatches (0.83 s for 65,536 of them): a search that
    kept back a per-sequence share alone ran past its budget. On the work clock (deterministic: the same
    readings up to the search in both runs) the search's deadline moves by exactly the reserve."""
    import skrull.solver.planners.auto as auto_module
    import skrull.solver.search.budget as budget_module

    rng = random.Random(3)
    request = make_request(
        [[rng.randint(1, 90) for _ in range(40)]], dp=2, cp=2, solver="auto", time_budget_s=0.2, deterministic=True
    )
    seen: list[tuple[float, float]] = []
    real_search = AutoPlanner._search

    def spy(self: AutoPlanner, problem: Problem, candidates: Any, deadline: float, clock: Any) -> Any:
        seen.append((deadline, auto_module.finish_reserve_s(candidates)))
        return real_search(self, problem, candidates, deadline, clock)

    monkeypatch.setattr(AutoPlanner, "_search", spy)
    kept = solve(request)
    monkeypatch.setattr(budget_module, "FINISH_RESERVE_PER_MICROBATCH_S", 0.0)
    unkept = solve(request)
    (with_reserve, reserve_s), (without_reserve, zero) = seen
    assert zero == 0.0 and reserve_s > 0
    assert without_reserve - with_reserve == pytest.approx(reserve_s, rel=1e-9)
    assert plan_problems(kept, request) == [] and plan_problems(unkept, request) == []


def test_deterministic_auto_runs_the_starts_whose_prior_fits_the_budget_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``deterministic`` every start ran in process whatever the budget (4,096 sequences at CP 1,024: 100 s
    for 3 s of work, 60 of them in ``wlb`` and ``wlb-keep``); now a start runs when its prior, the same on any
    machine, fits the chunk's budget, so the plan stays the same everywhere."""
    rng = random.Random(5)
    request = make_request(
        [[rng.randint(1, 400) for _ in range(200)]], dp=1, cp=64, bucket=100, solver="auto", time_budget_s=0.05,
        deterministic=True,
    )  # fmt: skip
    problem = Problem.from_request(request)
    sizes, gpus, cp = [200], 64, 64
    fits = {s.name for s in starts_module.STARTS if s.unit_s(sizes, gpus=gpus, cp=cp) <= 0.05}
    ran: list[str] = []
    real_run = starts_module._run

    def spy(start: Any, sub: Problem) -> Any:
        ran.append(start.name)
        return real_run(start, sub)

    monkeypatch.setattr(starts_module, "_run", spy)
    first = solve(request)
    expected = [
        s.name for s in starts_module.STARTS if (s.always or s.name in fits) and starts_module.plans_modes(s, problem)
    ]
    assert ran == expected
    assert {"wlb", "wlb-keep", "hydraulis"}.isdisjoint(ran) and {"packed", "skrull"} <= set(ran)
    ran.clear()
    assert solve(request).iterations == first.iterations and ran == expected
