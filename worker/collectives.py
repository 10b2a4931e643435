"""Process groups for the groups a plan uses, and the fixed-size collectives context parallelism issues.

``torch.distributed.new_group`` is collective over the whole world: every process must create the same
groups in the same order, members or not. ``GroupRegistry.for_plan`` therefore derives the list from
the plan alone (every distinct set of ranks of a microbatch that shards something over more than one
GPU, sorted), so all ranks agree without talking. A microbatch's ``ranks`` may be any subset of the
world (dynamic CP size); members are ranked inside the group in ascending global rank (the ``slot`` of
worker/layout.py), which is how ``new_group`` orders them.

Every collective here moves slot-major buffers of equal size per member (padded by the caller), since
gloo refuses uneven all-gathers and equal sizes keep NCCL on its fast path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from skrull.solver.types import Iteration, Plan


@dataclass(slots=True)
class GroupRegistry:
    """The process group of each rank set (sorted tuple of global ranks) this process may use."""

    groups: dict[tuple[int, ...], dist.ProcessGroup | None] = field(default_factory=dict)

    @staticmethod
    def rank_sets(plan: Plan) -> tuple[tuple[int, ...], ...]:
        """Sorted rank sets of every microbatch that needs collectives, in a deterministic order."""
        sets = {
            tuple(sorted(mb.ranks))
            for it in plan.iterations
            for mb in it.microbatches
            if len(mb.ranks) > 1 and mb.sharded
        }
        return tuple(sorted(sets, key=lambda s: (len(s), s)))

    @staticmethod
    def rank_sets_of(iteration: Iteration) -> tuple[tuple[int, ...], ...]:
        """``rank_sets`` of one iteration (groups created as iterations arrive, in the same order)."""
        sets = {tuple(sorted(mb.ranks)) for mb in iteration.microbatches if len(mb.ranks) > 1 and mb.sharded}
        return tuple(sorted(sets, key=lambda s: (len(s), s)))

    @classmethod
    def create(cls, rank_sets: Iterable[Sequence[int]]) -> GroupRegistry:
        """Create one group per rank set, on every process of the world, in the given order."""
        registry = cls()
        world = dist.get_world_size()
        me = dist.get_rank()
        for ranks in rank_sets:
            key = tuple(sorted(ranks))
            if len(key) == world:
                group: dist.ProcessGroup | None = dist.group.WORLD
            else:
                group = dist.new_group(ranks=list(key))
            registry.groups[key] = group if me in key else None
        return registry

    @classmethod
    def for_plan(cls, plan: Plan) -> GroupRegistry:
        return cls.create(cls.rank_sets(plan))

    def get(self, ranks: Sequence[int]) -> dist.ProcessGroup:
        key = tuple(sorted(ranks))
        group = self.groups.get(key)
        if group is None:
            raise KeyError(f"no process group for ranks {list(key)} on this process (not created or not a member)")
        return group


def all_gather_slots(send: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> tuple[torch.Tensor, Any]:
    """Gather ``send`` (``[P, ...]``) from every member into ``[N * P, ...]``, slot-major."""
    size = dist.get_world_size(group)
    out = send.new_empty((size * send.shape[0], *send.shape[1:]))
    work = _all_gather_single(out, send.contiguous(), group=group, async_op=async_op)
    return out, work


def reduce_scatter_slots(send: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> tuple[torch.Tensor, Any]:
    """Sum ``send`` (``[N * P, ...]``, slot-major) over the members; member ``i`` keeps slot ``i``."""
    size = dist.get_world_size(group)
    out = send.new_empty((send.shape[0] // size, *send.shape[1:]))
    work = _reduce_scatter_single(out, send.contiguous(), group=group, async_op=async_op)
    return out, work


def all_to_all_slots(send: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> tuple[torch.Tensor, Any]:
    """Slot ``i`` of ``send`` (``[N * P, ...]``) goes to member ``i``; slot ``j`` of the result came from ``j``."""
    out = torch.empty_like(send)
    work = dist.all_to_all_single(out, send.contiguous(), group=group, async_op=async_op)
    return out, work


def wait(work: Any) -> None:
    if work is not None:
        work.wait()


def _all_gather_single(out: torch.Tensor, inp: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> Any:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> Any:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)
