"""A standard TRL SFT script on a chat dataset, trained under Skrull plans.

    python examples/trl_sft.py --write-demo-data --data chats.jsonl
    torchrun --standalone --nproc-per-node 4 examples/trl_sft.py \\
        --model-config examples/models/qwen2-tiny.json --data chats.jsonl --dp 2 --cp 2 \\
        --global-batch-size 8 --bucket-tokens 64 --max-steps 2 [--check]

It differs from a stock script in the lines marked ``# skrull``: ``SkrullSFTTrainer`` replaces
``SFTTrainer`` (worker/hf/trl.py) and is told how to build the planned loader, which replaces TRL's
collator, ``packing`` and ``padding_free``. Rows of ``--data`` are chats, ``{"messages": [{"role": ...,
"content": ...}, ...]}``; TRL renders them with the tokenizer's chat template (``apply_chat_template``)
and trains on the assistant turns only (``assistant_only_loss``). The tokenizer is ``--tokenizer`` (a
directory), the one of ``--model``, or else a tiny word-level tokenizer built here from the data's words,
with a ChatML-like template whose ``{% generation %}`` markers tell the assistant tokens apart: nothing is
downloaded. ``--check`` compares the first optimizer step's loss and every gradient with the plain
single-process ``SFTTrainer`` step on the same global batch (a stock ``SFTTrainer`` in a new process:
padded batch, eager attention, float32) and prints ``check passed`` when the largest relative error is at
most 1e-4. Runs on CPUs with gloo and, unchanged, on GPUs with nccl.

A mixture of experts: its router loss is off (``router_aux_loss_coef=0.0``) unless ``--router-aux-loss
per-microbatch`` asks for it per microbatch of the plan (``SkrullSFTTrainer(router_aux_loss=
"per_microbatch")``, TRL's coefficient, the config's); ``--check`` then compares with the own loop's
reference, Hugging Face's plain step over the prepared rows plus its own ``aux_loss`` of each of the plan's
microbatches (worker/hf/router_loss.py), since TRL's plain step weights its term differently.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from datasets import load_dataset
from torch.distributed.device_mesh import init_device_mesh
from transformers import PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig, SFTTrainer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from skrull.worker.dataloader import PlannedBatches  # noqa: E402  # skrull
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.router_loss import router_microbatches  # noqa: E402
from skrull.worker.hf.step import model_gradients, plain_step, print_check, step_errors  # noqa: E402
from skrull.worker.hf.trl import SkrullSFTTrainer  # noqa: E402  # skrull

TOLERANCE = 1e-4

#: Special tokens of the tiny tokenizer: padding, unknown words, and the turn markers of its template.
SPECIAL_TOKENS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
#: A ChatML-like template: each turn ``<|im_start|>role content <|im_end|>``; the assistant's content and its
#: ``<|im_end|>`` (the token that ends its turn) inside ``{% generation %}``, the tokens trained.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "<|im_start|>assistant {% generation %}{{ m['content'] }} <|im_end|>{% endgeneration %}\n"
    "{% else %}<|im_start|>{{ m['role'] }} {{ m['content'] }} <|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
#: Words of the demo conversations.
DEMO_WORDS = [
    "the", "a", "planner", "balances", "long", "and", "short", "sequences", "over", "ranks", "while", "each",
    "gpu", "trains", "its", "microbatch", "context", "parallel", "groups", "share", "one", "sequence", "when",
    "it", "is", "too", "long", "for", "a", "bucket", "what", "why", "how", "does", "plan", "shard", "pack",
    "loss", "gradient", "step", "token", "chat", "model", "data", "every", "rank", "gets", "same",
]  # fmt: skip


def build_tokenizer(chats: list[list[dict[str, str]]]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the words of ``chats`` (and the roles), with ``CHAT_TEMPLATE``.

    Words are split on whitespace, in sorted order, so every process (and the reference run) builds the
    same vocabulary from the same data.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"system", "user", "assistant"}
    for chat in chats:
        for message in chat:
            words.update(message["content"].split())
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *sorted(words)])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def demo_chats(n: int, *, seed: int, max_tokens: int = 120) -> list[dict[str, list[dict[str, str]]]]:
    """``n`` conversations of 1 or 2 user/assistant exchanges, some with a system turn, of 7 to ``max_tokens``
    tokens with ``build_tokenizer`` (a turn is its words and 3 tokens: the markers and the role)."""
    rng = random.Random(seed)

    def text(low: int, high: int) -> str:
        return " ".join(rng.choice(DEMO_WORDS) for _ in range(rng.randint(low, high)))

    rows: list[dict[str, list[dict[str, str]]]] = []
    while len(rows) < n:
        messages = [{"role": "system", "content": text(2, 6)}] if rng.random() < 0.3 else []
        longest = rng.choice([4, 10, 30])
        for _ in range(rng.randint(1, 2)):
            messages.append({"role": "user", "content": text(1, longest)})
            messages.append({"role": "assistant", "content": text(1, longest)})
        if sum(len(m["content"].split()) + 3 for m in messages) <= max_tokens:
            rows.append({"messages": messages})
    return rows


def read_chats(path: str) -> list[list[dict[str, str]]]:
    """The ``messages`` of every row of a JSON-lines file (checked: role and content strings)."""
    chats = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        messages = json.loads(line).get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise SystemExit(f"--data: row {number}: needs 'messages': [{{'role': str, 'content': str}}, ...]")
        chats.append(messages)
    return chats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model-config", help="a config.json: random weights")
    model.add_argument("--model", help="a model name or path (from_pretrained), with its tokenizer")
    p.add_argument("--tokenizer", default=None, help="a tokenizer directory with a chat template")
    p.add_argument("--data", required=True, help="JSON lines: {'messages': [{'role': ..., 'content': ...}, ...]}")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--bucket-tokens", type=int, default=None, help="override the profile's memory bucket")
    p.add_argument("--profile", default="h100-80g/qwen2.5-0.5b")
    p.add_argument(
        "--cp-modes",
        default="allgather",
        help="comma list: how sharded attention may run (allgather, ulysses; with both, per microbatch)",
    )
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--max-length", type=int, default=1024, help="TRL truncates longer chats")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="trl-sft-out")
    p.add_argument("--check", action="store_true", help="first step against the plain SFTTrainer step")
    p.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute each layer in backward (TRL's default)"
    )
    p.add_argument(
        "--router-aux-loss",
        choices=("per-microbatch",),
        default=None,
        help="a mixture of experts' router aux loss (output_router_logits): per microbatch of the plan",
    )
    p.add_argument("--write-demo-data", action="store_true", help="write demo chats to --data and exit")
    p.add_argument("--demo-rows", type=int, default=48, help="conversations --write-demo-data writes")
    # the plain single-process SFTTrainer step --check runs in a new process (not torchrun)
    p.add_argument("--reference-rows", default=None, help=argparse.SUPPRESS)
    p.add_argument("--reference-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.write_demo_data and not (args.model_config or args.model):
        p.error("one of --model-config or --model is required")
    return args


def sft_config(args: argparse.Namespace, **overrides: Any) -> SFTConfig:
    """The run's SFTConfig: a stock one, plain SGD at a constant rate so that --check compares one step."""
    cuda = torch.cuda.is_available()
    fields: dict[str, Any] = {
        "output_dir": args.output_dir,
        "max_steps": args.max_steps,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 1,  # one plan iteration per optimizer step
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "optim": "sgd",
        "weight_decay": 0.0,
        "max_grad_norm": 0.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "seed": args.seed,
        "use_cpu": not cuda,
        "ddp_backend": "nccl" if cuda else "gloo",
        "bf16": False,  # the model's own dtype: float32 here, as --check compares
        "activation_checkpointing": args.activation_checkpointing,  # TRL's default is on; any CP runs it
        "assistant_only_loss": True,  # only the assistant turns are trained
        "max_length": args.max_length,
        "average_tokens_across_devices": True,
        # a mixture of experts' router loss off (TRL turns it on for MoE models; under plans it is refused
        # unless asked for per microbatch: docs/integrations/trl.md); 0.0 changes nothing for a dense model
        "router_aux_loss_coef": None if args.router_aux_loss else 0.0,
    }
    fields.update(overrides)
    return SFTConfig(**fields)


