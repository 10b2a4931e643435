"""The gathered K/V in memory (CONTRACT.md "Cluster topology and gathered K/V"): an all-gather microbatch
keeps, on every GPU of its group, the K/V of the rest of its sharded sequences, so GPU j fits when
``own_j + r * (N-1)/N * T <= bucket_tokens``; a Ulysses microbatch keeps none. A profile whose
``memory.gathered_kv`` is ``key_prefixes`` (what worker/dacp.py keeps: each own piece's key prefix) is
charged ``r * (2N+1)/(2N) * T`` instead. Every planner keeps to the profile's rule, the validator refuses a
plan that does not, and without the two memory figures nothing changes."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.errors import InvalidPlanError, RequestError, SkrullError
from skrull.solver.gathered import fit_gathered_kv
from skrull.solver.io import request_from_dict
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planners.dacp import dacp_place, round_robin_place
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.solver.profiles.derive import GPUS, MODELS, derive_profile
from skrull.solver.search.construct import spread_batch
from skrull.solver.sharding import SHARDING_MODES
from skrull.solver.types import Iteration, Microbatch, MicrobatchSpec, Parallel, Plan, Problem, SolveInfo
from skrull.solver.validate import validate_plan

BASE = load_profile("h100-80g/qwen2.5-0.5b")


def with_kv(
    profile: Profile,
    *,
    kv: float | None,
    activation: float = 1_000_000.0,
    bucket: int | None = None,
    gathered: str | None = None,
) -> Profile:
    """``profile`` with ``memory.kv_bytes_per_token`` = kv (None: without it) over ``activation``, and
    ``memory.gathered_kv`` = gathered (None: without it, the contract's rule)."""
    doc = profile.to_dict()
    memory = {k: v for k, v in doc["memory"].items() if k not in ("kv_bytes_per_token", "gathered_kv")}
    memory["activation_bytes_per_token"] = activation
    if kv is not None:
        memory["kv_bytes_per_token"] = kv
    if gathered is not None:
        memory["gathered_kv"] = gathered
    if bucket is not None:
        memory["bucket_tokens"] = bucket
    return profile_from_dict({**doc, "memory": memory})


def eq7_fits(bucket: int, local: list[list[int]], sharded: list[int]) -> bool:
    """The rule without gathered K/V (eq. 7), written from the contract: every GPU's own tokens, its local
    sequences plus at most ceil(T/N) of the sharded ones, within the bucket."""
    share = math.ceil(sum(sharded) / len(local))
    return all(sum(lens) + share <= bucket for lens in local)


def contract_fits(
    bucket: int, r: Fraction, local: list[list[int]], sharded: list[int], mode: str, gathered: str | None = None
) -> bool:
    """The rule, in exact rationals: own tokens + r * f(N) * T <= bucket (r = 0 for Ulysses), f(N) the
    contract's (N-1)/N, or (2N+1)/(2N) where the worker keeps each own piece's key prefix."""
    n, total = len(local), sum(sharded)
    factor = Fraction(2 * n + 1, 2 * n) if gathered == "key_prefixes" else Fraction(n - 1, n)
    kv = 0 if mode == "ulysses" or n == 1 else r * factor * total
    return all(sum(lens) + math.ceil(Fraction(total, n)) + kv <= bucket for lens in local)


groups = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.integers(1, 3000), max_size=3), min_size=n, max_size=n),
        st.lists(st.integers(1, 20000), max_size=3) if n > 1 else st.just([]),
    )
)


