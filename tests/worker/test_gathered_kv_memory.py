"""What an all-gather microbatch keeps from forward to backward, measured, against the model's charge.

Here one sharded layer runs forward on one process (the group's collective replaced by its result: a GPU
of a group of N holds the same tensors), and every tensor its backward will need is collected: the ones
the CP Function holds, and the saved tensors of its nested graphs (attention kernels with a
flash-attention-like contract: they keep their inputs and output, nothing of size query x key). Of those,
the ones that are not the GPU's own activations (its q, k, v and attention outputs) are the gathered K/V
it keeps.

What the worker keeps (worker/dacp.py): the key prefix ``[0, end)`` of every piece it holds, gathered
and laid out for the varlen kernel (``key_prefix_index``): ``sum over its pieces of end`` tokens of K/V.
Under the default zigzag split (piece p and 2N-1-p of 2N chunks) that is ``S * (2N+1) / (2N)`` tokens
of a sequence of S on every GPU but the middle one (whose two chunks merge into one piece), plus, where
2N does not divide S, at most ``(S mod 2N) * (2N-1)/(2N)`` tokens (each remainder token dealt to a GPU
at or before this one moves this GPU's chunk ends by one); under the contiguous split GPU j keeps
``end`` of its block, at most S (GPU N-1: exactly S).

The contract's charge, ``(N-1)/N * sum(sharded S)``, is below that (x2.5 at N=2, x1.5 at N=4, x1.21 at
N=8, x1.10 at N=16 under zigzag). A profile with ``memory.gathered_kv: key_prefixes`` (what
derive-profile writes) is charged ``ceil(r * (2N+1) * T / (2N))`` bucket tokens per GPU
(``CostModel.gathered_kv_factor``): here, with r = 1 (one bucket token is one token of K/V), that is
exactly what the worker keeps under zigzag when 2N divides every sequence, within the remainder tokens
otherwise, and an upper bound under contiguous sharding (over by ``T/(2N)`` at most: 25% at N=2, 3% at
N=16).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from skrull.solver.cost import CostModel
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.solver.sharding import group_ranges, position_ranges
from skrull.worker.dacp import DACPPlan, dacp_attention
from skrull.worker.kernels import AttentionKernel, select_kernel
from skrull.worker.layout import MicrobatchLayout, ShardedSequence

CPU = torch.device("cpu")
HEADS, KV_HEADS, DIM = 4, 2, 8
FP32 = 4
#: K and V of one token of one layer: the profile's kv_bytes_per_token for this one-layer model
KV_BYTES_PER_TOKEN = 2 * KV_HEADS * DIM * FP32


class _FlashLike(torch.autograd.Function):
    """A varlen attention that keeps what flash-attention keeps (q, k, v, out), and recomputes in backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any) -> torch.Tensor:
        ctx.args = args
        with torch.no_grad():
            out = select_kernel(CPU, torch.float32).fn(q, k, v, *args)
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, _ = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            out = select_kernel(CPU, torch.float32).fn(*leaves, *ctx.args)
            grads = torch.autograd.grad(out, leaves, grad)
        return (*grads, *(None for _ in ctx.args))


FLASH_LIKE = AttentionKernel(name="flash-like", fn=lambda q, k, v, *args: _FlashLike.apply(q, k, v, *args))


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    return []


