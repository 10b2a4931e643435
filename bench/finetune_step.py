"""Measured training step of a Qwen2.5-0.5B-shaped model under planners' plans, on this machine's GPUs.

For each length distribution (real-shaped batches: ``synthesize_request`` samples the bundled
distributions, lengths capped at ``cp * bucket_tokens``) and each planner, the plan of ``--batches``
global batches is run by ``skrull.worker.hf.finetune`` on one process per GPU (NCCL): the model built
from ``--model-config`` with random weights, bf16, flash-attn varlen (the best kernel installed), the
LM head and loss in chunks, SGD. One untimed warm-up step, then ``--passes`` passes over the plan's
iterations; the step time is the slowest rank's wall time of forward, backward and gradient all-reduce,
averaged over the timed steps. The table gives, per dataset and planner, the plan's estimated iteration
time (reference model, the profile given), the measured step time and the speedup over ``deepspeed``.

The decoder layers run compiled (``--compile``, worker/compiling.py) and the warm-up runs every
iteration of the plan once (``--warmup-passes``), so no step timed compiles. With one GPU the ranks'
work runs in this process (a one-process group), so every planner shares one compile.

Needs CUDA GPUs; without one it says so in one line and exits 2 (``--device cpu`` runs the same code
on a tiny model: a smoke test). Prints a Markdown table and writes it, with the device, the versions
and the date, to ``--out``.

    python bench/finetune_step.py --profile docs/gpu-check/qwen2.5-0.5b.profile.json \
        --out docs/gpu-check/finetune-step.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from skrull.solver.io import parse_profile, read_json  # noqa: E402
from skrull.solver.lengths.datasets import synthesize_request  # noqa: E402
from skrull.solver.planning import solve  # noqa: E402
from skrull.solver.profile import Profile, load_profile  # noqa: E402
from skrull.solver.types import Parallel, Problem  # noqa: E402
from skrull.worker.hf.finetune import FinetuneConfig, finetune_plan  # noqa: E402
from skrull.worker.hf.model import read_model_config  # noqa: E402

DATASETS = ("mooncake",)
SOLVERS = ("auto", "skrull", "packed", "deepspeed")


def _profile(value: str) -> Profile:
    if value.endswith(".json") or Path(value).is_file():
        return parse_profile(read_json(value, field="--profile"), field="--profile")
    return load_profile(value)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default=str(ROOT / "examples" / "models" / "qwen2.5-0.5b.json"))
    p.add_argument("--profile", default="h100-80g/qwen2.5-0.5b", help="bundled name or profile JSON file")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--solvers", default=",".join(SOLVERS))
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--cp", type=int, default=None, help="default: the visible GPUs / dp")
    p.add_argument("--per-rank", type=int, default=16, help="sequences per DP rank per global batch")
    p.add_argument("--batches", type=int, default=2, help="global batches (iterations) per plan")
    p.add_argument("--passes", type=int, default=1, help="timed passes over the plan's iterations")
    p.add_argument("--bucket-tokens", type=int, default=None, help="override the profile's bucket")
    p.add_argument("--loss-chunk-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", choices=("auto", "on", "off"), default="on")
    p.add_argument("--warmup-passes", type=int, default=1, help="untimed passes over the plan's iterations")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (gloo, float32)")
    p.add_argument("--max-tokens", type=int, default=None, help="cap every sequence at this many tokens")
    p.add_argument("--out", default=str(ROOT / "docs" / "gpu-check" / "finetune-step.md"))
    return p.parse_args(argv)


def run_in_process(plan: Any, lengths: tuple[int, ...], *, config: FinetuneConfig, device: torch.device) -> Any:
    """One rank's steps in this process, in a one-process group (every planner shares one compile)."""
    import torch.distributed as dist

    from skrull.worker.hf.finetune import result_from_parts, run_finetune_rank

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device.index or 0)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return result_from_parts([run_finetune_rank(plan, lengths, config=config, rank=0, device=device)])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "bench/finetune_step.py: needs CUDA GPUs and none is visible (torch.cuda.is_available() is False); "
            "nothing was measured",
            file=sys.stderr,
        )
        return 2
    gpus = torch.cuda.device_count() if device.type == "cuda" else 1
    cp = args.cp or max(1, gpus // args.dp)
    parallel = Parallel(dp=args.dp, cp=cp)
    if parallel.num_gpus > gpus:
        print(f"bench/finetune_step.py: dp * cp = {parallel.num_gpus} > {gpus} visible GPUs", file=sys.stderr)
        return 2
    profile = _profile(args.profile)
    model_config = read_model_config(args.model_config)
    rows: list[dict[str, Any]] = []
    for dataset in [d for d in args.datasets.split(",") if d]:
        request = synthesize_request(
            dataset=dataset,
            parallel=parallel,
            profile=profile,
            sequences_per_rank=args.per_rank,
            num_batches=args.batches,
            seed=args.seed,
            bucket_tokens=args.bucket_tokens,
        )
        if args.max_tokens is not None:  # a smoke run's short sequences
            request = dataclasses.replace(
                request, batches=tuple(tuple(min(n, args.max_tokens) for n in b) for b in request.batches)
            )
        lengths = Problem.from_request(request).lengths
        for solver in [s for s in args.solvers.split(",") if s]:
            plan = solve(dataclasses.replace(request, solver=solver))
            config = FinetuneConfig(
                model_config=model_config,
                steps=len(plan.iterations) * args.passes,
                seed=args.seed,
                lr=1e-5,
                dtype="bfloat16" if device.type == "cuda" else "float32",
                loss_chunk_tokens=args.loss_chunk_tokens,
                warmup_steps=len(plan.iterations) * args.warmup_passes,
                compile=args.compile,
            )
            if parallel.num_gpus == 1:
                result = run_in_process(plan, lengths, config=config, device=device)
            else:
                result = finetune_plan(plan, lengths, world_size=parallel.num_gpus, backend="nccl", config=config)
            measured = 1e3 * statistics.fmean(r.seconds for r in result.steps)
            estimated = plan.estimated_ms / len(plan.iterations)
            rows.append(
                {
                    "dataset": dataset,
                    "solver": solver,
                    "kernel": result.kernel,
                    "compiled": result.compiled,
                    "tokens": sum(lengths),
                    "microbatches": sum(len(it.microbatches) for it in plan.iterations),
                    "estimated_ms": estimated,
                    "measured_ms": measured,
                    "error": (estimated - measured) / measured if measured > 0 else float("nan"),
                    "compiles_in_timed_steps": sum(r.compiles for r in result.steps),
                    "loss": result.steps[-1].loss,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            # the table so far, after every row: a run cut short by a time cap keeps what it measured
            text = report(rows, args=args, parallel=parallel, profile=profile, model_config=model_config, device=device)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text if rows else "no row measured")
    worst = max((abs(r["error"]) for r in rows), default=0.0)
    print(f"largest |estimate - measured| / measured: {100 * worst:.1f}% (target <= 10%)")
    return 0


def report(
    rows: list[dict[str, Any]],
    *,
    args: argparse.Namespace,
    parallel: Parallel,
    profile: Profile,
    model_config: dict[str, Any],
    device: torch.device,
) -> str:
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (smoke run)"
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    lines = [
        "# Measured training step under plans (bench/finetune_step.py)",
        "",
        f"{date}; {parallel.num_gpus} x {where}; DP{parallel.dp} x CP{parallel.cp}; torch {torch.__version__}, "
        f"transformers {_version('transformers')}, flash-attn {_version('flash-attn')}.",
        f"Model: {Path(args.model_config).name} ({model_config['num_hidden_layers']} layers, hidden "
        f"{model_config['hidden_size']}), random weights, {'bf16' if device.type == 'cuda' else 'float32'}, SGD; "
        f"loss chunks of {args.loss_chunk_tokens} rows.",
        f"Batches: {args.batches} per dataset, {args.per_rank} sequences per DP rank; estimates from profile "
        f"{profile.name}, bucket {args.bucket_tokens or profile.bucket_tokens} tokens.",
        "Step time: slowest rank's forward + backward + gradient all-reduce, mean over the timed steps "
        f"({args.passes} pass(es) over the plan's iterations after {args.warmup_passes} untimed); decoder layers "
        f"compiled: {rows[0]['compiled'] if rows else '-'}; estimate error = (estimated - measured) / measured "
        "(target within 10%).",
        "",
        "| dataset | solver | kernel | tokens | microbatches | estimated ms / iteration | measured ms / step "
        "| estimate error | speedup vs deepspeed | compiles in timed steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {r["dataset"]: r["measured_ms"] for r in rows if r["solver"] == "deepspeed"}
    for r in rows:
        ref = base.get(r["dataset"])
        speedup = f"{ref / r['measured_ms']:.2f}x" if ref and r["measured_ms"] > 0 else "-"
        lines.append(
            f"| {r['dataset']} | {r['solver']} | {r['kernel']} | {r['tokens']} | {r['microbatches']} "
            f"| {r['estimated_ms']:.1f} | {r['measured_ms']:.1f} | {100 * r['error']:+.1f}% | {speedup} "
            f"| {r['compiles_in_timed_steps']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
