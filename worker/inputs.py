"""One GPU's input tensors for one microbatch, from its layout and per-sequence token tensors.

``pack`` lays rows out as the worker view says (local sequences whole, then shard pieces);
``position_ids`` restart per local sequence and stay global in shard pieces; ``unpack`` hands rows
back to their sequences. ``SyntheticData`` makes reproducible per-sequence tensors from a seed and the
sequence id alone, so every process of a run can build any sequence without communication.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from skrull.worker.layout import MicrobatchLayout

Fetch = Callable[[int], torch.Tensor]


def pack(layout: MicrobatchLayout, fetch: Fetch) -> torch.Tensor:
    """Concatenate ``fetch(id)`` for local sequences and the own slices ``[a, b)`` of sharded ones."""
    parts = [fetch(i) for i in layout.local_ids]
    parts.extend(fetch(p.seq_id)[p.start : p.end] for p in layout.pieces)
    if not parts:  # an empty microbatch (equal_microbatches): no tokens, the forward still runs
        return torch.empty(0, dtype=torch.long)
    return torch.cat(parts)


def position_ids(layout: MicrobatchLayout, device: torch.device) -> torch.Tensor:
    return torch.tensor(layout.position_ids, dtype=torch.long, device=device)


def cu_seqlens(layout: MicrobatchLayout, device: torch.device) -> torch.Tensor:
    """The packed buffer's offsets (int32, flash-attention's dtype)."""
    return torch.tensor(layout.cu_seqlens, dtype=torch.int32, device=device)


def unpack(layout: MicrobatchLayout, rows: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
    """``(seq_id, start, rows)`` for each local sequence and piece of a packed buffer."""
    out = []
    offset = 0
    for seq_id, n in zip(layout.local_ids, layout.local_lengths, strict=True):
        out.append((seq_id, 0, rows[offset : offset + n]))
        offset += n
    for p in layout.pieces:
        out.append((p.seq_id, p.start, rows[offset : offset + p.num_tokens]))
        offset += p.num_tokens
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticData:
    """Reproducible per-sequence tensors: the same values in every process for the same seed and id."""

    seed: int
    lengths: tuple[int, ...]

    def _generator(self, seq_id: int, stream: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 1_000_003 + seq_id) * 7 + stream)

    def hidden(self, seq_id: int, hidden_size: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Layer inputs ``[S, hidden]`` ~ N(0, 1)."""
        g = self._generator(seq_id, 0)
        return torch.randn(self.lengths[seq_id], hidden_size, generator=g).to(dtype)

    def grad_output(self, seq_id: int, hidden_size: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Upstream gradient ``[S, hidden]`` ~ N(0, 1) for a forward + backward without a loss."""
        g = self._generator(seq_id, 1)
        return torch.randn(self.lengths[seq_id], hidden_size, generator=g).to(dtype)

    def tokens(self, seq_id: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` of length S: S+1 random tokens, shifted by one (next-token labels)."""
        g = self._generator(seq_id, 2)
        ids = torch.randint(0, vocab_size, (self.lengths[seq_id] + 1,), generator=g)
        return ids[:-1], ids[1:]

    def lm_tokens(self, seq_id: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` of a causal-LM sample of S random tokens: labels are the next token of
        the same sequence and ``-100`` at its last token (S - 1 targets, what Hugging Face's shifted loss
        takes from ``labels=input_ids``)."""
        g = self._generator(seq_id, 3)
        ids = torch.randint(0, vocab_size, (self.lengths[seq_id],), generator=g)
        return ids, torch.cat([ids[1:], torch.full((1,), -100, dtype=torch.long)])
