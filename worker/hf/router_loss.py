"""A mixture of experts' router auxiliary (load-balancing) loss under plans: the per-microbatch form.

The loss (Switch Transformer eq. 4-6, as Hugging Face's ``load_balancing_loss_func`` computes it over the
tokens of one forward, the router logits of every layer pooled):

    aux(m) = E * sum_e f_e * P_e,   f_e = C_e / R,   P_e = S_e / R

with ``E`` experts, ``C_e`` the top-k assignments of expert ``e`` and ``S_e`` the sum of its router
probability over the tokens of microbatch ``m`` and every layer, and ``R`` the number of (token, layer) rows.

Two semantics exist, and plans offer one of them, by name (``router_aux_loss``):

- **plain-step global-batch statistics: not offered.** A plain step over the whole global batch takes
  ``f_e`` and ``P_e`` over every token of the global batch. Under plans the microbatches run one after the
  other, and each one's backward runs before the next one's forward; ``f_e`` is known only after every
  microbatch's forward, so no microbatch's gradient can be taken against it without keeping every
  microbatch's activations until the last forward (a second forward, or all activations at once: what
  plans exist to avoid).
- **``"per_microbatch"``**: what Megatron-Core and a Hugging Face Trainer with gradient accumulation compute.
  Each microbatch's aux loss is taken over that microbatch's own tokens, and each counts with the model's
  ``router_aux_loss_coef`` as the plain Trainer counts it under gradient accumulation (the model adds
  ``coef * aux`` to each microbatch's loss, which the Trainer does not divide by the accumulation steps when
  the loss is normalised by ``num_items_in_batch``). The step's loss is then

      loss = sum over targets CE / num_targets + coef * sum over the plan's microbatches m of aux(m)

  A microbatch is one forward of the model: a GPU's own sequences, or, where sequences are sharded over a
  CP group, every token the group's GPUs hold in that microbatch (``router_microbatches``). On a group each
  GPU sees only its own tokens, so ``C_e`` and ``R`` are summed over the group first (one all-reduce of
  ``E + 1`` numbers, no gradient: top-k counts have none). ``aux`` is then linear in each GPU's own
  ``S_e``, so each GPU adds ``coef * E * sum_e (C_e / R) * (S_e,own / R)``: the group's terms sum to
  ``coef * aux(m)`` and each GPU's router gets exactly ``d aux / d S_e = E * C_e / R**2``, with no
  collective in the backward.

How many microbatches a plan makes depends on the plan (the lengths, the profile, the layout), so this loss
is the plan's, not a plain run's: the check compares it with a single-process step that sums the same
terms over the same microbatches (``plain_step(..., router_microbatches=...)`` in worker/hf/step.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from skrull.solver.plan import Iteration

#: the ``router_aux_loss`` values plans train (one knob everywhere: ``scheduled_step``, the examples'
#: ``--router-aux-loss``); None (the default) refuses a model whose ``output_router_logits`` is true
ROUTER_AUX_LOSS_OPTIONS: tuple[str, ...] = ("per_microbatch",)


def check_router_aux_loss(value: Any) -> str | None:
    """``value`` when it is None or one of ``ROUTER_AUX_LOSS_OPTIONS``; else one ``ValueError`` naming it."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in ROUTER_AUX_LOSS_OPTIONS:
        raise ValueError(
            f"router_aux_loss={value!r}: must be None (refuse output_router_logits=True) or one of "
            f"{', '.join(repr(o) for o in ROUTER_AUX_LOSS_OPTIONS)}"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterAux:
    """What the per-microbatch aux loss needs of the model: experts, top-k, coefficient."""

    num_experts: int
    top_k: int
    coef: float

    @classmethod
    def of(cls, config: Any) -> RouterAux | None:
        """From a model config whose ``output_router_logits`` is true; None when it is false."""
        if not getattr(config, "output_router_logits", False):
            return None
        experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
        top_k = getattr(config, "num_experts_per_tok", None)
        coef = getattr(config, "router_aux_loss_coef", None)
        if not isinstance(experts, int) or not isinstance(top_k, int) or not isinstance(coef, int | float):
            raise ValueError(
                f"router_aux_loss: the model config has no num_experts / num_experts_per_tok / "
                f"router_aux_loss_coef ({experts!r}, {top_k!r}, {coef!r})"
            )
        return cls(num_experts=experts, top_k=top_k, coef=float(coef))

    def own_term(self, router_logits: Sequence[torch.Tensor], *, group: Any = None) -> torch.Tensor:
        """This GPU's part of ``coef * aux(m)`` (module doc): the terms of a group's GPUs sum to it.
        ``router_logits``: one ``[tokens, E]`` tensor per layer (the model's ``output_router_logits``);
        ``group``: the CP group the microbatch's sequences are sharded over (None: this GPU alone)."""
        if not router_logits:
            raise ValueError("router_aux_loss: the model returned no router logits (output_router_logits)")
        device = router_logits[0].device
        counts = torch.zeros(self.num_experts, dtype=torch.float32, device=device)
        probs = torch.zeros(self.num_experts, dtype=torch.float32, device=device)
        rows = 0
        for layer in router_logits:
            weights = torch.nn.functional.softmax(layer.to(device), dim=-1)
            _, chosen = torch.topk(weights, self.top_k, dim=-1)
            counts = counts + torch.bincount(chosen.reshape(-1), minlength=self.num_experts).to(torch.float32)
            probs = probs + weights.float().sum(dim=0)
            rows += int(weights.shape[0])
        stats = torch.cat([counts, torch.tensor([float(rows)], device=device)]).detach()
        if group is not None:
            dist.all_reduce(stats, group=group)  # the microbatch's whole counts and rows, over its group
        total = stats[-1]
        if float(total) == 0:
            return probs.sum() * 0.0
        fraction = stats[:-1] / total
        return self.coef * self.num_experts * torch.sum(fraction * (probs / total))


def router_microbatches(iteration: Iteration) -> list[tuple[int, ...]]:
    """The sequence ids (the plan's) of each microbatch the per-microbatch aux loss is taken over: a plan
    microbatch whose sequences are sharded over a group of several GPUs is one (the group's forward); one
    without sharding is one per GPU holding sequences (each GPU's own forward)."""
    out: list[tuple[int, ...]] = []
    for mb in iteration.microbatches:
        if len(mb.ranks) == 1 or mb.sharded:
            if mb.seq_ids:
                out.append(tuple(mb.seq_ids))
        else:
            out.extend(tuple(local) for local in mb.local if local)
    return out
