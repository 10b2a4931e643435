"""Plans in Ulysses for the worker's tests: the plan's ``mode`` is what runs (no run-level override), so a
test that runs a placement in Ulysses marks its microbatches so, as planning with ``cp_modes ["ulysses"]``
marks every microbatch that shards over two or more GPUs."""

from __future__ import annotations

import dataclasses

from skrull.solver.cp_modes import ULYSSES
from skrull.solver.types import Plan


def all_ulysses(plan: Plan) -> Plan:
    """``plan`` with every microbatch that shards over two or more GPUs in Ulysses (the others as they are)."""
    return dataclasses.replace(
        plan,
        iterations=tuple(
            dataclasses.replace(
                it,
                microbatches=tuple(
                    dataclasses.replace(mb, mode=ULYSSES) if mb.sharded and len(mb.ranks) > 1 else mb
                    for mb in it.microbatches
                ),
            )
            for it in plan.iterations
        ),
    )


def run_in(plan: Plan, mode: str) -> Plan:
    """``plan`` as a case runs it: all in Ulysses for ``ulysses``, else as planned (its Ulysses microbatches,
    if any, stay Ulysses: nothing turns a planned mode back)."""
    return all_ulysses(plan) if mode == ULYSSES else plan
