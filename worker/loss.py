"""Per-token loss normalization over the whole iteration (Skrull appendix A).

Scheduling changes which GPU and which microbatch a token is computed in, so any normalization that
depends on microbatch or rank boundaries (mean per microbatch, per sequence, then mean over gradient
accumulation steps and DP ranks) gives a different loss and different gradients for every plan. The
one normalization that does not is per token over the iteration:

    loss = sum over every supervised token t of the iteration of CE(t) / num_tokens_in_iteration

Each GPU adds ``sum of CE over its own tokens / num_tokens_in_iteration`` for each microbatch and
gradients are summed (not averaged) over GPUs; the total is then exactly the loss of the unscheduled
batch, whatever the plan. A sharded sequence's tokens are spread over its group: each member computes
the loss of its own rows only, and the attention's collectives carry the gradients across.

``num_tokens_in_iteration`` is the worker view's field when every token carries a label; with masked
labels (prompt tokens, padding) use ``count_supervised_tokens``, one all-reduce per iteration.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE_INDEX = -100


def per_token_loss(logits: torch.Tensor, labels: torch.Tensor, *, num_tokens_in_iteration: int) -> torch.Tensor:
    """``sum CE(logits, labels) / num_tokens_in_iteration`` over this buffer (labels ``-100`` skipped)."""
    if num_tokens_in_iteration < 1:
        raise ValueError(f"num_tokens_in_iteration must be >= 1, got {num_tokens_in_iteration}")
    total = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / num_tokens_in_iteration


def own_supervised_tokens(labels: Sequence[torch.Tensor]) -> int:
    """Labels other than ``-100`` over this rank's buffers (no communication)."""
    return sum(int((t != IGNORE_INDEX).sum()) for t in labels)


def count_supervised_tokens(labels: list[torch.Tensor], *, group: dist.ProcessGroup | None = None) -> int:
    """Labels other than ``-100`` over this rank's buffers, summed over ``group`` (the world by default).

    Every token must be counted once: pass each GPU's own rows (local sequences and its shard pieces).
    """
    device = labels[0].device if labels else torch.device("cpu")
    count = torch.tensor(own_supervised_tokens(labels), dtype=torch.long, device=device)
    if dist.is_initialized():
        dist.all_reduce(count, group=group)
    return int(count.item())