def load_model_and_tokenizer(args: argparse.Namespace, chats: list[list[dict[str, str]]], **model_kw: Any) -> Any:
    """(model, tokenizer): ``--model`` with its tokenizer, or ``--model-config`` with random weights."""
    from transformers import AutoTokenizer

    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    elif args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    else:
        tokenizer = build_tokenizer(chats)
    if args.model:
        from transformers import AutoModelForCausalLM

        from skrull.worker.hf.attention import register

        impl = model_kw.pop("attn_implementation", None) or register()
        device = model_kw.pop("device", None)
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=impl)
        return (model.to(device) if device is not None else model), tokenizer
    router = router_option(args)
    config = read_model_config(args.model_config, router_aux_loss=router)
    config["vocab_size"] = max(config["vocab_size"], len(tokenizer))  # the tokenizer's ids fit the embedding
    # random weights: the model's end and start tokens are the tokenizer's (the Trainer would align them at
    # train time, with a warning from every rank)
    for name in ("eos_token_id", "bos_token_id"):
        if getattr(tokenizer, name) is not None:
            config[name] = getattr(tokenizer, name)
    return build_model(config, seed=args.seed, router_aux_loss=router, **model_kw), tokenizer


def router_option(args: argparse.Namespace) -> str | None:
    """``--router-aux-loss`` as the library's ``router_aux_loss`` value (``per-microbatch``: ``per_microbatch``)."""
    return args.router_aux_loss.replace("-", "_") if args.router_aux_loss else None


