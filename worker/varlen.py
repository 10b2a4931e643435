"""The varlen metadata of a ready microbatch in the spellings attention libraries expect.

One packed buffer (worker/layout.py: local sequences whole, then shard pieces) is described by
``cu_seqlens`` (offsets, int32, starting at 0) and ``max_seqlen``. Libraries spell it differently:

- flash-attn ``flash_attn_varlen_func``: ``cu_seqlens_q``, ``cu_seqlens_k``, ``max_seqlen_q``, ``max_seqlen_k``;
- PyTorch ``torch.nn.attention.varlen.varlen_attn``: ``cu_seq_q``, ``cu_seq_k``, ``max_q``, ``max_k``;
- Hugging Face packed batches (``DataCollatorWithFlattening``): ``position_ids`` of shape ``[1, T]``
  restarting at 0 for each sequence, plus the flash-attention kwargs ``cu_seq_lens_q``,
  ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``. Position ids alone mark a boundary wherever
  they restart at 0, so they describe a buffer exactly only when it holds no shard piece (a piece
  starts at its global position); the explicit ``cu_seq_lens_*`` kwargs are always exact;
- Megatron-Core ``PackedSeqParams`` (THD format): ``qkv_format``, ``cu_seqlens_q``, ``cu_seqlens_kv``,
  ``cu_seqlens_q_padded``, ``cu_seqlens_kv_padded``, ``max_seqlen_q``, ``max_seqlen_kv``; given here as a
  plain dataclass with the same field names (``dataclasses.asdict`` it into Megatron's class).

These describe the local part of attention (every segment attends to itself). Sharded sequences also
need the group's keys: that is what ``worker.dacp`` adds around the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from skrull.worker.layout import MicrobatchLayout


def _cu(layout: MicrobatchLayout, device: torch.device) -> torch.Tensor:
    return torch.tensor(layout.cu_seqlens, dtype=torch.int32, device=device)


def flash_attn_kwargs(layout: MicrobatchLayout, *, device: torch.device | None = None) -> dict[str, Any]:
    cu = _cu(layout, device or torch.device("cpu"))
    return {
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu,
        "max_seqlen_q": layout.max_seqlen,
        "max_seqlen_k": layout.max_seqlen,
    }


def torch_varlen_kwargs(layout: MicrobatchLayout, *, device: torch.device | None = None) -> dict[str, Any]:
    cu = _cu(layout, device or torch.device("cpu"))
    return {"cu_seq_q": cu, "cu_seq_k": cu, "max_q": layout.max_seqlen, "max_k": layout.max_seqlen}


def hf_packed_kwargs(layout: MicrobatchLayout, *, device: torch.device | None = None) -> dict[str, Any]:
    """``position_ids`` restarting per segment (``[1, T]``) and the explicit flash-attention kwargs."""
    dev = device or torch.device("cpu")
    positions = [t for n in layout.segment_lengths for t in range(n)]
    cu = _cu(layout, dev)
    return {
        "position_ids": torch.tensor([positions], dtype=torch.long, device=dev),
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": layout.max_seqlen,
        "max_length_k": layout.max_seqlen,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedSeqParams:
    """Megatron-Core's packed-sequence fields (THD), without importing Megatron."""

    qkv_format: str
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor | None
    cu_seqlens_kv_padded: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_kv: int


def megatron_packed_seq_params(layout: MicrobatchLayout, *, device: torch.device | None = None) -> PackedSeqParams:
    cu = _cu(layout, device or torch.device("cpu"))
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None,
        max_seqlen_q=layout.max_seqlen,
        max_seqlen_kv=layout.max_seqlen,
    )
