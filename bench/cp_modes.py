"""Where each context-parallel mode wins: all-gather CP against Ulysses, on fresh draws and derived profiles.

For profiles derived for models and GPUs other than the bundled ones (bench/shapes.py: attention heads 8
to 64 per TP rank, Llama-2-70B at TP 1 for 64), group sizes 2 to 64 and long-tailed length distributions
(lengths up to the most an all-gather group holds with its gathered K/V, 1M at most; from CP 32 a
synthetic long tail, ``longtail-1m``: a bundled long-tailed distribution's lengths with 10% log-uniform
between 64K and 1M tokens, so requests reach the most the group holds), each request is planned three
ways on the reference cost model:

* ``auto`` with ``cp_modes = [allgather, ulysses]`` (it picks per microbatch),
* ``auto`` with all-gather only (the default),
* ``xtuner`` (every pack Ulysses over the whole group; "n/a" where the group does not divide the heads).

Profiles are what ``skrull derive-profile`` writes (bench/shapes.py): ``topology`` (8 GPUs a node; a CP
group of 8 aligned in a node uses ``intra_node``, CP 16 to 64 span nodes and use ``inter_node``),
``overlap`` (worker/dacp.py: Ulysses' second all-to-all exposed) and ``memory.kv_bytes_per_token`` (an
all-gather microbatch keeps its gathered K/V: r = kv / activation bytes per token, the "r" column).

Cells are modelled iteration times (ms), "refused" where the planner refuses the request (all-gather alone
cannot hold the longest sequence with its gathered K/V) or fails (the error is printed under the table);
"ulysses share" is the share of sharded microbatches the both-modes plan runs as Ulysses; "link" the links
its sharded microbatches were priced on (the plan's ``link`` field). ``auto`` runs on the wall clock (as
users run it: two runs of the same request differ by what the machine's load let each search do) and, for
the "work clock" column, with ``deterministic`` (the same search work for both, on any machine): that
column is the modes' effect without the load's noise. Fresh requests each run (seed from the clock unless ``--seed``).

The second table is the exact model with the mode as a decision (solver/ilp/builder.py): on small fresh
requests (DP 2, ``--exact-per-rank`` sequences per rank, CP 2 to 8) ``ilp`` with both modes against
``ilp`` with all-gather only, and against that all-gather plan with each microbatch then given its cheaper
mode (what choosing the mode after an all-gather solve gives), with the status and the gap to the model's
own bound (``solve.model_gap``) of the both-modes solve.

    python bench/cp_modes.py [--seed N] [--per-rank 16] [--budget 0.1] [--exact-per-rank 6] [--exact-budget 5]

Prints Markdown (seed, machine, date, commit, load average); asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import random
import time

from budget import git_commit  # bench/budget.py
from shapes import derived

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.io import placeable_tokens
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planners.minmax_ilp import preload_cp_sat
from skrull.solver.planning import solve
from skrull.solver.profile import Profile
from skrull.solver.types import Parallel, Plan, Request

#: (model, gpu, tp): heads per TP rank 8 (Llama-2-70B at TP 8), 28 (Qwen2.5-7B), 32 (Llama-2-7B at TP 1),
#: 40 (Llama-2-13B at TP 1), 64 (Llama-2-70B at TP 1, 8 K/V)
SHAPES = (("llama2-70b", "h100-80g", 8), ("qwen2.5-7b", "a100-80g", 1), ("llama2-7b", "h200-141g", 1),
          ("llama2-13b", "b200-180g", 1), ("llama2-70b", "b200-180g", 1))  # fmt: skip
#: ZeRO-3 ranks a shape's profile assumes (Llama-2-70B at TP 1 needs 64 for a bucket of 5,861 tokens)
ZERO_DP = {("llama2-70b", 1): 64}
GROUPS = (2, 4, 8, 16, 32, 64)
DATASETS = ("chatqa2-long-sft", "arxiv", "commoncrawl")
MAX_TOKENS = 1 << 20
LONG_TAIL = "longtail-1m"
#: from this group size on, requests draw from LONG_TAIL
LONG_TAIL_FROM_CP = 32


def long_tail_request(request: Request, rng: random.Random, limit: int) -> Request:
    """``request``'s lengths with 10% replaced by long outliers: one at ``limit`` (the most a plan holds,
    1M at most), the others log-uniform between 64K and 1M tokens (capped at ``limit``)."""
    batches = []
    for batch in request.batches:
        lengths = list(batch)
        for n, k in enumerate(rng.sample(range(len(lengths)), max(1, len(lengths) // 10))):
            drawn = round(math.exp(rng.uniform(math.log(1 << 16), math.log(MAX_TOKENS))))
            lengths[k] = limit if n == 0 else min(limit, drawn)  # one at the most the group holds (1M at most)
        batches.append(tuple(lengths))
    return dataclasses.replace(request, batches=tuple(batches))


def shape_profiles() -> list[Profile]:
    """The derived profile of each of ``SHAPES``."""
    profiles = [derived(model, gpu, tp=tp, zero_dp=ZERO_DP.get((model, tp), 8)) for model, gpu, tp in SHAPES]
    assert all(p.heads is not None for p in profiles)
    return profiles


def draw(rng: random.Random, profile: Profile, cp: int, per_rank: int) -> tuple[Request, str, int]:
    """A fresh DP 2 x ``cp`` request from one of ``DATASETS``, lengths up to the most an all-gather group of
    ``cp`` holds with its gathered K/V (``solver.io.placeable_tokens``; ``cp * bucket`` less the K/V), 1M at
    most, so both plans of a row run the same request: ``(request, dataset, that limit)``."""
    base = rng.choice(DATASETS)
    layout = Request(batches=((1,),), parallel=Parallel(dp=2, cp=cp), profile=profile)
    limit = min(placeable_tokens(layout), MAX_TOKENS)  # what an all-gather group holds with its gathered K/V
    request = synthesize_request(
        dataset=base, parallel=Parallel(dp=2, cp=cp), profile=profile, sequences_per_rank=per_rank,
        seed=rng.randrange(2**31), max_tokens=limit,
    )  # fmt: skip
    return request, base, limit


def ulysses_share(plan: Plan) -> float:
    sharded = [mb for it in plan.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > 1]
    return sum(mb.mode == "ulysses" for mb in sharded) / len(sharded) if sharded else 0.0


def links(plan: Plan) -> str:
    """The links the plan's sharded microbatches on more than one GPU used (``intra``, ``inter``, both)."""
    used = {mb.link for it in plan.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > 1}
    return "/".join(sorted(str(u).removesuffix("_node") for u in used)) or "none"