def check_router(args: argparse.Namespace, trainer: SkrullSFTTrainer, grads: dict[str, torch.Tensor]) -> int:
    """Rank 0, with ``--router-aux-loss``: the first step against the own loop's reference over the rows TRL
    prepared, Hugging Face's plain step plus ``coef * aux_loss`` of each of the plan's microbatches."""
    reference, _ = load_model_and_tokenizer(args, read_chats(args.data), attn_implementation="eager")
    batch = trainer.planned.batches[0]
    rows = [trainer.train_dataset[i] for i in batch]
    loss = plain_step(
        reference,
        [torch.tensor(r["input_ids"]) for r in rows],
        labels=[torch.tensor(r["labels"] if r.get("labels") is not None else r["input_ids"]) for r in rows],
        router_microbatches=router_microbatches(trainer.planned.plan_of(0).iterations[0]),
    )
    errors = step_errors(
        loss=trainer.step_losses[0], reference_loss=loss, grads=grads, reference_grads=model_gradients(reference)
    )
    print(f"loss {trainer.step_losses[0]:.6f}, plain {loss:.6f}")
    return print_check(errors, tolerance=TOLERANCE, what="check: first step against the plain step")


def reference_step(args: argparse.Namespace) -> int:
    """The plain single-process step: a stock SFTTrainer, one step over the given rows as one padded batch."""
    indices = [int(i) for i in args.reference_rows.split(",")]
    chats = read_chats(args.data)
    model, tokenizer = load_model_and_tokenizer(args, chats, attn_implementation="eager")
    dataset = load_dataset("json", data_files=args.data, split="train").select(indices)
    grads: dict[str, torch.Tensor] = {}

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, *a: Any, **kw: Any) -> None:
            grads.update({n: p.grad.detach().float().cpu().clone() for n, p in model.named_parameters()})

    config = sft_config(args, max_steps=1, per_device_train_batch_size=len(indices), use_cpu=True, ddp_backend=None)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[Gradients()]
    )
    out = trainer.train()
    torch.save({"loss": float(out.training_loss), "grads": grads}, args.reference_out)
    return 0


