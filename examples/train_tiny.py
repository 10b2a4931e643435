"""Train a tiny causal LM on CPU (gloo, one process per GPU rank) on plans from a live planning service.

    skrull serve --port 8000 &
    python examples/train_tiny.py --url http://127.0.0.1:8000 --dp 2 --cp 2 --iterations 8

Each process iterates ``skrull.worker.dataloader.PlannedBatches``: the global batches of a seeded loader order
are submitted to the service ahead of time, this rank's views are prefetched, and each iteration
arrives as packed microbatches (a varying number). Attention is DACP (worker/dacp.py) over the CP
group; the loss is normalized per token over the whole iteration (worker/loss.py) and gradients are
summed over the world. Prints one line per iteration with the loss, the iteration's wall time and the
time the loop was blocked on the planner (max over ranks); ``--out FILE`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from skrull.api.client import PlanningClient  # noqa: E402
from skrull.worker.collectives import GroupRegistry  # noqa: E402
from skrull.worker.dacp import DACPPlan, dacp_attention  # noqa: E402
from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.kernels import select_kernel  # noqa: E402
from skrull.worker.launch import launch  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402
from skrull.worker.loss import per_token_loss  # noqa: E402
from skrull.worker.model import TinyCausalLM  # noqa: E402
from skrull.worker.train import reduce_gradients  # noqa: E402

VOCAB = 97
#: A CPU-sized profile (the coefficients of examples/requests/tiny-cpu-dp2-cp2.json).
TINY_PROFILE: dict[str, Any] = {
    "name": "tiny-cpu",
    "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
    "memory": {"bucket_tokens": 64},
    "microbatch_ms": 3.0,
}


def make_dataset(num_samples: int, *, max_tokens: int, seed: int) -> list[list[int]]:
    """Token sequences with long-tailed lengths (1..max_tokens): a map-style dataset (a list)."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_samples):
        n = min(max_tokens, max(2, int(rng.lognormvariate(2.8, 0.9))))
        out.append([rng.randrange(VOCAB) for _ in range(n)])
    return out


def train(rank: int, world_size: int, backend: str, args: argparse.Namespace, out: str | None) -> None:
    torch.manual_seed(args.seed)
    model = TinyCausalLM(vocab_size=VOCAB)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    device = torch.device("cpu")
    kernel = select_kernel(device, torch.float32)
    registry = GroupRegistry.create([tuple(range(d * args.cp, (d + 1) * args.cp)) for d in range(args.dp)])
    dataset = make_dataset(args.samples, max_tokens=args.cp * TINY_PROFILE["memory"]["bucket_tokens"], seed=args.seed)
    rows: list[dict[str, float]] = []
    with PlanningClient(args.url) as client:
        loader = PlannedBatches(
            dataset,
            [len(s) for s in dataset],
            LoaderOptions(
                rank=rank,
                dp=args.dp,
                cp=args.cp,
                global_batch_size=args.global_batch_size,
                profile=TINY_PROFILE,
                seed=args.seed,
                solver=args.solver,
                time_budget_s=args.time_budget_s,
                prefetch=args.prefetch,
                batches_per_plan=args.batches_per_plan,
                num_iterations=args.iterations,
            ),
            client=client,
        )
        start = time.perf_counter()
        for ready in loader:
            if args.step_delay_s:  # stand-in for the rest of a real model's step (a bigger model, an optimizer)
                time.sleep(args.step_delay_s)
            optimizer.zero_grad()
            loss_sum = torch.zeros((), dtype=torch.float64)
            for mb in ready.microbatches:
                group = registry.get(mb.layout.ranks) if mb.layout.communicates else None
                plan = DACPPlan.build(mb.layout, group=group, kernel=kernel, device=device)
                logits = model(mb.input_ids, mb.position_ids, lambda q, k, v, p=plan: dacp_attention(q, k, v, p))
                loss = per_token_loss(logits, mb.labels, num_tokens_in_iteration=mb.loss_normalizer)
                loss.backward()  # type: ignore[no-untyped-call]
                loss_sum += loss.detach().double()
            reduce_gradients(model)
            optimizer.step()
            stats = torch.tensor([float(loss_sum), ready.blocked_s, len(ready.microbatches)], dtype=torch.float64)
            dist.all_reduce(stats[:1])
            blocked = stats[1:2].clone()
            dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
            now = time.perf_counter()
            rows.append(
                {
                    "iteration": ready.iteration,
                    "loss": float(stats[0]),
                    "step_ms": 1000 * (now - start),
                    "blocked_ms": 1000 * float(blocked),
                    "microbatches_rank0": float(stats[2]),
                }
            )
            start = now
            if rank == 0:
                r = rows[-1]
                print(
                    f"iteration {ready.iteration}: loss {r['loss']:.4f}  step {r['step_ms']:.1f} ms  "
                    f"blocked on the planner {r['blocked_ms']:.2f} ms  "
                    f"({len(ready.microbatches)} microbatches on rank 0)",
                    flush=True,
                )
        loader.close()
    if rank == 0 and out:
        Path(out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the planning service, e.g. http://127.0.0.1:8000")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--cp", type=int, default=2)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--samples", type=int, default=512, help="dataset size")
    p.add_argument("--prefetch", type=int, default=1, help="iterations fetched ahead (0: none)")
    p.add_argument("--batches-per-plan", type=int, default=1, help="global batches per planning request")
    p.add_argument("--solver", default="auto")
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=0.1,
        help="planner budget per request (default 0.1 s; plans are prefetched)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--step-delay-s", type=float, default=0.0, help="extra time per step (a stand-in for a bigger model)"
    )
    p.add_argument("--out", help="write per-iteration results as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # processes import torch and the service plans the first batches before the first line: say so now
    print(
        f"train_tiny: starting {args.dp * args.cp} processes (gloo) against {args.url}; one line per iteration "
        "follows once the first planned batch arrives",
        file=sys.stderr,
        flush=True,
    )
    launch(train, world_size=args.dp * args.cp, backend="gloo", args=(args, args.out))


if __name__ == "__main__":
    main()
