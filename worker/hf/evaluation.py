"""Evaluation under plans: the loss the plain Trainer reports on an evaluation set, computed with plans.

The evaluation set runs through the same machinery as training (``PlannedBatches.for_evaluation``: every
row once, in dataset order, each global batch planned, long rows sharded over their CP group and run by
the DACP attention), forward only. Every rank scores the targets of its own rows, token by token, and
adds each token's cross-entropy to its row (``row_losses``; ``MicrobatchLayout.row_tokens`` names the
row a shard piece's token was cut from); one all-reduce over the world then gives every row's summed
cross-entropy ``s_i`` and target count ``n_i`` exactly once, whatever the plan.

What the plain ``Trainer.evaluate`` reports (transformers 5, one process): its sequential eval loader
cuts the set into batches of ``b = per_device_eval_batch_size`` consecutive rows; a batch's loss is the
model's mean over that batch's targets, and ``eval_loss`` is the mean of the batch losses weighted by
their row counts (``losses.repeat(batch_size)``, the last partial batch trimmed by
``gather_for_metrics``), batches without a target (a NaN loss) left out as ``logging_nan_inf_filter``
does:

    eval_loss = sum_B |B| * (sum_{i in B} s_i / sum_{i in B} n_i) / sum_B |B|

``plain_eval_loss`` computes exactly this from the rows' sums, so the reported figure is the plain
single-process Trainer's at the same ``per_device_eval_batch_size``; with ``b`` at least the set's size it
is the mean over every target token of the set. (The plain Trainer's own figure depends on ``b``, and under
several processes on how its sampler deals rows to them; the single process is the yardstick.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from skrull.worker.dacp import DACPPlan
from skrull.worker.dataloader import ReadyIteration
from skrull.worker.hf.inputs import model_inputs
from skrull.worker.loss import IGNORE_INDEX


@torch.no_grad()
def row_losses(
    model: Any,
    ready: ReadyIteration,
    plans: Sequence[DACPPlan],
    *,
    sums: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """Add this rank's summed cross-entropy and target count of each dataset row of ``ready`` into ``sums``
    and ``counts`` (indexed by dataset index; float64 and int64). Runs every microbatch forward, so that the
    ranks of a CP group meet in the same collectives."""
    for mb, plan in zip(ready.microbatches, plans, strict=True):
        kwargs, labels = model_inputs(mb, plan)
        logits = model(**kwargs).logits[0]
        n = mb.layout.num_tokens
        if n == 0:  # a padding row for a member that holds no token: no target
            continue
        targets = labels[:n]
        ce = F.cross_entropy(logits[:n].float(), targets, ignore_index=IGNORE_INDEX, reduction="none")
        origin = [ready.sample_indices[s] for s, _ in mb.layout.row_tokens]  # the row each token was cut from
        rows = torch.tensor(origin, dtype=torch.long, device=sums.device)
        sums.index_add_(0, rows, ce.to(sums.device, torch.float64))
        counts.index_add_(0, rows, (targets != IGNORE_INDEX).to(counts.device, torch.int64))


def reduce_rows(sums: torch.Tensor, counts: torch.Tensor) -> None:
    """Sum the rows' losses and counts over the world (each token was scored on exactly one rank)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums)
        dist.all_reduce(counts)


def plain_eval_loss(sums: Sequence[float], counts: Sequence[int], *, batch_size: int) -> float:
    """The plain single-process ``Trainer.evaluate``'s ``eval_loss`` from each row's summed cross-entropy
    and target count (module doc); NaN when no batch has a target."""
    if batch_size < 1:
        raise ValueError(f"per_device_eval_batch_size={batch_size}: must be >= 1")
    if len(sums) != len(counts):
        raise ValueError(f"{len(sums)} row losses for {len(counts)} row counts")
    weighted, rows = 0.0, 0
    for start in range(0, len(sums), batch_size):
        n = sum(int(c) for c in counts[start : start + batch_size])
        if n == 0:
            continue
        size = len(sums[start : start + batch_size])
        weighted += size * (sum(float(s) for s in sums[start : start + batch_size]) / n)
        rows += size
    return weighted / rows if rows else float("nan")