@given(
    group=groups,
    bucket=st.integers(1, 30000),
    kv=st.integers(1, 400_000),
    activation=st.integers(1, 2_000_000),
    gathered=st.sampled_from([None, "others", "key_prefixes"]),
)
@settings(max_examples=300, deadline=None)
def test_fits_is_the_profiles_rule_to_the_token(
    group: tuple[list[list[int]], list[int]], bucket: int, kv: int, activation: int, gathered: str | None
) -> None:
    local, sharded = group
    model = CostModel(with_kv(BASE, kv=float(kv), activation=float(activation), bucket=bucket, gathered=gathered))
    r = Fraction(kv, activation)
    assert model.gathered_kv_ratio == r
    for mode in ("allgather", "ulysses"):
        assert model.fits(local, sharded, mode) == contract_fits(bucket, r, local, sharded, mode, gathered)
        if mode == "allgather" or len(local) == 1:  # Ulysses needs a group dividing the heads
            uses = model.bucket_use_tokens(local, sharded, mode=mode)
            assert (max(uses) <= bucket) == contract_fits(bucket, r, local, sharded, mode, gathered)
    n = len(local)
    if n > 1:  # the one factor every rule reads
        expected = (2 * n + 1, 2 * n) if gathered == "key_prefixes" else (n - 1, n)
        assert model.gathered_kv_factor(n) == expected
        total = sum(sharded)
        assert model.gathered_kv_tokens(total, n) == (math.ceil(r * Fraction(*expected) * total) if total else 0)


@pytest.mark.parametrize("value", ["all", "", 1, None, "KEY_PREFIXES"])
def test_an_unknown_gathered_kv_rule_is_refused_naming_the_field(value: object) -> None:
    doc = with_kv(BASE, kv=1000.0).to_dict()
    doc["memory"]["gathered_kv"] = value
    with pytest.raises(RequestError) as err:
        profile_from_dict(doc)
    assert err.value.field == "profile.memory.gathered_kv"
    assert err.value.value == value and "others, key_prefixes" in str(err.value)


@pytest.mark.parametrize("gathered", ["others", "key_prefixes"])
def test_the_gathered_kv_rule_round_trips(gathered: str) -> None:
    profile = with_kv(BASE, kv=1000.0, gathered=gathered)
    assert profile.gathered_kv == gathered
    assert profile_from_dict(profile.to_dict()).gathered_kv == gathered
    assert with_kv(BASE, kv=1000.0).gathered_kv is None


@given(group=groups, bucket=st.integers(1, 30000))
@settings(max_examples=200, deadline=None)
def test_without_kv_bytes_memory_is_eq7_exactly(group: tuple[list[list[int]], list[int]], bucket: int) -> None:
    local, sharded = group
    for profile in (with_kv(BASE, kv=None, bucket=bucket), with_kv(BASE, kv=0.0, bucket=bucket)):
        model = CostModel(profile)
        assert profile.gathered_kv_ratio == 0
        assert model.gathered_kv_tokens(sum(sharded), len(local)) == 0
        assert model.fits(local, sharded) == eq7_fits(bucket, local, sharded)
        assert model.max_sequence_tokens(len(local)) == len(local) * bucket


@given(lengths=st.lists(st.integers(1, 40000), min_size=1, max_size=12), n=st.sampled_from([2, 4, 8]))
@settings(max_examples=150, deadline=None)
def test_dacp_without_gathered_kv_places_exactly_as_before(lengths: list[int], n: int) -> None:
    """A DACP given a gathered K/V of 0 makes the same decisions as one given none (the paper's)."""
    model = CostModel(BASE)
    for place in (dacp_place, round_robin_place):
        plain = place(lengths, group_size=n, bucket_tokens=8000, flops=model.flops)
        zero = place(lengths, group_size=n, bucket_tokens=8000, flops=model.flops, gathered=lambda _t: 0)
        assert plain == zero


def test_fit_gathered_kv_leaves_a_planners_output_alone_without_kv_bytes() -> None:
    problem = Problem.from_request(
        synthesize_request(
            dataset="arxiv", parallel=Parallel(dp=2, cp=4), profile=with_kv(BASE, kv=None), sequences_per_rank=8
        )
    )
    output = PlannerOutput(
        iterations=(
            (MicrobatchSpec(step=0, ranks=(0, 1, 2, 3), local=((), (), (), ()), sharded=problem.batch_ids[0]),),
        )
    )
    assert fit_gathered_kv(output, problem, ("allgather",)) is output


# -- every planner ------------------------------------------------------------------------------------------

#: Planners fast enough for a property test (the exact ones at a small budget on small requests).
PLANNERS = tuple(planner_names())


