"""Pictures of stored plans: the timeline SVG (solver/reports/render.py) and a small HTML page around it.

The stored request carries its profile inline, so a solved job is drawn with the same lengths and cost
model it was planned with: the DACP split (overlap, sharded compute, overhead) and bucket use per GPU.

A picture is bounded: it draws one bar per GPU per microbatch, so a plan of a few sequences sharded over
tens of thousands of GPUs would make one of hundreds of MB. Over ``max_picture_bars`` bars
(``SKRULL_MAX_PICTURE_BARS``, default 20,000, a few MB of SVG) the timeline answers 413 naming the limit and
how many bars the asked iterations have (ask for fewer with ``?iteration=``), and the page shows the
figures without the picture. Bars alone do not bound bytes: each bar's tooltip lists the sequence ids its
GPU runs, so a 1M-sequence plan drew 63 MB in few bars. So the picture is bounded in bytes too
(``max_picture_bytes``, ``SKRULL_MAX_PICTURE_BYTES``, default 8 MiB): its size is estimated from the plan
before anything is drawn (about 200 bytes per bar plus every listed id's digits and separator), and
refused with the same 413 when over; a drawing that still comes out larger is refused too.
"""

from __future__ import annotations

import json
from html import escape

from skrull.api.errors import ApiProblem
from skrull.api.sizes import DEFAULT_MAX_PICTURE_BARS
from skrull.api.store.base import JobRecord
from skrull.solver.cost import CostModel
from skrull.solver.io import plan_from_dict, request_from_dict
from skrull.solver.reports.render import iteration_bounds_ms, plan_timelines, render_svg

#: How often (seconds) the page of a plan still solving reloads itself.
REFRESH_S = 2


#: Bytes of SVG per bar besides its listed ids (rect, tooltip figures), a lower estimate.
BAR_BYTES = 200
DEFAULT_MAX_PICTURE_BYTES = 8 * 2**20


def picture_bytes_estimate(doc: dict[str, object], chosen: range | list[int]) -> int:
    """A lower estimate of the SVG's bytes: ``BAR_BYTES`` per bar plus, for every id a bar's tooltip lists
    (its GPU's local ids and the microbatch's sharded ids), its digits and a separator."""
    total = 0
    iterations = doc["iterations"]
    assert isinstance(iterations, list)
    for i in chosen:
        for mb in iterations[i]["microbatches"]:
            gpus = len(mb["ranks"])
            total += BAR_BYTES * gpus
            total += sum(len(str(k)) + 2 for local in mb["local"] for k in local)
            total += gpus * sum(len(str(k)) + 2 for k in mb["sharded"])
    return total


def picture_bytes_too_large(size: int, limit: int, *, plan_id: str) -> ApiProblem:
    return ApiProblem(
        status=413,
        slug="picture-too-large",
        title="picture too large",
        detail=f"the timeline of plan {plan_id} would be about {size} bytes (its bars list every sequence id); at "
        f"most {limit} are drawn (SKRULL_MAX_PICTURE_BYTES): ask for fewer iterations (?iteration=i), or read rank "
        "views",
        limit_bytes=limit,
        bytes=size,
    )


def picture_too_large(bars: int, limit: int, *, plan_id: str) -> ApiProblem:
    return ApiProblem(
        status=413,
        slug="picture-too-large",
        title="picture too large",
        detail=f"the timeline of plan {plan_id} would draw {bars} bars (one per GPU per microbatch); at most {limit} "
        "are drawn (SKRULL_MAX_PICTURE_BARS): ask for fewer iterations (?iteration=i), or read rank views",
        limit=limit,
        bars=bars,
    )