def kept_tensors(out: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor the backward of ``out``'s CP Function holds: its own and its nested graphs' saved ones."""
    node = out.grad_fn
    assert node is not None
    held = _tensors(getattr(node, "sharded_saved", None)) + _tensors(getattr(node, "local_saved", None))
    kept = list(held)
    seen: set[int] = set()
    stack = [t.grad_fn for t in held if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        kept += _tensors(getattr(fn, "saved_tensors", None))
        kept += [t for name in dir(fn) if name.startswith("_saved_") for t in _tensors(getattr(fn, name, None))]
        stack += [nxt for nxt, _ in fn.next_functions]
    return kept


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def gathered_kv_bytes_kept(
    local: tuple[int, ...], sharded: tuple[int, ...], *, group_size: int, position: int, sharding: str = "zigzag"
) -> int:
    """Bytes of saved storage, beyond the GPU's own activations, one sharded all-gather layer keeps, the
    sharded sequences cut by ``sharding`` (solver/sharding.py, as the worker's layout cuts them)."""
    ranges = group_ranges(sharding, sharded, group_size)
    layout = MicrobatchLayout(
        step=0,
        ranks=tuple(range(group_size)),
        position=position,
        local_ids=tuple(range(len(local))),
        local_lengths=local,
        sharded=tuple(ShardedSequence(seq_id=100 + i, num_tokens=s, ranges=ranges[i]) for i, s in enumerate(sharded)),
    )
    plan = _plan(layout)
    rows = layout.num_tokens
    q = torch.randn(rows, HEADS, DIM, requires_grad=True)
    k = torch.randn(rows, KV_HEADS, DIM, requires_grad=True)
    v = torch.randn(rows, KV_HEADS, DIM, requires_grad=True)
    out = dacp_attention(q, k, v, plan)
    node = out.grad_fn
    assert node is not None
    own = {_storage(t)[0] for t in (q, k, v)}
    own |= {_storage(t)[0] for t in _tensors(getattr(node, "local_saved", None))[3:]}  # the local output
    sharded_saved = _tensors(getattr(node, "sharded_saved", None))
    if sharded_saved:
        own.add(_storage(sharded_saved[-1])[0])  # the pieces' attention output: own tokens' activation
    # the plan's index tensors are built once per microbatch and shared by its layers: not this layer's
    own |= {_storage(t)[0] for t in vars_of(plan) if isinstance(t, torch.Tensor)}
    storages = {_storage(t) for t in kept_tensors(out)}
    kept = sum(nbytes for ptr, nbytes in storages if ptr not in own)
    out.sum().backward()  # what was kept is what backward needs: it still runs
    return kept


def vars_of(plan: DACPPlan) -> list[Any]:
    return [getattr(plan, f.name) for f in dataclasses.fields(plan)]


def _plan(layout: MicrobatchLayout) -> DACPPlan:
    """The plan of ``layout`` on one process standing for its GPU of the group (collectives: ``_one_gpu``)."""

    def ints(values: tuple[int, ...], dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype)

    fake_group: Any = object()
    return DACPPlan(
        layout=layout,
        group=fake_group,
        mode="allgather",
        kernel=FLASH_LIKE,
        local_cu_seqlens=ints(layout.local_cu_seqlens),
        local_max_seqlen=max(layout.local_lengths, default=0),
        gather_index=ints(layout.gather_index, torch.long),
        key_index=ints(layout.key_prefix_index, torch.long),
        piece_cu_seqlens_q=ints(layout.piece_cu_seqlens_q),
        piece_cu_seqlens_k=ints(layout.piece_cu_seqlens_k),
        piece_max_q=max((p.num_tokens for p in layout.pieces), default=0),
        piece_max_k=max((p.end for p in layout.pieces), default=0),
        sharded_cu_seqlens=ints(layout.sharded_cu_seqlens),
        sharded_max_seqlen=max(layout.sharded_lengths, default=0),
    )


@pytest.fixture(autouse=True)
def _one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's collectives on one process: the all-gather returns N slots (a group of N returns as many
    rows, whatever they hold), the reduce-scatter keeps the first."""
    from skrull.worker import dacp

    sizes: dict[str, int] = {}

    def gather(send: torch.Tensor, *, group: Any, async_op: bool) -> tuple[torch.Tensor, None]:
        return send.repeat(sizes["n"], *([1] * (send.dim() - 1))), None

    def scatter(send: torch.Tensor, *, group: Any, async_op: bool) -> tuple[torch.Tensor, None]:
        return send[: send.shape[0] // sizes["n"]].clone(), None

    original = dacp._overlapped_forward

    def forward(ctx: Any, q: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sizes["n"] = args[2].layout.group_size
        return original(ctx, q, *args, **kwargs)

    monkeypatch.setattr(dacp, "all_gather_slots", gather)
    monkeypatch.setattr(dacp, "reduce_scatter_slots", scatter)
    monkeypatch.setattr(dacp, "_overlapped_forward", forward)


def key_prefix_tokens(sharded: tuple[int, ...], *, group_size: int, position: int, sharding: str = "zigzag") -> int:
    """``sum over this GPU's pieces of end``: the K/V tokens the worker keeps (module doc)."""
    return sum(end for pieces in position_ranges(sharding, sharded, group_size, position) for _, end in pieces)


def contract_charge_tokens(sharded: tuple[int, ...], *, group_size: int) -> float:
    """The contract's gathered K/V charge, in tokens of K/V: ``(N-1)/N * sum(sharded S)``."""
    return (group_size - 1) / group_size * sum(sharded)


def key_prefixes_model(gathered: str | None = "key_prefixes") -> CostModel:
    """The model of a profile whose K/V and activation bytes per token are equal (r = 1: a bucket token is
    a token of K/V), with ``memory.gathered_kv`` = gathered (what derive-profile writes)."""
    doc = load_profile("h100-80g/qwen2.5-0.5b").to_dict()
    memory = {**doc["memory"], "kv_bytes_per_token": KV_BYTES_PER_TOKEN}
    memory["activation_bytes_per_token"] = KV_BYTES_PER_TOKEN
    memory.pop("gathered_kv", None)
    if gathered is not None:
        memory["gathered_kv"] = gathered
    profile: Profile = profile_from_dict({**doc, "memory": memory})
    return CostModel(profile)


def remainder_slack_tokens(sharded: tuple[int, ...], *, group_size: int) -> float:
    """The most a zigzag GPU keeps beyond ``(2N+1)/(2N) * S`` of a sequence: ``(S mod 2N) * (2N-1)/(2N)``
    (module doc), summed over the sharded sequences."""
    n2 = 2 * group_size
    return sum((s % n2) * (n2 - 1) / n2 for s in sharded)


#: (local, sharded, N): every sharded length a multiple of 2N in the first six, remainders in the rest.
CASES = [
    ((64,), (256,), 2),
    ((), (256,), 2),
    ((32, 32), (128, 256), 2),
    ((64,), (512,), 4),
    ((), (1024,), 8),
    ((), (1024,), 16),
    ((16,), (257, 131), 2),
    ((), (1029, 70), 4),
    ((8,), (515,), 8),
    ((), (1001,), 16),
]


@pytest.mark.parametrize(("local", "sharded", "group_size"), CASES)
@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
def test_the_worker_keeps_the_key_prefix_of_each_piece(
    local: tuple[int, ...], sharded: tuple[int, ...], group_size: int, sharding: str
) -> None:
    for position in range(group_size):
        kept = gathered_kv_bytes_kept(local, sharded, group_size=group_size, position=position, sharding=sharding)
        tokens = key_prefix_tokens(sharded, group_size=group_size, position=position, sharding=sharding)
        assert kept == tokens * KV_BYTES_PER_TOKEN, (position, kept, tokens * KV_BYTES_PER_TOKEN)


@pytest.mark.parametrize(("local", "sharded", "group_size"), CASES)
def test_the_key_prefixes_charge_is_what_the_worker_keeps_under_zigzag(
    local: tuple[int, ...], sharded: tuple[int, ...], group_size: int
) -> None:
    """The most any GPU of the group keeps equals the charge when 2N divides every sharded length, and is
    within the remainder tokens of it otherwise (module doc); never more than that."""
    n = group_size
    kept = [gathered_kv_bytes_kept(local, sharded, group_size=n, position=p) // KV_BYTES_PER_TOKEN for p in range(n)]
    charge = key_prefixes_model().gathered_kv_tokens(sum(sharded), n)
    assert charge == -(-(2 * n + 1) * sum(sharded) // (2 * n))
    slack = remainder_slack_tokens(sharded, group_size=n)
    if slack == 0:
        assert max(kept) == charge, (kept, charge)
    assert all(k <= charge + slack for k in kept), (kept, charge, slack)
    assert max(kept) >= charge - 1  # tight: the rule does not charge more than a GPU keeps, up to rounding


@pytest.mark.parametrize(("local", "sharded", "group_size"), CASES)
def test_the_key_prefixes_charge_bounds_what_the_worker_keeps_under_contiguous_sharding(
    local: tuple[int, ...], sharded: tuple[int, ...], group_size: int
) -> None:
    """GPU j keeps the end of its block of each sequence, at most S; the last GPU exactly S. The charge
    ``(2N+1)/(2N) * T`` is above it by ``T/(2N)`` (rounded up) for that GPU."""
    n = group_size
    kept = [
        gathered_kv_bytes_kept(local, sharded, group_size=n, position=p, sharding="contiguous") // KV_BYTES_PER_TOKEN
        for p in range(n)
    ]
    charge = key_prefixes_model().gathered_kv_tokens(sum(sharded), n)
    assert max(kept) == kept[-1] == sum(sharded)
    assert charge - max(kept) == -(-sum(sharded) // (2 * n))


@pytest.mark.parametrize(("local", "sharded", "group_size"), CASES)
def test_the_contracts_rule_charges_less_than_the_worker_keeps(
    local: tuple[int, ...], sharded: tuple[int, ...], group_size: int
) -> None:
    """A profile without ``memory.gathered_kv`` (the contract's rule): kept / charged = (2N+1) / (2(N-1))
    under the zigzag split (2.5 at N=2, 1.5 at N=4, 1.21 at N=8, 1.10 at N=16), within the remainders."""
    n = group_size
    kept = max(gathered_kv_bytes_kept(local, sharded, group_size=n, position=p) for p in range(n))
    charged = contract_charge_tokens(sharded, group_size=n)
    assert key_prefixes_model(None).gathered_kv_tokens(sum(sharded), n) == math.ceil(charged - 1e-9)
    expected = charged * (2 * n + 1) / (2 * (n - 1))
    slack = remainder_slack_tokens(sharded, group_size=n)
    assert expected - 1 <= kept / KV_BYTES_PER_TOKEN <= expected + slack
