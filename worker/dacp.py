"""DACP attention (Skrull section 4.1, Fig. 2(d)): local sequences whole, sharded ones context-parallel.

One GPU's packed buffer holds ``n_local`` rows of local sequences, then its pieces of the sharded
sequences (worker/layout.py). Attention over it has two independent parts:

- local sequences: one varlen causal attention call, no communication;
- sharded sequences, context parallel over the microbatch's group, with one of two schemes:

  ``allgather`` (Llama 3, "The Llama 3 Herd of Models" sec. 3.3.2): every member all-gathers the K and V
  of the group's pieces, then each own piece ``[a, b)`` attends to the key prefix ``[0, b)`` of its
  sequence with bottom-right causal masking. Backward returns dQ locally and reduce-scatters the
  gradients of the gathered K/V, so every member receives the sum over the group of dK/dV for its own
  rows. Communication per member and layer: the K/V of all sharded tokens, twice (Skrull eq. 15-16).

  ``ulysses`` (DeepSpeed-Ulysses; XTuner sequence parallel): an all-to-all trades the sequence split for
  a head split (member j gets heads ``j*H/N .. (j+1)*H/N - 1`` of every sharded token), each member runs
  whole-sequence causal attention on its heads, and a second all-to-all returns the outputs; backward
  mirrors it. Needs ``H % N == 0``; key/value heads are replicated to ``lcm(H_kv, N)`` when ``H_kv % N != 0``
  (``ulysses_kv_copies``: each GPU receives exactly the K/V heads its query heads read).

Overlap (Skrull eq. 2, ``max(T_comm, T_comp(Local)) + T_comp(Dist)``): forward issues the sharded
collective asynchronously, runs the local attention, then waits; backward computes what needs no
communication first (the sharded part's gradients for ``allgather``, whose reduce-scatter then flies
during the local backward; the local backward for ``ulysses``, while the gradient all-to-all flies).

Both are one ``torch.autograd.Function`` each with explicit collectives; the attention kernels keep
their own backward (a nested autograd graph is recorded in forward and differentiated in backward), so
flash-attention, PyTorch's varlen kernel and the CPU reference all plug in unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

from skrull.solver.cp_modes import ALLGATHER, ULYSSES
from skrull.solver.cp_modes import CP_MODES as CP_MODES
from skrull.solver.errors import RequestError
from skrull.worker.collectives import all_gather_slots, all_to_all_slots, reduce_scatter_slots, wait
from skrull.worker.kernels import NO_FEATURES, AttentionKernel, Features
from skrull.worker.layout import MicrobatchLayout

if TYPE_CHECKING:
    from skrull.solver.types import Plan

CPMode = Literal["allgather", "ulysses"]  # solver.cp_modes' ALLGATHER and ULYSSES, for type hints


def refuse_unrunnable_modes(plan: Plan, *, heads: int) -> None:
    """Refuse, before the first step and on every rank alike (each holds the whole plan), a plan whose
    microbatch runs in a mode this model cannot: Ulysses over a group that does not divide its ``heads``
    attention heads (the head split). The plan's ``mode`` is what runs; no run-level setting changes it, so
    the refusal names the microbatch and its mode, and says how to plan one that runs."""
    for it in plan.iterations:
        for k, mb in enumerate(it.microbatches):
            if mb.mode == ULYSSES and mb.sharded and len(mb.ranks) > 1 and heads % len(mb.ranks):
                raise ValueError(
                    f"iteration {it.index} microbatch {k} runs {ULYSSES} over {len(mb.ranks)} GPUs, which do not "
                    f"divide the model's num_attention_heads = {heads}: plan with a profile whose heads are the "
                    f"model's (skrull derive-profile --hf-config), or allow {ALLGATHER} (cp_modes)"
                )


def _int32(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _long(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


@dataclass(frozen=True, slots=True, kw_only=True)
class DACPPlan:
    """Everything one GPU needs to run DACP attention for one microbatch (built once, used per layer)."""

    layout: MicrobatchLayout
    group: dist.ProcessGroup | None
    mode: str
    kernel: AttentionKernel
    local_cu_seqlens: torch.Tensor
    local_max_seqlen: int
    gather_index: torch.Tensor
    key_index: torch.Tensor
    piece_cu_seqlens_q: torch.Tensor
    piece_cu_seqlens_k: torch.Tensor
    piece_max_q: int
    piece_max_k: int
    sharded_cu_seqlens: torch.Tensor
    sharded_max_seqlen: int

    @classmethod
    def build(
        cls,
        layout: MicrobatchLayout,
        *,
        group: dist.ProcessGroup | None,
        kernel: AttentionKernel,
        device: torch.device,
    ) -> DACPPlan:
        # The plan's mode is what runs (what the cost model priced): to run Ulysses, plan with
        # cp_modes ["ulysses"]; no run-level setting overrides a microbatch.
        if layout.mode not in CP_MODES:
            raise RequestError("mode", layout.mode, f"unknown context-parallel mode; known: {', '.join(CP_MODES)}")
        mode = layout.mode
        if layout.communicates and group is None:
            raise ValueError(f"microbatch step {layout.step} shards over {list(layout.ranks)} but no group was given")
        if layout.communicates:
            assert group is not None
            size = dist.get_world_size(group)
            assert size == layout.group_size, f"group of {size} for a microbatch of {layout.group_size} GPUs"
            assert dist.get_rank(group) == layout.slot, "process-group rank must be the layout's slot"
        pieces_q = tuple(p.num_tokens for p in layout.pieces)
        pieces_k = tuple(p.end for p in layout.pieces)
        return cls(
            layout=layout,
            group=group if layout.communicates else None,
            mode=mode,
            kernel=kernel,
            local_cu_seqlens=_int32(layout.local_cu_seqlens, device),
            local_max_seqlen=max(layout.local_lengths, default=0),
            gather_index=_long(layout.gather_index, device),
            key_index=_long(layout.key_prefix_index, device),
            piece_cu_seqlens_q=_int32(layout.piece_cu_seqlens_q, device),
            piece_cu_seqlens_k=_int32(layout.piece_cu_seqlens_k, device),
            piece_max_q=max(pieces_q, default=0),
            piece_max_k=max(pieces_k, default=0),
            sharded_cu_seqlens=_int32(layout.sharded_cu_seqlens, device),
            sharded_max_seqlen=max(layout.sharded_lengths, default=0),
        )

    @property
    def num_local_tokens(self) -> int:
        return self.layout.num_local_tokens

    @property
    def has_sharded(self) -> bool:
        return bool(self.layout.sharded)


def dacp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: DACPPlan,
    *,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention over one GPU's packed buffer: ``q`` ``[T, H, D]``, ``k``/``v`` ``[T, H_kv, D]``.

    ``softcap`` (logit soft-capping, ``softcap * tanh(s / softcap)`` on the scores) and ``window`` (a sliding
    window of keys, Hugging Face's ``sliding_window``) apply on every path: local sequences, shard pieces
    against their gathered key prefix (whose bottom-right alignment puts each query at its global position)
    and Ulysses' whole sequences (worker/kernels.py)."""
    if q.shape[0] != plan.layout.num_tokens:
        raise ValueError(f"buffer has {q.shape[0]} rows, the microbatch layout {plan.layout.num_tokens}")
    if not plan.has_sharded and plan.group is None and q.shape[0] > 0:
        # whole sequences only: the kernel's own autograd. The CP Functions' nested graph (leaf copies in
        # forward, an autograd.grad in backward) exists to overlap collectives this microbatch does not have,
        # and costs host time in every layer of a step that is host-bound (docs/gpu-check/2026-11-26).
        cu, longest = plan.local_cu_seqlens, plan.local_max_seqlen
        return plan.kernel(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True,
            softcap=softcap, window=window,
        )  # fmt: skip
    features = Features(softcap=softcap or 0.0, window=window) if softcap or window is not None else NO_FEATURES
    fn = _AllGatherCP if plan.mode == ALLGATHER else _UlyssesCP
    # The CP Functions keep a nested graph of their own (leaf copies in forward, torch.autograd.grad in
    # backward). Under activation checkpointing, the checkpoint's saved-tensor hooks would pack that graph's
    # tensors too, and unpacking them in the nested autograd.grad (a graph task of its own) recomputes the
    # whole layer a second time, CP collectives included, inside this Function's backward, on the ranks that
    # hold shard pieces only: the group's collectives then pair up wrongly and hang (found: DP1 x CP4, a
    # rank waiting in the recomputed all-gather while its peers reduce-scatter). Kept out of the hooks, the
    # nested graph is held by the Function until backward, and the checkpoint recomputes each layer once,
    # at the same point of the backward on every rank.
    with torch.autograd.graph.saved_tensors_hooks(_kept, _kept):
        out: torch.Tensor = fn.apply(q, k, v, plan, features)  # type: ignore[no-untyped-call]
    return out


