"""A standard Hugging Face Trainer script, trained under Skrull plans.

    torchrun --standalone --nproc-per-node 4 examples/hf_trainer.py \\
        --model-config examples/models/qwen2-tiny.json --data train.jsonl --dp 2 --cp 2 \\
        --global-batch-size 16 --bucket-tokens 64 --max-steps 4 [--check]

It differs from a stock script in the lines marked ``# skrull``: the planned loader replaces the
collator, and ``SkrullTrainer`` replaces ``Trainer`` (worker/hf/trainer.py). Rows of ``--data`` are
``{"input_ids": [...]}`` with optional ``"labels"`` (the Hugging Face convention: the same length as
``input_ids``, ``-100`` where no loss is taken; the model shifts them). ``--check`` compares the first
optimizer step's loss and every gradient with the plain single-process step on the same global batch
(Hugging Face's own forward and loss over the padded batch, float32) and prints ``check passed`` when
the largest relative error is at most 1e-4. ``--resume-check`` (run with ``python``: it starts its own
torchrun runs) trains ``--max-steps`` straight, then half of them with a Trainer checkpoint and the rest
resumed from it in new processes, and prints ``check passed`` when the losses and the final weights are
the straight run's. Runs on CPUs with gloo and, unchanged, on GPUs with nccl.

A mixture of experts whose config sets ``output_router_logits: true`` is refused unless
``--router-aux-loss per-microbatch`` asks for the router's auxiliary loss per microbatch of the plan
(``SkrullTrainer(router_aux_loss="per_microbatch")``); ``--check`` then adds Hugging Face's own ``aux_loss``
of each of the plan's microbatches to the plain step (worker/hf/router_loss.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from transformers import TrainerCallback, TrainingArguments

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from skrull.worker.dataloader import PlannedBatches  # noqa: E402  # skrull
from skrull.worker.hf.model import build_model, read_model_config, with_lora  # noqa: E402
from skrull.worker.hf.router_loss import router_microbatches  # noqa: E402
from skrull.worker.hf.step import model_gradients, plain_step, print_check, step_errors  # noqa: E402
from skrull.worker.hf.trainer import SkrullTrainer  # noqa: E402  # skrull
from skrull.worker.loader_options import LoaderOptions  # noqa: E402  # skrull

TOLERANCE = 1e-4
#: Largest difference of a resumed run's losses and final weights from the straight run's.
RESUME_TOLERANCE = 1e-6


def say(line: str) -> None:
    """One line of progress on rank 0, flushed at once: a run is minutes long and its output often a pipe."""
    print(f"hf_trainer: {line}", flush=True)


class StepLines(TrainerCallback):
    """Rank 0 says each optimizer step as it ends, with the world's loss (``SkrullTrainer.step_losses``)."""

    def __init__(self, losses: list[float]) -> None:
        self.losses = losses

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.losses:
            say(f"step {state.global_step}/{state.max_steps}: loss {self.losses[-1]:.6f}")