def timeline_svg(
    job: JobRecord,
    request_json: str,
    iterations: list[int] | None = None,
    *,
    max_bars: int = DEFAULT_MAX_PICTURE_BARS,
    max_bytes: int = DEFAULT_MAX_PICTURE_BYTES,
) -> str:
    """The SVG of a solved job (``job.plan_json`` set); ``iterations`` default to all. Over ``max_bars``
    bars: the 413 ``picture_too_large`` problem, before anything is drawn."""
    assert job.plan_json is not None, "only solved jobs are drawn"
    doc = json.loads(job.plan_json)
    chosen = range(len(doc["iterations"])) if iterations is None else iterations
    bars = sum(len(mb["ranks"]) for i in chosen for mb in doc["iterations"][i]["microbatches"])
    if bars > max_bars:
        raise picture_too_large(bars, max_bars, plan_id=job.job_id)
    estimate = picture_bytes_estimate(doc, chosen)
    if estimate > max_bytes:
        raise picture_bytes_too_large(estimate, max_bytes, plan_id=job.job_id)
    plan = plan_from_dict(doc)
    request = request_from_dict(json.loads(request_json))
    lengths = [n for batch in request.batches for n in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)
    par = plan.parallel
    title = (
        f"plan {job.job_id[:12]}: {plan.solver}, DP{par.dp} x CP{par.cp}, bucket {plan.bucket_tokens} tokens, "
        f"profile {request.profile.name}"
    )
    svg = render_svg(plan_timelines(plan, lengths=lengths, model=model, iterations=iterations), title=title)
    if len(svg) > max_bytes:  # characters of an ASCII document: its bytes
        raise picture_bytes_too_large(len(svg), max_bytes, plan_id=job.job_id)
    return svg


def plan_bounds_text(plan_json: str, request_json: str | None) -> str:
    """The plan's bounds, totals over its iterations, named as ``skrull compare`` and the timeline's panels name
    them (``render.iteration_bounds_ms`` of the sequences each iteration runs); without the request, the
    plan's own ``lower_bound_ms`` (the specification's, also valid for any layout)."""
    doc = json.loads(plan_json)
    if request_json is None:
        bound = sum(float(it["lower_bound_ms"]) for it in doc["iterations"])
        return f"no plan beats {bound:.1f} ms (any layout)"
    plan = plan_from_dict(doc)
    request = request_from_dict(json.loads(request_json))
    lengths = [n for batch in request.batches for n in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)
    any_layout = static = 0.0
    for it in plan.iterations:
        ran = [lengths[i] for mb in it.microbatches for i in mb.seq_ids]
        a, s = iteration_bounds_ms(ran, model, plan.parallel)
        any_layout += max(a, it.lower_bound_ms)
        static += max(s, it.static_bound_ms or 0.0, a)
    return f"no plan beats {any_layout:.1f} ms (any layout); none with static CP groups beats {static:.1f} ms"


def view_page(job: JobRecord, svg: str | None, request_json: str | None = None) -> str:
    """The HTML page of a plan: its status and figures, the timeline inline once solved."""
    pid = escape(job.job_id)
    facts = [
        ("status", job.status),
        ("solver", job.solver),
        ("iterations", f"{job.iterations_solved} of {job.num_iterations} solved"),
        ("sequences", str(job.num_sequences)),
        ("GPUs", str(job.num_gpus)),
    ]
    if job.plan_json is not None:
        plan = json.loads(job.plan_json)
        total = sum(float(it["estimated_ms"]) for it in plan["iterations"])
        count = len(plan["iterations"])
        facts.append(("estimated", f"{total:.1f} ms in all, over {count} iteration{'' if count == 1 else 's'}"))
        facts.append(("bounds", plan_bounds_text(job.plan_json, request_json)))
        facts.append(("planning", f"{float(plan['solve']['wall_ms']):.1f} ms, {plan['solve']['status']}"))
    if job.error_json is not None:
        facts.append(("error", str(json.loads(job.error_json).get("detail", "failed"))))
    rows = "\n".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts)
    refresh = "" if job.is_final else f'<meta http-equiv="refresh" content="{REFRESH_S}">'
    waiting = f'<p class="pending">The timeline appears once the plan is solved ({escape(job.status)}).</p>'
    picture = svg if svg is not None else waiting
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">{refresh}
<title>Skrull plan {pid}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 12px; }}
th {{ text-align: left; padding: 2px 12px 2px 0; color: #555; font-weight: normal; }}
td {{ padding: 2px 0; }}
.links a {{ margin-right: 12px; }}
</style></head>
<body>
<h1>Plan <code>{pid}</code></h1>
<table>{rows}</table>
<p class="links"><a href="/v1/plans/{pid}">plan JSON</a><a href="/v1/plans/{pid}/timeline.svg">timeline.svg</a></p>
<div id="timeline">{picture}</div>
</body></html>
"""
