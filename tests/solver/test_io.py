"""Requests are validated up front: each bad input gives one error naming the field and the value."""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from skrull.solver.errors import RequestError, SequenceTooLongError, UnknownProfileError, UnknownSolverError
from skrull.solver.io import plan_from_dict, plan_to_dict, read_json, request_from_dict, request_to_dict
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from tests.conftest import HAND_PROFILE

GOOD: dict[str, Any] = {
    "batches": [[1024, 530, 31000], [77, 12000]],
    "parallel": {"dp": 4, "cp": 8},
    "profile": "h100-80g/qwen2.5-0.5b",
    "solver": "skrull",
    "time_budget_s": 1.0,
    "bucket_tokens": 26000,
}


def with_(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    doc.update(changes)
    return doc


def test_contract_example_parses_with_global_ids() -> None:
    request = request_from_dict(GOOD)
    assert request.batches == ((1024, 530, 31000), (77, 12000))
    assert request.bucket_tokens == 26000
    assert request.parallel.num_gpus == 32
    plan = solve(request)
    ids = sorted(i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids)
    assert ids == [0, 1, 2, 3, 4]
    assert {i for mb in plan.iterations[1].microbatches for i in mb.seq_ids} == {3, 4}


@pytest.mark.parametrize(
    ("doc", "field", "value"),
    [
        (with_(batches=[]), "batches", []),
        (with_(batches=[[]]), "batches[0]", []),
        (with_(batches=[[5, 0]]), "batches[0][1]", 0),
        (with_(batches=[[5], [3, -2]]), "batches[1][1]", -2),
        (with_(batches=[[5, 2.5]]), "batches[0][1]", 2.5),
        (with_(batches=[[5, "7"]]), "batches[0][1]", "7"),
        (with_(batches=[[True]]), "batches[0][0]", True),
        (with_(batches="1,2"), "batches", "1,2"),
        (with_(parallel={"dp": 0, "cp": 8}), "parallel.dp", 0),
        (with_(parallel={"dp": 2, "cp": -1}), "parallel.cp", -1),
        (with_(parallel={"dp": 2}), "parallel.cp", None),
        (with_(time_budget_s=0), "time_budget_s", 0),
        (with_(bucket_tokens=0), "bucket_tokens", 0),
        (with_(backend="gurobi"), "backend", "gurobi"),
    ],
)
def test_rejects_bad_field_naming_it(doc: dict[str, Any], field: str, value: Any) -> None:
    with pytest.raises(RequestError) as err:
        request_from_dict(doc)
    assert err.value.field == field
    assert err.value.value == value
    assert field in str(err.value)


def test_rejects_sequence_longer_than_group() -> None:
    doc = with_(batches=[[10], [5, 208_001]], bucket_tokens=26000, profile=HAND_PROFILE)  # no gathered K/V
    with pytest.raises(SequenceTooLongError) as err:
        request_from_dict(doc)
    assert err.value.seq_id == 2
    assert err.value.num_tokens == 208_001
    assert err.value.limit_tokens == 8 * 26000
    assert "sequence 2" in str(err.value) and "208001" in str(err.value) and "208000" in str(err.value)


def test_accepts_sequence_exactly_group_capacity() -> None:
    request = request_from_dict(with_(batches=[[208_000]], profile=HAND_PROFILE, bucket_tokens=26000))
    assert solve(request).iterations[0].microbatches[0].sharded == (0,)


def test_the_group_capacity_is_less_the_gathered_kv_unless_ulysses_may_run_it() -> None:
    """The bundled profile charges the gathered K/V (kv / activation bytes = r) as the worker keeps it, each
    own piece's key prefix (memory.gathered_kv key_prefixes: (2N+1)/(2N) of the sharded tokens): a CP8 group
    holds in all-gather the largest S with ceil(S/8) + ceil(r * 17/16 * S) <= 26000, below 8 * 26000; with
    Ulysses allowed (8 does not divide Qwen2.5-0.5B's 14 heads, 2 does) on CP2, the whole 2 * 26000."""
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    assert profile.gathered_kv == "key_prefixes"
    r = Fraction(profile.kv_bytes_per_token) / Fraction(profile.activation_bytes_per_token)  # type: ignore[arg-type]
    limit = max(s for s in range(190_000, 208_001) if math.ceil(s / 8) + math.ceil(r * 17 * s / 16) <= 26000)
    assert limit < 208_000 - 1
    request_from_dict(with_(batches=[[limit]]))
    with pytest.raises(SequenceTooLongError) as err:
        request_from_dict(with_(batches=[[limit + 1]]))
    assert err.value.limit_tokens == limit and "gathered K/V" in str(err.value)
    both = {"parallel": {"dp": 1, "cp": 2}, "cp_modes": ["allgather", "ulysses"]}
    plan = solve(request_from_dict(with_(batches=[[52_000]], **both)))
    assert [(mb.sharded, mb.mode) for mb in plan.iterations[0].microbatches] == [((0,), "ulysses")]


def test_rejects_unknown_profile_and_solver() -> None:
    with pytest.raises(UnknownProfileError) as err:
        request_from_dict(with_(profile="a100/nope"))
    assert err.value.field == "profile" and "h100-80g/qwen2.5-0.5b" in str(err.value)
    with pytest.raises(UnknownSolverError) as err2:
        request_from_dict(with_(solver="magic"))
    assert err2.value.field == "solver" and "skrull" in str(err2.value)


def test_rejects_bad_inline_profile_field() -> None:
    bad = copy.deepcopy(HAND_PROFILE)
    bad["compute"]["ms_per_tflop"] = -1
    with pytest.raises(RequestError) as err:
        request_from_dict(with_(profile=bad))
    assert err.value.field == "profile.compute.ms_per_tflop"


def test_bucket_override_applies_over_profile() -> None:
    request = request_from_dict(
        with_(profile=HAND_PROFILE, bucket_tokens=7, batches=[[3]], parallel={"dp": 1, "cp": 1})
    )
    assert request.profile.bucket_tokens == 100
    assert request.bucket_tokens == 7
    assert solve(request).bucket_tokens == 7


def test_malformed_json_names_the_position(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"batches": [[1, 2]', encoding="utf-8")
    with pytest.raises(RequestError) as err:
        read_json(path, field="--request")
    assert "line 1" in str(err.value) and err.value.field == "--request"


def test_plan_round_trips_through_json() -> None:
    request = request_from_dict(GOOD)
    plan = solve(request)
    doc = json.loads(json.dumps(plan_to_dict(plan)))
    back = plan_from_dict(doc)
    assert plan_to_dict(back) == doc
    assert request_from_dict(request_to_dict(request)) == request


def test_sharding_mode_and_solve_stats_round_trip_and_stay_optional() -> None:
    plan = solve(request_from_dict({**GOOD, "solver": "wlb", "batches": [[30000] + [200] * 40]}))
    doc = plan_to_dict(plan)
    modes = {mb.get("sharding") for it in doc["iterations"] for mb in it["microbatches"]}
    assert modes <= {"per-sequence", "per-document"} and modes
    assert "avg_delay_iterations" in doc["solve"]["stats"]
    back = plan_from_dict(json.loads(json.dumps(doc)))
    assert [mb.sharding for it in back.iterations for mb in it.microbatches] == [
        mb.sharding for it in plan.iterations for mb in it.microbatches
    ]
    assert back.solve.stats_dict == pytest.approx(plan.solve.stats_dict, abs=1e-6)
    plain = plan_to_dict(solve(request_from_dict(GOOD)))
    assert "stats" not in plain["solve"]
    assert all("sharding" not in mb for it in plain["iterations"] for mb in it["microbatches"])


def test_plan_with_unknown_sharding_mode_names_the_field() -> None:
    doc = plan_to_dict(solve(request_from_dict(GOOD)))
    doc["iterations"][0]["microbatches"][0]["sharding"] = "striped"
    with pytest.raises(RequestError, match=r"iterations\[0\]\.microbatches\[0\]\.sharding: 'striped'"):
        plan_from_dict(doc)


def test_a_plan_given_as_a_request_is_named_for_what_it_is() -> None:
    plan_doc = plan_to_dict(solve(request_from_dict(GOOD)))
    with pytest.raises(RequestError) as err:
        request_from_dict(plan_doc)
    assert err.value.field == "schema" and err.value.value == plan_doc["schema"]
    assert "looks like a plan" in str(err.value)


@pytest.mark.parametrize(("value", "says"), [(float("nan"), "not a number"), (float("inf"), "overflows")])
def test_non_finite_numbers_given_in_process_are_named(value: float, says: str) -> None:
    with pytest.raises(RequestError) as err:
        request_from_dict(with_(time_budget_s=value))
    assert err.value.field == "time_budget_s" and says in str(err.value)


def test_a_request_without_a_budget_plans_with_its_planners_default_and_writes_none() -> None:
    from skrull.solver.budget import default_budget_s

    # 16,384 sequences at CP 64: deepspeed needs more than the one-second default, and is not refused for it
    doc = {
        "batches": [[64] * 16384],
        "parallel": {"dp": 2, "cp": 64},
        "profile": "h100-80g/qwen2.5-0.5b",
        "solver": "deepspeed",
    }
    request = request_from_dict(doc)
    assert request.time_budget_s is None
    assert request_from_dict({**doc, "time_budget_s": None}) == request  # null reads as left out, as the service
    assert request.resolved_time_budget_s == default_budget_s("deepspeed", [16384], request.parallel) > 1.0
    with pytest.raises(RequestError, match="time_budget_s"):
        solve(request_from_dict({**doc, "time_budget_s": 1.0}))
    plan = solve(request)
    assert sorted(i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids) == list(range(16384))
    # the document stays without a budget, so reading it back gives the same request
    assert "time_budget_s" not in request_to_dict(request)
    assert request_from_dict(request_to_dict(request)) == request


@pytest.mark.parametrize("solver", ["ilp", "ilp-flex"])
def test_an_exact_planner_without_a_budget_runs_until_it_proves_its_plan(solver: str) -> None:
    doc = {k: v for k, v in GOOD.items() if k != "time_budget_s"}
    request = request_from_dict({**doc, "solver": solver})
    assert request.resolved_time_budget_s == 60.0  # its cap, not the heuristics' one second
    plan = solve(request)
    assert plan.solve.status == "optimal" and plan.solve.wall_ms < 60e3