def read_rows(path: str) -> list[dict[str, list[int]]]:
    """Rows in Hugging Face's convention: ``labels`` aligned with ``input_ids`` (the model shifts them),
    ``input_ids`` themselves when a row has none; the loader is told so (``label_convention="hf"``)."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        doc = json.loads(line)
        ids = [int(t) for t in doc["input_ids"]]
        labels = [int(t) for t in doc.get("labels", ids)]
        if len(labels) != len(ids) or len(ids) < 2:
            raise SystemExit(f"--data: row {number}: needs >= 2 input_ids and labels of the same length")
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-config", help="a config.json: random weights")
    model.add_argument("--model", help="a model name or path (from_pretrained)")
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
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="hf-trainer-out")
    p.add_argument(
        "--compile", choices=("auto", "on", "off", "fullgraph", "stack"), default="auto",
        help="decoder layers under torch.compile (skrull's fast step); auto: on CUDA only",
    )  # fmt: skip
    p.add_argument("--check", action="store_true", help="first step against the plain step; 'check passed'")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each layer in backward")
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="train LoRA adapters of this rank (PEFT)")
    p.add_argument(
        "--router-aux-loss",
        choices=("per-microbatch",),
        default=None,
        help="a mixture of experts' router aux loss (output_router_logits): per microbatch of the plan",
    )
    p.add_argument("--save-steps", type=int, default=0, help="save a Trainer checkpoint every N steps")
    p.add_argument("--resume-from", default=None, help="a checkpoint directory to resume from")
    p.add_argument("--final-weights", default=None, help="write the final weights here (torch.save, rank 0)")
    p.add_argument(
        "--resume-check",
        action="store_true",
        help="run with python (not torchrun): --max-steps straight, then half of them with a checkpoint and the "
        "rest resumed in new processes, each under torchrun; losses and final weights must be equal",
    )
    return p.parse_args(argv)


def resume_check(args: argparse.Namespace, argv: list[str]) -> int:
    """Three torchrun runs of this script: straight, first half with a checkpoint, the rest resumed."""
    import os
    import subprocess
    import tempfile

    if "RANK" in os.environ:
        raise SystemExit("--resume-check starts its own torchrun runs: run it with python, not torchrun")
    if args.max_steps < 2:
        raise SystemExit("--resume-check needs --max-steps >= 2")
    half = args.max_steps // 2
    base = [a for a in argv if a not in ("--resume-check", "--check")]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.dp * args.cp}"]

    def run(what: str, *extra: str) -> list[float]:
        """One torchrun run; its progress lines are passed on as they come, the rest of its output kept."""
        say(f"{what} (torchrun, {args.dp * args.cp} processes)")
        with tempfile.TemporaryFile(mode="w+") as errors:  # a file: a full stderr pipe would stall the run
            proc = subprocess.Popen(
                [*launch, __file__, *base, *extra], stdout=subprocess.PIPE, stderr=errors, text=True
            )
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith("hf_trainer: "):
                    say(f"  {line.removeprefix('hf_trainer: ').rstrip()}")
            if proc.wait() != 0:
                errors.seek(0)
                sys.stderr.write(errors.read()[-4000:])
                raise SystemExit(f"a torchrun run failed ({proc.returncode})")
        (loss_line,) = [x for x in lines if x.startswith("losses: ")]
        return [float(x) for x in loss_line.split()[1:]]

    with tempfile.TemporaryDirectory(prefix="skrull-resume-") as tmp:
        straight = run(
            f"run 1/3: {args.max_steps} steps straight", "--output-dir", f"{tmp}/a", "--final-weights", f"{tmp}/a.pt"
        )
        first = run(
            f"run 2/3: the first {half} steps, a checkpoint after step {half}",
            "--output-dir", f"{tmp}/b", "--max-steps", str(half), "--save-steps", str(half),
        )  # fmt: skip
        rest = run(
            f"run 3/3: steps {half + 1}-{args.max_steps} resumed from checkpoint-{half} in new processes",
            "--output-dir", f"{tmp}/b", "--resume-from", f"{tmp}/b/checkpoint-{half}", "--final-weights", f"{tmp}/b.pt",
        )  # fmt: skip
        say("checking: losses and final weights of the resumed run against the straight one")
        weights_a, weights_b = torch.load(f"{tmp}/a.pt"), torch.load(f"{tmp}/b.pt")
    resumed = first + rest
    loss_error = (
        max(abs(a - b) for a, b in zip(straight, resumed, strict=True)) if len(resumed) == len(straight) else 1.0
    )
    weight_error = max(float((weights_a[k] - weights_b[k]).abs().max()) for k in weights_a)
    print(f"losses straight: {' '.join(f'{x:.6f}' for x in straight)}")
    print(f"losses resumed:  {' '.join(f'{x:.6f}' for x in resumed)} (checkpoint after step {half}, new processes)")
    print(f"largest loss difference {loss_error:.3e}, largest final weight difference {weight_error:.3e}")
    # bitwise equal on CPUs; GPU kernels may reorder sums, hence the tolerance
    if len(resumed) != len(straight) or loss_error > RESUME_TOLERANCE or weight_error > RESUME_TOLERANCE:
        print("check failed")
        return 1
    print("check passed")
    return 0


def router_option(args: argparse.Namespace) -> str | None:
    """``--router-aux-loss`` as the library's ``router_aux_loss`` value (``per-microbatch``: ``per_microbatch``)."""
    return args.router_aux_loss.replace("-", "_") if args.router_aux_loss else None


