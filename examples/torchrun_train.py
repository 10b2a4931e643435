"""A plain PyTorch training loop under ``torchrun`` (DDP or FSDP2), trained under Skrull plans.

    torchrun --standalone --nproc-per-node 4 examples/torchrun_train.py \\
        --model-config examples/models/qwen2-tiny.json --data train.jsonl --dp 2 --cp 2 \\
        --global-batch-size 16 --bucket-tokens 64 --steps 2 --grad-sync fsdp [--check]

The lines marked ``# skrull`` are what differs from a stock loop: the planned loader instead of a
sampler and collator, the model's attention set to DACP, the process groups of each iteration, and one
``scheduled_step`` per optimizer step (this rank's microbatches, forward and backward each, the gradient
sync on the last one through DDP's ``no_sync`` or FSDP2's ``set_requires_gradient_sync``). Rows of
``--data`` are ``{"input_ids": [...]}`` with optional ``"labels"`` (Hugging Face convention: unshifted,
``-100`` where no loss is taken). ``--check`` compares the first step's loss and every gradient with the
plain single-process Hugging Face step on the same global batch and prints ``check passed`` when the
largest relative error is at most 1e-4. Runs on CPUs with gloo and, unchanged, on GPUs with nccl.

A mixture of experts whose config sets ``output_router_logits: true`` is refused unless
``--router-aux-loss per-microbatch`` asks for the router's auxiliary loss per microbatch of the plan
(docs/worker.md); ``--check`` then compares with a plain step that adds that loss over the same microbatches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from skrull.worker import grad_sync  # noqa: E402  # skrull
from skrull.worker.dataloader import PlannedBatches  # noqa: E402  # skrull
from skrull.worker.groups import IterationGroups  # noqa: E402  # skrull
from skrull.worker.hf.fast import compile_model  # noqa: E402  # skrull
from skrull.worker.hf.model import build_model, read_model_config, with_lora  # noqa: E402  # skrull
from skrull.worker.hf.router_loss import router_microbatches  # noqa: E402
from skrull.worker.hf.step import (  # noqa: E402
    model_gradients,
    model_heads,
    plain_step,
    print_check,
    scheduled_step,  # skrull
    step_errors,
)
from skrull.worker.kernels import select_kernel  # noqa: E402  # skrull
from skrull.worker.loader_options import LoaderOptions  # noqa: E402  # skrull

TOLERANCE = 1e-4


def read_rows(path: str) -> list[dict[str, list[int]]]:
    """Rows in Hugging Face's convention: ``labels`` aligned with ``input_ids`` (the model shifts them),
    ``input_ids`` themselves when a row has none; the loader is told so (``label_convention="hf"``)."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if line.strip():
            doc = json.loads(line)
            ids, labels = doc["input_ids"], doc.get("labels", doc["input_ids"])
            if len(labels) != len(ids) or len(ids) < 2:
                raise SystemExit(f"--data: row {number}: needs >= 2 input_ids and labels of the same length")
            rows.append({"input_ids": ids, "labels": labels})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", required=True, help="a config.json: random weights")
    p.add_argument("--data", required=True, help="JSON lines: {'input_ids': [...], 'labels': [...]?}")
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--cp", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--bucket-tokens", type=int, default=None, help="override the profile's memory bucket")
    p.add_argument("--profile", default="h100-80g/qwen2.5-0.5b")
    p.add_argument(
        "--cp-modes",
        default="allgather",
        help="comma list: how sharded attention may run (allgather, ulysses; with both, per microbatch)",
    )
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grad-sync", choices=grad_sync.GRAD_SYNCS, default="ddp")
    p.add_argument(
        "--compile", choices=("auto", "on", "off", "fullgraph", "stack"), default="auto", help="decoder layers compiled"
    )
    p.add_argument("--check", action="store_true", help="first step against the plain step; 'check passed'")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each layer in backward")
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="train LoRA adapters of this rank (PEFT)")
    p.add_argument(
        "--router-aux-loss",
        choices=("per-microbatch",),
        default=None,
        help="a mixture of experts' router aux loss (output_router_logits): per microbatch of the plan",
    )
    p.add_argument("--calibrate", action="store_true", help="refit the profile from the run's microbatch times")
    p.add_argument("--calibrated-profile-out", default=None, help="with --calibrate: write the calibrated profile")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")  # env://, from torchrun
    mesh = init_device_mesh(device.type, (args.dp, args.cp), mesh_dim_names=("dp", "cp"))  # skrull
    router_aux_loss = args.router_aux_loss.replace("-", "_") if args.router_aux_loss else None  # skrull
    rows = read_rows(args.data)
    planned = PlannedBatches(  # skrull
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            global_batch_size=args.global_batch_size,
            profile=args.profile,
            bucket_tokens=args.bucket_tokens,
            seed=args.seed,
            num_iterations=args.steps,
            equal_microbatches=args.grad_sync != "allreduce",
            label_convention="hf",
            calibrate=args.calibrate,
            cp_modes=args.cp_modes.split(","),
        ),
        mesh=mesh,
        device=device,
    )
    if len(planned) < args.steps:
        raise SystemExit(
            f"--steps {args.steps}: --data holds {len(rows)} rows, {len(planned)} global batches of "
            f"{args.global_batch_size}; give more rows or fewer steps"
        )
    config = read_model_config(args.model_config, router_aux_loss=router_aux_loss)
    model = build_model(config, seed=args.seed, device=device, router_aux_loss=router_aux_loss)  # skrull: DACP
    planned.check_model_heads(model_heads(model))  # skrull: with Ulysses allowed, the profile's heads are the model's
    if args.lora:  # PEFT LoRA: the base weights frozen, the adapters trained (peft.get_peft_model), before wrap
        model = with_lora(model, rank=args.lora, seed=args.seed)
    if args.activation_checkpointing:  # any CP: every rank recomputes each layer at the same point
        model.activation_checkpointing_enable()
    compile_model(model, compile=args.compile, device=device)  # skrull: the fast step (layers compiled; CUDA default)
    model = grad_sync.wrap(model, args.grad_sync)  # skrull: DDP / FSDP2 that sum over the world
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model.train()  # dropout on where the model has it (from_pretrained returns a model in eval mode)
    groups = IterationGroups(planned)  # skrull
    kernel = select_kernel(device, torch.float32)  # skrull
    first_grads: dict[str, torch.Tensor] = {}
    losses = []
    for ready in planned:  # skrull: one plan iteration per optimizer step
        optimizer.zero_grad()
        timings: list[float] | None = [] if args.calibrate else None
        result = scheduled_step(  # skrull: this rank's microbatches, forward and backward, synced on the last
            model,
            ready.microbatches,
            registry=groups(ready),
            kernel=kernel,
            device=device,
            microbatch_ms=timings,
            router_aux_loss=router_aux_loss,
        )
        if timings is not None:  # skrull: gathered over the job; the planner refits and plans with it
            planned.record_timings(ready, timings)
        if args.check and not first_grads:
            first_grads = grad_sync.full_gradients(model)  # a collective under FSDP: every rank
        optimizer.step()
        losses.append(result.loss)
    rank = dist.get_rank()
    if rank == 0:
        print("losses: " + " ".join(f"{x:.6f}" for x in losses))
        if result.router_aux_loss is not None:  # what the loss holds besides the cross-entropy
            print(f"router aux loss: {result.router_aux_loss} (last step's part: {result.router_loss:.6f})")
        modes = ["+".join(planned.sharding_modes(step)) or "-" for step in range(len(losses))]
        print("cp modes: " + " ".join(modes))  # how each step's sharded microbatches ran
    if planned.calibration is not None and rank == 0:
        fitted = planned.calibration.fitted_profile()
        if args.calibrated_profile_out and fitted is not None:
            Path(args.calibrated_profile_out).write_text(json.dumps(fitted, indent=2) + "\n")
        floor = planned.calibration.noise_floor()  # what the fit still misses of this run, in sample
        if floor is not None:
            print(floor.line())
        print(planned.calibration.summary_line())
    units = router_microbatches(planned.plan_of(0).iterations[0]) if router_aux_loss else None
    planned.close()
    code = check(args, planned, rows, losses[0], first_grads, router_units=units) if args.check and rank == 0 else 0
    dist.destroy_process_group()
    return code


