"""One training iteration under a plan, and the same iteration with no scheduling at all.

``scheduled_backward`` is what every GPU runs in a training loop: its microbatches in step order
(gradient accumulation), DACP attention over each microbatch's group, the per-token loss over the
whole iteration (worker/loss.py, Skrull appendix A), then gradients and the loss summed over the world
(the data-parallel reduction; summed, not averaged, because the normalization is already global).

``unscheduled_backward`` runs every sequence of the iteration alone in loader order in one process
with the same normalization: the loss and gradients any correct plan must reproduce.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from skrull.solver.types import Plan
from skrull.solver.worker_view import plan_rank_view
from skrull.worker.collectives import GroupRegistry
from skrull.worker.dacp import DACPPlan, dacp_attention
from skrull.worker.inputs import SyntheticData, pack, position_ids
from skrull.worker.kernels import AttentionKernel
from skrull.worker.layout import rank_layouts
from skrull.worker.loss import per_token_loss
from skrull.worker.model import TinyCausalLM, sequence_attention


def scheduled_backward(
    model: TinyCausalLM,
    plan: Plan,
    data: SyntheticData,
    *,
    iteration: int,
    rank: int,
    registry: GroupRegistry,
    kernel: AttentionKernel,
    device: torch.device,
) -> float:
    """Accumulate this GPU's gradients for ``iteration``, then sum gradients over the world.

    Returns the iteration's loss (summed over the world). Collective over the whole world.
    """
    lengths = data.lengths
    vocab = model.lm_head.out_features
    num_tokens = plan_rank_view(plan, lengths, iteration=iteration, rank=rank).num_tokens_in_iteration
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for layout in rank_layouts(plan, lengths, iteration=iteration, rank=rank):
        group = registry.get(layout.ranks) if layout.communicates else None
        dplan = DACPPlan.build(layout, group=group, kernel=kernel, device=device)
        if layout.num_tokens:
            ids = pack(layout, lambda i: data.tokens(i, vocab)[0]).to(device)
            labels = pack(layout, lambda i: data.tokens(i, vocab)[1]).to(device)
        else:  # nothing of its own, but the group's collectives still need this member
            ids = torch.zeros(0, dtype=torch.long, device=device)
            labels = torch.zeros(0, dtype=torch.long, device=device)
        logits = model(ids, position_ids(layout, device), lambda q, k, v, p=dplan: dacp_attention(q, k, v, p))
        loss = per_token_loss(logits, labels, num_tokens_in_iteration=num_tokens)
        loss.backward()  # type: ignore[no-untyped-call]
        loss_sum += loss.detach().double()
    reduce_gradients(model)
    dist.all_reduce(loss_sum)
    return float(loss_sum.item())


def reduce_gradients(model: nn.Module) -> None:
    """Sum every parameter's gradient over the world (missing gradients count as zero)."""
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        dist.all_reduce(param.grad)


def unscheduled_backward(model: TinyCausalLM, data: SyntheticData, seq_ids: Sequence[int]) -> float:
    """Every sequence alone, one process, per-token normalization over ``seq_ids``: returns the loss."""
    vocab = model.lm_head.out_features
    num_tokens = sum(data.lengths[i] for i in seq_ids)
    total = 0.0
    device = model.lm_head.weight.device
    for seq_id in seq_ids:
        ids, labels = data.tokens(seq_id, vocab)
        logits = model(ids.to(device), torch.arange(len(ids), device=device), sequence_attention)
        loss = per_token_loss(logits, labels.to(device), num_tokens_in_iteration=num_tokens)
        loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    return total
