"""The varlen metadata of a ready microbatch in the spellings attention libraries expect.

One packed buffer (worker/layout.py: local sequences whole, then shard pieces) is described by
``cu_seqlens`` (offsets, int32, starting at 0) and ``max_seqlen``. Libraries spell it differently:

- flash-attn ``flash_attn_varlen_func``: ``cu_seqlens_q``, ``cu_seqlens_k``, ``max_seqlen_q``, ``max_seqlen_k``;
- PyTorch ``torch.nn.attention.varlen.varlen_attn``: ``cu_seq_q``, ``cu_seq_k``, ``max_q``, ``max_k``;
- Hugging Face packed batches (``DataCollatorWithFlattening``): ``position_ids`` of shape ``[1, T]``
  restarting at 0 for each sequence, plus the flash-attention kwargs ``cu_seq_lens_q``,
  ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``. Position ids alone mark a boundary wherever
  they restart at 0, so they describe a buffer exactly only when it holds no shard piece (a piece
  starts at its global position); the explicit ``cu_seq_lens_*`` kwargs are always exact.

Megatron-Core is not spelled here: its ``PackedSeqParams`` also carries the context-parallel group and
Megatron splits sharded sequences by its own rule, so worker/megatron.py builds Megatron's own class
and tensors (local and sharded sequences alike).

These describe whole sequences only (every segment attends to itself), so they refuse a microbatch that
holds shard pieces: a piece's queries also need the keys of the pieces before it on the other GPUs of
its group, which is what ``worker.dacp`` adds around the kernel. Handing a piece to a stock attention
as if it were a sequence would train silently on truncated context; the error says so instead.
"""

from __future__ import annotations

from typing import Any

import torch

from skrull.worker.layout import MicrobatchLayout


def require_whole_sequences(layout: MicrobatchLayout, *, consumer: str) -> None:
    """A ``ValueError`` naming the pieces when ``layout`` holds any: only DACP attention runs them."""
    pieces = layout.pieces
    if pieces:
        seqs = sorted({p.seq_id for p in pieces})
        raise ValueError(
            f"microbatch (step {layout.step}, ranks {list(layout.ranks)}) holds shard pieces of sequences {seqs}: "
            f"{consumer} sees whole sequences only; a piece needs the keys of its group's other pieces, which only "
            f"the DACP attention supplies (worker/dacp.py; attn_implementation 'skrull_dacp' for Hugging Face models)"
        )


def _cu(layout: MicrobatchLayout, device: torch.device) -> torch.Tensor:
    return torch.tensor(layout.cu_seqlens, dtype=torch.int32, device=device)


def flash_attn_kwargs(layout: MicrobatchLayout, *, device: torch.device | None = None) -> dict[str, Any]:
    require_whole_sequences(layout, consumer="flash_attn_varlen_func")
    cu = _cu(layout, device or torch.device("cpu"))
    return {
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu,
        "max_seqlen_q": layout.max_seqlen,
        "max_seqlen_k": layout.max_seqlen,
    }


def torch_varlen_kwargs(layout: MicrobatchLayout, *, device: torch.device | None = None) -> dict[str, Any]:
    require_whole_sequences(layout, consumer="torch varlen_attn")
    cu = _cu(layout, device or torch.device("cpu"))
    return {"cu_seq_q": cu, "cu_seq_k": cu, "max_q": layout.max_seqlen, "max_k": layout.max_seqlen}


def hf_packed_kwargs(layout: MicrobatchLayout, *, device: torch.device | None = None) -> dict[str, Any]:
    """``position_ids`` restarting per sequence (``[1, T]``) and the explicit flash-attention kwargs: what a
    stock model's own sdpa, eager or flash-attention path needs to keep packed sequences apart."""
    require_whole_sequences(layout, consumer="a Hugging Face model's own attention")
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
