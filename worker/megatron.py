"""Megatron-Core inputs from a rank's planned microbatches: ``PackedSeqParams`` (THD) and the token tensors.

A planned microbatch (worker/layout.py) holds, on this GPU, some sequences whole ("local") and its parts
of sequences sharded over the group's N GPUs. Megatron-Core runs one packed THD batch per forward, with
context parallelism either on over one group or off, so ``megatron_microbatches`` turns the microbatch
into what Megatron can express, in this order:

1. **local** (only when the GPU has local sequences): every local sequence whole, ``local_cp_size=1``
   and ``cp_group=None``, which tells Transformer Engine's attention to turn context parallelism off for
   this forward (megatron-core 0.16.1, ``TEDotProductAttention.forward`` in
   megatron/core/extensions/transformer_engine.py: with no ``cp_group``, ``local_cp_size`` must be 1 and
   the CP group is cleared). ``cu_seqlens_*_padded`` equal ``cu_seqlens_*`` (no padding).
2. **sharded** (when the microbatch shards sequences over N > 1 GPUs): this GPU's part of every sharded
   sequence, ``cp_group`` = the caller's process group of the microbatch's ranks and
   ``local_cp_size = N``; Transformer Engine then runs context-parallel attention over that group
   (the same code path installs it).

A microbatch whose group has one GPU ("sharded" over one GPU is whole) gives only a local item; an
empty microbatch (``equal_microbatches``) gives no item.

**Megatron's split, not the plan's.** Megatron-Core with THD + CP partitions a packed batch with
Transformer Engine's ``thd_get_partitioned_indices`` (megatron/core/utils.py
``get_thd_batch_on_this_cp_rank``): every sequence is padded at its end to a length divisible by 2N
(``cu_seqlens_*_padded``), cut into 2N equal chunks, and CP rank r holds chunks r and 2N-1-r, in that
order; sequences follow each other. Transformer Engine counts the real tokens of each chunk as
``clamp(S - k * chunk, 0, chunk)`` (``get_cu_seqlens_on_cp_rank``), so padding sits at each sequence's
end. For a sequence of S tokens, S divisible by 2N, this is exactly the project's zigzag
(solver/sharding.py). Otherwise the project's zigzag deals the S mod 2N remainder tokens round-robin over
the group, and Megatron instead pads: **this adapter produces Megatron's split** (whatever sharding mode
the plan named), so each rank holds ``2 * ceil(S / 2N)`` rows of the sequence, real tokens first. That
is up to two rows per sharded sequence more than the plan's bucket-exact count (rows of padding, or real
tokens moved towards low CP ranks), and at most 2N-1 padding rows per sequence over the group. Padding
rows carry ``pad_token_id``, their padded position as position id, label 0 and loss mask 0.

The CP rank is the GPU's rank in the process group, which orders members by ascending global rank
(``MicrobatchLayout.slot``), whatever order the plan lists ``ranks`` in.

**Tensors** are Megatron's GPT inputs for THD, batch dimension 1: ``tokens``, ``labels``,
``position_ids`` (long) and ``loss_mask`` (float), each ``[1, T]``. Labels are the dataset's aligned
labels; where they are ``IGNORE_INDEX`` (-100) the label becomes 0 and the loss mask 0, because Megatron's
cross entropy indexes the vocabulary with every label. ``cu_seqlens_q/kv`` are the global (whole-group,
unpadded) offsets of the item's sequences, ``cu_seqlens_*_padded`` the padded ones, ``max_seqlen_*`` the
longest padded sequence: what Megatron builds itself in ``get_thd_batch_on_this_cp_rank`` before
slicing.

Megatron-Core is imported only when an item is built (the optional extra ``megatron``: megatron-core
0.16.x, the newest release that installs on Python 3.11; 0.19 needs Python 3.12). docs/integrations/megatron.md
shows the training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from skrull.solver.cp_modes import ALLGATHER
from skrull.solver.errors import RequestError
from skrull.worker.layout import MicrobatchLayout
from skrull.worker.loss import IGNORE_INDEX

#: ``fetch(seq_id)``: a whole sequence's ``(input_ids, labels)``, aligned (as ``ready_microbatch`` takes).
Fetch = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
#: The caller's process groups, by the microbatch's ranks in ascending order (the group's member order).
CpGroups = Callable[[tuple[int, ...]], dist.ProcessGroup] | Mapping[tuple[int, ...], dist.ProcessGroup]

LOCAL = "local"
SHARDED = "sharded"
MEGATRON_EXTRA = "megatron"


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronMicrobatch:
    """One forward of Megatron-Core: its ``PackedSeqParams`` and this GPU's THD tensors (``[1, T]``)."""

    step: int
    #: ``"local"`` (CP off on this GPU) or ``"sharded"`` (CP over ``packed_seq_params.cp_group``)
    kind: str
    seq_ids: tuple[int, ...]
    #: real tokens of each sequence in ``seq_ids`` (whole sequences, not this GPU's part)
    seq_num_tokens: tuple[int, ...]
    #: ``megatron.core.packed_seq_params.PackedSeqParams`` (Megatron's own class)
    packed_seq_params: Any
    tokens: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """Rows on this GPU, padding included."""
        return int(self.tokens.shape[1])

    @property
    def cp_size(self) -> int:
        return int(self.packed_seq_params.local_cp_size)


