"""``skrull finetune``: train a Hugging Face model from its config.json under a plan; ``--check`` it.

Plans the request (or reads ``--plan``, validated against it), builds the model from ``--model-config``
with seeded random weights (nothing is downloaded), spawns ``--world-size`` processes (gloo on CPU,
NCCL with one GPU each) and runs ``--steps`` SGD steps, step s under the plan's iteration
``s mod iterations``, on seeded random token ids of the request's lengths. ``--check`` replays every
step as a plain single-process Hugging Face training step over the same global batch (padded, no
packing, no CP) and compares the loss and every parameter gradient: it prints the largest relative
error and "check passed", or "check failed" with exit status 1. torch and transformers are imported
only when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
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
from skrull.solver.io import dumps, plan_from_dict, read_json, request_to_dict
from skrull.solver.planning import solve
from skrull.solver.types import Plan, Problem, Request
from skrull.solver.validate import validate_plan

EXIT_CHECK_FAILED = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "finetune",
        help="train a Hugging Face model (config.json, random weights) under a plan on W processes; --check",
    )
    p.add_argument("--model-config", "-m", required=True, metavar="FILE", help="Hugging Face config.json")
    add_process_arguments(p)
    p.add_argument("--plan", "-p", default=None, metavar="FILE", help="run this plan (validated) instead of solving")
    p.add_argument("--steps", "-n", type=int, default=1, help="optimizer steps (default 1)")
    p.add_argument("--check", action="store_true", help="compare each step with the plain HF step; exit 1 on mismatch")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--loss-chunk-tokens", type=int, default=None, help="LM head + loss in chunks of this many rows")
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off", "fullgraph", "stack"),
        default="auto",
        help="decoder layers under torch.compile (dynamic token counts); auto: on CUDA only; on: regional "
        "(the attention eager between two graphs); fullgraph: one graph per layer, the attention a custom op; "
        "stack: the whole decoder one graph (not with --grad-sync fsdp)",
    )
    p.add_argument("--warmup", type=int, default=0, help="untimed steps first, not applied (default 0)")
    p.add_argument("--tolerance", type=float, default=None, help="max relative error (default 1e-4; 5e-2 in 16 bits)")
    p.add_argument(
        "--grad-sync",
        default="allreduce",
        help="how gradients are summed: allreduce (default), ddp (DistributedDataParallel, no_sync) or fsdp "
        "(FSDP2 fully_shard); ddp and fsdp plan with equal_microbatches",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="time every microbatch, refit the profile after each step and plan the next steps with it; ends "
        "with the run's 'calibration noise floor: ...' and one 'calibration: ...' line (docs/profiles.md)",
    )
    p.add_argument(
        "--calibrated-profile-out", default=None, metavar="PATH", help="with --calibrate: write the calibrated profile"
    )
    p.add_argument(
        "--calibration-records-out",
        default=None,
        metavar="PATH",
        help="with --calibrate: write every measured microbatch (ranks, local and sharded lengths, mode, ms, the "
        "profile its plan was made with) as JSON, to see where the model is off",
    )
    p.add_argument(
        "--router-aux-loss",
        choices=("per-microbatch",),
        default=None,
        help="a mixture of experts' router auxiliary loss (output_router_logits: true), refused without this: "
        "per-microbatch: each microbatch of the plan's load-balancing loss over its own tokens (docs/worker.md)",
    )
    add_progress_flag(p)
    p.set_defaults(func=cmd_finetune)


def _load_plan(args: argparse.Namespace, request: Request) -> Plan:
    if args.plan is None:
        return solve(request)
    plan = plan_from_dict(read_json(args.plan, field="--plan"))
    validate_plan(plan, request)
    return plan


def _check_options(args: argparse.Namespace) -> None:
    """Refuse this command's own bad options (the shared ones are checked by ``request_for_processes``)."""
    if args.steps < 1:
        raise RequestError("--steps", args.steps, "must be an integer >= 1")
    if args.warmup < 0:
        raise RequestError("--warmup", args.warmup, "must be an integer >= 0")
    if args.loss_chunk_tokens is not None and args.loss_chunk_tokens < 1:
        raise RequestError("--loss-chunk-tokens", args.loss_chunk_tokens, "must be an integer >= 1")
    if not args.lr > 0:
        raise RequestError("--lr", args.lr, "must be a number > 0")
    from skrull.worker.grad_sync import GRAD_SYNCS

    if args.grad_sync not in GRAD_SYNCS:
        raise RequestError("--grad-sync", args.grad_sync, f"must be one of {', '.join(GRAD_SYNCS)}")