def plain_model(args: argparse.Namespace) -> Any:
    """The reference of ``--check``: the same weights with the model's own eager attention."""
    router = router_option(args)
    if args.model_config:
        config = read_model_config(args.model_config, router_aux_loss=router)
        plain = build_model(config, seed=args.seed, attn_implementation="eager", router_aux_loss=router)
    else:
        from transformers import AutoModelForCausalLM

        plain = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager", dtype=torch.float32)
    return with_lora(plain, rank=args.lora, seed=args.seed) if args.lora else plain


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.resume_check:
        return resume_check(args, argv)
    cuda = torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,  # one plan iteration per optimizer step
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=[],
        seed=args.seed,
        use_cpu=not cuda,
        ddp_backend="nccl" if cuda else "gloo",
        average_tokens_across_devices=True,
        remove_unused_columns=False,
        activation_checkpointing=args.activation_checkpointing,
    )
    device = training.device  # skrull: initializes torch.distributed under torchrun, before the mesh
    mesh = init_device_mesh(device.type, (args.dp, args.cp), mesh_dim_names=("dp", "cp"))  # skrull
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    rows = read_rows(args.data)
    if rank == 0:
        say(
            f"{len(rows)} rows from {args.data}; global batches of {args.global_batch_size} planned for "
            f"DP{args.dp} x CP{args.cp}"
        )
    planned = PlannedBatches(  # skrull
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            global_batch_size=args.global_batch_size,
            profile=args.profile,
            bucket_tokens=args.bucket_tokens,
            seed=args.seed,
            equal_microbatches=True,
            num_iterations=args.max_steps,
            label_convention="hf",
            cp_modes=args.cp_modes.split(","),
        ),
        mesh=mesh,
        device=device,
    )
    if len(planned) < args.max_steps:
        raise SystemExit(
            f"--max-steps {args.max_steps}: --data holds {len(rows)} rows, {len(planned)} global batches of "
            f"{args.global_batch_size}; give more rows or fewer steps"
        )
    if rank == 0:
        say(f"building the model from {args.model_config or args.model}")
    router_aux_loss = router_option(args)  # skrull: None refuses output_router_logits=True
    if args.model_config:
        config = read_model_config(args.model_config, router_aux_loss=router_aux_loss)
        model = build_model(config, seed=args.seed, device=device, router_aux_loss=router_aux_loss)  # skrull: DACP
    else:
        from transformers import AutoModelForCausalLM

        from skrull.worker.hf.attention import register

        loaded: Any = AutoModelForCausalLM.from_pretrained(  # skrull: DACP attention
            args.model, attn_implementation=register(), dtype=torch.float32
        )
        model = loaded.to(device)
    if args.lora:  # PEFT LoRA: the base weights frozen, the adapters trained (peft.get_peft_model)
        model = with_lora(model, rank=args.lora, seed=args.seed)
    grads: dict[str, torch.Tensor] = {}

    class FirstStepGradients(TrainerCallback):
        def on_pre_optimizer_step(self, *a: Any, **kw: Any) -> None:
            if not grads:
                grads.update(
                    {
                        n: p.grad.detach().float().cpu().clone()
                        for n, p in model.named_parameters()
                        if p.grad is not None
                    }
                )

    trainer = SkrullTrainer(  # skrull
        model=model, args=training, planned=planned, compile=args.compile, router_aux_loss=router_aux_loss,
        callbacks=[FirstStepGradients()] if args.check else None,
    )  # fmt: skip
    trainer.add_callback(StepLines(trainer.step_losses))
    if rank == 0:
        start = f"resuming from {args.resume_from}" if args.resume_from else "training"
        say(f"{start}: {args.max_steps} step(s) in all")
    trainer.train(resume_from_checkpoint=args.resume_from)
    if rank == 0:
        print("losses: " + " ".join(f"{x:.6f}" for x in trainer.step_losses))
        if trainer.step_router_losses:  # what the loss holds besides the cross-entropy
            print(f"router aux loss: {router_aux_loss} (last step's part: {trainer.step_router_losses[-1]:.6f})")
        modes = ["+".join(planned.sharding_modes(step)) or "-" for step in range(len(trainer.step_losses))]
        print("cp modes: " + " ".join(modes))  # how each step's sharded microbatches ran
        if args.final_weights:
            torch.save({n: p.detach().cpu() for n, p in model.state_dict().items()}, args.final_weights)
    if not args.check:
        return 0
    if rank != 0:
        return 0
    say("checking the first step against the plain step in one process")
    reference = plain_model(args)
    batch = planned.batches[0]
    loss = plain_step(
        reference,
        [torch.tensor(rows[i]["input_ids"]) for i in batch],
        labels=[torch.tensor(rows[i]["labels"]) for i in batch],
        router_microbatches=router_microbatches(planned.plan_of(0).iterations[0]) if router_aux_loss else None,
    )
    errors = step_errors(
        loss=trainer.step_losses[0], reference_loss=loss, grads=grads, reference_grads=model_gradients(reference)
    )
    return print_check(errors, tolerance=TOLERANCE, what="check: first step against the plain step")


def run() -> int:
    """``main`` on every rank, then the process group destroyed before the interpreter exits: the Trainer
    never destroys it, and a rank leaving with it alive (ranks other than 0 finish before rank 0's check)
    was seen to abort at exit ("terminate called without an active exception") after training well."""
    try:
        return main()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(run())
