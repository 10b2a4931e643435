"""DACP attention on real gloo process groups matches every sequence run alone (outputs and gradients).

One launch of 4 processes runs many plans (random requests under several planners, both
context-parallel modes, both shardings, and a hand-made dynamic-CP plan whose groups are arbitrary
subsets in arbitrary order); the parent compares each with the float64 per-sequence reference.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planning import assemble_plan, solve
from skrull.solver.types import MicrobatchSpec, Plan, Problem
from skrull.solver.validate import validate_plan
from skrull.worker.dacp import DACPPlan
from skrull.worker.launch import launch
from skrull.worker.layer_check import ExecuteConfig, LayerConfig, collect, compare, run_rank
from tests.conftest import HAND_PROFILE, make_request
from tests.worker.modes import run_in

WORLD = 4
TOLERANCE = 1e-4
#: 12 query heads, 3 key/value heads: Ulysses splits heads over groups of 2, 3 and 4 (replicating K/V
#: heads where 3 does not divide), all-gather CP keeps GQA as is.
LAYER = LayerConfig(hidden_size=48, num_heads=12, num_kv_heads=3, head_dim=4)


@dataclass(frozen=True)
class Case:
    name: str
    plan: Plan
    lengths: tuple[int, ...]
    config: ExecuteConfig


def random_case(seed: int, solver: str, *, dp: int, cp: int, cp_mode: str, sharding: str) -> Case:
    rng = random.Random(seed)
    batches = [[rng.choice([rng.randint(1, 12), rng.randint(13, 70)]) for _ in range(rng.randint(4, 9))]]
    request = make_request(batches, dp=dp, cp=cp, bucket=36, solver=solver)
    config = ExecuteConfig(layer=LAYER, seed=seed, sharding=sharding)
    name = f"{solver}-dp{dp}cp{cp}-{cp_mode}-{sharding}-{seed}"
    return Case(
        name=name, plan=run_in(solve(request), cp_mode), lengths=Problem.from_request(request).lengths, config=config
    )


def dynamic_case(cp_mode: str) -> Case:
    """Groups (3, 1), (2, 0), (2, 0, 3) and the whole world, local and sharded mixed, a 2-token shard over 3
    GPUs (one position holds nothing), then an iteration where only GPU 1 works."""
    request = make_request([[20, 9, 33, 2, 14, 40, 5, 27], [11]], dp=1, cp=4, bucket=40)
    specs = (
        MicrobatchSpec(step=0, ranks=(3, 1), local=((0,), ()), sharded=(2,)),
        MicrobatchSpec(step=0, ranks=(2, 0), local=((1,), (4,)), sharded=()),
        MicrobatchSpec(step=1, ranks=(2, 0, 3), local=((), (6,), ()), sharded=(3, 7)),
        MicrobatchSpec(step=2, ranks=(0, 1, 2, 3), local=((), (), (), ()), sharded=(5,)),
    )
    problem = Problem.from_request(request)
    lonely = (MicrobatchSpec(step=0, ranks=(1,), local=((8,),), sharded=()),)
    plan = assemble_plan(problem, PlannerOutput(iterations=(specs, lonely)), solver="skrull", wall_ms=0.0)
    validate_plan(plan, request)
    config = ExecuteConfig(layer=LAYER, seed=11)
    return Case(name=f"dynamic-{cp_mode}", plan=run_in(plan, cp_mode), lengths=problem.lengths, config=config)


def plan_sharding_case(cp_mode: str) -> Case:
    """Microbatches whose plan names WLB-LLM's cuts: per-document (2N chunks, remainder round-robin) and
    per-sequence (the sharded sequences packed into one buffer, cut zigzag), with local work beside."""
    request = make_request([[23, 9, 31, 6, 17, 2]], dp=1, cp=4, bucket=40)
    specs = (
        MicrobatchSpec(step=0, ranks=(0, 1, 2, 3), local=((1,), (), (3,), ()), sharded=(0, 2), sharding="per-document"),
        MicrobatchSpec(step=1, ranks=(0, 1, 2, 3), local=((), (), (), ()), sharded=(4, 5), sharding="per-sequence"),
    )
    problem = Problem.from_request(request)
    plan = assemble_plan(problem, PlannerOutput(iterations=(specs,)), solver="wlb", wall_ms=0.0)
    validate_plan(plan, request)
    config = ExecuteConfig(layer=LAYER, seed=13)
    return Case(name=f"plan-sharding-{cp_mode}", plan=run_in(plan, cp_mode), lengths=problem.lengths, config=config)


def mixed_modes_case() -> Case:
    """One iteration mixing the plan's modes: Ulysses over the world with local work beside, all-gather over
    the world, Ulysses over the group (2, 0, 3) (3 divides the 12 heads and the 3 K/V heads), and GPU 1 alone:
    each microbatch runs its plan's mode (there is no run-level one)."""
    profile = {
        **HAND_PROFILE,
        "memory": {"bucket_tokens": 40},
        "heads": {"attention": LAYER.num_heads, "kv": LAYER.num_kv_heads},
        "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.0004, "fixed_ms": 0.3},
    }
    request = make_request(
        [[23, 9, 31, 6, 17, 2, 29, 8]], dp=1, cp=4, profile=profile, cp_modes=["allgather", "ulysses"]
    )
    group = (0, 1, 2, 3)
    specs = (
        MicrobatchSpec(step=0, ranks=group, local=((1,), (), (3,), ()), sharded=(0, 2), mode="ulysses"),
        MicrobatchSpec(step=1, ranks=group, local=((), (), (), ()), sharded=(4, 5)),
        MicrobatchSpec(step=2, ranks=(2, 0, 3), local=((), (), ()), sharded=(6,), mode="ulysses"),
        MicrobatchSpec(step=2, ranks=(1,), local=((7,),), sharded=()),
    )
    problem = Problem.from_request(request)
    plan = assemble_plan(problem, PlannerOutput(iterations=(specs,)), solver="skrull", wall_ms=0.0)
    validate_plan(plan, request)
    config = ExecuteConfig(layer=LAYER, seed=17)
    return Case(name="mixed-modes", plan=plan, lengths=problem.lengths, config=config)


