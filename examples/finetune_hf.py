"""Fine-tune a Hugging Face model on plans from a live planning service, one process per GPU rank.

    skrull serve --port 8000 &
    python examples/finetune_hf.py --url http://127.0.0.1:8000 \
        --model-config examples/models/qwen2-tiny.json --dataset llama3-sft-mix --dp 2 --cp 2 --steps 4

On GPUs: ``--backend nccl --dtype bfloat16 --profile h100-80g/qwen2.5-0.5b`` (flash-attn varlen when
installed) and a real config, e.g. ``examples/models/qwen2.5-0.5b.json``.

What happens, top to bottom:

1. The dataset: sequence lengths sampled from a bundled length distribution (``--dataset``; scaled by
   ``--length-scale`` so a CPU can run it, capped at ``cp * bucket_tokens``), token ids seeded random.
   Any map-style dataset of token-id lists (or ``{"input_ids", "labels"}`` items) works the same way.
2. ``PlannedBatches`` (worker/dataloader.py) submits the global batches of a seeded loader order to the
   service ahead of use and fetches this rank's view of each iteration in the background; each
   iteration arrives as this rank's packed microbatches (a varying number).
3. The model: ``build_model`` makes a ``transformers`` causal LM from the config with seeded random
   weights and DACP attention (worker/hf/attention.py).
4. Each step: ``scheduled_step`` runs the microbatches (DACP over each microbatch's group), the loss
   is the mean over every target token of the global batch, gradients are summed over the world
   (docs/finetune.md); then the optimizer steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from examples.train_tiny import TINY_PROFILE  # noqa: E402  (buckets of 64 tokens: CP already at a few hundred)
from skrull.api.client import PlanningClient  # noqa: E402
from skrull.solver.lengths.datasets import load_distribution  # noqa: E402
from skrull.worker.collectives import GroupRegistry  # noqa: E402
from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.step import scheduled_step  # noqa: E402
from skrull.worker.kernels import select_kernel  # noqa: E402
from skrull.worker.launch import device_for, launch  # noqa: E402
from skrull.worker.layer_check import DTYPES  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402


def make_dataset(args: argparse.Namespace, *, vocab_size: int, max_tokens: int) -> list[list[int]]:
    """Token-id lists whose lengths follow ``args.dataset`` (scaled, capped); ids seeded random."""
    rng = np.random.default_rng(args.seed)
    lengths = load_distribution(args.dataset, field="--dataset").sample(args.samples, rng)
    lengths = np.clip(np.rint(lengths * args.length_scale), 2, max_tokens).astype(int)
    return [rng.integers(0, vocab_size, size=int(n)).tolist() for n in lengths]


def process_groups(dp: int, cp: int) -> GroupRegistry:
    """Every group a plan may use, created up front in the same order on every process: the CP groups
    of the static layout, plus the aligned power-of-two blocks that dynamic-CP plans (groups wider than
    CP) are built from."""
    world = dp * cp
    sets = {tuple(range(d * cp, (d + 1) * cp)) for d in range(dp)}
    size = 2
    while size <= world:
        sets.update(tuple(range(start, start + size)) for start in range(0, world - size + 1, size))
        size *= 2
    sets.add(tuple(range(world)))
    return GroupRegistry.create(sorted((s for s in sets if len(s) > 1), key=lambda s: (len(s), s)))


def say(line: str) -> None:
    """One line of progress, flushed at once: the run is minutes long and its output is often a pipe."""
    print(f"finetune_hf: {line}", flush=True)


def train(rank: int, world_size: int, backend: str, args: argparse.Namespace) -> None:
    device = device_for(backend, rank)
    dtype = DTYPES[args.dtype]
    config = read_model_config(args.model_config)
    if rank == 0:
        say(f"building the model ({config['model_type']}, {config['num_hidden_layers']} layers) on every rank")
    model = build_model(config, seed=args.seed, device=device, dtype=dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    kernel = select_kernel(device, dtype)
    registry = process_groups(args.dp, args.cp)
    profile: Any = TINY_PROFILE if args.profile == "tiny-cpu" else args.profile
    bucket = args.bucket_tokens or (TINY_PROFILE["memory"]["bucket_tokens"] if args.profile == "tiny-cpu" else None)
    max_tokens = args.cp * bucket if bucket else args.max_tokens
    dataset = make_dataset(args, vocab_size=int(config["vocab_size"]), max_tokens=max_tokens)
    rows = []
    if rank == 0:
        say(f"{len(dataset)} sequences ({args.dataset}); submitting {args.steps} global batch(es) to {args.url}")
    with PlanningClient(args.url) as client:
        loader = PlannedBatches(
            dataset,
            [len(s) for s in dataset],
            LoaderOptions(
                rank=rank,
                dp=args.dp,
                cp=args.cp,
                global_batch_size=args.global_batch_size,
                profile=profile,
                seed=args.seed,
                solver=args.solver,
                time_budget_s=args.time_budget_s,
                prefetch=1,
                num_iterations=args.steps,
                bucket_tokens=args.bucket_tokens,
            ),
            client=client,
            device=device,
        )
        for ready in loader:
            start = time.perf_counter()
            optimizer.zero_grad()
            step = scheduled_step(
                model,
                ready.microbatches,
                registry=registry,
                kernel=kernel,
                device=device,
                loss_chunk_tokens=args.loss_chunk_tokens,
            )
            optimizer.step()
            blocked = torch.tensor([ready.blocked_s], dtype=torch.float64, device=device)
            dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
            row = {
                "iteration": ready.iteration,
                "loss": step.loss,
                "target_tokens": step.num_targets,
                "step_ms": 1000 * (time.perf_counter() - start),
                "blocked_ms": 1000 * float(blocked),
                "microbatches_rank0": len(ready.microbatches),
            }
            rows.append(row)
            if rank == 0:
                say(
                    f"step {ready.iteration}: loss {step.loss:.4f} over {step.num_targets} target tokens, "
                    f"{row['step_ms']:.0f} ms, blocked on the planner {row['blocked_ms']:.1f} ms, "
                    f"{len(ready.microbatches)} microbatch(es) on rank 0"
                )
        loader.close()
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    if rank == 0:
        say(f"done: {len(rows)} step(s)" + (f", rows in {args.out}" if args.out else ""))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the planning service, e.g. http://127.0.0.1:8000")
    p.add_argument("--model-config", default=str(ROOT / "examples" / "models" / "qwen2-tiny.json"))
    p.add_argument("--dataset", default="llama3-sft-mix", help="bundled length distribution")
    p.add_argument("--length-scale", type=float, default=0.02, help="multiply sampled lengths (CPU: shrink)")
    p.add_argument("--max-tokens", type=int, default=32768, help="length cap when the bucket is not known here")
    p.add_argument("--samples", type=int, default=256, help="dataset size")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--cp", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--profile", default="tiny-cpu", help="tiny-cpu (built in) or a bundled profile name")
    p.add_argument("--bucket-tokens", type=int, default=None)
    p.add_argument("--solver", default="auto")
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=0.1,
        help="planner budget per request (default 0.1 s; plans are prefetched)",
    )
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (one GPU per process)")
    p.add_argument("--dtype", default="float32", help="float32, or bfloat16 on GPUs")
    p.add_argument("--loss-chunk-tokens", type=int, default=None, help="chunked LM head + loss (big vocabularies)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write per-step results as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    say(f"starting {args.dp * args.cp} processes ({args.backend}), DP{args.dp} x CP{args.cp}, solver {args.solver}")
    launch(train, world_size=args.dp * args.cp, backend=args.backend, args=(args,))


if __name__ == "__main__":
    main()
