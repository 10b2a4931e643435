"""``skrull show``: draw a plan's iterations as per-GPU timelines (SVG, or PNG through cairosvg).

    skrull show plan.json --request request.json -o plan.svg     # a plan from `skrull plan`
    skrull show --request request.json --solver skrull -o plan.png  # plan it, then draw it

Also the drawing behind ``skrull compare --plot FILE`` (one panel per planner, one time scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.io import plan_from_dict, read_json, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.reports.render import Timeline, iteration_timeline, plan_timelines, render_svg, svg_to_png
from skrull.solver.types import Plan, Request
from skrull.solver.validate import validate_plan

FORMATS: tuple[str, ...] = (".svg", ".png")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("show", help="draw a plan as a per-GPU timeline (SVG or PNG)")
    p.add_argument("plan", nargs="?", metavar="PLAN", help="plan JSON (from `skrull plan`); omit to plan --request")
    p.add_argument("--request", "-r", metavar="FILE", help="the plan's request: lengths for the DACP split and buckets")
    p.add_argument("--solver", "-s", default=None, help="planner to run when no PLAN is given (default: the request's)")
    p.add_argument("--iteration", "-i", type=int, action="append", help="iteration to draw (repeatable; default all)")
    p.add_argument("--output", "-o", metavar="FILE", help="plan.svg or plan.png (default: SVG on stdout)")
    p.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    request: Request | None = None
    if args.request:
        doc = read_json(args.request, field="--request")
        if isinstance(doc, dict) and args.solver is not None:
            doc["solver"] = args.solver
        request = request_from_dict(doc)
    if args.plan:
        plan = plan_from_dict(read_json(args.plan, field="PLAN"))
        if request is not None:
            validate_plan(plan, dataclasses.replace(request, solver=plan.solver))
    elif request is not None:
        plan = solve(request)
    else:
        raise RequestError("PLAN", None, "give a plan file, or a request to plan (--request FILE)")
    svg = plan_svg(plan, request, iterations=args.iteration)
    write_picture(svg, args.output)
    return 0


def _lengths_and_model(request: Request | None) -> tuple[list[int] | None, CostModel | None]:
    if request is None:
        return None, None
    lengths = [n for batch in request.batches for n in batch]
    # the request's modes: the bounds drawn hold for the modes its plans may use (solver/reports/render.py)
    return lengths, CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)


def plan_svg(plan: Plan, request: Request | None, *, iterations: Sequence[int] | None = None) -> str:
    """The SVG of ``plan`` (every iteration by default); ``request`` adds the DACP split and bucket use."""
    lengths, model = _lengths_and_model(request)
    for i in iterations or ():
        if not 0 <= i < len(plan.iterations):
            raise RequestError("--iteration", i, f"must be in 0..{len(plan.iterations) - 1}")
    par = plan.parallel
    title = f"{plan.solver} plan, DP{par.dp} x CP{par.cp}, bucket {plan.bucket_tokens} tokens"
    if request is not None:
        title += f", profile {request.profile.name}"
    return render_svg(plan_timelines(plan, lengths=lengths, model=model, iterations=iterations), title=title)


def compare_svg(request: Request, plans: Mapping[str, Plan], *, iteration: int = 0) -> str:
    """One panel per planner for the same iteration, stacked one above another on one time scale."""
    lengths, model = _lengths_and_model(request)
    panels: list[Timeline] = [
        iteration_timeline(
            plan, iteration=iteration, lengths=lengths, model=model, title=f"{name}: iteration {iteration}"
        )
        for name, plan in plans.items()
        if iteration < len(plan.iterations)
    ]
    par = request.parallel
    return render_svg(
        panels,
        title=f"planners, one panel each (stacked), DP{par.dp} x CP{par.cp}, bucket {request.bucket_tokens} tokens",
    )


def write_picture(svg: str, output: str | None) -> None:
    """SVG text to ``output`` (or stdout); a ``.png`` name is converted with cairosvg."""
    if output is None:
        sys.stdout.write(svg + "\n")
        return
    suffix = Path(output).suffix.lower()
    if suffix not in FORMATS:
        raise RequestError("--output", output, f"must end in {' or '.join(FORMATS)}")
    if suffix == ".png":
        Path(output).write_bytes(svg_to_png(svg))
    else:
        Path(output).write_text(svg + "\n", encoding="utf-8")
