"""Process groups for the groups a plan uses, and the fixed-size collectives context parallelism issues.

``torch.distributed.new_group`` is collective over the whole world: every process must create the same
groups in the same order, members or not. ``GroupRegistry.for_plan`` therefore derives the list from
the plan alone (every distinct set of ranks of a microbatch that shards something over more than one
GPU, sorted), so all ranks agree without talking. A microbatch's ``ranks`` may be any subset of the
world (dynamic CP size); members are ranked inside the group in ascending global rank (the ``slot`` of
worker/layout.py), which is how ``new_group`` orders them.

Every collective here moves slot-major buffers of equal size per member (padded by the caller), since
gloo refuses uneven all-gathers and equal sizes keep NCCL on its fast path.

Test-only slow collectives: with ``SKRULL_TEST_COLLECTIVE_DELAY_MS_PER_MIB`` set (or ``set_test_delay``),
every collective here takes at least ``delay * (N-1)/N * MiB`` ms from the moment it is issued, ``MiB``
the bytes of its whole buffer (all-gather: the gathered output; reduce-scatter: its input; all-to-all:
what each member sends): the time a link of bus bandwidth ``1 / delay`` MiB per ms needs (busbw as
nccl-tests defines it). An asynchronous collective stays asynchronous: the real one runs on gloo's own
thread and ``wait`` sleeps only for what is left of the delay when it is called, so compute issued in
between overlaps it exactly as it would a slow link. It exists to prove on CPU that the cost model's
overlap is the worker's (tests/worker/test_overlap_timing.py) and to calibrate communication with a
known answer (worker/calibration.py); it is never set in training.
"""

from __future__ import annotations

import os
import time
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
    out = send.new_empty((dist.get_world_size(group) * send.shape[0], *send.shape[1:]))
    return out, _into(_all_gather_single, out, send, moved=out, group=group, async_op=async_op)


def reduce_scatter_slots(send: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> tuple[torch.Tensor, Any]:
    """Sum ``send`` (``[N * P, ...]``, slot-major) over the members; member ``i`` keeps slot ``i``."""
    out = send.new_empty((send.shape[0] // dist.get_world_size(group), *send.shape[1:]))
    return out, _into(_reduce_scatter_single, out, send, moved=send, group=group, async_op=async_op)


def all_to_all_slots(send: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> tuple[torch.Tensor, Any]:
    """Slot ``i`` of ``send`` (``[N * P, ...]``) goes to member ``i``; slot ``j`` of the result came from ``j``."""
    out = torch.empty_like(send)
    return out, _into(dist.all_to_all_single, out, send, moved=send, group=group, async_op=async_op)


def _into(
    collective: Any,
    out: torch.Tensor,
    send: torch.Tensor,
    *,
    moved: torch.Tensor,
    group: dist.ProcessGroup,
    async_op: bool,
) -> Any:
    """Run ``collective(out, send, group=, async_op=)`` (``send`` made contiguous) and return its work, slowed
    by the test-only delay (``_slowed``) as for ``moved``'s bytes: the buffer whose size is the link's busbw
    volume (the gathered output of an all-gather, the input of a reduce-scatter or an all-to-all)."""
    inp = send.contiguous()
    return _slowed(
        lambda: collective(out, inp, group=group, async_op=async_op),
        num_bytes=moved.numel() * moved.element_size(),
        group=group,
        async_op=async_op,
    )


#: The environment variable of the test-only slow collective (module doc): milliseconds per MiB of busbw.
DELAY_ENV = "SKRULL_TEST_COLLECTIVE_DELAY_MS_PER_MIB"
_MIB = float(2**20)
_delay_override: float | None = None


def set_test_delay(ms_per_mib: float | None) -> None:
    """Make every collective of this process slow by ``ms_per_mib`` (None: back to the environment's)."""
    global _delay_override
    if ms_per_mib is not None and not ms_per_mib >= 0:
        raise ValueError(f"ms_per_mib must be >= 0, got {ms_per_mib}")
    _delay_override = ms_per_mib


def injected_delay_ms_per_mib() -> float:
    """The injected delay in ms per MiB of bus traffic, 0 when none is set (the normal case)."""
    if _delay_override is not None:
        return _delay_override
    raw = os.environ.get(DELAY_ENV)
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{DELAY_ENV}={raw!r}: not a number of ms per MiB") from None
    if not value >= 0:
        raise ValueError(f"{DELAY_ENV}={raw!r}: must be >= 0")
    return value


class _DelayedWork:
    """A collective's ``Work`` that completes no earlier than ``issued + delay_s`` (the slow link)."""

    def __init__(self, work: Any, issued: float, delay_s: float) -> None:
        self.work, self.done_at = work, issued + delay_s

    def wait(self) -> bool:
        if self.work is not None:
            self.work.wait()
        left = self.done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return True


def _slowed(run: Any, *, num_bytes: int, group: dist.ProcessGroup, async_op: bool) -> Any:
    """Run the collective ``run()``; with the test-only delay set, make it last the link's time (module doc)."""
    delay = injected_delay_ms_per_mib()
    if delay <= 0:
        return run()
    size = dist.get_world_size(group)
    delay_s = delay * (size - 1) / size * num_bytes / _MIB / 1e3
    issued = time.perf_counter()
    slow = _DelayedWork(run(), issued, delay_s)
    if async_op:
        return slow
    slow.wait()
    return None


def wait(work: Any) -> None:
    if work is not None:
        work.wait()


def _all_gather_single(out: torch.Tensor, inp: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> Any:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, *, group: dist.ProcessGroup, async_op: bool) -> Any:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)