def check(
    args: argparse.Namespace,
    planned: PlannedBatches,
    rows: list[dict[str, list[int]]],
    loss: float,
    grads: dict[str, torch.Tensor],
    *,
    router_units: list[tuple[int, ...]] | None = None,
) -> int:
    """The first step against Hugging Face's plain step over the same global batch, in one process; with
    ``router_units`` (the plan's microbatches, positions in the global batch) the router loss per microbatch."""
    router = "per_microbatch" if router_units is not None else None
    config = read_model_config(args.model_config, router_aux_loss=router)
    reference = build_model(config, seed=args.seed, attn_implementation="eager", router_aux_loss=router)
    if args.lora:
        reference = with_lora(reference, rank=args.lora, seed=args.seed)
    batch = planned.batches[0]
    want = plain_step(
        reference,
        [torch.tensor(rows[i]["input_ids"]) for i in batch],
        labels=[torch.tensor(rows[i]["labels"]) for i in batch],
        router_microbatches=router_units,
    )
    errors = step_errors(loss=loss, reference_loss=want, grads=grads, reference_grads=model_gradients(reference))
    return print_check(errors, tolerance=TOLERANCE, what=f"check ({args.grad_sync}): first step against the plain step")


if __name__ == "__main__":
    raise SystemExit(main())