def over_bucket(plan: Plan, lengths: list[int], model: CostModel) -> list[tuple[int, int, int]]:
    """(iteration, step, GPU) of every GPU-microbatch holding more than the bucket with its gathered K/V."""
    out = []
    for it in plan.iterations:
        for mb in it.microbatches:
            uses = model.bucket_use_tokens(
                [[lengths[i] for i in ids] for ids in mb.local],
                [lengths[i] for i in mb.sharded],
                sharding=mb.sharding,
                mode=mb.mode,
            )
            out += [(it.index, mb.step, g) for g, use in zip(mb.ranks, uses, strict=True) if use > model.bucket_tokens]
    return out


@given(
    solver=st.sampled_from(PLANNERS),
    lengths=st.lists(st.integers(1, 4500), min_size=2, max_size=10),
    kv=st.integers(20_000, 300_000),
    cp=st.sampled_from([2, 4]),
    modes=st.sampled_from([["allgather"], ["allgather", "ulysses"], ["ulysses"]]),
    gathered=st.sampled_from([None, "key_prefixes"]),
)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_planner_puts_a_gpu_over_the_bucket_with_its_gathered_kv(
    solver: str, lengths: list[int], kv: int, cp: int, modes: list[str], gathered: str | None
) -> None:
    profile = with_kv(BASE, kv=float(kv), activation=1_000_000.0, bucket=3000, gathered=gathered)
    doc: dict[str, Any] = {
        "batches": [lengths],
        "parallel": {"dp": 2, "cp": cp},
        "profile": profile.to_dict(),
        "solver": solver,
        "time_budget_s": 1.0,
        "cp_modes": modes,
    }
    try:
        plan = solve(request_from_dict(doc))
    except RequestError:
        return  # refused before planning, naming the field (a sequence no allowed mode holds, a mode the planner lacks)
    assert over_bucket(plan, lengths, CostModel(profile)) == []


@pytest.mark.parametrize(("gathered", "kv"), [(None, 200_000.0), ("key_prefixes", 100_000.0)])
@pytest.mark.parametrize("solver", PLANNERS)
def test_every_planner_plans_a_long_context_batch_within_the_bucket_with_its_gathered_kv(
    solver: str, gathered: str | None, kv: float
) -> None:
    """A batch where eq. 7 alone lets all-gather microbatches overflow (r = 0.2 under the contract's rule,
    0.1 with key prefixes kept; sequences up to 2.5 buckets on CP4): every planner plans it (Ulysses
    allowed, and the sequences fit all-gather too), and no GPU-microbatch exceeds the bucket once its
    gathered K/V is counted."""
    profile = with_kv(BASE, kv=kv, activation=1_000_000.0, bucket=3000, gathered=gathered)
    lengths = [7400, 6500, 5200, 3100, 2900, 1400, 800, 640, 300, 120, 7000, 4100, 2500, 900, 60, 33]
    model = CostModel(profile)
    assert max(lengths) <= model.max_sequence_tokens(4) < 4 * 3000
    doc: dict[str, Any] = {
        "batches": [lengths],
        "parallel": {"dp": 2, "cp": 4},
        "profile": {**profile.to_dict(), "heads": {"attention": 16, "kv": 2}},  # CP4 divides the heads
        "solver": solver,
        "time_budget_s": 2.0,
    }
    modes = ["ulysses"] if solver == "xtuner" else ["allgather"]
    plan = solve(request_from_dict({**doc, "cp_modes": modes}))
    assert over_bucket(plan, lengths, model) == []
    assert sorted(i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids) == list(
        range(len(lengths))
    )


# -- the validator -----------------------------------------------------------------------------------------


def one_microbatch_plan(profile: Profile, length: int, mode: str) -> tuple[Plan, Any]:
    request = request_from_dict(
        {
            "batches": [[length]],
            "parallel": {"dp": 1, "cp": 2},
            "profile": profile.to_dict(),
            "solver": "skrull",
            "cp_modes": ["allgather", "ulysses"],
        }
    )
    model = CostModel(profile)
    link = model.link_of((0, 1))  # the bundled profile has a topology: the microbatch names its link
    mb = Microbatch(
        step=0,
        ranks=(0, 1),
        local=((), ()),
        sharded=(0,),
        estimated_ms=model.microbatch_time_ms([[], []], [length], mode, link=link),
        sharding=SHARDING_MODES[0],
        mode=mode,
        link=link,
    )
    iteration = Iteration(
        index=0,
        microbatches=(mb,),
        estimated_ms=mb.estimated_ms,
        lower_bound_ms=model.lower_bound_ms([length], request.parallel),
        static_bound_ms=model.static_bound_ms([length], request.parallel),
    )
    plan = Plan(
        solver="skrull",
        parallel=request.parallel,
        bucket_tokens=request.bucket_tokens,
        iterations=(iteration,),
        pending=(),
        solve=SolveInfo(wall_ms=0.0, status="heuristic", objective_ms=mb.estimated_ms, bound_ms=None, gap=None),
    )
    return plan, request


