"""The timeline SVG read back as XML: one lane per GPU, every microbatch on every GPU of its group, slot
widths proportional to estimated_ms, the DACP split and bucket use as the reference model says."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.io import parse_profile
from skrull.solver.planning import solve
from skrull.solver.reports.render import AXIS_PX, LABEL_CHAR_PX, iteration_timeline, plan_timelines, render_svg
from skrull.solver.types import Parallel, Plan, Request

SVG_NS = "{http://www.w3.org/2000/svg}"
PROFILE = parse_profile("h100-80g/qwen2.5-0.5b")


def make_request(batches: list[list[int]], *, dp: int = 2, cp: int = 4, solver: str = "skrull") -> Request:
    return Request(
        batches=tuple(tuple(b) for b in batches), parallel=Parallel(dp=dp, cp=cp), profile=PROFILE, solver=solver
    )


def draw(plan: Plan, request: Request | None) -> ET.Element:
    lengths = [n for b in request.batches for n in b] if request else None
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens) if request else None
    return ET.fromstring(render_svg(plan_timelines(plan, lengths=lengths, model=model)))


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG_NS}g") if cls in g.get("class", "").split()]


def rects(elem: ET.Element, cls: str) -> list[ET.Element]:
    return [r for r in elem.iter(f"{SVG_NS}rect") if cls in r.get("class", "").split()]


def test_one_lane_per_gpu_and_every_microbatch_on_each_of_its_gpus() -> None:
    request = make_request([[30000, 900, 4000, 12000, 700, 2500, 800, 1500, 60000]], dp=2, cp=4)
    plan = solve(request)
    root = draw(plan, request)
    panel = groups(root, "panel")
    assert len(panel) == 1
    lanes = groups(panel[0], "lane")
    assert sorted(int(g.get("data-gpu", "-1")) for g in lanes) == list(range(8))
    drawn = sorted((int(g.get("data-gpu", "-1")), int(g.get("data-index", "-1"))) for g in groups(root, "microbatch"))
    expected = sorted((gpu, k) for k, mb in enumerate(plan.iterations[0].microbatches) for gpu in mb.ranks)
    assert drawn == expected


def test_slot_widths_are_proportional_to_estimated_ms() -> None:
    request = make_request([[30000, 900, 4000, 12000], [700, 2500, 800, 1500, 60000]], dp=2, cp=4)
    root = draw(solve(request), request)
    ratios = [
        float(g.get("data-width", "0")) / float(g.get("data-estimated-ms", "1")) for g in groups(root, "microbatch")
    ]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-4)
    for g in groups(root, "microbatch"):
        (slot,) = rects(g, "slot")
        assert float(slot.get("width", "0")) == pytest.approx(float(g.get("data-width", "0")), abs=0.01)


def test_the_longest_gpu_fills_the_axis() -> None:
    request = make_request([[30000, 900, 4000, 12000, 700]], dp=2, cp=2)
    plan = solve(request)
    timeline = iteration_timeline(
        plan, iteration=0, lengths=[n for b in request.batches for n in b], model=CostModel(PROFILE)
    )
    root = ET.fromstring(render_svg([timeline]))
    ends = [float(r.get("x", "0")) + float(r.get("width", "0")) for r in rects(root, "slot")]
    starts = [float(r.get("x", "0")) for r in rects(root, "slot")]
    assert max(ends) - min(starts) == pytest.approx(AXIS_PX, abs=0.05)
    # static DP x CP layout: the synchronized makespan is the specification's iteration time (eq. 8)
    assert timeline.makespan_ms == pytest.approx(plan.iterations[0].estimated_ms, rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40000), min_size=1, max_size=30),
    cp=st.sampled_from([1, 2, 4]),
    solver=st.sampled_from(["skrull", "deepspeed", "dynamic-cp"]),
)
def test_split_and_bucket_follow_the_reference_model(lengths: list[int], cp: int, solver: str) -> None:
    model = CostModel(PROFILE)
    # placeable: at most what one group holds (cp * bucket less the gathered K/V the profile charges)
    lengths = [min(n, model.max_sequence_tokens(cp)) for n in lengths]
    request = make_request([lengths], dp=2, cp=cp, solver=solver)
    plan = solve(request)
    timeline = iteration_timeline(plan, iteration=0, lengths=lengths, model=model)
    for index, mb in enumerate(plan.iterations[0].microbatches):
        bars = [b for b in timeline.bars if b.index == index]
        assert sorted(b.gpu for b in bars) == sorted(mb.ranks)
        busy = [b.busy_ms for b in bars]
        assert all(x is not None and x <= mb.estimated_ms + 1e-6 for x in busy)
        # the group waits for its slowest member: that member's split is the whole microbatch (eqs. 2-4)
        assert max(x for x in busy if x is not None) == pytest.approx(mb.estimated_ms, rel=1e-6, abs=1e-6)
        # the strip draws each GPU's own tokens; the gathered K/V the memory rule adds is not drawn
        gathered = model.gathered_kv_tokens(sum(lengths[i] for i in mb.sharded), len(mb.ranks), mb.mode)
        uses = [
            use - gathered
            for use in model.bucket_use_tokens(
                [[lengths[i] for i in ids] for ids in mb.local], [lengths[i] for i in mb.sharded], mode=mb.mode
            )
        ]
        for b in bars:
            assert b.bucket_use is not None
            assert b.bucket_use * request.bucket_tokens == pytest.approx(uses[mb.ranks.index(b.gpu)])
            assert b.bucket_use <= 1 + 1e-9


def test_without_lengths_slots_are_drawn_whole() -> None:
    request = make_request([[3000, 900, 4000]], dp=1, cp=2)
    root = draw(solve(request), None)
    mbs = groups(root, "microbatch")
    assert mbs and all(len(rects(g, "estimated")) == 1 and not rects(g, "overlap") for g in mbs)
    assert not rects(root, "bucket")


def test_sharded_sequences_are_drawn_with_their_split() -> None:
    request = make_request([[60000, 100]], dp=1, cp=4)  # 60000 tokens must be sharded over the group
    plan = solve(request)
    assert any(mb.sharded for mb in plan.iterations[0].microbatches)
    root = draw(plan, request)
    assert rects(root, "sharded") and rects(root, "bucket-sharded")
    assert all(math.isfinite(float(r.get("width", "nan"))) for r in root.iter(f"{SVG_NS}rect"))


def test_refuses_an_iteration_the_plan_does_not_have() -> None:
    request = make_request([[3000, 900]], dp=1, cp=2)
    with pytest.raises(RequestError, match="iteration"):
        iteration_timeline(solve(request), iteration=3)


def test_refuses_lengths_of_another_request() -> None:
    request = make_request([[3000, 900, 50, 60]], dp=1, cp=2)
    with pytest.raises(RequestError, match="too few sequences"):
        iteration_timeline(solve(request), iteration=0, lengths=[3000], model=CostModel(PROFILE))


def test_each_bound_drawn_says_which_it_is() -> None:
    request = make_request([[30000, 900, 4000, 12000]], dp=2, cp=4)
    plan = solve(request)
    it = plan.iterations[0]
    assert it.static_bound_ms is not None
    svg = render_svg(plan_timelines(plan))
    assert f"no plan beats {it.lower_bound_ms:.1f} ms (any layout)" in svg
    assert f"none with static CP groups beats {it.static_bound_ms:.1f} ms" in svg


def test_the_bounds_drawn_are_compares_and_a_flexible_plan_is_told_the_static_one_does_not_bind_it() -> None:
    # the contract example's first batch: auto runs it on all 32 GPUs, below the static bound
    from skrull.solver.io import read_json, request_from_dict
    from skrull.solver.reports.compare import compare

    request = request_from_dict(read_json("examples/requests/contract-example.json"))
    rows, plans = compare(request, ["auto", "deepspeed"])
    lengths = [n for b in request.batches for n in b]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)
    auto = plan_timelines(plans["auto"], lengths=lengths, model=model)
    assert sum(t.lower_bound_ms for t in auto) == pytest.approx(rows[0].bound_ms)
    assert sum(t.static_bound_ms or 0.0 for t in auto) == pytest.approx(rows[0].bound_static_ms)
    first = auto[0]
    assert not first.static_layout and first.static_bound_ms is not None
    assert first.estimated_ms < first.static_bound_ms  # wider groups: the static bound does not hold for it
    assert "this plan's wider groups are not bound by it" in render_svg(auto)
    ds = plan_timelines(plans["deepspeed"], lengths=lengths, model=model)
    assert ds[0].static_layout and "not bound by it" not in render_svg(ds)


def test_a_gpu_holding_only_shards_shows_no_whole_sequence_segment() -> None:
    # deepspeed shards every sequence: no GPU computes a whole sequence while the shards are exchanged
    request = make_request([[30000, 12000]], dp=1, cp=4, solver="deepspeed")
    root = draw(solve(request), request)
    bars = groups(root, "microbatch")
    assert bars and all(g.get("data-local") == "0" for g in bars)
    assert not any(rects(g, "overlap") for g in bars)
    assert all(rects(g, "exchange") for g in bars)  # the exchange shows as what it is


def test_one_microbatch_is_singular_and_the_memory_strip_has_a_scale() -> None:
    request = make_request([[900]], dp=1, cp=2)
    root = draw(solve(request), request)
    texts = [t.text or "" for t in root.iter(f"{SVG_NS}text")]
    assert any("1 microbatch;" in t for t in texts) and not any("1 microbatches" in t for t in texts)
    (scale,) = [g for g in groups(root, "legend-scale")]
    assert scale.get("data-bucket-tokens") == str(request.bucket_tokens)
    assert any(f"{request.bucket_tokens:,} tokens" in (t.text or "") for t in scale.iter(f"{SVG_NS}text"))


def test_label_boxes_do_not_look_like_waiting_time() -> None:
    request = make_request([[30000, 900, 4000, 12000]], dp=1, cp=2)
    root = draw(solve(request), request)
    waiting = {r.get("fill") for r in root.iter(f"{SVG_NS}rect") if "legend-waiting" in r.get("class", "")}
    labels = {r.get("fill") for r in root.iter(f"{SVG_NS}rect") if "label-back" in r.get("class", "")}
    sample = {r.get("fill") for r in root.iter(f"{SVG_NS}rect") if "legend-label" in r.get("class", "")}
    assert labels and not labels & waiting and labels == sample  # the legend shows the label's box too


# -- what a PNG keeps: legend, groups and sequence ids drawn, not only in tooltips -----------------------------


def legends(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-where", ""): g for g in groups(root, "legend")}


def translate_y(elem: ET.Element) -> float:
    return float(elem.get("transform", "translate(0,0)").rstrip(")").split(",")[1])


def test_the_legend_names_every_colour_in_plain_words_above_the_panels() -> None:
    request = make_request([[30000, 900, 4000, 12000]], dp=1, cp=2)
    root = draw(solve(request), request)
    found = legends(root)
    assert set(found) == {"top"}  # a short picture: one legend, at the top
    (first_panel, *_) = groups(root, "panel")
    assert translate_y(found["top"]) < translate_y(first_panel)
    text = " ".join(t.text or "" for t in found["top"].iter(f"{SVG_NS}text"))
    assert "waiting for the slowest GPU of the group" in text and "max(" not in text
    assert rects(found["top"], "legend-waiting") and rects(found["top"], "legend-overlap")
    # every fill a bar uses has its legend entry
    fills = {r.get("fill") for g in groups(root, "microbatch") for r in g.iter(f"{SVG_NS}rect")} - {"#ffffff"}
    keyed = {r.get("fill") for r in found["top"].iter(f"{SVG_NS}rect")}
    assert fills <= keyed | {"#eeeeee"}  # the free part of the bucket strip is the strip itself


def test_a_tall_picture_repeats_the_legend_below_its_last_panel() -> None:
    request = make_request([[30000, 900, 4000], [12000, 700, 2500]], dp=4, cp=8)
    root = draw(solve(request), request)
    found = legends(root)
    assert set(found) == {"top", "bottom"}
    assert translate_y(found["bottom"]) > max(translate_y(p) for p in groups(root, "panel"))


def test_brackets_join_exactly_the_gpus_of_each_group() -> None:
    request = make_request([[30000, 900, 4000, 12000, 700, 2500, 800, 1500, 60000, 300, 5000, 7000]], dp=2, cp=4)
    plan = solve(request)
    root = draw(plan, request)
    brackets = [p for p in root.iter(f"{SVG_NS}path") if p.get("class") == "group-bracket"]
    for k, mb in enumerate(plan.iterations[0].microbatches):
        mine = [p for p in brackets if p.get("data-index") == str(k)]
        covered = {g for p in mine for g in range(int(p.get("data-first", "0")), int(p.get("data-last", "-1")) + 1)}
        assert covered == (set(mb.ranks) if len(mb.ranks) > 1 else set()), (k, mb.ranks)


def test_wide_bars_name_their_microbatch_group_and_sequence_ids_in_text() -> None:
    # one microbatch over the whole group: every bar is wide and its label lists every id it runs
    request = make_request([[60000, 100, 3000]], dp=1, cp=4)
    plan = solve(request)
    (mb,) = plan.iterations[0].microbatches
    root = draw(plan, request)
    for g in groups(root, "microbatch"):
        (label,) = [t.text or "" for t in g.iter(f"{SVG_NS}text") if t.get("class") == "label"]
        position = mb.ranks.index(int(g.get("data-gpu", "-1")))
        assert label.startswith(f"#0 GPUs {min(mb.ranks)}-{max(mb.ranks)}"), label
        if mb.sharded:
            assert f"sharded {','.join(map(str, mb.sharded))}" in label
        if mb.local[position]:
            assert f"whole {','.join(map(str, mb.local[position]))}" in label


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40000), min_size=1, max_size=40),
    cp=st.sampled_from([1, 2, 4]),
    solver=st.sampled_from(["skrull", "deepspeed", "dynamic-cp"]),
)
def test_a_label_fits_its_bar_and_names_its_microbatch(lengths: list[int], cp: int, solver: str) -> None:
    lengths = [min(n, cp * PROFILE.bucket_tokens) for n in lengths]
    request = make_request([lengths], dp=2, cp=cp, solver=solver)
    root = draw(solve(request), request)
    for g in groups(root, "microbatch"):
        labels = [t.text or "" for t in g.iter(f"{SVG_NS}text") if t.get("class") == "label"]
        width = float(g.get("data-width", "0"))
        assert len(labels) <= 1
        for label in labels:
            assert label.split()[0] == f"#{g.get('data-index')}"
            assert len(label) * LABEL_CHAR_PX + 6 <= width + 1e-9
        if width >= 6 + LABEL_CHAR_PX * len(f"#{g.get('data-index')}"):
            assert labels  # a bar wide enough for its number shows it
