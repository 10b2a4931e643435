"""The Hugging Face Trainer under plans (``SkrullTrainer``) against the plain Trainer with
``DataCollatorWithFlattening``, on the same rows: tokens/s of both.

Rows: seeded random token ids with lengths drawn from a bundled distribution (``--dataset``, capped at
``--max-tokens``). Both trainers train a model built from ``--model-config`` (random weights, the same
seed), SGD, ``--global-batch-size`` rows per optimizer step, for ``--warmup`` untimed then ``--steps``
timed steps (wall time from the step's start to its end, the device synchronised):

- plans: ``SkrullTrainer`` with ``PlannedBatches`` (planner ``--solver``, ``equal_microbatches``), DACP
  attention, the fast step (decoder layers compiled: ``--compile``);
- plain: ``Trainer`` with ``DataCollatorWithFlattening`` (the rows of a step packed into one row,
  ``position_ids`` restarting per sequence) and the model's own ``--plain-attention`` (sdpa by default:
  flash-attn 2 is rarely installed), no compile (``--plain-compile`` sets ``torch_compile``).

Run it under torchrun (one process per GPU; ``--nproc-per-node 1`` on one GPU); ``--device cpu`` runs a
tiny smoke version with gloo. Writes a Markdown table to ``--out``.

    torchrun --standalone --nproc-per-node 1 bench/hf_trainer_step.py --out docs/gpu-check/hf-trainer.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default=str(ROOT / "examples" / "models" / "qwen2.5-0.5b.json"))
    p.add_argument("--dataset", default="llama3-sft-mix")
    p.add_argument("--max-tokens", type=int, default=16384, help="cap on a row's length")
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--solver", default="skrull")
    p.add_argument("--profile", default="h100-80g/qwen2.5-0.5b")
    p.add_argument("--bucket-tokens", type=int, default=None)
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--plain-attention", default="sdpa")
    p.add_argument("--plain-compile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def make_rows(args: argparse.Namespace, vocab: int, count: int) -> list[dict[str, list[int]]]:
    import numpy as np

    from skrull.solver.lengths.datasets import load_distribution

    dist = load_distribution(args.dataset)
    rng = random.Random(args.seed)
    drawn = dist.sample(count, rng=np.random.default_rng(args.seed))
    lengths = [max(2, min(args.max_tokens, int(n))) for n in drawn]
    return [{"input_ids": [rng.randrange(vocab) for _ in range(n)]} for n in lengths]


class _Clock:
    """Step wall times (device synchronised) through a TrainerCallback."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: list[float] = []
        self._t0 = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class StepClock(TrainerCallback):
            def on_step_begin(self, *a: Any, **kw: Any) -> None:
                clock._sync()
                clock._t0 = time.perf_counter()

            def on_step_end(self, *a: Any, **kw: Any) -> None:
                clock._sync()
                clock.times.append(time.perf_counter() - clock._t0)

        return StepClock()


