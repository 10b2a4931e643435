"""Without a ``torch.distributed`` group (ranks given explicitly, several of them) the loaders of a job cannot
agree on a budget derived from the step; each request then asks for the planner's minimum for it, which every
rank computes alike from the request (found: the planner's 1 s default made a 100 ms loop wait 575 ms per
iteration, 6.85x the loop fed with plans made beforehand)."""

from __future__ import annotations

import random

from skrull.solver.types import Parallel
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.plan_sources import LocalPlans
from skrull.worker.planner.budget import unagreed_budget_s


def test_ranks_without_a_group_ask_every_request_with_the_same_small_budget() -> None:
    rng = random.Random(1)
    lengths = [rng.choice([100, 900, 3000, 12000]) for _ in range(256)]
    rows = [list(range(n)) for n in lengths]
    docs = []
    for rank in range(4):
        planned = PlannedBatches(
            rows,
            lengths,
            LoaderOptions(rank=rank, dp=2, cp=2, global_batch_size=64, profile="h100-80g/qwen2.5-0.5b", prefetch=0),
            plans=LocalPlans(),
        )  # fmt: skip
        docs.append([planned.request_document(chunk) for chunk in range(len(planned.batches))])
        planned.close()
    assert all(d == docs[0] for d in docs)  # the same requests, budgets included: the same plans everywhere
    for doc in docs[0]:
        want = unagreed_budget_s("auto", [len(b) for b in doc["batches"]], Parallel(dp=2, cp=2))
        assert want is not None and 0 < want < 1.0  # below the planner's 1 s default
        assert doc["time_budget_s"] == want
    given = PlannedBatches(
        rows,
        lengths,
        LoaderOptions(
            rank=0, dp=2, cp=2, global_batch_size=64, profile="h100-80g/qwen2.5-0.5b", prefetch=0, time_budget_s=0.5
        ),
        plans=LocalPlans(),
    )  # fmt: skip
    assert given.request_document(0)["time_budget_s"] == 0.5  # a budget given is the budget
    given.close()
