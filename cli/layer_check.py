"""``skrull execute``: run every GPU's part of a plan through one attention layer, optionally checked.

Plans the request once (the plan every process receives), spawns ``--world-size`` processes (gloo on
CPU, NCCL on GPUs), runs forward and backward of one attention layer (random weights and inputs, fixed
seed) with DACP attention, and prints per-rank work and time. ``--check`` compares outputs, input
gradients and weight gradients with each sequence run alone in one process (float64) and exits 1 when
any error exceeds the tolerance. torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from skrull.cli.flags import add_progress_flag, say_progress
from skrull.cli.processes import (
    TOLERANCE_16_BIT,
    TOLERANCE_FLOAT32,
    add_process_arguments,
    plan_modes,
    request_for_processes,
)
from skrull.solver.errors import RequestError, SkrullError
from skrull.solver.planning import solve
from skrull.solver.sharding import SHARDING_MODES
from skrull.solver.types import Plan, Problem

EXIT_CHECK_FAILED = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "execute",
        help="run a plan's attention layer on W local processes (gloo/nccl); --check against each sequence alone",
    )
    add_process_arguments(p)
    p.add_argument("--check", action="store_true", help="compare with each sequence run alone; exit 1 on mismatch")
    p.add_argument(
        "--sharding",
        default="zigzag",
        help=f"cut of microbatches the plan leaves at the default: {', '.join(SHARDING_MODES)} (default zigzag)",
    )
    p.add_argument("--hidden-size", type=int, default=64, help="the attention layer's model width (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads, dividing --heads (default 2)")
    p.add_argument("--head-dim", type=int, default=16, help="size of each head (default 16)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes over the plan first (default 1)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help=f"max abs error (default {TOLERANCE_FLOAT32:g}; {TOLERANCE_16_BIT:g} in 16 bits)",
    )
    add_progress_flag(p)
    p.set_defaults(func=cmd_execute)


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise RequestError(flag, value, "must be an integer >= 1")


def _check_layer_options(args: argparse.Namespace) -> None:
    """Refuse bad options of this command (the shared ones are checked by ``request_for_processes``)."""
    if args.sharding not in SHARDING_MODES:
        raise RequestError("--sharding", args.sharding, f"unknown; known: {', '.join(SHARDING_MODES)}")
    if args.warmup < 0:
        raise RequestError("--warmup", args.warmup, "must be an integer >= 0")
    for flag, value in (
        ("--hidden-size", args.hidden_size),
        ("--heads", args.heads),
        ("--kv-heads", args.kv_heads),
        ("--head-dim", args.head_dim),
    ):
        _positive(flag, value)
    if args.heads % args.kv_heads:
        raise RequestError("--kv-heads", args.kv_heads, f"must divide --heads ({args.heads})")
    if args.head_dim % 2:
        raise RequestError("--head-dim", args.head_dim, "must be even (rotary embedding)")


def _print_timings(plan: Plan, result: Any, args: argparse.Namespace, world_size: int) -> None:
    par = plan.parallel
    num_mb = sum(len(it.microbatches) for it in plan.iterations)
    print(
        f"plan: {plan.solver}, {len(plan.iterations)} iteration(s), {num_mb} microbatches, DP{par.dp} x CP{par.cp}; "
        f"{world_size} processes ({args.backend}), kernel {result.kernel}, cp {plan_modes(plan)}, "
        f"{args.sharding} shards"
    )
    print()
    print(f"timed pass after {args.warmup} warm-up pass(es):")
    print()
    print("| rank | microbatches | local tokens | shard tokens | fwd+bwd ms | tokens/s |")
    print("|------|--------------|--------------|--------------|------------|----------|")
    for t in result.timings:
        print(
            f"| {t.rank:4d} | {t.microbatches:12d} | {t.local_tokens:12d} | {t.piece_tokens:12d} "
            f"| {t.seconds * 1e3:10.1f} | {t.tokens_per_s:8.0f} |"
        )


def _print_check(rows: Any, num_sequences: int) -> int:
    """The check table; the exit status (``EXIT_CHECK_FAILED`` when a tensor is beyond tolerance)."""
    print()
    print(f"check: every sequence alone in one process (float64, plain causal SDPA), {num_sequences} sequences")
    print()
    print("| tensor                | max abs error | tolerance | ok  |")
    print("|-----------------------|---------------|-----------|-----|")
    for row in rows:
        ok = "yes" if row.ok else "NO"
        print(f"| {row.tensor:21s} | {row.max_abs_error:13.3e} | {row.tolerance:9.1e} | {ok:3s} |")
    failed = [r for r in rows if not r.ok]
    if failed:
        worst = max(failed, key=lambda r: r.max_abs_error / r.tolerance)
        print(
            f"skrull: error: check failed: {len(failed)} tensor(s) beyond tolerance; worst {worst.tensor}: "
            f"{worst.max_abs_error:.3e} > {worst.tolerance:.1e}",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    print()
    print(f"check passed: {len(rows)} tensors within tolerance")
    return 0


def cmd_execute(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401

        from skrull.worker.launch import LaunchError
        from skrull.worker.layer_check import ExecuteConfig, LayerConfig, compare, execute_plan
    except ImportError as exc:
        raise SkrullError(f"skrull execute needs torch ({exc.name} missing): pip install 'skrull[worker]'") from None
    request, world_size = request_for_processes(args)
    _check_layer_options(args)
    tolerance = args.tolerance
    if tolerance is None:
        tolerance = TOLERANCE_FLOAT32 if args.dtype == "float32" else TOLERANCE_16_BIT
    config = ExecuteConfig(
        layer=LayerConfig(
            hidden_size=args.hidden_size, num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim
        ),
        seed=args.seed,
        kernel=args.kernel,
        sharding=args.sharding,
        dtype=args.dtype,
        warmup_passes=args.warmup,
        progress=args.progress,
    )
    say_progress(f"skrull execute: planning {len(request.batches)} batch(es) with {request.solver}", flag=args.progress)
    plan = solve(request)
    lengths = Problem.from_request(request).lengths
    say_progress(
        f"skrull execute: starting {world_size} processes ({args.backend}): {args.warmup} warm-up pass(es), "
        "then the timed one",
        flag=args.progress,
    )
    try:
        result = execute_plan(plan, lengths, world_size=world_size, backend=args.backend, config=config)
    except LaunchError as exc:
        raise SkrullError(f"worker process failed: {exc}") from None
    _print_timings(plan, result, args, world_size)
    if not args.check:
        return 0
    say_progress(
        f"skrull execute: checking {len(result.outputs)} sequences, each alone in one process", flag=args.progress
    )
    return _print_check(compare(result, lengths, config=config, tolerance=tolerance), len(result.outputs))