def _print_run(
    plan: Plan, result: Any, model_config: dict[str, Any], args: argparse.Namespace, world_size: int
) -> None:
    par = plan.parallel
    wide = sum(1 for it in plan.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > par.cp)
    sharded = sum(len(mb.sharded) for it in plan.iterations for mb in it.microbatches)
    print(
        f"model: {model_config['model_type']} ({model_config['num_hidden_layers']} layers, hidden "
        f"{model_config['hidden_size']}, {model_config['num_attention_heads']} heads / "
        f"{model_config.get('num_key_value_heads', model_config['num_attention_heads'])} kv heads)"
    )
    print(
        f"plan: {plan.solver}, {len(plan.iterations)} iteration(s), DP{par.dp} x CP{par.cp}, {sharded} sharded "
        f"sequence(s), {wide} microbatch(es) on groups wider than CP, {len(plan.pending)} pending; "
        f"{world_size} processes ({args.backend}), kernel {result.kernel}, cp {plan_modes(plan)}, {args.dtype}"
    )
    if result.kernel_line:
        how = "eager"
        if result.compiled:
            how = {"fullgraph": "compiled, one graph per layer", "stack": "compiled, the decoder stack one graph"}.get(
                args.compile, "compiled"
            )
        print(f"{result.kernel_line}; decoder layers {how}")
    print()
    # compiles: graphs compiled during the step on rank 0 (a new shape range; its time is in the step's)
    print("| step | iteration | target tokens | loss | step ms (slowest rank) | compiles |")
    print("|------|-----------|---------------|------|------------------------|----------|")
    for r in result.steps:
        print(
            f"| {r.step:4d} | {r.iteration:9d} | {r.num_targets:13d} | {r.loss:.6f} | {r.seconds * 1e3:22.1f} "
            f"| {r.compiles:8d} |"
        )
    routed = [r for r in result.steps if getattr(r, "router_aux_loss", None)]
    if routed:  # what the loss holds besides the cross-entropy, and in which semantics
        parts = ", ".join(f"step {r.step}: {r.router_loss:.6f}" for r in routed)
        print(f"\nloss includes the router aux loss, {routed[0].router_aux_loss} (its part: {parts})")


def _print_calibration(calibration: dict[str, Any], args: argparse.Namespace) -> None:
    """Per step: the profile its plan was made with, estimated vs measured, then the one summary line."""
    print()
    print("| step | plan's profile | estimated ms | measured ms | median microbatch error |")
    print("|------|----------------|--------------|-------------|-------------------------|")
    for r in calibration["reports"]:
        print(
            f"| {r['iteration']:4d} | {r['profile']} | {r['estimated_ms']:.1f} | {r['measured_ms']:.1f} "
            f"| {r['median_microbatch_error']:.1%} |"
        )
    if args.calibrated_profile_out:
        if calibration["profile"] is None:
            print(f"no calibrated profile written: too few microbatches measured (--steps {args.steps})")
        else:
            Path(args.calibrated_profile_out).write_text(dumps(calibration["profile"]) + "\n", encoding="utf-8")
            print(f"wrote {args.calibrated_profile_out}: {calibration['profile']['name']}")
    if args.calibration_records_out:
        Path(args.calibration_records_out).write_text(dumps(calibration["measured"]) + "\n", encoding="utf-8")
        print(f"wrote {args.calibration_records_out}: {len(calibration['measured'])} measured microbatches")
    if calibration.get("noise_floor_line"):
        print(calibration["noise_floor_line"])
    print(calibration["summary"])