def _kept(t: torch.Tensor) -> torch.Tensor:
    """A saved-tensor hook that keeps the tensor as it is (see ``dacp_attention``)."""
    return t


def _kernel_features(features: Features) -> dict[str, Any]:
    """The kernel's keyword arguments for ``features`` (none when there are none)."""
    if not features.any:
        return {}
    return {"softcap": features.softcap or None, "window": features.window}


# --- shared pieces ---------------------------------------------------------------------------------
def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _local_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DACPPlan, features: Features
) -> tuple[Any, torch.Tensor]:
    """Local attention with its own graph: ``(saved, output)``; ``saved`` is None when there is none."""
    n = plan.num_local_tokens
    if n == 0:
        return None, q.new_zeros(0, q.shape[1], v.shape[2])
    with torch.enable_grad():
        ql, kl, vl = _leaf(q[:n]), _leaf(k[:n]), _leaf(v[:n])
        out = plan.kernel(
            ql,
            kl,
            vl,
            cu_seqlens_q=plan.local_cu_seqlens,
            cu_seqlens_k=plan.local_cu_seqlens,
            max_seqlen_q=plan.local_max_seqlen,
            max_seqlen_k=plan.local_max_seqlen,
            causal=True,
            **_kernel_features(features),
        )
    return (ql, kl, vl, out), out.detach()


