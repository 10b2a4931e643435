"""Train a small Megatron-Core GPT on planned batches: Skrull decides, per microbatch, which sequences run
whole on one GPU and which are split over its context-parallel group; Megatron-Core runs each part.

Needs CUDA GPUs, NCCL, megatron-core 0.16.x (``pip install 'skrull[megatron]'``) and Transformer Engine
(THD context parallelism runs in its attention). Not run by the CPU tests, which only ask for ``--help``.

    torchrun --nproc-per-node 8 examples/megatron_step.py --cp 4 --iterations 4

Per iteration (one global batch, one plan iteration) every rank turns its planned microbatches into
Megatron forwards (``skrull.worker.megatron.megatron_iteration``: a local item with CP off, a sharded item
with CP over its group) and runs them in one ``forward_backward_func`` call; Megatron's DDP reduces the
gradients over DP x CP and scales them by the number of loss tokens of the whole global batch
(``calculate_per_token_loss``). docs/integrations/megatron.md explains each step.

The model uses learned absolute position embeddings, which Megatron reads from ``position_ids``: with RoPE,
megatron-core 0.16.1 rotates THD tokens over the model's static CP group rather than the item's, which
the page's "Limits" section covers.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="megatron_step.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Run under torchrun on CUDA GPUs, e.g.: torchrun --nproc-per-node 8 examples/megatron_step.py --cp 4",
    )
    parser.add_argument("--cp", type=int, default=2, help="context-parallel size (the world is dp x cp)")
    parser.add_argument("--iterations", type=int, default=4, help="global batches to train")
    parser.add_argument("--global-batch-size", type=int, default=32, help="sequences per global batch")
    parser.add_argument("--num-samples", type=int, default=512, help="synthetic dataset size")
    parser.add_argument("--max-tokens", type=int, default=16384, help="longest synthetic sequence")
    parser.add_argument("--bucket-tokens", type=int, default=8192, help="tokens one GPU holds per microbatch")
    parser.add_argument("--profile", default="h100-80g/qwen2.5-0.5b", help="a bundled Skrull profile")
    parser.add_argument("--solver", default="skrull", help="a planner of the static layout (groups = CP groups)")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def synthetic_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Token rows with long-tailed lengths: ``input_ids`` and next-token ``labels`` (-100 at the end)."""
    import torch

    g = torch.Generator().manual_seed(args.seed)
    rows = []
    for _ in range(args.num_samples):
        n = int(min(args.max_tokens, 16 + torch.empty(1).exponential_(generator=g).item() * args.max_tokens / 8))
        ids = torch.randint(0, args.vocab_size, (n,), generator=g)
        rows.append({"input_ids": ids, "labels": torch.cat([ids[1:], torch.tensor([-100])])})
    return rows


def loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Sum of the per-token losses over real, supervised rows and their count (per-token loss mode:
    Megatron divides the gradients by the count summed over the whole global batch)."""
    import torch

    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1)
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.stack([loss.detach(), num_tokens.float()])}


def forward_step(data_iterator: Any, model: Any) -> tuple[Any, Any]:
    """Megatron's forward step on one ``MegatronMicrobatch``: THD tensors plus its ``PackedSeqParams``."""
    item = next(data_iterator)
    output = model(
        item.tokens,
        item.position_ids,
        None,  # no attention mask: THD attention is causal within each sequence of cu_seqlens
        labels=item.labels,
        packed_seq_params=item.packed_seq_params,
    )
    return output, partial(loss_func, item.loss_mask)


def refuse(message: str) -> NoReturn:
    """Stop before any work, saying why once. Under torchrun every rank meets the same refusal: rank 0 says
    it and every rank exits 0, since a failing exit would have torchrun print its failure report for every
    rank around the one line; run with python, the exit status is 2."""
    if os.environ.get("RANK", "0") == "0":
        print(f"megatron_step.py: {message}", file=sys.stderr, flush=True)
    sys.exit(0 if "RANK" in os.environ else 2)