def all_cases() -> list[Case]:
    cases = [dynamic_case("allgather"), dynamic_case("ulysses"), plan_sharding_case("allgather"), mixed_modes_case()]
    for seed, solver, dp, cp, mode, sharding in (
        (1, "skrull", 2, 2, "allgather", "zigzag"),
        (2, "skrull", 1, 4, "allgather", "zigzag"),
        (3, "skrull", 2, 2, "ulysses", "zigzag"),
        (4, "skrull", 1, 4, "ulysses", "contiguous"),
        (5, "round-robin", 1, 4, "allgather", "contiguous"),
        (6, "deepspeed", 2, 2, "allgather", "zigzag"),
        (7, "packed", 1, 4, "ulysses", "zigzag"),
    ):
        cases.append(random_case(seed, solver, dp=dp, cp=cp, cp_mode=mode, sharding=sharding))
    return cases


def run_cases(rank: int, world_size: int, backend: str, cases: list[Case], out_dir: str) -> None:
    for k, case in enumerate(cases):
        output = run_rank(case.plan, case.lengths, config=case.config, rank=rank, device=torch.device("cpu"))
        torch.save(output, Path(out_dir) / f"case{k}-rank{rank}.pt")


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Case, list[object]]]:
    cases = all_cases()
    out = tmp_path_factory.mktemp("dacp")
    launch(run_cases, world_size=WORLD, args=(cases, str(out)))
    return [
        (case, [torch.load(out / f"case{k}-rank{r}.pt", weights_only=False) for r in range(WORLD)])
        for k, case in enumerate(cases)
    ]


def test_cases_cover_rollback_mixed_microbatches_and_idle_ranks() -> None:
    plans = [c.plan for c in all_cases()]
    mbs = [mb for p in plans for it in p.iterations for mb in it.microbatches]
    assert any(mb.sharded and any(mb.local) for mb in mbs), "a microbatch with local and sharded sequences"
    assert any(mb.sharded and not all(mb.local) for mb in mbs), "a group member with no local sequence"
    assert any(len({g for mb in it.microbatches for g in mb.ranks}) < WORLD for p in plans for it in p.iterations), (
        "a rank with no work in an iteration"
    )


def test_outputs_and_gradients_match_each_sequence_alone(executed: list[tuple[Case, list[object]]]) -> None:
    failures = []
    for case, parts in executed:
        result = collect(case.plan, case.lengths, parts, hidden_size=case.config.layer.hidden_size)  # type: ignore[arg-type]
        for row in compare(result, case.lengths, config=case.config, tolerance=TOLERANCE):
            if not row.ok:
                failures.append(f"{case.name}: {row.tensor} {row.max_abs_error:.2e} > {row.tolerance:.1e}")
    assert not failures, failures


def test_every_rank_reports_its_own_tokens(executed: list[tuple[Case, list[object]]]) -> None:
    for case, parts in executed:
        for rank, part in enumerate(parts):
            timing = part.timing  # type: ignore[attr-defined]
            layouts_tokens = 0
            for it in case.plan.iterations:
                for mb in it.microbatches:
                    if rank in mb.ranks:
                        layouts_tokens += sum(case.lengths[i] for i in mb.local[mb.ranks.index(rank)])
            assert timing.rank == rank and timing.local_tokens == layouts_tokens