def test_the_validator_refuses_an_allgather_microbatch_over_the_bucket_with_its_gathered_kv() -> None:
    """r = 0.1, bucket 1000, one sequence of 1900 sharded over 2 GPUs: 950 own tokens plus
    ceil(0.1 * 1/2 * 1900) = 95 of K/V is 1045 > 1000 in all-gather; in Ulysses 950 fits."""
    profile = with_kv(BASE, kv=100_000.0, activation=1_000_000.0, bucket=1000)
    plan, request = one_microbatch_plan(profile, 1900, "allgather")
    with pytest.raises(InvalidPlanError) as err:
        validate_plan(plan, request)
    assert any(
        p.startswith("iterations[0].microbatches[0]: GPU") and "950 tokens and 95 tokens' worth of gathered K/V" in p
        for p in err.value.problems
    ), err.value.problems
    ulysses, request = one_microbatch_plan(profile, 1900, "ulysses")
    validate_plan(ulysses, request)
    # and the same plan without the K/V figures is eq. 7's and valid
    plain, request = one_microbatch_plan(with_kv(BASE, kv=None, bucket=1000), 1900, "allgather")
    validate_plan(plain, request)


def test_ulysses_is_chosen_where_allgather_does_not_fit() -> None:
    """Both modes allowed and the sequence too long for all-gather with its K/V: the plan runs it in
    Ulysses (which the profile's 14 heads allow on 2 GPUs), valid; all-gather alone is refused."""
    profile = with_kv(BASE, kv=100_000.0, activation=1_000_000.0, bucket=1000)
    doc: dict[str, Any] = {"batches": [[1900, 300]], "parallel": {"dp": 1, "cp": 2}, "profile": profile.to_dict()}
    plan = solve(request_from_dict({**doc, "solver": "skrull", "cp_modes": ["allgather", "ulysses"]}))
    (sharded,) = [mb for mb in plan.iterations[0].microbatches if mb.sharded]
    assert (sharded.sharded, sharded.mode) == ((0,), "ulysses")
    with pytest.raises(RequestError) as err:
        request_from_dict({**doc, "solver": "skrull", "cp_modes": ["allgather"]})
    assert "gathered K/V" in str(err.value) and err.value.field == "batches[0][0]"


# -- today's plans for an MHA model -------------------------------------------------------------------------


def llama2_13b_like() -> Profile:
    """A derived Llama-2-13B on H100 (MHA: 40 K/V heads, r = 819,200 / 7,892,480 = 0.104)."""
    return derive_profile(MODELS["llama2-13b"], GPUS["h100-80g"])


def test_todays_plans_for_an_mha_model_overflow_and_the_new_rule_plans_none() -> None:
    """Plans made under eq. 7 alone (the profile without kv_bytes_per_token) for the long-context arxiv
    lengths on DP2 x CP8: counted under the gathered-K/V rule, some GPU-microbatches exceed the bucket;
    the same requests planned with the rule have none."""
    profile = llama2_13b_like()
    assert profile.gathered_kv_ratio == pytest.approx(819_200 / 7_892_480)
    old = dataclasses.replace(profile, kv_bytes_per_token=None)
    model = CostModel(profile)
    parallel = Parallel(dp=2, cp=8)
    limit = model.max_sequence_tokens(parallel.cp)
    over_old = over_new = 0
    for seed in range(3):
        for solver in ("skrull", "auto"):
            request = synthesize_request(
                dataset="arxiv",
                parallel=parallel,
                profile=profile,
                sequences_per_rank=16,
                seed=seed,
                solver=solver,
                max_tokens=limit,
            )
            lengths = [s for b in request.batches for s in b]
            over_old += len(over_bucket(solve(dataclasses.replace(request, profile=old)), lengths, model))
            over_new += len(over_bucket(solve(request), lengths, model))
    assert over_old > 0
    assert over_new == 0


