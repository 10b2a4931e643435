"""A planned microbatch as a Hugging Face causal LM's inputs.

``PlannedBatches`` (worker/dataloader.py) and ``skrull finetune`` deliver ``ReadyMicrobatch`` objects: one
GPU's packed buffer of local sequences and shard pieces, with ``input_ids``, aligned ``labels`` (the next
token of the same sequence, ``-100`` where there is no target), ``position_ids`` (0.. per local sequence,
global positions in shard pieces, so rotary embeddings see each token where it sits in its sequence) and
``cu_seqlens``. The model takes them as one packed row, ``[1, T]``, plus the microbatch's ``DACPPlan``
under the keyword ``skrull_dacp`` (worker/hf/attention.py).

A GPU that holds no token of a microbatch (a short sequence sharded over a wide group) still runs the
model, because the group's collectives need it: it gets one padding row (token 0, position 0, label
``-100``), which the attention ignores and the loss skips.

``pad_to_bucket`` pads a microbatch the same way up to the next of a few bucketed sizes, so that layers
replayed as CUDA graphs (worker/compiling.py, ``compile="cudagraphs"``) see a few token counts only. It
changes neither the loss nor a gradient: padding rows attend to nothing and nothing attends to them (the
attention's output there is zero and it passes no gradient back: worker/attention_op.py), every other
operation of a decoder layer is row by row, and their labels are ``-100``, so their loss, and with it the
gradient flowing into them, is zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from skrull.worker.dacp import DACPPlan
from skrull.worker.dataloader import ReadyMicrobatch
from skrull.worker.hf.attention import PLAN_KWARG
from skrull.worker.loss import IGNORE_INDEX
from skrull.worker.varlen import hf_packed_kwargs


def model_inputs(mb: ReadyMicrobatch, plan: DACPPlan) -> tuple[dict[str, Any], torch.Tensor]:
    """``(forward kwargs, labels [T])`` for ``model(**kwargs)`` on this microbatch."""
    ids, positions, labels = mb.input_ids, mb.position_ids, mb.labels
    if ids.shape[0] == 0:
        ids = torch.zeros(1, dtype=torch.long, device=ids.device)
        positions = torch.zeros(1, dtype=torch.long, device=ids.device)
        labels = torch.full((1,), IGNORE_INDEX, dtype=torch.long, device=ids.device)
    kwargs = {
        "input_ids": ids.unsqueeze(0),
        "position_ids": positions.unsqueeze(0),
        "use_cache": False,
        PLAN_KWARG: plan,
    }
    return kwargs, labels


def stock_model_inputs(mb: ReadyMicrobatch) -> tuple[dict[str, Any], torch.Tensor]:
    """``(forward kwargs, labels [T])`` for a model running its OWN attention (sdpa, eager, flash-attention)
    on a microbatch of whole sequences: one packed row with ``position_ids`` restarting at 0 for each
    sequence, which is how transformers tells packed sequences apart (its masks for sdpa and eager, its
    varlen path for flash-attention), plus the explicit ``cu_seq_lens_*`` flash-attention kwargs.

    A microbatch holding shard pieces is refused (``worker.varlen.require_whole_sequences``): only the DACP
    attention runs pieces (``model_inputs``).
    """
    kwargs = hf_packed_kwargs(mb.layout, device=mb.input_ids.device)
    assert torch.equal(kwargs["position_ids"][0], mb.position_ids), "whole sequences' positions restart at 0"
    return {"input_ids": mb.input_ids.unsqueeze(0), "use_cache": False, **kwargs}, mb.labels


def bucket_rows(num_rows: int, buckets: Sequence[int]) -> int:
    """The smallest of ``buckets`` holding ``num_rows`` rows (a ``ValueError`` naming the largest if none)."""
    fitting = [b for b in buckets if b >= num_rows]
    if not fitting:
        raise ValueError(
            f"buckets: a microbatch of {num_rows} rows exceeds the largest bucket {max(buckets, default=0)}"
        )
    return min(fitting)


def pad_to_bucket(
    kwargs: dict[str, Any], labels: torch.Tensor, *, buckets: Sequence[int]
) -> tuple[dict[str, Any], torch.Tensor]:
    """``model_inputs``' result padded with rows of token 0, position 0, label ``-100`` up to
    ``bucket_rows`` (module docstring: loss and gradients unchanged)."""
    rows = int(kwargs["input_ids"].shape[1])
    extra = bucket_rows(rows, buckets) - rows
    if extra == 0:
        return kwargs, labels
    out = dict(kwargs)
    for name in ("input_ids", "position_ids"):
        t = kwargs[name]
        out[name] = torch.cat([t, t.new_zeros(1, extra)], dim=1)
    return out, torch.cat([labels, labels.new_full((extra,), IGNORE_INDEX)])
