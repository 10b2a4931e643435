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
"""

from __future__ import annotations

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