@pytest.mark.parametrize("backend", ["cpsat", "scip"])
def test_the_exact_model_runs_in_ulysses_what_allgather_cannot_hold(backend: str) -> None:
    """The ILP's memory rows: r = 0.2, bucket 1000 on CP2; 1900 tokens need 950 own + 190 of K/V in
    all-gather (over), 950 in Ulysses. The exact plan keeps it in Ulysses and proves its optimum, and no
    GPU-microbatch is over the bucket."""
    profile = with_kv(BASE, kv=200_000.0, activation=1_000_000.0, bucket=1000)
    lengths = [1900, 700, 400, 1200]
    doc: dict[str, Any] = {
        "batches": [lengths],
        "parallel": {"dp": 1, "cp": 2},
        "profile": profile.to_dict(),
        "solver": "ilp",
        "backend": backend,
        "time_budget_s": 20.0,
        "cp_modes": ["allgather", "ulysses"],
    }
    plan = solve(request_from_dict(doc))
    model = CostModel(profile)
    assert over_bucket(plan, lengths, model) == []
    assert plan.solve.status == "optimal"  # nothing was split after the solve: the rows held it
    assert [mb.mode for mb in plan.iterations[0].microbatches if 0 in mb.sharded] == ["ulysses"]
    assert not model.fits([[], []], [1900], "allgather") and model.fits([[], []], [1900], "ulysses")


@pytest.mark.parametrize("solver", ["auto", "dynamic-cp", "hydraulis", "ilp-flex"])
def test_a_sequence_only_ulysses_holds_is_planned_or_refused_never_a_crash(solver: str) -> None:
    """1900 tokens over 2 GPUs: 950 own plus 95 of gathered K/V is over the 1000-token bucket in all-gather,
    950 fits in Ulysses. Planners that choose groups size them by the mode that holds most (``auto``'s
    deterministic starts raised a bare ValueError from the dynamic-cp start); a planner that cannot run
    it says so with a SkrullError."""
    profile = with_kv(BASE, kv=100_000.0, activation=1_000_000.0, bucket=1000)
    doc: dict[str, Any] = {
        "batches": [[1900, 300, 40]],
        "parallel": {"dp": 1, "cp": 2},
        "profile": profile.to_dict(),
        "solver": solver,
        "deterministic": True,
        "cp_modes": ["allgather", "ulysses"],
        "time_budget_s": 5.0,
    }
    try:
        plan = solve(request_from_dict(doc))
    except SkrullError as exc:
        assert solver in ("dynamic-cp", "hydraulis"), exc  # peers that run all-gather only
        return
    (long,) = [mb for mb in plan.iterations[0].microbatches if 0 in mb.seq_ids]
    assert long.mode == "ulysses" and long.sharded == (0,)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_the_spread_start_sizes_wide_groups_by_what_they_hold_with_the_gathered_kv(alpha: float) -> None:
    """1990 tokens fit two 1000-token buckets, but not with the K/V two GPUs gather (r = 0.1): auto's spread
    start gives the sequence a wider block, never one whose memory it overflows (at DP1 x CP1,024 on Mooncake
    lengths the safety net then refused a plannable request)."""
    profile = with_kv(BASE, kv=100_000.0, activation=1_000_000.0, bucket=1000)
    doc: dict[str, Any] = {
        "batches": [[1990, *([37] * 60)]],
        "parallel": {"dp": 1, "cp": 8},
        "profile": profile.to_dict(),
        "solver": "auto",
        "cp_modes": ["allgather"],
    }
    request = request_from_dict(doc)
    problem = Problem.from_request(request)
    cost = CostModel(profile, bucket_tokens=request.bucket_tokens, choose_modes=request.cp_modes)
    specs, _ = spread_batch(problem, problem.batch_ids[0], cost, alpha)
    (long,) = [mb for mb in specs if 0 in mb.sharded]
    assert cost.fits([[] for _ in long.ranks], [1990]) is (len(long.ranks) > 2)
    assert len(long.ranks) > 2
