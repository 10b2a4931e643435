"""The process groups a planned iteration needs, created as iterations arrive.

DACP runs a sharded sequence's attention over the microbatch's group of ranks, so every group of ranks
that shares a sharded sequence needs a ``torch.distributed`` process group. ``dist.new_group`` is a
collective over the whole world: every process must create every group, members or not, in the same
order. With the node's planner process (``worker.planner.client.ProcessPlans``, the loader's default)
or in-process plans (``worker.plan_sources.LocalPlans``) every rank can read the whole plan, so each
creates the groups of an iteration in one sorted order
(``GroupRegistry.rank_sets_of``) the first time it meets them; a group is never created twice.
"""

from __future__ import annotations

from skrull.worker.collectives import GroupRegistry
from skrull.worker.dataloader import PlannedBatches, ReadyIteration
from skrull.worker.plan_sources import LocalPlans
from skrull.worker.planner.client import ProcessPlans


class IterationGroups:
    """``groups(ready)``: the registry holding every group ``ready`` needs (module doc). Call it on every
    rank for every iteration, in order, before the iteration's step."""

    def __init__(self, planned: PlannedBatches) -> None:
        self.planned = planned
        self.registry = GroupRegistry()

    def __call__(self, ready: ReadyIteration) -> GroupRegistry:
        plans = self.planned.plans
        if not isinstance(plans, LocalPlans | ProcessPlans):
            raise ValueError(
                f"planned.plans={type(plans).__name__}: process groups are created from the whole plan, which "
                "every rank reads only from the node's planner process (the loader's default) or LocalPlans"
            )
        plan = plans.plan(ready.plan_id, timeout_s=self.planned.timeout_s)
        iteration = plan.iterations[ready.iteration % self.planned.batches_per_plan]
        missing = [s for s in GroupRegistry.rank_sets_of(iteration) if s not in self.registry.groups]
        if missing:
            self.registry.groups.update(GroupRegistry.create(missing).groups)
        return self.registry
