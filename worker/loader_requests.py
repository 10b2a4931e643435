"""Turning the loader's rows into planning requests (docs/formats.md "Request").

The planned loader (worker/dataloader.py) asks for one plan per chunk of ``batches_per_plan`` global batches.
The request of a chunk is a function of the rows' lengths, the chunk's dataset indices, the indices the
previous plan left pending (carried into the chunk's first batch), the layout and the loader's options, plus
a budget that the loader agrees over the job. Keeping that function here, apart from the loader's threads,
caches and row checks, lets it be read and tested as what it is: a pure document builder.

What a request holds, field by field:

- ``batches``: each global batch's lengths, the carried sequences first in the chunk's first batch;
- ``parallel``, ``profile`` (a calibrated profile when the loader refits one), ``solver``, ``bucket_tokens``;
- ``defer`` with deferral on: ``max_sequences`` (0 for the epoch's last chunk: whatever waits runs now),
  ``max_wait`` when not 1, ``carried`` when any sequence was carried in;
- ``time_budget_s``: the option when given, else what ``budget_s`` decides for the chunk's batch sizes;
- ``equal_microbatches``, ``cp_modes`` (when not the default), ``deterministic``, each only when set, so a
  request with default settings names no more than it must (its content is its plan's key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skrull.solver.cp_modes import DEFAULT_CP_MODES
from skrull.solver.types import defers
from skrull.worker.loader_options import LoaderOptions

#: ``budget_s(batch_sizes, deferring)``: the budget in seconds for a request of batches of these sizes
#: (None: the planner's default); ``deferring`` says whether the request may defer sequences
BudgetRule = Callable[[list[int], bool], float | None]


def chunk_lengths(lengths: Sequence[int], batches: Sequence[Sequence[int]], carried: Sequence[int]) -> list[list[int]]:
    """Each global batch of a chunk as token lengths: ``batches`` are dataset indices, ``carried`` the indices
    the previous plan left pending, which run first in the chunk's first batch (they never wait twice)."""
    out = [[lengths[i] for i in batch] for batch in batches]
    out[0] = [lengths[i] for i in carried] + out[0]
    return out


def defer_field(options: LoaderOptions, *, last: bool, carried: int) -> dict[str, int] | None:
    """The request's ``defer`` object (solver/defer.py), None without deferral. The epoch's last chunk defers
    nothing, so every dataset index runs exactly once per epoch."""
    if not options.defer_max_sequences:
        return None
    field = {"max_sequences": 0 if last else options.defer_max_sequences}
    if options.defer_max_wait != 1 and not last:
        field["max_wait"] = options.defer_max_wait
    if carried:
        field["carried"] = carried
    return field


def request_document(
    options: LoaderOptions,
    *,
    batches: list[list[int]],
    dp: int,
    cp: int,
    cp_modes: Sequence[str],
    profile: str | Mapping[str, Any],
    last: bool,
    carried: int,
    budget_s: BudgetRule,
) -> dict[str, Any]:
    """The request of one chunk: ``batches`` as lengths (``chunk_lengths``), ``carried`` of them carried into
    the first, ``last`` for the epoch's last chunk (module doc for each field)."""
    doc: dict[str, Any] = {
        "batches": batches,
        "parallel": {"dp": dp, "cp": cp},
        "profile": profile,
        "solver": options.solver,
    }
    if options.bucket_tokens is not None:
        doc["bucket_tokens"] = options.bucket_tokens
    defer = defer_field(options, last=last, carried=carried)
    if defer is not None:
        doc["defer"] = defer
    budget = options.time_budget_s
    if budget is None:
        budget = budget_s([len(b) for b in batches], defers(defer["max_sequences"] if defer else None))
    if budget is not None:
        doc["time_budget_s"] = budget
    if options.equal_microbatches:
        doc["equal_microbatches"] = True
    if tuple(cp_modes) != DEFAULT_CP_MODES:
        doc["cp_modes"] = list(cp_modes)
    if options.deterministic:
        doc["deterministic"] = True
    return doc
