"""The peers' published tables, reproduced in simulation on the reference cost model, side by side.

Sections (``--only`` picks some): ``peers`` (every planner on every bundled distribution, relative to
skrull), ``fig3`` (Skrull Fig. 3: skrull over DeepSpeed and sorted batching), ``table3`` (Skrull Table 3:
out-of-memory counts with and without rollback), ``wlb`` (WLB-LLM Table 2: imbalance degree and packing
time), ``megatron`` (Megatron dynamic CP's 1.48x / 1.25x on GitHub- / CommonCrawl-shaped lengths), ``xtuner``
(XTuner's own packing, K/V repeat and all-to-alls, ``solver/planners/xtuner_packer.py``, against the
loader-order ``xtuner`` planner and ``auto``).

Everything is simulated: times come from ``skrull.solver.cost`` with the bundled H100 profiles (estimated, not
measured), so agreement in *direction* and *rough size* is what to look for; the printed notes say
where and why the numbers differ. Prints Markdown; asserts nothing.
Run: python bench/peers.py [--batches N] [--only peers,fig3,table3,wlb,megatron,xtuner] [--ilp-seconds S]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from tqdm import tqdm

from skrull.solver.cost import CostModel
from skrull.solver.lengths.datasets import distribution_names, load_distribution, synthesize_request
from skrull.solver.metrics import imbalance_degree, work_ms
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planners.dacp import dacp_place, round_robin_place
from skrull.solver.planners.dynamic_cp import DynamicCpPlanner
from skrull.solver.planners.fixed_length import fixed_length_greedy, fixed_length_ilp, original_packing
from skrull.solver.planners.gds import balance_dp
from skrull.solver.planners.registry import PEERS
from skrull.solver.planners.skrull import gds_dacp_batch
from skrull.solver.planners.wlb import WlbPlanner
from skrull.solver.planning import assemble_plan, solve
from skrull.solver.profile import load_profile
from skrull.solver.reports.compare import compare
from skrull.solver.types import Parallel, Plan, Problem, Request
from skrull.solver.validate import validate_plan

QWEN_05B = "h100-80g/qwen2.5-0.5b"
QWEN_7B = "h100-80g/qwen2.5-7b"


def fmt_x(value: float) -> str:
    return f"{value:.2f}x"


def efficiency(plan: Plan, request: Request) -> float:
    """Estimated time per unit of the work the plan runs (``skrull.solver.metrics.work_ms``; fair to deferral)."""
    lengths = [s for b in request.batches for s in b]
    return plan.estimated_ms / work_ms(plan, lengths, CostModel(request.profile, bucket_tokens=request.bucket_tokens))


def run_planner(planner: object, request: Request) -> tuple[Plan, float]:
    """Plan with a configured planner instance; validated; (plan, wall ms)."""
    problem = Problem.from_request(request)
    start = time.perf_counter()
    output = planner.plan(problem)  # type: ignore[attr-defined]
    wall_ms = (time.perf_counter() - start) * 1e3
    plan = assemble_plan(problem, output, solver=str(planner.name), wall_ms=wall_ms)  # type: ignore[attr-defined]
    validate_plan(plan, request)
    return plan, wall_ms


# --- peers on every distribution ----------------------------------------------------------------------


def section_peers(batches: int, seed: int) -> None:
    setups = [(QWEN_05B, Parallel(dp=4, cp=8), 64), (QWEN_7B, Parallel(dp=2, cp=16), 40)]
    solvers = ["skrull", *PEERS]
    print("## Peers on every bundled distribution\n")
    print(
        "Speed relative to skrull, as time per unit of work (`(skrull ms / work) / (peer ms / work)`, work"
        " summed over the sequences a plan runs, `skrull.solver.metrics.work_ms`, so deferring sequences is not"
        " speed): above 1.00x the peer is faster. In brackets: the planner's estimated ms per iteration."
        f" {batches} batches.\n"
    )
    findings: list[tuple[str, str, str, float]] = []
    why: list[str] = []
    for profile_name, parallel, per_rank in setups:
        profile = load_profile(profile_name)
        spreads: list[float] = []
        print(f"### {profile_name}, DP{parallel.dp} x CP{parallel.cp}, {per_rank} per rank\n")
        print("| dataset | skrull ms | " + " | ".join(PEERS) + " |")
        print("|---|---:|" + "---:|" * len(PEERS))
        for dataset in tqdm(
            distribution_names(), desc=f"peers {profile_name}", file=sys.stderr, leave=False, disable=None
        ):
            request = synthesize_request(
                dataset=dataset,
                parallel=parallel,
                profile=profile,
                sequences_per_rank=per_rank,
                num_batches=batches,
                seed=seed,
            )
            _, plans = compare(request, solvers)
            base = efficiency(plans["skrull"], request)
            spreads.append(group_spread(plans["skrull"], request))
            cells = []
            for peer in PEERS:
                gain = base / efficiency(plans[peer], request)
                cells.append(f"{fmt_x(gain)} ({plans[peer].estimated_ms / batches:.0f})")
                if gain > 1.0 + 1e-3:
                    findings.append((profile_name, dataset, peer, gain))
            print(f"| {dataset} | {plans['skrull'].estimated_ms / batches:.0f} | " + " | ".join(cells) + " |")
        print()
        coeffs = CostModel(profile).coefficients
        comm = coeffs.comm_ms_per_token
        compute = coeffs.ms_per_flop * coeffs.flops_per_token / parallel.cp
        why.append(
            f"{profile_name}: sharding a token costs {100 * comm / compute:.1f}% of its linear compute on"
            f" CP{parallel.cp} in communication (overlapped with local work), while skrull's busiest GPU in a"
            f" microbatch computes {statistics.mean(spreads):.2f}x the group's mean"
        )
    print(f"Peers faster than skrull: {len(findings)} of {len(setups) * len(distribution_names()) * len(PEERS)}.")
    for name in PEERS:
        wins = [f for f in findings if f[2] == name]
        if wins:
            best = max(wins, key=lambda f: f[3])
            print(f"- {name}: {len(wins)} cells, best {fmt_x(best[3])} ({best[1]}, {best[0]})")
    print("\nWhy (the reference model's view):")
    for line in why:
        print(f"- {line}.")
    print(
        "- So spreading every sequence evenly (wlb, verl-kk, hydraulis, dynamic-cp) beats keeping short ones"
        " whole: DACP's Alg. 1 visits sequences in ascending length onto the least-loaded rank, so the largest"
        " land last and unbalance the group, and the model has no penalty for tiny shards (no tile padding,"
        " no kernel-efficiency loss below 128 rows, WLB-LLM Fig. 10), which is what made local placement pay"
        " on the paper's hardware. On the long-heavy shapes (mooncake, chatqa2) GDS also needs a few more"
        " microbatches than the all-sharded packers (one count per rank, grown until every strided microbatch"
        " places), and dynamic-cp / hydraulis win further by giving the longest sequences groups wider than"
        " CP.\n"
    )


def group_spread(plan: Plan, request: Request) -> float:
    """Mean over multi-GPU microbatches of (busiest GPU's FLOPs) / (group's mean FLOPs)."""
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    lengths = [s for b in request.batches for s in b]
    ratios = []
    for it in plan.iterations:
        for mb in it.microbatches:
            if len(mb.ranks) < 2:
                continue
            shared = sum(model.flops(lengths[i]) for i in mb.sharded) / len(mb.ranks)
            loads = [sum(model.flops(lengths[i]) for i in ids) + shared for ids in mb.local]
            ratios.append(max(loads) / (sum(loads) / len(loads)))
    return statistics.mean(ratios) if ratios else 1.0


# --- Skrull Fig. 3 -------------------------------------------------------------------------------------

#: Skrull's datasets and the bundled shapes standing in for them (Skrull sec. 3.2: Wikipedia and
#: LMsysChat1M share the long-tail shape of Llama 3's SFT mix; ChatQA2-Long-SFT is bimodal).
FIG3_DATASETS = [
    ("Wikipedia", "llama3-sft-mix", 11),
    ("LMsysChat1M", "llama3-sft-mix", 12),
    ("ChatQA2", "chatqa2-long-sft", 13),
]


def section_fig3(batches: int) -> None:
    print("## Skrull Fig. 3: speedup of skrull over DeepSpeed and sorted batching\n")
    print(
        "Setups as in Skrull sec. 5.1: <DP4, CP8, 64 per rank>, and <DP2, CP16, 40> for Qwen2.5-7B on"
        " ChatQA2. Wikipedia and LMsysChat1M are stood in for by two samples of the Llama-3 SFT mix"
        " (the paper says they share its long-tail shape); the other bundled shapes follow.\n"
    )
    print("| model | dataset (stand-in) | skrull ms | over deepspeed | over sorted |")
    print("|---|---|---:|---:|---:|")
    paper_points: dict[str, list[tuple[float, float]]] = {QWEN_05B: [], QWEN_7B: []}
    extra = [(n, n, 0) for n in distribution_names() if n not in {d for _, d, _ in FIG3_DATASETS}]
    for profile_name in (QWEN_05B, QWEN_7B):
        profile = load_profile(profile_name)
        for label, dataset, seed in [*FIG3_DATASETS, *extra]:
            parallel, per_rank = Parallel(dp=4, cp=8), 64
            if profile_name == QWEN_7B and dataset == "chatqa2-long-sft":
                parallel, per_rank = Parallel(dp=2, cp=16), 40
            request = synthesize_request(
                dataset=dataset,
                parallel=parallel,
                profile=profile,
                sequences_per_rank=per_rank,
                num_batches=batches,
                seed=seed,
            )
            _, plans = compare(request, ["skrull", "deepspeed", "sorted"])
            skrull = plans["skrull"].estimated_ms
            over_ds = plans["deepspeed"].estimated_ms / skrull
            over_sorted = plans["sorted"].estimated_ms / skrull
            if seed:
                paper_points[profile_name].append((over_ds, over_sorted))
            name = label if label == dataset else f"{label} ({dataset})"
            print(
                f"| {profile_name.split('/')[1]} | {name} | {skrull / batches:.0f} | {fmt_x(over_ds)} | "
                f"{fmt_x(over_sorted)} |"
            )
    small = [p[0] for p in paper_points[QWEN_05B]]
    large = [p[0] for p in paper_points[QWEN_7B]]
    both = small + large
    sorted_all = [p[1] for pts in paper_points.values() for p in pts]
    print("\n| aggregate over the paper's three datasets | simulated | Skrull paper |")
    print("|---|---:|---:|")
    print(f"| Qwen2.5-0.5B, mean over DeepSpeed | {fmt_x(statistics.mean(small))} | 5.50x |")
    print(f"| Qwen2.5-7B, mean over DeepSpeed | {fmt_x(statistics.mean(large))} | 2.03x |")
    print(f"| both, mean over DeepSpeed | {fmt_x(statistics.mean(both))} | 3.76x |")
    print(f"| both, peak over DeepSpeed | {fmt_x(max(both))} | 7.54x |")
    print(f"| both, mean over sorted | {fmt_x(statistics.mean(sorted_all))} | 3.45x |")
    print(f"| both, peak over sorted | {fmt_x(max(sorted_all))} | 6.85x |")
    print(
        "\nWhy they differ: the paper measured DeepSpeed Ulysses with ZeRO-2 on H100s; here both sides are"
        " the reference model with estimated profiles. DeepSpeed's one-sequence microbatches pay the"
        " profile's per-microbatch overhead (7.9 ms for 0.5B, 79 ms for 7B: an assumed 25% of ZeRO-2's"
        " gradient reduction left exposed) once per sequence, which is most of skrull's simulated gain; for"
        f" 7B that estimate is evidently too high (simulated {fmt_x(statistics.mean(large))} against the"
        " measured 2.03x, whose smaller"
        " gain the paper ties to the 13K bucket). Sorted batching is LongAlign's with micro-batch size 1,"
        " so under this model it saves almost nothing over DeepSpeed; the paper's sorted baseline was"
        " faster than that.\n"
    )


# --- Skrull Table 3 ------------------------------------------------------------------------------------


def placement_failures(problem: Problem, ids: Sequence[int], *, place: Callable[..., object], rollback: bool) -> int:
    """Microbatches whose placement fails when GDS sizes each DP rank's microbatches by tokens only
    (``Subset[j::m]`` until every one is within C*N, Alg. 2 line 8 first half) and the in-group placement
    then runs (``place`` returns None). Without RollBack such a microbatch has a sequence that must be
    sharded onto a full rank: Skrull's scheduler does not notice and the allocation runs out of memory.
    With RollBack a failure is caught (line 8 second half) and GDS retries with one more microbatch."""
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
    lengths = problem.lengths
    par = problem.parallel
    capacity = problem.group_capacity_tokens
    failures = 0
    for rank_ids in balance_dp(ids, [model.flops(lengths[i]) for i in ids], par.dp):
        subset = sorted(rank_ids, key=lambda i: (lengths[i], i))
        m = max(1, -(-sum(lengths[i] for i in subset) // capacity))
        while max(sum(lengths[i] for i in subset[j::m]) for j in range(m)) > capacity:
            m += 1
        for j in range(m):
            mb = sorted(subset[j::m])
            result = place(
                [lengths[i] for i in mb],
                group_size=par.cp,
                bucket_tokens=problem.bucket_tokens,
                flops=model.flops,
                rollback=rollback,
            )
            failures += result is None
    return failures


def section_table3(iterations: int) -> None:
    print("## Skrull Table 3: skrull and round-robin with and without rollback\n")
    print(
        f"Qwen2.5-0.5B, ChatQA2-Long-SFT shape, <DP1, CP8, 64 per batch>, {iterations} iterations (the paper"
        " shows the first four). GDS sizes each rank's microbatches by tokens, then the in-group placement"
        " runs. Without rollback (Alg. 1 without line 18) a sequence that must be sharded onto a full rank"
        " goes unnoticed: an out-of-memory microbatch (and iteration). With rollback such a failure is"
        " caught and GDS retries with one more microbatch. Guarded: this project's GDS, which also retries"
        " when placement without rollback fails, so every plan is valid; its time and speedup over"
        " DeepSpeed.\n"
    )
    profile = load_profile(QWEN_05B)
    request = synthesize_request(
        dataset="chatqa2-long-sft",
        parallel=Parallel(dp=1, cp=8),
        profile=profile,
        sequences_per_rank=64,
        num_batches=iterations,
        seed=5,
    )
    problem = Problem.from_request(request)
    deepspeed = solve(dataclasses.replace(request, solver="deepspeed")).estimated_ms
    print("| scheduler | rollback | OOM iterations | OOM microbatches | GDS retries | guarded ms / it | vs deepspeed |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, place in (("skrull (DACP)", dacp_place), ("round-robin (B.2)", round_robin_place)):
        for rollback in (True, False):
            failures = [placement_failures(problem, ids, place=place, rollback=rollback) for ids in problem.batch_ids]
            ooms = [0] * len(failures) if rollback else failures
            output = PlannerOutput(
                iterations=tuple(
                    tuple(gds_dacp_batch(problem, ids, place=place, rollback=rollback)) for ids in problem.batch_ids
                )
            )
            plan = assemble_plan(problem, output, solver="skrull", wall_ms=0.0)
            validate_plan(plan, request)
            retries = sum(failures) if rollback else 0
            print(
                f"| {label} | {'yes' if rollback else 'no'} | {sum(1 for n in ooms if n)} / {iterations} |"
                f" {sum(ooms)} | {retries} | {plan.estimated_ms / iterations:.0f} |"
                f" {fmt_x(deepspeed / plan.estimated_ms)} |"
            )
    print(
        "\nSkrull paper, Table 3: both schedulers run out of memory without rollback and none with it; skrull"
        " is faster than round-robin (the table's figures are an image not in the source text, so only"
        " this ordering is compared). Reproduced: out-of-memory microbatches appear exactly without"
        " rollback. Not reproduced: skrull faster than round-robin. On this bimodal shape a microbatch's time"
        " is dominated by its sharded long sequences, whose compute follows the overlap window, so where"
        " DACP or round-robin puts the short local ones (about 40%) moves the estimate by well under 0.1%.\n"
    )


# --- WLB-LLM Table 2 -----------------------------------------------------------------------------------


def wlb_batches(num_batches: int, num_microbatches: int, window: int, seed: int) -> list[list[int]]:
    """Global batches as the loader makes them: documents in order, packed into ``num_microbatches``
    sequences of ``window`` tokens (``original_packing``); a batch is the documents of M sequences."""
    dist = load_distribution("mooncake")
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    stream: list[int] = []
    while len(out) < num_batches:
        stream.extend(int(x) for x in np.minimum(dist.sample(4096, rng), window))
        packs = original_packing(stream, window)
        while len(packs) > num_microbatches and len(out) < num_batches:
            take = sum(len(p) for p in packs[:num_microbatches])
            out.append(stream[:take])
            stream = stream[take:]
            packs = original_packing(stream, window)
    return out


def concat(batches: Sequence[Sequence[int]]) -> list[int]:
    return [s for b in batches for s in b]


def packing_imbalance(
    lengths: Sequence[int], packs: Sequence[Sequence[int]], model: CostModel, cp: int, *, batches: int = 1
) -> float:
    """Mean over batches of ``max * count / total`` microbatch time. Packs of a multi-batch window are
    dealt to its batches heaviest first, in snake order, so every batch gets a like mix (our choice; the
    paper does not say how a window's sequences are split back into batches)."""
    times = sorted(
        (model.microbatch_time_ms([[] for _ in range(cp)], [lengths[k] for k in p]) for p in packs if p), reverse=True
    )
    per_batch: list[list[float]] = [[] for _ in range(batches)]
    for n, t in enumerate(times):
        row, col = divmod(n, batches)
        per_batch[col if row % 2 == 0 else batches - 1 - col].append(t)
    return statistics.mean(max(b) * len(b) / sum(b) for b in per_batch if b)


def section_wlb(batches: int, ilp_seconds: float) -> None:
    num_mb, cp, window = 8, 16, 131072
    bucket = 10240  # S_max = 16 * 10240 = 160K: variable-length packing may exceed the 128K window
    profile = load_profile("h100-80g/llama2-7b")
    model = CostModel(profile, bucket_tokens=bucket)
    docs = wlb_batches(max(batches, 16), num_mb, window, seed=7)
    print("## WLB-LLM Table 2: imbalance degree and packing time per batch\n")
    print(
        f"7B-128K-like: Llama2-7B profile, CP{cp}, a 128K window, {num_mb} microbatches per global batch,"
        f" Mooncake-shaped documents (truncated to 128K; the loader's in-order packing makes each batch),"
        f" {len(docs)} batches. Imbalance = max microbatch time x count / total (reference model, all"
        f" sharded on CP{cp}). WLB may pack up to S_max = {cp * bucket} tokens (an assumed memory cap"
        " above the window).\n"
    )
    print("| method | global batches packed together | imbalance degree | packing ms per batch | WLB-LLM paper |")
    print("|---|---:|---:|---:|---|")
    orig = [packing_imbalance(b, original_packing(b, window), model, cp) for b in docs]
    print(f"| Original packing | 1 | {statistics.mean(orig):.3f} | 0.0 | (image) |")
    for together in (1, 4):
        groups = [concat(docs[k : k + together]) for k in range(0, len(docs) - together + 1, together)]
        values, times = [], []
        for g in groups:
            start = time.perf_counter()
            packs = fixed_length_greedy(g, num_mb * together, window)
            times.append((time.perf_counter() - start) * 1e3 / together)
            if packs is not None:
                values.append(packing_imbalance(g, packs, model, cp, batches=together))
        print(
            f"| Fixed-len greedy | {together} | {statistics.mean(values):.3f} | {statistics.mean(times):.1f} |"
            " (image) |"
        )
    for together, count in ((1, 4), (4, 1)):
        values, times, statuses = [], [], []
        for k in range(count):
            g = concat(docs[k * together : (k + 1) * together])
            start = time.perf_counter()
            packs, status, _ = fixed_length_ilp(g, num_mb * together, window, time_limit_s=ilp_seconds)
            times.append((time.perf_counter() - start) * 1e3 / together)
            statuses.append(status)
            if packs is not None:
                values.append(packing_imbalance(g, packs, model, cp, batches=together))
        paper = "over 25 s per batch" if together == 4 else "(image)"
        value = f"{statistics.mean(values):.3f}" if values else "-"
        print(
            f"| Fixed-len ILP (CP-SAT, {ilp_seconds:.0f} s limit; {', '.join(sorted(set(statuses)))}) | {together} |"
            f" {value} | {statistics.mean(times):.0f} | {paper} |"
        )
    request = Request(
        batches=tuple(tuple(b) for b in docs),
        parallel=Parallel(dp=num_mb, cp=cp),
        profile=profile,
        solver="wlb",
        bucket_tokens_override=bucket,
    )
    for queues in (1, 2):
        plan, wall_ms = run_planner(WlbPlanner(num_queues=queues, microbatches_per_rank=1), request)
        stats = plan.solve.stats_dict
        paper = "1.05 at 20 ms per batch" if queues == 2 else "(image)"
        print(
            f"| WLB-LLM, {queues} queue{'s' if queues > 1 else ''} (delay {stats['avg_delay_iterations']:.2f} it,"
            f" {int(stats['pending_sequences'])} pending) | 1, outliers delayed | {imbalance_degree(plan):.3f} |"
            f" {wall_ms / len(docs):.1f} | {paper} |"
        )
    print(
        "\nWhy they differ: the imbalance here is of the reference model's microbatch times, which include the"
        " per-microbatch overhead and the linear GEMM share, so all methods sit closer to 1 than forward"
        " attention latencies would; WLB's thresholds are tuned on the request itself (the paper tunes them"
        " on a data sample) under a 0.5-iteration delay limit, and its packing time includes that tuning"
        " (four candidate thresholds, each a full packing). CP-SAT is not the paper's commercial solver,"
        " and 2 shared cores are not its host.\n"
    )


# --- Megatron dynamic CP -------------------------------------------------------------------------------


def section_megatron(batches: int) -> None:
    print("## Megatron dynamic CP: GitHub- and CommonCrawl-shaped lengths\n")
    print(
        "Blog setup: Llama-13B, global batch 2,048, PP8 x CP8, packing only vs dynamic CP. Simulated:"
        " Llama2-13B profile (ZeRO-3 over DP8), DP8 x CP8 = 64 GPUs, 2,048 sequences per batch (256 per DP"
        f" rank), no pipeline; `packed` (in-order packing to CP x bucket, every sequence on the CP group) vs"
        f" `dynamic-cp`; {batches} batches.\n"
    )
    profile = load_profile("h100-80g/llama2-13b")
    published = {"github": (195.88, 289.32), "commoncrawl": (139.17, 174.39)}
    variants: list[tuple[str, DynamicCpPlanner]] = [
        ("dynamic-cp (blog: workload-sized groups)", DynamicCpPlanner()),
        ("dynamic-cp, memory-only group sizes (public code)", DynamicCpPlanner(workload_cp=False)),
        ("dynamic-cp, memory-only, S^2 workload (public code)", DynamicCpPlanner(workload_cp=False, workload="l2")),
    ]
    print("| data | planner | ms / it | sync ms / it | speedup over packing | blog TFLOPS/GPU | blog speedup |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for dataset in ("github", "commoncrawl"):
        request = synthesize_request(
            dataset=dataset,
            parallel=Parallel(dp=8, cp=8),
            profile=profile,
            sequences_per_rank=256,
            num_batches=batches,
            seed=21,
        )
        packed = solve(dataclasses.replace(request, solver="packed"))
        before, after = published[dataset]
        per_it = packed.estimated_ms / batches
        print(f"| {dataset} | packed | {per_it:.0f} | {per_it:.0f} | 1.00x | {before} | 1.00x |")
        for label, planner in variants:
            plan, _ = run_planner(planner, request)
            makespan = plan.solve.stats_dict["makespan_ms"]
            blog = f"{after} | {after / before:.2f}x" if planner.workload_cp else "- | -"
            print(
                f"| {dataset} | {label} | {plan.estimated_ms / batches:.0f} | {makespan / batches:.0f} |"
                f" {fmt_x(packed.estimated_ms / plan.estimated_ms)} | {blog} |"
            )
    print(
        "\nWhy they differ: the blog's gain includes pipeline bubbles (PP8) that imbalanced microbatches"
        " widen and that this pipeline-free model cannot see, its own profiled cost model and asynchronous"
        " solver, and real data (here only the Pile's mean document sizes with assumed spreads). The"
        " ordering GitHub > CommonCrawl follows from GitHub's heavier tail: more long files that static"
        " packing cannot balance and that dynamic CP spreads over wider groups.\n"
    )


#: (profile, DP, CP) of the xtuner section: CP must divide the attention heads (Qwen2.5-7B 28, 0.5B 14).
XTUNER_SETUPS = ((QWEN_7B, 2, 4), (QWEN_05B, 4, 2))
XTUNER_DATASETS = ("chatqa2-long-sft", "arxiv", "commoncrawl")


def section_xtuner(batches: int, seed: int, budget_s: float = 1.0) -> None:
    """XTuner as it runs (its Packer cuts samples into exact ``max_length`` packs, pieces attend within
    themselves; its all-to-all carries repeated K/V heads, 8 collectives a layer) against the ``xtuner``
    planner (the same sampler and Ulysses dispatch on whole sequences packed in loader order, this project's
    all-to-all) and ``auto`` with both CP modes. "attention kept" is the share of the request's attention
    FLOPs (the quadratic term) the Packer's pieces still compute: what cutting samples removes."""
    from skrull.solver.planners.xtuner_packer import xtuner_packed_run

    print("## XTuner: its own packing against the loader-order peer and auto\n")
    print(f"{batches} global batches of 32 sequences per DP rank, seed {seed}; auto at {budget_s:g} s, both modes.\n")
    print(
        "| profile | DP x CP | dataset | xtuner (loader order) ms, packs | XTuner Packer ms, packs, samples cut "
        "| Packer without the K/V repeat ms | attention kept | auto ms | Packer vs auto | loader order vs auto |"
    )
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|")
    for name, dp, cp in XTUNER_SETUPS:
        profile = load_profile(name)
        for dataset in XTUNER_DATASETS:
            request = synthesize_request(
                dataset=dataset, parallel=Parallel(dp=dp, cp=cp), profile=profile, sequences_per_rank=32,
                num_batches=batches, seed=seed,
            )  # fmt: skip
            both = dataclasses.replace(request, cp_modes=("allgather", "ulysses"), time_budget_s=budget_s)
            loader = solve(dataclasses.replace(both, solver="xtuner"))
            auto = solve(dataclasses.replace(both, solver="auto"))
            packed = xtuner_packed_run(request, seed=seed)
            plain = xtuner_packed_run(request, seed=seed, repeat_kv=False)
            lengths = [s for b in request.batches for s in b]
            # the attention term is flops_per_token_sq * S^2 per sequence (or piece): its factor cancels
            kept = sum(p * p for pack in packed.packs for p in pack) / sum(s * s for s in lengths)
            loader_packs = sum(len(it.microbatches) for it in loader.iterations)
            print(
                f"| {name} | {dp} x {cp} | {dataset} | {loader.estimated_ms:.1f}, {loader_packs} "
                f"| {packed.total_ms:.1f}, {len(packed.packs)}, {packed.samples_split} | {plain.total_ms:.1f} "
                f"| {kept:.1%} "
                f"| {auto.estimated_ms:.1f} | {packed.total_ms / auto.estimated_ms - 1:+.1%} "
                f"| {loader.estimated_ms / auto.estimated_ms - 1:+.1%} |"
            )
    print(
        "\nThe Packer's run is not a plan of the request: it cuts samples (their pieces do not attend to each"
        " other: a different training semantics) and ends with XTuner's dropped residual kept as a last short"
        " pack, so both sides run the same tokens. Negative: faster than auto.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ilp-seconds", type=float, default=10.0)
    parser.add_argument("--only", default="peers,fig3,table3,wlb,megatron,xtuner")
    args = parser.parse_args()
    sections = set(args.only.split(","))
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, python"
        f" {platform.python_version()}\n"
    )
    if "peers" in sections:
        section_peers(args.batches, args.seed)
    if "fig3" in sections:
        section_fig3(args.batches)
    if "table3" in sections:
        section_table3(max(args.batches, 20))
    if "wlb" in sections:
        section_wlb(args.batches, args.ilp_seconds)
    if "megatron" in sections:
        section_megatron(max(1, args.batches // 2))
    if "xtuner" in sections:
        section_xtuner(max(1, args.batches // 2), args.seed)


if __name__ == "__main__":
    main()