def test_the_plans_mode_reaches_every_layout_and_is_what_runs() -> None:
    from skrull.worker.dacp import DACPPlan
    from skrull.worker.kernels import select_kernel
    from skrull.worker.layout import rank_layouts

    case = mixed_modes_case()
    modes = {
        (layout.step, layout.ranks): layout.mode
        for rank in range(WORLD)
        for layout in rank_layouts(case.plan, case.lengths, iteration=0, rank=rank)
    }
    assert modes[(0, (0, 1, 2, 3))] == "ulysses" and modes[(2, (2, 0, 3))] == "ulysses"
    assert modes[(1, (0, 1, 2, 3))] == "allgather"
    alone = next(x for x in rank_layouts(case.plan, case.lengths, iteration=0, rank=1) if x.ranks == (1,))
    ulysses = dataclasses.replace(alone, mode="ulysses")
    kernel = select_kernel(torch.device("cpu"), torch.float32, "reference")
    assert DACPPlan.build(ulysses, group=None, kernel=kernel, device=torch.device("cpu")).mode == "ulysses"
    assert DACPPlan.build(alone, group=None, kernel=kernel, device=torch.device("cpu")).mode == "allgather"


def test_ulysses_replicates_kv_heads_so_every_query_head_reads_its_own() -> None:
    # For every head layout up to 64: after the exchange GPU r holds query heads r*A/N .. and, of the K/V
    # heads repeated ulysses_kv_copies times, slot r's lcm(kv, N)/N; grouped-query attention there pairs
    # local query head i with local K/V head i // (A/N / (lcm/N)), which must be the model's own K/V head.
    from skrull.solver.cp_modes import kv_heads_per_gpu
    from skrull.worker.dacp import ulysses_kv_copies

    for heads in range(1, 65):
        for kv in (k for k in range(1, heads + 1) if heads % k == 0):
            for n in (g for g in range(1, 65) if heads % g == 0):
                copies = ulysses_kv_copies(kv, n)
                per_gpu = kv * copies // n
                assert per_gpu == kv_heads_per_gpu(kv, n) <= kv and (kv * copies) % n == 0
                hq = heads // n
                for r in range(n):
                    for i in range(hq):
                        local_kv = r * per_gpu + i // (hq // per_gpu)
                        assert local_kv // copies == (r * hq + i) // (heads // kv), (heads, kv, n, r, i)


def test_each_microbatch_runs_its_plans_mode_and_no_run_level_setting_overrides_it() -> None:
    """The worker's run-level ``cp_mode`` is gone: ``DACPPlan`` takes the microbatch's ``mode`` (an all-gather
    microbatch runs all-gather whatever), and neither the execute nor the finetune config has a mode."""
    from skrull.worker.hf.finetune import FinetuneConfig
    from skrull.worker.kernels import select_kernel
    from skrull.worker.layout import MicrobatchLayout

    kernel = select_kernel(torch.device("cpu"), torch.float32)
    for mode in ("allgather", "ulysses"):
        layout = MicrobatchLayout(
            step=0, ranks=(0,), position=0, local_ids=(0,), local_lengths=(5,), sharded=(), mode=mode
        )
        built = DACPPlan.build(layout, group=None, kernel=kernel, device=torch.device("cpu"))
        assert built.mode == mode
    for config in (ExecuteConfig, FinetuneConfig):
        assert "cp_mode" not in {f.name for f in dataclasses.fields(config)}
    with pytest.raises(TypeError, match="mode"):
        DACPPlan.build(layout, group=None, kernel=kernel, device=torch.device("cpu"), mode="ulysses")  # type: ignore[call-arg]


def test_a_ulysses_plan_the_layer_cannot_run_is_refused_before_the_first_step() -> None:
    """Ulysses over 4 GPUs with 6 attention heads cannot split them: ``run_rank`` refuses the whole plan on
    every rank (each holds the whole plan) before it builds a process group or runs a microbatch, naming the
    microbatch and the mode."""
    case = mixed_modes_case()
    six = dataclasses.replace(case.config, layer=dataclasses.replace(LAYER, num_heads=6, num_kv_heads=3))
    with pytest.raises(ValueError, match=r"iteration 0 microbatch 0 runs ulysses over 4 GPUs.*num_attention_heads = 6"):
        run_rank(case.plan, case.lengths, config=six, rank=0, device=torch.device("cpu"))
    # planned all-gather, the same placement runs with any heads: refused only where the plan says Ulysses
    allgather = dataclasses.replace(
        case.plan,
        iterations=tuple(
            dataclasses.replace(
                it, microbatches=tuple(dataclasses.replace(mb, mode="allgather") for mb in it.microbatches)
            )
            for it in case.plan.iterations
        ),
    )
    from skrull.worker.dacp import refuse_unrunnable_modes

    refuse_unrunnable_modes(allgather, heads=6)