def training_args(args: argparse.Namespace, out: str, steps: int, device: torch.device, **extra: Any) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=args.global_batch_size,
        gradient_accumulation_steps=1,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        use_cpu=device.type != "cuda",
        ddp_backend="nccl" if device.type == "cuda" else "gloo",
        remove_unused_columns=False,
        disable_tqdm=True,
        **extra,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import DataCollatorWithFlattening, Trainer

    from skrull.worker.dataloader import PlannedBatches
    from skrull.worker.hf.model import build_model, read_model_config
    from skrull.worker.hf.trainer import SkrullTrainer
    from skrull.worker.kernels import kernel_choice
    from skrull.worker.loader_options import LoaderOptions

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/hf_trainer_step.py: --device cuda but no CUDA GPU is visible; nothing measured", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = read_model_config(args.model_config)
    steps = args.warmup + args.steps
    rows = make_rows(args, int(config["vocab_size"]), steps * args.global_batch_size)
    lengths = [len(r["input_ids"]) for r in rows]
    results: dict[str, dict[str, float]] = {}

    # --- under plans ---------------------------------------------------------------------------------
    targs = training_args(args, "/tmp/skrull-bench-hf-plans", steps, device, average_tokens_across_devices=True)
    device = targs.device if device.type == "cuda" else device  # initializes torch.distributed under torchrun
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("dp", "cp"))
    planned = PlannedBatches(
        rows,
        lengths,
        LoaderOptions(
            global_batch_size=args.global_batch_size * world,
            profile=args.profile,
            bucket_tokens=args.bucket_tokens,
            seed=args.seed,
            equal_microbatches=True,
            num_iterations=steps,
            label_convention="hf",
            solver=args.solver,
            shuffle=False,
        ),
        mesh=mesh,
        device=device,
    )
    model = build_model(config, seed=args.seed, device=device, dtype=dtype)
    clock = _Clock(device)
    trainer = SkrullTrainer(
        model=model, args=targs, planned=planned, compile=args.compile, callbacks=[clock.callback()]
    )
    trainer.train()
    timed = clock.times[args.warmup :]
    tokens = sum(lengths[args.warmup * args.global_batch_size * world :]) / world
    results["plans"] = {"tokens_per_s": tokens / sum(timed), "step_s": sum(timed) / len(timed)}
    line = f"{kernel_choice(device, dtype).describe()}; decoder layers {'compiled' if trainer.compiled else 'eager'}"
    del trainer, model

    # --- plain Trainer with DataCollatorWithFlattening -----------------------------------------------
    plain = build_model(config, seed=args.seed, device=device, dtype=dtype, attn_implementation=args.plain_attention)
    clock = _Clock(device)
    extra = {"torch_compile": True} if args.plain_compile else {}
    pargs = training_args(args, "/tmp/skrull-bench-hf-plain", steps, device, **extra)
    mine = rows[torch.distributed.get_rank() :: world] if world > 1 else rows
    counted: list[int] = []
    collator = DataCollatorWithFlattening()

    def collate(features: list[dict[str, Any]]) -> dict[str, Any]:
        counted.append(sum(len(f["input_ids"]) for f in features))
        return collator(features)

    plain_trainer = Trainer(
        model=plain, args=pargs, train_dataset=mine, data_collator=collate, callbacks=[clock.callback()]
    )
    plain_trainer.train()
    timed = clock.times[args.warmup :]
    plain_tokens = sum(counted[args.warmup : steps])
    results["plain"] = {"tokens_per_s": plain_tokens / sum(timed), "step_s": sum(timed) / len(timed)}
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0:
        text = report(results, args=args, line=line, device=device, world=world, tokens=sum(lengths))
        print(text)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(json.dumps(results))
    return 0


def report(
    results: dict[str, dict[str, float]], *, args: argparse.Namespace, line: str, device: torch.device, world: int,
    tokens: int,
) -> str:  # fmt: skip
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke run)"
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    base = results["plain"]["tokens_per_s"]
    lines = [
        "# Hugging Face Trainer under plans vs the plain Trainer (bench/hf_trainer_step.py)",
        "",
        f"{date}; {world} x {where}; torch {torch.__version__}; {Path(args.model_config).name}, random weights; "
        f"{args.dataset} lengths (cap {args.max_tokens}), {args.global_batch_size} rows per step per GPU, "
        f"{tokens} tokens over {args.warmup} untimed + {args.steps} timed steps; SGD.",
        f"Plans: SkrullTrainer, planner {args.solver}, {line}. Plain: Trainer + DataCollatorWithFlattening, "
        f"attn_implementation={args.plain_attention}, torch_compile={args.plain_compile}.",
        "",
        "| trainer | tokens/s | s / step | vs plain |",
        "|---|---|---|---|",
    ]
    for name in ("plans", "plain"):
        r = results[name]
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['step_s']:.3f} | {r['tokens_per_s'] / base:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