def _print_check(checks: Any, tolerance: float) -> int:
    """The check table; the exit status (``EXIT_CHECK_FAILED`` beyond ``tolerance``, or NaN)."""
    print()
    print("check: the plain Hugging Face step (one process, padded global batch, eager attention, float32)")
    print()
    print("| step | loss | reference loss | loss rel. error | worst gradient | rel. error |")
    print("|------|------|----------------|-----------------|----------------|------------|")
    for c in checks:
        print(
            f"| {c.step:4d} | {c.loss:.6f} | {c.reference_loss:.6f} | {c.loss_rel_error:.2e} "
            f"| {c.worst_grad[0]} | {c.worst_grad[1]:.2e} |"
        )
    worst = max(checks, key=lambda c: c.max_rel_error)
    print()
    print(
        f"largest relative error: {worst.max_rel_error:.3e} (step {worst.step}; loss and "
        f"{worst.grads_checked} parameter gradients per step; tolerance {tolerance:.1e})"
    )
    if not worst.max_rel_error <= tolerance:  # NaN fails too
        print("check failed")
        print(
            f"skrull: error: check failed: relative error {worst.max_rel_error:.3e} > {tolerance:.1e}",
            file=sys.stderr,
        )
        return EXIT_CHECK_FAILED
    print("check passed")
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from skrull.worker.hf.finetune import FinetuneConfig, check_steps, finetune_plan
        from skrull.worker.hf.model import read_model_config
        from skrull.worker.launch import LaunchError
    except ImportError as exc:
        raise SkrullError(
            f"skrull finetune needs torch and transformers ({exc.name} missing): pip install 'skrull[worker,hf]'"
        ) from None
    if args.calibrated_profile_out and not args.calibrate:
        raise RequestError("--calibrated-profile-out", args.calibrated_profile_out, "needs --calibrate")
    if args.calibration_records_out and not args.calibrate:
        raise RequestError("--calibration-records-out", args.calibration_records_out, "needs --calibrate")
    router_aux_loss = args.router_aux_loss.replace("-", "_") if args.router_aux_loss else None
    model_config = read_model_config(args.model_config, router_aux_loss=router_aux_loss)
    request, world_size = request_for_processes(args)
    _check_options(args)
    from skrull.worker.grad_sync import NEED_EQUAL_MICROBATCHES

    if args.grad_sync in NEED_EQUAL_MICROBATCHES:  # every rank a microbatch at every step (worker/grad_sync.py)
        request = dataclasses.replace(request, equal_microbatches=True)
    tolerance = args.tolerance
    if tolerance is None:
        tolerance = TOLERANCE_FLOAT32 if args.dtype == "float32" else TOLERANCE_16_BIT
    say_progress(
        f"skrull finetune: planning {len(request.batches)} batch(es) with {request.solver}"
        if args.plan is None
        else f"skrull finetune: reading the plan {args.plan}",
        flag=args.progress,
    )
    plan = _load_plan(args, request)
    if not plan.iterations:
        raise RequestError("--request", args.request, "the plan has no iteration to train on")
    lengths = Problem.from_request(request).lengths
    config = FinetuneConfig(
        model_config=model_config,
        steps=args.steps,
        seed=args.seed,
        lr=args.lr,
        kernel=args.kernel,
        dtype=args.dtype,
        record_grads=args.check,
        loss_chunk_tokens=args.loss_chunk_tokens,
        warmup_steps=args.warmup,
        progress=args.progress,
        grad_sync=args.grad_sync,
        calibrate_request=request_to_dict(request, inline_profile=True) if args.calibrate else None,
        compile=args.compile,
        router_aux_loss=router_aux_loss,
    )
    # rank 0 reports each step once the processes have imported torch and built the model
    say_progress(
        f"skrull finetune: starting {world_size} processes ({args.backend}), plan {plan.solver}", flag=args.progress
    )
    try:
        result = finetune_plan(plan, lengths, world_size=world_size, backend=args.backend, config=config)
    except LaunchError as exc:
        raise SkrullError(f"worker process failed: {exc}") from None
    _print_run(plan, result, model_config, args, world_size)
    status = 0
    if args.check:
        say_progress(
            f"skrull finetune: checking {len(result.steps)} step(s) against the plain step in one process",
            flag=args.progress,
        )
        status = _print_check(check_steps(plan, lengths, result, config=config), tolerance)
    if args.calibrate and result.calibration is not None:  # its summary line is the last line
        _print_calibration(result.calibration, args)
    return status
