"""The worker-view document has one writer (``RankView.to_dict``) and one reader
(``rank_view_from_dict``): every view of every planner's plan reads back as an equal value, and
``rank_view`` of an iteration is the plan's view of that iteration."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from skrull.solver.errors import RequestError
from skrull.solver.planning import solve
from skrull.solver.types import Problem
from skrull.solver.worker_view import plan_rank_view, rank_view, rank_view_from_dict
from tests.conftest import allgather_planners, make_request

BATCHES = [[121, 30, 152, 19], [112, 190, 7, 1, 7], [125, 151, 113, 159, 16, 142, 23, 18, 13, 138, 112]]


@pytest.mark.parametrize("solver", allgather_planners())
def test_every_view_of_every_planner_reads_back_as_an_equal_value(solver: str) -> None:
    request = make_request(BATCHES, dp=2, cp=2, bucket=100, solver=solver, time_budget_s=0.3, deterministic=True)
    plan = solve(request)
    lengths = Problem.from_request(request).lengths
    for it in plan.iterations:
        for rank in range(plan.parallel.num_gpus):
            view = rank_view(it, lengths, parallel=plan.parallel, rank=rank)
            assert view == plan_rank_view(plan, lengths, iteration=it.index, rank=rank)
            assert view.iteration == it.index
            assert rank_view_from_dict(view.to_dict(plan_id="p")) == view


def _view_doc() -> dict[str, Any]:
    request = make_request([[10, 150]], dp=1, cp=2, bucket=100)
    plan = solve(request)
    return plan_rank_view(plan, [10, 150], iteration=0, rank=0).to_dict(plan_id="p")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("iteration",), -1, "view.iteration"),
        (("num_tokens_in_iteration",), "12", "view.num_tokens_in_iteration"),
        (("microbatches", 0), 7, "view.microbatches[0]"),
        (("microbatches", 0, "sharding"), "spiral", "view.microbatches[0].sharding"),
        (("microbatches", 0, "cu_seqlens"), [0, 5, 3], "view.microbatches[0].cu_seqlens"),
        (("microbatches", 0, "shards", 0, "ranges", 0), [9, 2], "view.microbatches[0].shards[0].ranges[0]"),
        (("microbatches", 0, "shards", 0, "length"), 2**80 * 0, "view.microbatches[0].shards[0].length"),
        (("microbatches", 0, "ranks", 0), True, "view.microbatches[0].ranks[0]"),
    ],
)
def test_a_bad_view_document_names_the_field(path: tuple[Any, ...], value: Any, field: str) -> None:
    doc = copy.deepcopy(_view_doc())
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(RequestError) as err:
        rank_view_from_dict(doc)
    assert err.value.field == field


@pytest.mark.parametrize("plan_id", [None, "abc123", "@@ranks@@0@@ranks@@", 'quote"and\\slash'])
def test_the_fast_encoding_is_the_documents_json(plan_id: str | None) -> None:
    # ranks encoded once per group must give exactly the bytes of encoding the whole document
    request = make_request([[30, 45, 7, 90, 12, 3, 60, 150, 5, 5, 8]], dp=2, cp=3, bucket=60, solver="dynamic-cp")
    plan = solve(request)
    lengths = [s for b in request.batches for s in b]
    for rank in range(6):
        view = plan_rank_view(plan, lengths, iteration=0, rank=rank)
        expected = json.dumps(view.to_dict(plan_id=plan_id), separators=(",", ":")).encode()
        assert view.to_json(plan_id=plan_id) == expected