def _local_backward(saved: Any, grad: torch.Tensor, shapes: tuple[torch.Size, ...]) -> tuple[torch.Tensor, ...]:
    if saved is None:
        return tuple(grad.new_zeros(0, *shape[1:]) for shape in shapes)
    ql, kl, vl, out = saved
    grads = torch.autograd.grad(out, (ql, kl, vl), grad, allow_unused=True)
    return tuple(g if g is not None else torch.zeros_like(x) for g, x in zip(grads, (ql, kl, vl), strict=True))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


Collective = Any  # (send, *, group, async_op) -> (received, work): one of worker/collectives.py's *_slots


def _issue(send: torch.Tensor | None, plan: DACPPlan, collective: Collective) -> tuple[torch.Tensor | None, Any]:
    """Start the collective on ``send`` asynchronously: ``(its output, the work to wait on)``; ``send`` itself
    on a group of one, ``(None, None)`` when nothing is sharded."""
    if send is None:
        return None, None
    if plan.group is None:
        return send, None
    received, work = collective(send, group=plan.group, async_op=True)
    return received, work


def _overlapped_forward(
    ctx: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: DACPPlan,
    features: Features,
    *,
    send: torch.Tensor | None,
    collective: Collective,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The forward both schemes share: issue the sharded part's collective on ``send`` asynchronously (None:
    nothing sharded), run the local attention under it, then wait: ``(received, local output)``. What the
    cost model's ``overlap`` section prices (docs/profiles.md): this collective hides behind the local
    attention call, nothing else. Keeps ``plan``, the input shapes and the local graph on ``ctx``."""
    ctx.plan = plan
    ctx.shapes = (q.shape, k.shape, v.shape)
    received, work = _issue(send, plan, collective)
    ctx.local_saved, out_local = _local_forward(q, k, v, plan, features)  # overlaps the collective
    wait(work)
    return received, out_local


def _overlapped_backward(
    ctx: Any, grad: torch.Tensor, *, send: torch.Tensor | None, collective: Collective
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """The backward both schemes share: issue the collective on ``send`` asynchronously, run the local
    backward under it, wait: ``(received, (dq, dk, dv) of the local rows)``."""
    plan: DACPPlan = ctx.plan
    received, work = _issue(send, plan, collective)
    grads = _local_backward(ctx.local_saved, grad[: plan.num_local_tokens], ctx.shapes)  # overlaps the collective
    wait(work)
    return received, grads


def _backward_start(ctx: Any, grad: torch.Tensor) -> tuple[DACPPlan, int, int, torch.Tensor]:
    """Where both schemes' backward start: the plan, its local row count ``n``, this GPU's piece count (the
    rows after ``n``) and the output gradient, contiguous."""
    plan: DACPPlan = ctx.plan
    n = plan.num_local_tokens
    return plan, n, ctx.shapes[0][0] - n, grad.contiguous()


class _ShardedCP(torch.autograd.Function):
    """The forward both schemes share: the rows are the local part (the first ``plan.num_local_tokens``) and
    then this GPU's shard pieces; the scheme's collective carries what ``send_rows`` makes of the pieces
    (nothing when nothing is sharded) while the local attention runs under it (``_overlapped_forward``), and
    ``piece_outputs`` turns what arrived into the pieces' outputs, which follow the local ones. A subclass
    is one scheme: its collective, those two steps and its backward."""

    @classmethod
    def forward(
        cls, ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DACPPlan, features: Features
    ) -> torch.Tensor:
        send, collective = cls.send_rows(ctx, q, k, v, plan)
        received, out_local = _overlapped_forward(ctx, q, k, v, plan, features, send=send, collective=collective)
        return torch.cat([out_local, cls.piece_outputs(ctx, q, v, plan, features, received)])

    @staticmethod
    def send_rows(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DACPPlan
    ) -> tuple[torch.Tensor | None, Collective]:
        """What this GPU sends of its pieces (None when nothing is sharded) and the scheme's asynchronous
        collective that carries it (worker/collectives.py), looked up as the forward runs, so what is bound
        to the module's name then is what runs."""
        raise NotImplementedError

    @staticmethod
    def piece_outputs(
        ctx: Any, q: torch.Tensor, v: torch.Tensor, plan: DACPPlan, features: Features, received: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError


class _AllGatherCP(_ShardedCP):
    """Llama-3 all-gather context parallelism for the sharded part, varlen attention for the local part."""

    @staticmethod
    def send_rows(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DACPPlan
    ) -> tuple[torch.Tensor | None, Collective]:
        """This GPU's pieces' K and V, padded to the group's piece size (``[P, 2, H_kv, D]``), all-gathered."""
        pieces = slice(plan.num_local_tokens, None)
        send = torch.stack([k[pieces], v[pieces]], dim=1) if plan.has_sharded else None
        return None if send is None else _pad_rows(send, plan.layout.padded_piece_tokens), all_gather_slots

    @staticmethod
    def piece_outputs(
        ctx: Any, q: torch.Tensor, v: torch.Tensor, plan: DACPPlan, features: Features, gathered: torch.Tensor | None
    ) -> torch.Tensor:
        n = plan.num_local_tokens
        num_pieces = q.shape[0] - n
        ctx.gathered_shape = None if gathered is None else gathered.shape
        ctx.sharded_saved = None
        if gathered is None or num_pieces == 0:
            return q.new_zeros(0, q.shape[1], v.shape[2])
        # the key prefix of every piece, packed for the varlen kernel, is the leaf: the gathered buffer
        # itself is not kept to backward (its gradient is the prefixes' gradient summed back by row), so
        # what this layer keeps of the group's K/V is the prefixes the kernel keeps, once
        keys = _leaf(gathered.index_select(0, plan.key_index))
        del gathered
        with torch.enable_grad():
            qp = _leaf(q[n:])
            out = plan.kernel(
                qp,
                keys[:, 0],
                keys[:, 1],
                cu_seqlens_q=plan.piece_cu_seqlens_q,
                cu_seqlens_k=plan.piece_cu_seqlens_k,
                max_seqlen_q=plan.piece_max_q,
                max_seqlen_k=plan.piece_max_k,
                causal=True,
                **_kernel_features(features),
            )
        ctx.sharded_saved = (qp, keys, out)
        return out.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        plan, n, num_pieces, grad = _backward_start(ctx, grad)
        q_shape, k_shape, _ = ctx.shapes
        dg = None
        dq_pieces = grad.new_zeros(num_pieces, *q_shape[1:])
        if ctx.gathered_shape is not None:
            if ctx.sharded_saved is not None:
                qp, keys, out = ctx.sharded_saved
                dqp, dkeys = torch.autograd.grad(out, (qp, keys), grad[n:], allow_unused=True)
                dq_pieces = dqp if dqp is not None else torch.zeros_like(qp)
                dg = grad.new_zeros(ctx.gathered_shape)
                if dkeys is not None:  # index_select's backward: each prefix row's gradient back to its row
                    dg.index_add_(0, plan.key_index, dkeys)
            else:  # this member holds no piece but the group still reduces
                dg = grad.new_zeros(ctx.gathered_shape)
        d_own, (dql, dkl, dvl) = _overlapped_backward(ctx, grad, send=dg, collective=reduce_scatter_slots)
        if d_own is not None:
            dk_pieces, dv_pieces = d_own[:num_pieces, 0], d_own[:num_pieces, 1]
        else:
            dk_pieces = grad.new_zeros(0, *k_shape[1:])
            dv_pieces = grad.new_zeros(0, *k_shape[1:])
        return torch.cat([dql, dq_pieces]), torch.cat([dkl, dk_pieces]), torch.cat([dvl, dv_pieces]), None, None


def ulysses_kv_copies(kv_heads: int, group_size: int) -> int:
    """How many copies of each K/V head a Ulysses exchange sends: ``lcm(kv, N) / kv``, so the group's
    ``lcm(kv, N)`` heads split evenly, ``lcm / N`` per GPU, and GPU r's heads are exactly those its query
    heads use (``attention`` is a multiple of both kv and N, so of the lcm: grouped-query attention over
    ``attention / N`` query heads and ``lcm / N`` K/V heads pairs query head i with K/V head
    ``i // (attention / lcm)``, the model's own pairing). 1 when N divides kv: nothing is replicated. The
    cost model charges the extra copies (``comm_a2a.kv_bytes_per_token``, solver/cost.py)."""
    return math.lcm(kv_heads, group_size) // kv_heads


class _UlyssesCP(_ShardedCP):
    """All-to-all (head-split) context parallelism for the sharded part, varlen for the local part."""

    @staticmethod
    def send_rows(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DACPPlan
    ) -> tuple[torch.Tensor | None, Collective]:
        """This GPU's pieces' Q, K and V split by heads, one slot per GPU of the group, each padded to the
        group's piece size (``[N * P, hq + 2 hk, D]``; K/V heads copied ``ulysses_kv_copies`` times),
        exchanged all-to-all."""
        if not plan.has_sharded:
            return None, all_to_all_slots
        n = plan.num_local_tokens
        num_pieces = q.shape[0] - n
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        size = plan.layout.group_size
        if heads % size != 0:
            raise RequestError("cp_mode", "ulysses", f"needs heads ({heads}) divisible by the group size ({size})")
        k_rep = ulysses_kv_copies(kv_heads, size)
        kp, vp = k[n:], v[n:]
        if k_rep > 1:
            kp, vp = kp.repeat_interleave(k_rep, dim=1), vp.repeat_interleave(k_rep, dim=1)
        hq, hk = heads // size, kp.shape[1] // size
        send = torch.cat(
            [q[n:].reshape(num_pieces, size, hq, dim), *(t.reshape(num_pieces, size, hk, dim) for t in (kp, vp))],
            dim=2,
        )  # [T_p, N, hq + 2 hk, D]
        padded = plan.layout.padded_piece_tokens
        ctx.heads_split = (hq, hk, k_rep, padded)
        return _pad_rows(send, padded).transpose(0, 1).reshape(size * padded, hq + 2 * hk, dim), all_to_all_slots

    @staticmethod
    def piece_outputs(
        ctx: Any, q: torch.Tensor, v: torch.Tensor, plan: DACPPlan, features: Features, recv: torch.Tensor | None
    ) -> torch.Tensor:
        num_pieces = q.shape[0] - plan.num_local_tokens
        heads, dim = q.shape[1], q.shape[2]
        size = plan.layout.group_size
        ctx.sharded_saved = None
        if recv is None:
            return q.new_zeros(0, heads, v.shape[2])
        hq, hk, _, padded = ctx.heads_split
        with torch.enable_grad():
            r = _leaf(recv)
            full = r.index_select(0, plan.gather_index)
            out_full = plan.kernel(
                full[:, :hq],
                full[:, hq : hq + hk],
                full[:, hq + hk :],
                cu_seqlens_q=plan.sharded_cu_seqlens,
                cu_seqlens_k=plan.sharded_cu_seqlens,
                max_seqlen_q=plan.sharded_max_seqlen,
                max_seqlen_k=plan.sharded_max_seqlen,
                causal=True,
                **_kernel_features(features),
            )
        ctx.sharded_saved = (r, out_full)
        back = out_full.new_zeros(size * padded, hq, dim).index_copy(0, plan.gather_index, out_full.detach())
        back = _exchange(back, plan)
        return back.reshape(size, padded, hq, dim)[:, :num_pieces].transpose(0, 1).reshape(num_pieces, heads, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        plan, n, num_pieces, grad = _backward_start(ctx, grad)
        q_shape, k_shape, _ = ctx.shapes
        heads, kv_heads, dim = q_shape[1], k_shape[1], q_shape[2]
        size = plan.layout.group_size
        g_send = None
        if ctx.sharded_saved is not None:
            hq, hk, k_rep, padded = ctx.heads_split
            g_send = _pad_rows(grad[n:].reshape(num_pieces, size, hq, dim), padded)
            g_send = g_send.transpose(0, 1).reshape(size * padded, hq, dim)
        g_recv, (dql, dkl, dvl) = _overlapped_backward(ctx, grad, send=g_send, collective=all_to_all_slots)
        if g_recv is None:
            empty_k = grad.new_zeros(0, *k_shape[1:])
            return (
                torch.cat([dql, grad.new_zeros(0, heads, dim)]),
                torch.cat([dkl, empty_k]),
                torch.cat([dvl, empty_k]),
                None,
                None,
            )
        r, out_full = ctx.sharded_saved
        (dr,) = torch.autograd.grad(out_full, (r,), g_recv.index_select(0, plan.gather_index))
        back = _exchange(dr.contiguous(), plan)  # slot j: grads of my rows for head chunk j
        back = back.reshape(size, padded, hq + 2 * hk, dim)[:, :num_pieces].transpose(0, 1)  # [T_p, N, hc, D]
        dq_p = back[:, :, :hq].reshape(num_pieces, heads, dim)
        dk_p = back[:, :, hq : hq + hk].reshape(num_pieces, size * hk, dim)
        dv_p = back[:, :, hq + hk :].reshape(num_pieces, size * hk, dim)
        if k_rep > 1:
            dk_p = dk_p.reshape(num_pieces, kv_heads, k_rep, dim).sum(dim=2)
            dv_p = dv_p.reshape(num_pieces, kv_heads, k_rep, dim).sum(dim=2)
        return torch.cat([dql, dq_p]), torch.cat([dkl, dk_p]), torch.cat([dvl, dv_p]), None, None


def _exchange(send: torch.Tensor, plan: DACPPlan) -> torch.Tensor:
    if plan.group is None:
        return send
    out, _ = all_to_all_slots(send, group=plan.group, async_op=False)
    return out