def preflight() -> None:
    """What this machine lacks, checked before megatron-core is imported (its imports warn on every rank
    about missing Apex/Transformer Engine before anything can be refused)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        refuse("needs CUDA GPUs (NCCL and Transformer Engine); this machine has none, nothing was run")
    needs = {
        "megatron.core": "megatron-core 0.16.x: pip install 'skrull[megatron]'",
        "transformer_engine": "Transformer Engine (THD context parallelism runs in its attention)",
    }
    for module, what in needs.items():
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            refuse(f"needs {what}; not installed, nothing was run")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    preflight()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from skrull.worker.dataloader import PlannedBatches
    from skrull.worker.loader_options import LoaderOptions
    from skrull.worker.megatron import megatron_iteration, padded_num_tokens

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % args.cp:
        sys.exit(f"megatron_step.py: --cp {args.cp} must divide the world size {world}")
    # Megatron's rank order (tp-cp-ep-dp-pp, tp = 1) puts global rank dp_rank * cp + cp_rank, as Skrull's plans do
    parallel_state.initialize_model_parallel(context_parallel_size=args.cp)
    model_parallel_cuda_manual_seed(args.seed)

    rows = synthetic_rows(args)
    lengths = [len(r["input_ids"]) for r in rows]
    config = TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_heads,
        context_parallel_size=args.cp,
        calculate_per_token_loss=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
    )
    gpt = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
        vocab_size=args.vocab_size,
        # position ids run to the padded length of the longest sequence
        max_sequence_length=padded_num_tokens(max(lengths), args.cp),
        position_embedding_type="learned_absolute",
    ).cuda()
    model = DistributedDataParallel(config, DistributedDataParallelConfig(), gpt)  # gradients over DP x CP
    config.no_sync_func = model.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=args.lr, bf16=True), [model])
    forward_backward = get_forward_backward_func()

    # the static layout: every sharded microbatch's ranks are this rank's CP group, created by Megatron
    cp_groups = {
        tuple(sorted(parallel_state.get_context_parallel_global_ranks())): parallel_state.get_context_parallel_group()
    }
    loader = PlannedBatches(
        rows,
        lengths,
        LoaderOptions(
            global_batch_size=args.global_batch_size,
            profile=args.profile,
            rank=rank,
            dp=world // args.cp,
            cp=args.cp,
            solver=args.solver,
            bucket_tokens=args.bucket_tokens,
            num_iterations=args.iterations,
            seed=args.seed,
        ),
    )
    try:
        for ready in loader:
            samples = ready.sample_indices  # one plan per global batch: sequence id i is samples[i]

            def fetch(seq_id: int, samples: tuple[int, ...] = samples) -> tuple[torch.Tensor, torch.Tensor]:
                row = rows[samples[seq_id]]
                return row["input_ids"], row["labels"]

            items = megatron_iteration(
                (mb.layout for mb in ready.microbatches), fetch, cp_groups=cp_groups, device=torch.device("cuda")
            )
            model.zero_grad_buffer()
            optimizer.zero_grad()
            if items:
                losses = forward_backward(
                    forward_step_func=forward_step,
                    data_iterator=iter(items),
                    model=[model],
                    num_microbatches=len(items),
                    seq_length=max(item.num_tokens for item in items),
                    micro_batch_size=1,
                    forward_only=False,
                )
            else:  # no work on this rank this iteration: join the gradient reduction all the same
                losses = []
                finalize_model_grads([model], torch.zeros([], dtype=torch.int, device="cuda"))
            optimizer.step()
            total = torch.stack([x["lm loss"] for x in losses]).sum(0) if losses else torch.zeros(2, device="cuda")
            dist.all_reduce(total)
            if rank == 0:
                print(f"iteration {ready.iteration}: loss {total[0].item() / max(total[1].item(), 1):.4f}", flush=True)
    finally:
        loader.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