def padded_num_tokens(num_tokens: int, cp_size: int) -> int:
    """``num_tokens`` rounded up to a multiple of ``2 * cp_size``: the padded length Transformer Engine's
    THD context parallelism needs (each sequence cut into 2N equal chunks)."""
    step = 2 * cp_size
    return -(-num_tokens // step) * step


def megatron_cp_ranges(num_tokens: int, cp_size: int, cp_rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The padded positions ``[start, end)`` CP rank ``cp_rank`` holds of one sequence, in row order:
    chunk ``cp_rank``, then chunk ``2 * cp_size - 1 - cp_rank`` of the padded sequence. Positions at or
    past ``num_tokens`` are padding."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank {cp_rank} outside a CP group of {cp_size}")
    chunk = padded_num_tokens(num_tokens, cp_size) // (2 * cp_size)
    late = 2 * cp_size - 1 - cp_rank
    return (cp_rank * chunk, (cp_rank + 1) * chunk), (late * chunk, (late + 1) * chunk)


def megatron_microbatches(
    layout: MicrobatchLayout,
    fetch: Fetch,
    *,
    cp_groups: CpGroups | None = None,
    device: torch.device | None = None,
    pad_token_id: int = 0,
) -> tuple[MegatronMicrobatch, ...]:
    """This GPU's Megatron-Core forwards for one planned microbatch: a local item, a sharded item, or both
    (local first), as the module docstring describes.

    ``cp_groups`` gives the process group of a sharded microbatch's ranks (a mapping or a callable keyed by
    ``tuple(sorted(ranks))``): create groups once, up front, on every rank (``torch.distributed.new_group``
    is collective), e.g. Megatron's ``parallel_state.get_context_parallel_group()`` keyed by
    ``get_context_parallel_global_ranks()``. A group whose members differ from the ranks is refused.
    """
    if layout.mode != ALLGATHER and layout.communicates:
        raise RequestError(
            f"microbatches[step={layout.step}].mode",
            layout.mode,
            "Megatron-Core's context parallelism is ring / all-gather attention: plan with cp_modes "
            f'["{ALLGATHER}"] to run under Megatron',
        )
    dev = device or torch.device("cpu")
    local_ids, local_lengths = list(layout.local_ids), list(layout.local_lengths)
    if layout.group_size == 1:  # "sharded" over one GPU: whole sequences, local work
        local_ids += [s.seq_id for s in layout.sharded]
        local_lengths += [s.num_tokens for s in layout.sharded]
    items: list[MegatronMicrobatch] = []
    if local_ids:
        items.append(_local_item(layout.step, local_ids, local_lengths, fetch, dev))
    if layout.communicates:
        group = _cp_group(layout, cp_groups)
        items.append(_sharded_item(layout, fetch, group, dev, pad_token_id))
    return tuple(items)


def megatron_iteration(
    layouts: Iterable[MicrobatchLayout],
    fetch: Fetch,
    *,
    cp_groups: CpGroups | None = None,
    device: torch.device | None = None,
    pad_token_id: int = 0,
) -> tuple[MegatronMicrobatch, ...]:
    """Every item of a rank's iteration in step order (what one ``forward_backward_func`` call consumes):
    ``megatron_microbatches`` of each layout, concatenated."""
    return tuple(
        item
        for layout in layouts
        for item in megatron_microbatches(layout, fetch, cp_groups=cp_groups, device=device, pad_token_id=pad_token_id)
    )


def megatron_packed_seq_params_class() -> type[Any]:
    """Megatron-Core's ``PackedSeqParams``, imported on first use (the optional extra ``megatron``)."""
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as error:
        raise ImportError(
            "skrull.worker.megatron needs Megatron-Core: install the extra "
            f"`pip install 'skrull[{MEGATRON_EXTRA}]'` (megatron-core 0.16.x)"
        ) from error
    return PackedSeqParams  # type: ignore[no-any-return]


# -- building the items ---------------------------------------------------------------------------------


def _sequence(fetch: Fetch, seq_id: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = fetch(seq_id)
    ids, labels = torch.as_tensor(ids).long(), torch.as_tensor(labels).long()
    if ids.dim() != 1 or ids.shape != labels.shape or ids.shape[0] != num_tokens:
        raise RequestError(
            f"fetch({seq_id})",
            [list(ids.shape), list(labels.shape)],
            f"must give input_ids and labels of {num_tokens} tokens each (the plan's length)",
        )
    return ids, labels


def _cu_seqlens(lengths: list[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _item(
    *,
    step: int,
    kind: str,
    seq_ids: list[int],
    seq_num_tokens: list[int],
    padded: list[int],
    rows: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]],
    cp_size: int,
    cp_group: Any,
    device: torch.device,
) -> MegatronMicrobatch:
    ids, labels, positions = (torch.cat(parts).to(device) for parts in rows)
    loss_mask = (labels != IGNORE_INDEX).float()
    labels = labels.masked_fill(labels == IGNORE_INDEX, 0)
    cu = _cu_seqlens(seq_num_tokens, device)
    cu_padded = cu if padded == seq_num_tokens else _cu_seqlens(padded, device)
    params = megatron_packed_seq_params_class()(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded,
        max_seqlen_q=max(padded),
        max_seqlen_kv=max(padded),
        local_cp_size=cp_size,
        cp_group=cp_group,
    )
    return MegatronMicrobatch(
        step=step,
        kind=kind,
        seq_ids=tuple(seq_ids),
        seq_num_tokens=tuple(seq_num_tokens),
        packed_seq_params=params,
        tokens=ids.unsqueeze(0),
        labels=labels.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        loss_mask=loss_mask.unsqueeze(0),
    )


def _local_item(
    step: int, seq_ids: list[int], lengths: list[int], fetch: Fetch, device: torch.device
) -> MegatronMicrobatch:
    ids, labels, positions = [], [], []
    for seq_id, n in zip(seq_ids, lengths, strict=True):
        seq_ids_t, seq_labels = _sequence(fetch, seq_id, n)
        ids.append(seq_ids_t)
        labels.append(seq_labels)
        positions.append(torch.arange(n))
    return _item(
        step=step,
        kind=LOCAL,
        seq_ids=seq_ids,
        seq_num_tokens=lengths,
        padded=lengths,
        rows=(ids, labels, positions),
        cp_size=1,
        cp_group=None,
        device=device,
    )


def _sharded_item(
    layout: MicrobatchLayout, fetch: Fetch, group: Any, device: torch.device, pad_token_id: int
) -> MegatronMicrobatch:
    cp_size, cp_rank = layout.group_size, layout.slot
    ids, labels, positions = [], [], []
    for s in layout.sharded:
        seq_ids_t, seq_labels = _sequence(fetch, s.seq_id, s.num_tokens)
        for start, end in megatron_cp_ranges(s.num_tokens, cp_size, cp_rank):
            real_end = min(end, s.num_tokens)
            pad = end - max(start, real_end)
            ids.append(torch.cat([seq_ids_t[start:real_end], torch.full((pad,), pad_token_id, dtype=torch.long)]))
            labels.append(torch.cat([seq_labels[start:real_end], torch.full((pad,), IGNORE_INDEX, dtype=torch.long)]))
            positions.append(torch.arange(start, end))
    return _item(
        step=layout.step,
        kind=SHARDED,
        seq_ids=[s.seq_id for s in layout.sharded],
        seq_num_tokens=list(layout.sharded_lengths),
        padded=[padded_num_tokens(n, cp_size) for n in layout.sharded_lengths],
        rows=(ids, labels, positions),
        cp_size=cp_size,
        cp_group=group,
        device=device,
    )


def _cp_group(layout: MicrobatchLayout, cp_groups: CpGroups | None) -> Any:
    key = layout.slot_ranks
    where = f"microbatch step {layout.step}"
    if cp_groups is None:
        raise RequestError(
            "cp_groups", None, f"{where} shards sequences over ranks {list(key)}: give their process group"
        )
    try:
        group = cp_groups[key] if isinstance(cp_groups, Mapping) else cp_groups(key)
    except KeyError:
        raise RequestError("cp_groups", list(key), f"has no process group for the ranks of {where}") from None
    if group is None:
        raise RequestError("cp_groups", list(key), f"gave no process group for the ranks of {where}")
    if dist.is_available() and isinstance(group, dist.ProcessGroup):
        members = tuple(dist.get_process_group_ranks(group))
        if members != key:
            raise RequestError(
                f"cp_groups[{tuple(key)}]", list(members), f"must be the process group of exactly ranks {list(key)}"
            )
    return group
