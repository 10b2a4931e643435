"""A Llama/Qwen-shaped decoder (RMSNorm, rotary GQA attention, SwiGLU MLP) over packed buffers.

The modules never see the distribution: they take a packed ``[T, hidden]`` buffer, its position ids and
an ``attend(q, k, v)`` function. The worker passes DACP attention for one microbatch
(worker/dacp.py); the per-sequence reference passes ``sequence_attention`` on one whole sequence. The
same weights therefore run both ways, and any difference comes from scheduling alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sequence_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over one whole sequence (``[S, H, D]``, GQA allowed): the unscheduled yardstick."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        is_causal=True,
        enable_gqa=True,
    )
    return out.squeeze(0).transpose(0, 1)


def rotary(x: torch.Tensor, position_ids: torch.Tensor, *, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (Su et al., RoFormer, eq. 34; rotate-half layout) of ``[T, H, D]``."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = position_ids.to(torch.float32).unsqueeze(1) * inv_freq.unsqueeze(0)  # [T, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).unsqueeze(1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).unsqueeze(1).to(x.dtype)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class AttentionLayer(nn.Module):
    """Q/K/V projections, rotary embedding, attention (GQA), output projection."""

    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        tokens = x.shape[0]
        q = rotary(self.q_proj(x).view(tokens, self.num_heads, self.head_dim), position_ids)
        k = rotary(self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim), position_ids)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        out: torch.Tensor = self.o_proj(attend(q, k, v).reshape(tokens, self.num_heads * self.head_dim))
        return out


class DecoderLayer(nn.Module):
    def __init__(
        self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int
    ) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.attn = AttentionLayer(
            hidden_size=hidden_size, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim
        )
        self.mlp_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), position_ids, attend)
        h = self.mlp_norm(x)
        out: torch.Tensor = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return out


class TinyCausalLM(nn.Module):
    """Embedding, ``num_layers`` decoder layers, final norm, LM head: logits ``[T, vocab]``."""

    def __init__(
        self,
        *,
        vocab_size: int = 97,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        intermediate_size: int = 64,
    ) -> None:
        super().__init__()
        head_dim = hidden_size // num_heads
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(
                hidden_size=hidden_size,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                intermediate_size=intermediate_size,
            )
            for _ in range(num_layers)
        )
        self.norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, position_ids, attend)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits
