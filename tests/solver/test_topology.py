"""The cost model with the profile's ``topology`` and ``overlap`` sections: estimates equal an independent
reference written here from CONTRACT.md ("Cluster topology and gathered K/V") and the overlap form of the
project (docs/formats.md, "Overlap"), per microbatch and per iteration, for every planner; the bounds stay
below every valid plan; a plan's microbatches say which link they used; without ``topology`` and
``overlap`` nothing changes."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.io import plan_from_dict, plan_to_dict, read_json, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.profile import profile_from_dict
from skrull.solver.search.bound import sharding_floor_ms
from skrull.solver.types import Microbatch, Request
from skrull.solver.validate import plan_problems
from tests.conftest import HAND_PROFILE, allgather_planners

MIB = 2.0**20
ROOT = Path(__file__).resolve().parents[2]
REQUESTS_DIR = ROOT / "examples" / "requests"


# --- an independent reference --------------------------------------------------------------------------
def reference_link(doc: dict[str, Any], ranks: list[int]) -> str | None:
    """CONTRACT.md: a group is on one node when every rank's ``g // gpus_per_node`` is the same."""
    if "topology" not in doc:
        return None
    per_node = doc["topology"]["gpus_per_node"]
    return "intra_node" if len({g // per_node for g in ranks}) == 1 else "inter_node"


def reference_comm_ms(doc: dict[str, Any], ranks: list[int], tokens: int, mode: str) -> float:
    """``T_comm`` / ``T_a2a`` of CONTRACT.md, with the link of the ranks when the profile has a topology."""
    n = len(ranks)
    if tokens == 0 or n == 1:
        return 0.0
    link = reference_link(doc, ranks)
    if mode == "allgather":
        comm = doc["comm"]
        if link is None:
            return comm["ms_per_mib"] * tokens * comm["bytes_per_token"] / MIB + comm["fixed_ms"]
        ms_per_mib = doc["topology"][link]["allgather_ms_per_mib"]
        return ms_per_mib * (n - 1) / n * tokens * comm["bytes_per_token"] / MIB + comm["fixed_ms"]
    a2a = doc["comm_a2a"]
    kv = doc["heads"]["kv"]
    volume = a2a["bytes_per_token"] + a2a.get("kv_bytes_per_token", 0.0) * (math.lcm(kv, n) // kv - 1)
    if link is None:
        return a2a["ms_per_mib"] * (tokens / n) * volume / MIB + a2a["fixed_ms"]
    ms_per_mib = doc["topology"][link]["alltoall_ms_per_mib"]
    return ms_per_mib * (n - 1) / n * (tokens / n) * volume / MIB + a2a["fixed_ms"]


#: forward's share of an attention call's FLOPs (FlashAttention-2: backward 2.5x forward) and of a dense
#: layer's (backward 2x forward)
ATTENTION_FORWARD = 2.0 / 7.0
LINEAR_FORWARD = 1.0 / 3.0


def reference_hidden_forward_share(doc: dict[str, Any], n: int, mode: str) -> float:
    """What runs forward of the hidden communication: all-gather's gather against its reduce-scatter (the
    same bytes); Ulysses' Q/K/V exchange (with ``lcm(kv, N)/kv`` copies of each K/V head) against the
    grad-output exchange, in heads."""
    if mode != "ulysses":
        return 0.5
    q, kv = doc["heads"]["attention"], doc["heads"]["kv"]
    qkv = q + 2 * kv * (math.lcm(kv, n) // kv)
    return qkv / (qkv + q)


def reference_microbatch_ms(
    doc: dict[str, Any], ranks: list[int], local: list[list[int]], sharded: list[int], mode: str = "allgather"
) -> float:
    """The contract's DACP form, or with ``overlap`` the worker's, per direction: ``max(H_f, A_f) + max(H_b,
    A_b) + X + (T_comp(local_j) - A_j) + T_comp(sharded / N)``, H the hidden and X the exposed part of the
    communication, A_j what hides it, each split into forward and backward."""
    c = doc["compute"]
    a = c["ms_per_tflop"] / 1e12

    def flops(s: int) -> float:
        return c["flops_per_token"] * s + c["flops_per_token_sq"] * s * s

    def t_comp(f: float) -> float:
        return a * f + c["fixed_ms"] if f > 0 else 0.0

    n = len(ranks)
    comm = reference_comm_ms(doc, ranks, sum(sharded), mode)
    dist = t_comp(sum(flops(s) for s in sharded) / n)
    overlap = doc.get("overlap")
    worst = 0.0
    for lens in local:
        own = t_comp(sum(flops(s) for s in lens))
        if overlap is None:
            worst = max(worst, max(comm, own) + dist)
            continue
        exposed = overlap.get("ulysses_exposed", 0.0) * comm if mode == "ulysses" else 0.0
        hidden = comm - exposed
        h_fwd = reference_hidden_forward_share(doc, n, mode) * hidden
        attention = a * c["flops_per_token_sq"] * sum(s * s for s in lens)
        if not lens:
            a_fwd = a_bwd = 0.0
        elif overlap.get("with", "local_attention") == "local_attention":
            a_fwd, a_bwd = ATTENTION_FORWARD * attention, (1 - ATTENTION_FORWARD) * attention
        else:
            rest = own - attention  # the linear compute and the fixed cost
            a_fwd = ATTENTION_FORWARD * attention + LINEAR_FORWARD * rest
            a_bwd = own - a_fwd
        t_j = max(h_fwd, a_fwd) + max(hidden - h_fwd, a_bwd) + exposed + (own - a_fwd - a_bwd) + dist
        worst = max(worst, t_j)
    return doc["microbatch_ms"] + worst


def reference_iteration_ms(doc: dict[str, Any], microbatches: list[tuple[list[int], float]], gpus: int) -> float:
    per_gpu = [0.0] * gpus
    for ranks, t in microbatches:
        for g in ranks:
            per_gpu[g] += t
    return max(per_gpu)


# --- profiles -------------------------------------------------------------------------------------------
def topology_doc(gpus_per_node: int, intra: float, inter: float, a2a_scale: float = 1.1) -> dict[str, Any]:
    return {
        "gpus_per_node": gpus_per_node,
        "intra_node": {"allgather_ms_per_mib": intra, "alltoall_ms_per_mib": intra * a2a_scale},
        "inter_node": {"allgather_ms_per_mib": inter, "alltoall_ms_per_mib": inter * a2a_scale},
        "source": "test figures",
    }


@st.composite
def profiles(draw: st.DrawFn, *, ulysses: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(HAND_PROFILE)
    doc["comm"]["ms_per_mib"] = draw(st.sampled_from([0.001, 0.02, 0.3]))
    if draw(st.booleans()):
        intra = draw(st.sampled_from([0.0005, 0.004, 0.05]))
        doc["topology"] = topology_doc(draw(st.integers(1, 8)), intra, intra * draw(st.sampled_from([1.0, 8.0, 40.0])))
    if draw(st.booleans()):
        doc["overlap"] = {
            "with": draw(st.sampled_from(["local_attention", "local_compute"])),
            "ulysses_exposed": draw(st.sampled_from([0.0, 0.5, 1.0])),
            "source": "test",
        }
    if ulysses:
        doc["heads"] = {"attention": 8, "kv": 2}
        doc["comm_a2a"] = {"bytes_per_token": 2**19, "ms_per_mib": 0.01, "fixed_ms": 0.4, "kv_bytes_per_token": 2**17}
    return doc


@st.composite
def microbatches(draw: st.DrawFn) -> tuple[list[int], list[list[int]], list[int]]:
    n = draw(st.sampled_from([1, 2, 4, 8]))
    start = draw(st.integers(0, 3)) * n
    ranks = list(range(start, start + n))
    lengths = st.integers(1, 5000)
    local = [draw(st.lists(lengths, max_size=3)) for _ in range(n)]
    sharded = draw(st.lists(lengths, max_size=3)) if n > 1 else []
    return ranks, local, sharded


# --- per microbatch -------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(profiles(ulysses=True), microbatches(), st.sampled_from(["allgather", "ulysses"]))
def test_a_microbatch_costs_what_the_reference_says(
    doc: dict[str, Any], mb: tuple[list[int], list[list[int]], list[int]], mode: str
) -> None:
    ranks, local, sharded = mb
    model = CostModel(profile_from_dict(doc))
    if mode == "ulysses" and (len(ranks) == 1 or not sharded):
        mode = "allgather"
    got = model.microbatch_time_ms(local, sharded, mode, link=model.link_of(ranks))
    assert got == pytest.approx(reference_microbatch_ms(doc, ranks, local, sharded, mode), rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(profiles(ulysses=True), microbatches())
def test_overlap_never_prices_a_microbatch_below_the_plain_form(
    doc: dict[str, Any], mb: tuple[list[int], list[list[int]], list[int]]
) -> None:
    # hiding less than all the local compute can only cost more: the plain form's bounds stay valid
    ranks, local, sharded = mb
    plain = {k: v for k, v in doc.items() if k != "overlap"}
    for mode in ("allgather", "ulysses") if len(ranks) > 1 and sharded else ("allgather",):
        with_overlap = reference_microbatch_ms(doc, ranks, local, sharded, mode)
        assert with_overlap >= reference_microbatch_ms(plain, ranks, local, sharded, mode) - 1e-9


def test_a_cp16_group_over_two_nodes_is_priced_inter_node_and_an_aligned_cp8_intra_node() -> None:
    doc = copy.deepcopy(HAND_PROFILE)
    doc["topology"] = topology_doc(8, 0.00271, 0.0208)
    model = CostModel(profile_from_dict(doc))
    assert model.link_of(range(16)) == "inter_node"
    assert model.link_of(range(8)) == "intra_node"
    assert model.link_of(range(8, 16)) == "intra_node"
    assert model.link_of(range(4, 12)) == "inter_node"  # CP8 not aligned: across the node boundary
    tokens = 65536
    cp16 = model.t_comm_ms(tokens, 16, link=model.link_of(range(16)))
    cp8 = model.t_comm_ms(tokens, 8, link=model.link_of(range(8)))
    assert cp16 == pytest.approx(0.0208 * 15 / 16 * tokens + 0.2)  # bytes_per_token is one MiB
    assert cp8 == pytest.approx(0.00271 * 7 / 8 * tokens + 0.2)
    # the same sequence, the same microbatch shape: only the link differs
    t16 = model.microbatch_time_ms([[] for _ in range(16)], [tokens], link="inter_node")
    t16_intra = model.microbatch_time_ms([[] for _ in range(16)], [tokens], link="intra_node")
    assert t16 - t16_intra == pytest.approx((0.0208 - 0.00271) * 15 / 16 * tokens)


def test_a_plan_names_each_microbatchs_link_and_the_validator_checks_it() -> None:
    doc = copy.deepcopy(HAND_PROFILE)
    doc["topology"] = topology_doc(2, 0.001, 0.01)
    request = request_from_dict(
        {
            "batches": [[150, 40, 30, 90, 12, 180]],
            "parallel": {"dp": 1, "cp": 4},
            "profile": {**doc, "memory": {"bucket_tokens": 60}},
            "solver": "skrull",
        }
    )
    plan = solve(request)
    links = {mb.link for it in plan.iterations for mb in it.microbatches}
    assert links == {"inter_node"}  # the one CP group of four spans two nodes of two
    again = plan_from_dict(plan_to_dict(plan))
    assert [mb.link for it in again.iterations for mb in it.microbatches] == [
        mb.link for it in plan.iterations for mb in it.microbatches
    ]
    assert plan_problems(again, request) == []
    wrong = _with_link(plan, "intra_node")
    assert any("link 'intra_node' != 'inter_node'" in p for p in plan_problems(wrong, request))
    no_topology = dataclasses.replace(
        request, profile=profile_from_dict(HAND_PROFILE | {"memory": {"bucket_tokens": 60}})
    )
    assert any("link 'inter_node' != None" in p for p in plan_problems(plan, no_topology))


def _with_link(plan: Any, link: str) -> Any:
    its = tuple(
        dataclasses.replace(it, microbatches=tuple(dataclasses.replace(mb, link=link) for mb in it.microbatches))
        for it in plan.iterations
    )
    return dataclasses.replace(plan, iterations=its)


def test_a_microbatch_link_that_is_no_link_is_refused_naming_the_field() -> None:
    doc = plan_to_dict(solve(request_from_dict(read_json(f"{REQUESTS_DIR}/tiny-cpu-dp2-cp2.json"))))
    doc["iterations"][0]["microbatches"][0]["link"] = "ethernet"
    with pytest.raises(RequestError, match="link"):
        plan_from_dict(doc)


# --- overlap section ------------------------------------------------------------------------------------
def test_the_overlap_section_round_trips_and_bad_values_name_the_field() -> None:
    doc = {**HAND_PROFILE, "overlap": {"with": "local_attention", "ulysses_exposed": 0.5, "source": "worker/dacp.py"}}
    profile = profile_from_dict(doc)
    assert profile.overlap is not None and profile.overlap.ulysses_exposed == 0.5
    assert profile_from_dict(profile.to_dict()) == profile
    for bad, field in (
        ({"with": "everything"}, "profile.overlap.with"),
        ({"ulysses_exposed": 1.5}, "profile.overlap.ulysses_exposed"),
        ({"ulysses_exposed": -0.1}, "profile.overlap.ulysses_exposed"),
        ({"ulysses_exposed": "half"}, "profile.overlap.ulysses_exposed"),
        ({"source": 3}, "profile.overlap.source"),
    ):
        with pytest.raises(RequestError, match=field.replace(".", r"\.")):
            profile_from_dict({**HAND_PROFILE, "overlap": bad})
    with pytest.raises(RequestError, match=r"profile\.overlap"):
        profile_from_dict({**HAND_PROFILE, "overlap": [0.5]})


def test_local_compute_with_nothing_exposed_is_the_plain_form_where_one_side_wins_both_directions() -> None:
    plain = CostModel(profile_from_dict(HAND_PROFILE))
    same = CostModel(profile_from_dict({**HAND_PROFILE, "overlap": {"with": "local_compute"}}))
    # communication far below (or far above) the local compute in forward and in backward alike
    for local, sharded in (([[30, 5], []], [70]), ([[90], [10, 10]], [40, 3]), ([[9], [8]], [])):
        assert same.microbatch_time_ms(local, sharded) == pytest.approx(plain.microbatch_time_ms(local, sharded))
    slow = {**HAND_PROFILE, "comm": {"bytes_per_token": 2**20, "ms_per_mib": 1.0, "fixed_ms": 0.0}}
    plain, same = (
        CostModel(profile_from_dict(slow)),
        CostModel(profile_from_dict({**slow, "overlap": {"with": "local_compute"}})),
    )
    assert same.microbatch_time_ms([[5], [5]], [400]) == pytest.approx(plain.microbatch_time_ms([[5], [5]], [400]))


def test_at_the_crossover_each_direction_hides_its_own_share_only() -> None:
    # all-gather of C = 50 ms against local attention of A = 50 ms on each GPU: the worker hides C/2 behind
    # forward's 2/7 of A and C/2 behind backward's 5/7, so the GPU waits 25 + 250/7 ms, not max(C, A) = 50
    doc = {
        **HAND_PROFILE,
        "compute": {"flops_per_token": 0.0, "flops_per_token_sq": 1e10, "ms_per_tflop": 2.0, "fixed_ms": 0.0},
        "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.5, "fixed_ms": 0.0},
        "microbatch_ms": 0.0,
        "overlap": {"with": "local_attention"},
    }
    model = CostModel(profile_from_dict(doc))
    a = 2.0 / 1e12
    attention = a * 1e10 * 50 * 50  # 50 ms
    comm = 0.5 * 100  # 50 ms
    dist = a * 1e10 * 100 * 100 / 2
    got = model.microbatch_time_ms([[50], [50]], [100])
    assert got == pytest.approx(comm / 2 + attention * 5 / 7 + dist)
    one_max = max(comm, attention) + dist
    assert got - one_max == pytest.approx(attention * 3 / 14)  # 17/14 of the one max before the sharded compute
    assert got == pytest.approx(reference_microbatch_ms(doc, [0, 1], [[50], [50]], [100]))


def test_local_attention_exposes_the_non_attention_local_compute() -> None:
    # one GPU hides a long all-gather behind its local attention only: the rest of its compute follows it
    doc = {**HAND_PROFILE, "comm": {"bytes_per_token": 2**20, "ms_per_mib": 1.0, "fixed_ms": 0.0}}
    model = CostModel(profile_from_dict({**doc, "overlap": {"with": "local_attention"}}))
    plain = CostModel(profile_from_dict(doc))
    a = 2.0 / 1e12
    local_ms = a * (1e9 * 50 + 1e5 * 50 * 50) + 0.5
    attention_ms = a * 1e5 * 50 * 50
    comm_ms = 1.0 * 30
    dist = a * (1e9 * 30 + 1e5 * 900) / 2 + 0.5
    assert plain.microbatch_time_ms([[50], []], [30]) == pytest.approx(3.0 + max(comm_ms, local_ms) + dist)
    expected = 3.0 + max(comm_ms, attention_ms) + (local_ms - attention_ms) + dist
    assert model.microbatch_time_ms([[50], []], [30]) == pytest.approx(expected)


# --- plans: every planner, estimates, bounds, every sequence once ---------------------------------------
@st.composite
def topology_requests(draw: st.DrawFn) -> Request:
    dp = draw(st.integers(1, 4))
    cp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    bucket = draw(st.integers(20, 300))
    doc = draw(profiles())
    doc["memory"] = {"bucket_tokens": bucket}
    limit = cp * bucket
    length = st.one_of(st.integers(1, max(1, bucket // 2)), st.integers(1, limit))
    batches = draw(st.lists(st.lists(length, min_size=1, max_size=24), min_size=1, max_size=2))
    return request_from_dict({"batches": batches, "parallel": {"dp": dp, "cp": cp}, "profile": doc})


BUDGETED = ("ilp", "ilp-flex", "auto")
FAST = tuple(n for n in allgather_planners() if n not in BUDGETED)


def check_plan_against_reference(request: Request, solver: str) -> None:
    plan = solve(dataclasses.replace(request, solver=solver))
    assert plan_problems(plan, request) == []
    doc = request.profile.to_dict()
    doc["memory"]["bucket_tokens"] = request.bucket_tokens
    lengths = [s for b in request.batches for s in b]
    placed = sorted(i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids)
    assert sorted(placed + list(plan.pending)) == list(range(len(lengths)))
    cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)
    for it in plan.iterations:
        priced = []
        for mb in it.microbatches:
            ref = reference_microbatch_ms(
                doc,
                list(mb.ranks),
                [[lengths[i] for i in ids] for ids in mb.local],
                [lengths[i] for i in mb.sharded],
                mb.mode,
            )
            assert mb.estimated_ms == pytest.approx(ref, rel=1e-9, abs=1e-9)
            assert mb.link == reference_link(doc, list(mb.ranks))
            priced.append((list(mb.ranks), ref))
        ref_it = reference_iteration_ms(doc, priced, request.parallel.num_gpus)
        assert it.estimated_ms == pytest.approx(ref_it, rel=1e-9, abs=1e-9)
        ran = [lengths[i] for mb in it.microbatches for i in mb.seq_ids]
        # no plan beats the bounds: this one included
        assert it.lower_bound_ms <= it.estimated_ms + 1e-9
        assert sharding_floor_ms(ran, cost, request.parallel) <= it.estimated_ms + 1e-9
    if plan.solve.bound_ms is not None:
        assert plan.solve.bound_ms <= plan.estimated_ms + 1e-9


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology_requests(), st.sampled_from(FAST))
def test_every_planner_with_topology_and_overlap_matches_the_reference(request: Request, solver: str) -> None:
    check_plan_against_reference(request, solver)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology_requests(), st.sampled_from(BUDGETED))
def test_budgeted_planners_with_topology_and_overlap_match_the_reference(request: Request, solver: str) -> None:
    check_plan_against_reference(dataclasses.replace(request, time_budget_s=0.3, deterministic=True), solver)


# --- without topology, as before ------------------------------------------------------------------------
def _halved_topology(doc: dict[str, Any]) -> dict[str, Any]:
    """A topology equal to the profile's single bandwidth on a group of two: ``(N-1)/N = 1/2`` of twice
    ``ms_per_mib`` (exact in floating point), every link alike."""
    out = copy.deepcopy(doc)
    ag = 2 * doc["comm"]["ms_per_mib"]
    a2a = 2 * doc["comm_a2a"]["ms_per_mib"] if "comm_a2a" in doc else ag
    link = {"allgather_ms_per_mib": ag, "alltoall_ms_per_mib": a2a}
    out["topology"] = {"gpus_per_node": 1, "intra_node": link, "inter_node": dict(link), "source": "test"}
    return out


@pytest.mark.parametrize("solver", ["skrull", "wlb", "packed", "verl-kk", "deepspeed", "dynamic-cp"])
def test_a_topology_equal_to_the_single_bandwidth_plans_exactly_as_without(solver: str) -> None:
    # on CP2 groups a topology whose links are twice ms_per_mib prices every microbatch as the single
    # bandwidth does: the same plan and estimates, each microbatch now naming its link
    doc = read_json(f"{REQUESTS_DIR}/tiny-cpu-dp2-cp2.json")
    doc = {**doc, "solver": solver, "deterministic": True, "time_budget_s": 2.0}
    before = plan_to_dict(solve(request_from_dict(doc)))
    after = plan_to_dict(solve(request_from_dict({**doc, "profile": _halved_topology(doc["profile"])})))
    for it in after["iterations"]:
        for mb in it["microbatches"]:
            assert mb.pop("link") == ("intra_node" if len(mb["ranks"]) == 1 else "inter_node")
    for b, a in zip(before["iterations"], after["iterations"], strict=True):
        assert a["microbatches"] == b["microbatches"]
        assert a["estimated_ms"] == b["estimated_ms"]
        # the layout-free bound prices groups of 2..G GPUs under the topology's (N-1)/N: its own figure,
        # still below the plan; the static one has no communication
        assert a["lower_bound_ms"] <= a["estimated_ms"]
        assert a["static_bound_ms"] == b["static_bound_ms"]
    assert after["solve"]["objective_ms"] == before["solve"]["objective_ms"]
    assert after["solve"]["status"] == before["solve"]["status"]
    if after["solve"]["bound_ms"] is not None:
        assert after["solve"]["bound_ms"] <= after["solve"]["objective_ms"] + 1e-9


@pytest.mark.parametrize("name", ["contract-example.json", "tiny-cpu-dp2-cp2.json", "mooncake-dp4-cp8.json"])
def test_without_topology_no_microbatch_names_a_link(name: str) -> None:
    doc = {**read_json(f"{REQUESTS_DIR}/{name}"), "solver": "skrull"}
    request = request_from_dict(doc)
    if request.profile.topology is not None:
        request = dataclasses.replace(request, profile=dataclasses.replace(request.profile, topology=None))
    plan = solve(request)
    assert all(mb.link is None for it in plan.iterations for mb in it.microbatches)
    assert all("link" not in mb for it in plan_to_dict(plan)["iterations"] for mb in it["microbatches"])


def test_bounds_hold_for_a_cluster_whose_inter_node_link_is_the_cheaper() -> None:
    # an odd profile: the bounds take the cheapest link any group of that size may use, never the aligned one
    doc = copy.deepcopy(HAND_PROFILE)
    doc["comm"]["ms_per_mib"] = 0.5
    doc["topology"] = topology_doc(2, 0.5, 0.001)
    doc["memory"] = {"bucket_tokens": 40}
    request = request_from_dict({"batches": [[150, 150, 10, 10, 150]], "parallel": {"dp": 1, "cp": 4}, "profile": doc})
    for solver in ("skrull", "dynamic-cp", "hydraulis"):
        check_plan_against_reference(request, solver)


def test_microbatch_link_defaults_to_none() -> None:
    mb = Microbatch(step=0, ranks=(0,), local=((0,),), sharded=(), estimated_ms=1.0)
    assert mb.link is None


# --- the worked example of docs/planners.md -------------------------------------------------------------
PLANNERS_DOC = ROOT / "docs" / "planners.md"


EXAMPLE = REQUESTS_DIR / "llama2-7b-2x64k-two-nodes.json"


def example_profile(*, topology: bool) -> dict[str, Any]:
    """The example request's profile (Llama-2-7B on H100, 8 GPUs a node, NVLink at 360 GB/s and InfiniBand
    at 45 GB/s per GPU), or the same without its topology."""
    doc: dict[str, Any] = read_json(EXAMPLE)["profile"]
    if not topology:
        doc.pop("topology")
    return doc


def test_the_worked_example_table_is_what_the_cost_model_computes() -> None:
    text = PLANNERS_DOC.read_text(encoding="utf-8")
    table = text.split("<!-- topology-example:microbatch -->", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:-1] for line in table.strip().splitlines()[2:]]
    shown = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows}
    with_links = CostModel(profile_from_dict(example_profile(topology=True)), bucket_tokens=8192)
    one_bandwidth = CostModel(profile_from_dict(example_profile(topology=False)), bucket_tokens=8192)
    tokens = 65536

    def cells(model: CostModel, n: int, link: str | None) -> list[str]:
        out = []
        for mode in ("allgather", "ulysses"):
            comm = model.comm_ms(tokens, n, mode, link=link)
            total = model.microbatch_time_ms([[] for _ in range(n)], [tokens], mode, link=link)
            out.append(f"{comm:.1f} / {total:.1f}")
        return out

    assert shown["CP8, GPUs 0-7"] == ["intra_node", *cells(with_links, 8, with_links.link_of(range(8)))]
    assert shown["CP16, GPUs 0-15"] == ["inter_node", *cells(with_links, 16, with_links.link_of(range(16)))]
    assert shown["CP16, one 360 GB/s bandwidth (no topology)"] == ["-", *cells(one_bandwidth, 16, None)]


def test_the_worked_example_plans_two_long_sequences_on_groups_inside_the_nodes() -> None:
    text = " ".join(PLANNERS_DOC.read_text(encoding="utf-8").split())

    def plan(solver: str, *, topology: bool) -> Any:
        doc = {**read_json(EXAMPLE), "profile": example_profile(topology=topology), "solver": solver}
        request = request_from_dict(doc)
        out = solve(request)
        assert plan_problems(out, request) == []
        return out

    best = plan("auto", topology=True)
    groups = sorted((mb.ranks, mb.mode, mb.link) for it in best.iterations for mb in it.microbatches)
    assert groups == [(tuple(range(8)), "ulysses", "intra_node"), (tuple(range(8, 16)), "ulysses", "intra_node")]
    static = plan("skrull", topology=True)
    assert [len(mb.ranks) for it in static.iterations for mb in it.microbatches] == [16]
    assert best.estimated_ms < static.estimated_ms
    flat = plan("skrull", topology=False)
    for figure in (best.estimated_ms, static.estimated_ms, flat.estimated_ms):
        assert f"{figure:,.1f} ms" in text


def test_the_service_schema_keeps_a_microbatchs_link() -> None:
    from skrull.api.schemas import PlanModel

    doc = copy.deepcopy(HAND_PROFILE)
    doc["topology"] = topology_doc(1, 0.001, 0.01)
    request = request_from_dict(
        {"batches": [[150, 40, 30]], "parallel": {"dp": 2, "cp": 2}, "profile": doc, "solver": "skrull"}
    )
    plan = plan_to_dict(solve(request))
    assert PlanModel.model_validate(plan).model_dump(by_alias=True, exclude_unset=True) == plan


@st.composite
def mixed_mode_requests(draw: st.DrawFn) -> Request:
    """Requests allowing both modes, on a profile that can plan Ulysses, with topology and/or overlap."""
    dp = draw(st.integers(1, 2))
    cp = draw(st.sampled_from([2, 4, 8]))
    bucket = draw(st.integers(20, 200))
    doc = draw(profiles(ulysses=True))
    doc["memory"] = {"bucket_tokens": bucket}
    length = st.one_of(st.integers(1, max(1, bucket // 2)), st.integers(1, cp * bucket))
    batch = draw(st.lists(length, min_size=1, max_size=16))
    return request_from_dict(
        {
            "batches": [batch],
            "parallel": {"dp": dp, "cp": cp},
            "profile": doc,
            "cp_modes": ["allgather", "ulysses"],
            "time_budget_s": 0.3,
            "deterministic": True,
        }
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_mode_requests(), st.sampled_from(["skrull", "auto", "xtuner", "ilp", "ilp-flex"]))
def test_planners_choosing_modes_with_topology_and_overlap_match_the_reference(request: Request, solver: str) -> None:
    check_plan_against_reference(request, solver)


# --- the exact models against exhaustive enumeration, near the crossover ----------------------------------
#: Attention, linear compute and communication of the same order for sequences of tens of tokens (attention
#: 0.02 * S^2 ms, linear 0.2 * S ms, all-gather 2 ms per sharded token, the all-to-all 4 per token of T/N) and
#: a small overhead, so the per-direction overlap decides which plan is best; hundreds of ms a microbatch, so
#: the exact models' integer coefficients (TIME_SCALE units of 0.1 us) round far below their tolerance.
CROSSOVER_PROFILE: dict[str, Any] = {
    "name": "crossover",
    "compute": {"flops_per_token": 1e8, "flops_per_token_sq": 1e7, "ms_per_tflop": 2000.0, "fixed_ms": 10.0},
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 2.0, "fixed_ms": 10.0},
    "heads": {"attention": 8, "kv": 2},
    "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 4.0, "fixed_ms": 20.0},
    "memory": {"bucket_tokens": 100},
    "microbatch_ms": 50.0,
}


class ReferencePricing:
    """The enumeration's pricing (tests/solver/ilp/brute_force.py) by this file's reference, not the cost
    model: memory and which modes run from ``CostModel``, every time from ``reference_microbatch_ms``."""

    def __init__(self, doc: dict[str, Any], model: CostModel) -> None:
        self.doc, self.model = doc, model

    def mode_fits(self, group_size: int, mode: str) -> bool:
        return self.model.mode_fits(group_size, mode)

    def fits(self, local: list[list[int]], sharded: list[int]) -> bool:
        return self.model.fits(local, sharded)

    def link_of(self, ranks: Any) -> None:
        return None

    def microbatch_time_ms(self, local: list[list[int]], sharded: list[int], mode: str, *, link: None) -> float:
        return reference_microbatch_ms(self.doc, list(range(len(local))), local, sharded, mode)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 200), min_size=1, max_size=4),
    st.sampled_from([(1, 2), (2, 2), (1, 4)]),
    st.integers(60, 100),
    st.sampled_from([("allgather",), ("allgather", "ulysses")]),
    st.sampled_from(["local_attention", "local_compute"]),
    st.sampled_from(["ilp", "ilp-flex"]),
)
def test_the_exact_models_optimum_with_per_direction_overlap_equals_exhaustive_enumeration(
    lengths: list[int], layout: tuple[int, int], bucket: int, modes: tuple[str, ...], scope: str, solver: str
) -> None:
    from skrull.solver.planners.exact_flexible import flexible_groups
    from tests.solver.ilp.brute_force import flexible_optimum_ms, optimum_ms

    dp, cp = layout
    lengths = [min(s, cp * bucket) for s in lengths]
    doc = {**CROSSOVER_PROFILE, "memory": {"bucket_tokens": bucket}, "overlap": {"with": scope, "ulysses_exposed": 0.5}}
    request = request_from_dict(
        {"batches": [lengths], "parallel": {"dp": dp, "cp": cp}, "profile": doc, "solver": solver,
         "cp_modes": list(modes), "time_budget_s": 30.0, "deterministic": True}
    )  # fmt: skip
    plan = solve(request)
    assert plan_problems(plan, request) == []
    check_plan_against_reference(request, solver)
    pricing: Any = ReferencePricing(doc, CostModel(request.profile, bucket_tokens=bucket))
    if solver == "ilp":
        best = optimum_ms(lengths, pricing, dp=dp, cp=cp, modes=modes)
    else:
        # the aligned blocks and any group the warm start brought in (the exact model's groups)
        used = {mb.ranks for it in plan.iterations for mb in it.microbatches}
        groups = sorted(set(flexible_groups(request.parallel)) | used)
        best = flexible_optimum_ms(lengths, pricing, groups, dp * cp, modes=modes)
    assert plan.solve.status == "optimal"
    # the exact model's answer is the cost model's estimate of its plan, and that is the enumerated optimum
    assert plan.solve.objective_ms == pytest.approx(plan.estimated_ms, rel=1e-9)
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= best + 1e-9


def test_the_overlap_worked_example_of_docs_profiles_is_what_the_cost_model_computes() -> None:
    text = (ROOT / "docs" / "profiles.md").read_text(encoding="utf-8").split("<!-- overlap-example -->", 1)[1]
    text = " ".join(text.split("\n\n### ", 1)[0].split())
    doc = read_json(ROOT / "profiles" / "h100-80g__llama2-7b.json")
    model = CostModel(profile_from_dict(doc))
    ranks = list(range(8))
    local, sharded = [[2880]] * 8, [16384]
    got = model.microbatch_time_ms(local, sharded, link=model.link_of(ranks))
    assert got == pytest.approx(reference_microbatch_ms(doc, ranks, local, sharded), rel=1e-12)
    c = doc["compute"]
    attention = c["ms_per_tflop"] / 1e12 * c["flops_per_token_sq"] * 2880**2
    comm = reference_comm_ms(doc, ranks, 16384, "allgather")
    for figure in (attention, comm, attention * 2 / 7, attention * 5 / 7, comm / 2, got):
        assert f"{figure:.2f} ms" in text, figure
    # the single max over both directions, what the model priced before
    one_max = got - (max(comm / 2, attention * 2 / 7) + max(comm / 2, attention * 5 / 7) - max(comm, attention))
    assert f"{one_max:.2f} ms" in text