#: what a planner raised other than a refusal, by (profile, CP, planner): printed under the table
ERRORS: list[str] = []


def run(request: Request, **changes: object) -> Plan | None:
    """The plan, or None where the request is refused (a ``RequestError``: all-gather alone cannot hold a
    sequence with its gathered K/V) or the planner fails otherwise (recorded in ``ERRORS``, not hidden)."""
    try:
        return solve(dataclasses.replace(request, **changes))  # type: ignore[arg-type]
    except RequestError:
        return None
    except Exception as exc:  # a planner's bug: reported under the table, the bench goes on
        ERRORS.append(f"{request.profile.name}, CP {request.parallel.cp}, {changes}: {type(exc).__name__}: {exc}")
        return None


def cell(plan: Plan | None) -> str:
    return f"{plan.estimated_ms:.1f}" if plan is not None else "refused"


def ratio(a: Plan | None, b: Plan | None) -> str:
    if a is None or b is None:
        return "n/a"
    return f"{a.estimated_ms / b.estimated_ms - 1:+.2%}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (fresh requests)")
    parser.add_argument("--per-rank", type=int, default=16, help="sequences per DP rank (DP 2)")
    parser.add_argument("--budget", type=float, default=0.1, help="auto's time_budget_s")
    parser.add_argument("--exact-per-rank", type=int, default=6, help="sequences per DP rank of the ilp table")
    parser.add_argument("--exact-budget", type=float, default=5.0, help="ilp's time_budget_s (0: no ilp table)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    rng = random.Random(seed)
    preload_cp_sat()  # as a service's solver process does (auto's hydraulis start needs CP-SAT)
    print(
        f"seed {seed}; commit {git_commit()}, {platform.machine()} ({os.cpu_count()} cores), python "
        f"{platform.python_version()}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load average "
        f"{os.getloadavg()[0]:.2f}; auto at {args.budget:g} s per request, DP 2, {2 * args.per_rank} sequences "
        "per batch\n"
    )
    print("| profile | heads | r | CP | link | dataset | longest | auto both ms | auto allgather ms | xtuner ms "
          "| both vs allgather | both vs allgather, work clock | ulysses share |")  # fmt: skip
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for profile in shape_profiles():
        assert profile.heads is not None
        for cp in GROUPS:
            request, base, limit = draw(rng, profile, cp, args.per_rank)
            dataset = base
            if cp >= LONG_TAIL_FROM_CP:
                request, dataset = long_tail_request(request, rng, limit), f"{base}+{LONG_TAIL}"
            both = run(request, solver="auto", time_budget_s=args.budget, cp_modes=("allgather", "ulysses"))
            allgather = run(request, solver="auto", time_budget_s=args.budget)
            xtuner = run(request, solver="xtuner", cp_modes=("ulysses",))
            fixed = dict(solver="auto", time_budget_s=args.budget, deterministic=True)
            both_work = run(request, cp_modes=("allgather", "ulysses"), **fixed)
            allgather_work = run(request, **fixed)
            x = f"{xtuner.estimated_ms:.1f}" if xtuner is not None else "n/a"
            print(
                f"| {profile.name} | {profile.heads.attention} | {profile.gathered_kv_ratio:.3f} | {cp} "
                f"| {links(both) if both else 'n/a'} | {dataset} | {max(request.batches[0])} "
                f"| {cell(both)} | {cell(allgather)} | {x} | {ratio(both, allgather)} "
                f"| {ratio(both_work, allgather_work)} | {f'{ulysses_share(both):.0%}' if both else 'n/a'} |",
                flush=True,
            )
    if ERRORS:
        print("\nPlanner errors (not refusals):\n")
        for line in ERRORS:
            print(f"- {line}")
        ERRORS.clear()
    if args.exact_budget > 0:
        exact_table(rng, per_rank=args.exact_per_rank, budget_s=args.exact_budget)


def exact_table(rng: random.Random, *, per_rank: int, budget_s: float) -> None:
    """``ilp`` deciding the mode against ``ilp`` on all-gather and that plan with its modes chosen after."""
    print(f"\n`ilp` with the mode as a decision, {budget_s:g} s each, DP 2, {2 * per_rank} sequences:\n")
    print("| profile | heads | r | CP | link | dataset | ilp both ms | status, model gap "
          "| all-gather plan, modes after ms | ilp all-gather ms | both vs modes after "
          "| microbatches ulysses / allgather |")  # fmt: skip
    print("|---|---:|---:|---:|---|---|---:|---|---:|---:|---:|---|")
    for profile in shape_profiles():
        assert profile.heads is not None
        for cp in (2, 4, 8):
            request, base, _ = draw(rng, profile, cp, per_rank)
            exact = dict(solver="ilp", time_budget_s=budget_s)
            both = run(request, cp_modes=("allgather", "ulysses"), **exact)
            allgather = run(request, **exact)
            if both is None or allgather is None:
                r_kv = profile.gathered_kv_ratio
                print(f"| {profile.name} | {profile.heads.attention} | {r_kv:.3f} | {cp} | | {base} "
                      f"| {cell(both)} | | | {cell(allgather)} | | |", flush=True)  # fmt: skip
                continue
            view = CostModel(profile, bucket_tokens=request.bucket_tokens, choose_modes=("allgather", "ulysses"))
            lengths = [s for b in request.batches for s in b]
            after = sum(
                view.iteration_ms(it.microbatches, lengths, request.parallel.num_gpus) for it in allgather.iterations
            )
            sharded = [mb for it in both.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > 1]
            ul = sum(mb.mode == "ulysses" for mb in sharded)
            gap = f"{both.solve.model_gap:.2%}" if both.solve.model_gap is not None else "n/a"
            print(
                f"| {profile.name} | {profile.heads.attention} | {profile.gathered_kv_ratio:.3f} | {cp} "
                f"| {links(both)} | {base} | {both.estimated_ms:.2f} "
                f"| {both.solve.status}, {gap} | {after:.2f} | {allgather.estimated_ms:.2f} "
                f"| {both.estimated_ms / after - 1:+.2%} | {ul} / {len(sharded) - ul} |",
                flush=True,
            )
    if ERRORS:
        print("\nPlanner errors (not refusals):\n")
        for line in ERRORS:
            print(f"- {line}")


if __name__ == "__main__":
    main()