def check(args: argparse.Namespace, argv: list[str], trainer: SkrullSFTTrainer, grads: dict[str, torch.Tensor]) -> int:
    """Rank 0: the first step's loss and gradients against ``reference_step`` run in a new process."""
    batch = trainer.planned.batches[0]
    launch = [a for a in argv if a != "--check"]
    # a single process: none of torchrun's variables, or the Trainer would join this run's process group
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"):  # fmt: skip
        env.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="skrull-trl-check-") as tmp:
        out = f"{tmp}/reference.pt"
        cmd = [sys.executable, __file__, *launch, "--output-dir", f"{tmp}/out"]
        cmd += ["--reference-rows", ",".join(str(i) for i in batch), "--reference-out", out]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"the reference SFTTrainer run failed ({done.returncode})")
        reference = torch.load(out)
    errors = step_errors(
        loss=trainer.step_losses[0], reference_loss=reference["loss"], grads=grads, reference_grads=reference["grads"]
    )
    if len(errors) - 1 != len(grads):  # a gradient the reference lacks: the models differ
        errors["gradients of the run the reference lacks"] = float("inf")
    print(f"loss {trainer.step_losses[0]:.6f}, plain {reference['loss']:.6f}")
    return print_check(errors, tolerance=TOLERANCE, what="check: first step against the plain SFTTrainer step")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.write_demo_data:
        rows = demo_chats(args.demo_rows, seed=args.seed)
        Path(args.data).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return 0
    if args.reference_out:
        return reference_step(args)
    if args.check and not args.model_config:
        raise SystemExit("--check builds the reference model from --model-config (random weights, the same seed)")
    training = sft_config(args)
    device = training.device  # initializes torch.distributed under torchrun
    mesh = init_device_mesh(device.type, (args.dp, args.cp), mesh_dim_names=("dp", "cp"))  # skrull
    chats = read_chats(args.data)
    model, tokenizer = load_model_and_tokenizer(args, chats, device=device)
    dataset = load_dataset("json", data_files=args.data, split="train")
    planned = functools.partial(  # skrull: the loader, over the rows TRL prepares
        PlannedBatches, mesh=mesh, global_batch_size=args.global_batch_size, profile=args.profile,
        bucket_tokens=args.bucket_tokens, seed=args.seed, equal_microbatches=True, num_iterations=args.max_steps,
        device=device, cp_modes=args.cp_modes.split(","),
    )  # fmt: skip
    grads: dict[str, torch.Tensor] = {}

    class FirstStepGradients(TrainerCallback):
        def on_pre_optimizer_step(self, *a: Any, **kw: Any) -> None:
            if not grads:
                grads.update({n: p.grad.detach().float().cpu().clone() for n, p in model.named_parameters()})

    trainer = SkrullSFTTrainer(  # skrull: was SFTTrainer
        model=model, args=training, train_dataset=dataset, processing_class=tokenizer, planned=planned,
        router_aux_loss=router_option(args), callbacks=[FirstStepGradients()] if args.check else None,
    )  # fmt: skip
    trainer.train()
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank != 0:
        return 0
    print("losses: " + " ".join(f"{x:.6f}" for x in trainer.step_losses))
    if trainer.step_router_losses:  # what the loss holds besides the cross-entropy
        print(f"router aux loss: {router_option(args)} (last step's part: {trainer.step_router_losses[-1]:.6f})")
    modes = ["+".join(trainer.planned.sharding_modes(step)) or "-" for step in range(len(trainer.step_losses))]
    print("cp modes: " + " ".join(modes))  # how each step's sharded microbatches ran
    if not args.check:
        return 0
    if len(trainer.train_dataset) != len(dataset):
        raise SystemExit("--check: TRL dropped rows while preparing (a chat with no assistant token left?)")
    if args.router_aux_loss:
        return check_router(args, trainer, grads)
    return check(args, argv, trainer, grads)


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
