"""``skrull``: plan, compare, build requests, validate plans, list and derive profiles.

User mistakes end with one line on stderr (``skrull: error: <field>: <value>: <reason>``) and exit
status 2; never a traceback or a partial plan. A planner that produces an invalid plan is a bug of the
project, not a user mistake: one line (``skrull: planner bug: ...``) and exit status 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import skrull
from skrull.cli import derive as derive_cli
from skrull.cli import finetune as finetune_cli
from skrull.cli import layer_check, serve, solver_worker
from skrull.cli import lengths as lengths_cli
from skrull.cli import profile as profile_cli
from skrull.cli import show as show_cli
from skrull.solver.budget import EXACT_SOLVERS
from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import read_cp_modes
from skrull.solver.errors import MISSING, PlannerBugError, RequestError, SkrullError
from skrull.solver.io import (
    BACKENDS,
    DEFAULT_CP,
    DEFAULT_DP,
    DEFAULT_PROFILE,
    DEFAULT_SOLVER,
    check_cp_modes_profile,
    dumps,
    parse_profile,
    plan_from_dict,
    plan_to_dict,
    read_json,
    request_from_dict,
    request_to_dict,
)
from skrull.solver.lengths.datasets import distribution_names, synthesize_request
from skrull.solver.planners.registry import get_planner, planner_names
from skrull.solver.planning import check_request, solve
from skrull.solver.profile import bundled_profile_names, load_profile
from skrull.solver.reports.compare import LEGEND, bounds_line, compare, format_table, parse_solver_spec
from skrull.solver.types import Parallel, Plan, Request
from skrull.solver.validate import validate_plan

EXIT_USER_ERROR = 2
#: A planner produced a plan the validator refuses (``PlannerBugError``), or any other internal fault:
#: not the user's mistake.
EXIT_PLANNER_BUG = 3


def _add_source(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("input: a request file, or a request synthesized from a bundled dataset")
    src.add_argument("--request", "-r", metavar="FILE", help="request JSON (docs/formats.md format)")
    src.add_argument("--dataset", metavar="NAME", help=f"length distribution: {', '.join(distribution_names())}")
    src.add_argument(
        "--dp", type=int, default=None, help=f"data-parallel degree (with --dataset; default {DEFAULT_DP})"
    )
    src.add_argument(
        "--cp", type=int, default=None, help=f"context-parallel degree (with --dataset; default {DEFAULT_CP})"
    )
    src.add_argument("--per-rank", type=int, default=None, help="sequences per DP rank per batch (default 64)")
    src.add_argument("--batches", type=int, default=None, help="global batches (iterations) to plan (default 1)")
    src.add_argument("--seed", type=int, default=None, help="sampling seed, and the request's seed (default 0)")
    src.add_argument(
        "--profile", default=None, help=f"bundled profile name or profile JSON file (default {DEFAULT_PROFILE})"
    )
    src.add_argument("--bucket-tokens", type=int, default=None, help="override the profile's memory bucket")
    src.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="wall-clock budget of the solve (default: the request's, else 1 s; 60 s for ilp and ilp-flex; "
        "raised to what the request's size needs)",
    )
    src.add_argument(
        "--backend", default=None, help=f"exact solver backend: {', '.join(BACKENDS)} (ilp, ilp-flex, auto)"
    )
    src.add_argument("--deterministic", action="store_true", help="same plan for the same request (ilp, auto)")
    src.add_argument(
        "--cp-modes",
        default=None,
        metavar="MODES",
        help="comma-separated modes a sharded sequence's attention may run in: allgather, ulysses (default: "
        "the request's, else allgather)",
    )


#: Flags that shape a synthesized request (--dataset) and their defaults; a request file sets these itself.
DATASET_DEFAULTS = {"dp": DEFAULT_DP, "cp": DEFAULT_CP, "per_rank": 64, "batches": 1}


def _load_request(args: argparse.Namespace, *, solver: str | None) -> Request:
    request = _read_request(args, solver=solver)
    _warn_if_check_failed(request)
    return request


def _warn_if_check_failed(request: Request) -> None:
    """A measured profile whose own check failed (its predictions against measured per-rank compute) still
    plans, but its estimates may be off: say so once, on stderr."""
    from skrull.worker.profiling.check import read_check  # numpy only: no torch

    check = read_check(request.profile.extra)
    if check is not None and not check[1]:
        limit = request.profile.extra["check"]["limit"]
        print(
            f"skrull: warning: profile {request.profile.name} failed its own check (median error {check[0]:.1%} "
            f"over the {float(limit):.0%} limit): its estimates may be off; `skrull profiles --long` lists the checks",
            file=sys.stderr,
        )


def _read_request(args: argparse.Namespace, *, solver: str | None) -> Request:
    if args.request and args.dataset:
        raise RequestError("--dataset", args.dataset, "give either --request or --dataset, not both")
    if args.request:
        for name in DATASET_DEFAULTS:
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                raise RequestError(flag, getattr(args, name), "applies only with --dataset; the request file sets it")
        doc = read_json(args.request, field="--request")
        if isinstance(doc, dict):
            if solver is not None:
                doc["solver"] = solver
            if args.profile is not None:
                doc["profile"] = _profile_arg(args.profile)
            if args.bucket_tokens is not None:
                doc["bucket_tokens"] = args.bucket_tokens
            if args.time_budget_s is not None:
                doc["time_budget_s"] = args.time_budget_s
            if args.backend is not None:
                doc["backend"] = args.backend
            if args.deterministic:
                doc["deterministic"] = True
            if args.seed is not None:
                doc["seed"] = args.seed
            if args.cp_modes is not None:
                doc["cp_modes"] = args.cp_modes.split(",")
        return request_from_dict(doc)
    if not args.dataset:
        raise RequestError("--request", MISSING, "give a request file (--request FILE) or a dataset (--dataset NAME)")
    for name, default in DATASET_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.seed is None:
        args.seed = 0
    for flag, value in (
        ("--dp", args.dp),
        ("--cp", args.cp),
        ("--per-rank", args.per_rank),
        ("--batches", args.batches),
    ):
        if value < 1:
            raise RequestError(flag, value, "must be an integer >= 1")
    if args.bucket_tokens is not None and args.bucket_tokens < 1:
        raise RequestError("--bucket-tokens", args.bucket_tokens, "must be an integer >= 1")
    profile = parse_profile(_profile_arg(args.profile or DEFAULT_PROFILE), field="--profile")
    request = synthesize_request(
        dataset=args.dataset,
        parallel=Parallel(dp=args.dp, cp=args.cp),
        profile=profile,
        sequences_per_rank=args.per_rank,
        num_batches=args.batches,
        seed=args.seed,
        bucket_tokens=args.bucket_tokens,
    )
    if solver is not None:
        get_planner(solver)
        request = dataclasses.replace(request, solver=solver)
    if args.time_budget_s is not None:
        if not args.time_budget_s > 0:
            raise RequestError("--time-budget-s", args.time_budget_s, "must be a number of seconds > 0")
        request = dataclasses.replace(request, time_budget_s=args.time_budget_s)
    if args.backend is not None:
        if args.backend not in BACKENDS:
            raise RequestError("--backend", args.backend, f"must be one of {', '.join(BACKENDS)}")
        request = dataclasses.replace(request, backend=args.backend)
    if args.cp_modes is not None:
        modes = read_cp_modes(args.cp_modes.split(","), "--cp-modes")
        check_cp_modes_profile(modes, request.profile)
        request = dataclasses.replace(request, cp_modes=modes)
    return dataclasses.replace(request, deterministic=args.deterministic)


def _profile_arg(value: str) -> Any:
    """A bundled name stays a name; a path to a JSON file is read as an inline profile."""
    if value.endswith(".json") or Path(value).is_file():
        return read_json(value, field="--profile")
    return value


def _write(text: str, output: str | None) -> None:
    if output:
        try:
            Path(output).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:  # a missing folder, no permission: name the flag, not the service
            raise RequestError("--output", output, f"cannot be written: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(text + "\n")


def cmd_plan(args: argparse.Namespace) -> int:
    request = _load_request(args, solver=args.solver)
    plan = solve(request)
    _write(dumps(plan_to_dict(plan), compact=args.compact), args.output)
    _note_if_stopped(request, plan)
    return 0


def _note_if_stopped(request: Request, plan: Plan) -> None:
    """An exact planner stopped by its budget before proving its plan optimal says so, with the gap left to
    its own model's bound (``solve.model_gap``, what more time can close) and what to raise: the plan is
    valid, only its optimality is unproven."""
    exact = plan.solver in EXACT_SOLVERS  # auto's bound is layout-free: more time need not close its gap
    own = plan.solve.model_gap is not None
    gap = plan.solve.model_gap if own else plan.solve.gap
    if exact and plan.solve.status in ("feasible", "timeout") and gap is not None and gap > 0:
        print(
            f"skrull: note: {plan.solver} stopped at a {gap:.1%} gap to "
            f"{'its model' if own else 'the plan'}'s proven bound when its "
            f"{request.resolved_time_budget_s:g} s budget ran out; raise --time-budget-s (time_budget_s) to close it",
            file=sys.stderr,
        )


def cmd_compare(args: argparse.Namespace) -> int:
    request = _load_request(args, solver=None)
    # "skrull, wlb" as typed after a comma in prose: spaces around the names are not part of them
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()] if args.solvers else None
    for spec in solvers or ():
        name, backend = parse_solver_spec(spec)
        get_planner(name)
        if backend is not None and backend not in BACKENDS:
            raise RequestError("--solvers", spec, f"unknown backend; one of {', '.join(BACKENDS)}")
    rows, plans = compare(request, solvers)
    if args.plot:
        drawn = {r.solver: plans[r.solver] for r in rows if r.solver in plans}
        show_cli.write_picture(show_cli.compare_svg(request, drawn), args.plot)
    if args.json:
        _write(dumps([dataclasses.asdict(r) for r in rows]), args.output)
        return 0
    n = request.num_sequences
    par = request.parallel
    title = (
        f"{n} sequences in {plural(len(request.batches), 'batch', 'batches')}, DP{par.dp} x CP{par.cp}, "
        f"profile {request.profile.name}, "
        f"bucket {request.bucket_tokens} tokens"
    )
    bounds = bounds_line(rows, len(request.batches))
    _write(title + "\n" + bounds + "\n\n" + format_table(rows) + "\n\n" + LEGEND.rstrip("\n"), args.output)
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    if not args.dataset:
        raise RequestError("--dataset", MISSING, f"required; one of {', '.join(distribution_names())}")
    request = _load_request(args, solver=args.solver)
    check_request(request)  # a request its solver refuses is refused here, not written
    # what synthesize_request cuts to: cp x bucket_tokens, less the gathered K/V where the profile charges it
    limit = CostModel(request.profile, bucket_tokens=request.bucket_tokens).max_sequence_tokens(request.parallel.cp)
    cut = sum(1 for batch in request.batches for n in batch if n == limit)
    if cut:  # sampled lengths over what any plan can hold are cut to it, as an SFT loader's max_length would
        total = sum(len(b) for b in request.batches)
        what = (
            f"cp x bucket_tokens = {limit} tokens"
            if limit == request.parallel.cp * request.bucket_tokens
            else f"{limit} tokens (cp x bucket_tokens less the gathered K/V of all-gather)"
        )
        print(
            f"skrull: note: {cut} of {total} sampled lengths were cut to {what}, the "
            "longest sequence a plan can hold (raise --cp or --bucket-tokens to keep them longer)",
            file=sys.stderr,
        )
    _write(dumps(request_to_dict(request), compact=True), args.output)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    request = request_from_dict(read_json(args.request, field="--request"))
    plan = plan_from_dict(read_json(args.plan, field="--plan"))
    validate_plan(plan, request)
    print(
        f"valid: {sum(len(it.microbatches) for it in plan.iterations)} microbatches, "
        f"{plan.estimated_ms:.3f} ms estimated"
    )
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    if args.name:
        print(dumps(parse_profile(_profile_arg(args.name)).to_dict()))
        return 0
    if not args.long:
        for name in bundled_profile_names():
            print(name)
        return 0
    from skrull.worker.profiling.check import read_check  # numpy only: no torch

    print("| profile | source | bucket tokens | ms_per_tflop | fixed_ms | microbatch_ms | check |")
    print("|---|---|---|---|---|---|---|")
    for name in bundled_profile_names():
        try:
            profile = load_profile(name)
        except ValueError as exc:  # a broken file in $SKRULL_PROFILES_DIR: say so, list the rest
            print(f"| {name} | unreadable: {exc} | - | - | - | - | - |")
            continue
        extra = profile.extra
        measured = extra.get("measured")
        source = f"measured on {measured.get('device', '?')}" if isinstance(measured, dict) else "derived"
        check = read_check(extra)
        verdict = "-" if check is None else f"{check[0]:.1%} median error ({'pass' if check[1] else 'fail'})"
        print(
            f"| {name} | {source} | {profile.bucket_tokens} | {profile.compute.ms_per_tflop:.3f} "
            f"| {profile.compute.fixed_ms:.2f} | {profile.microbatch_ms:.2f} | {verdict} |"
        )
    return 0


def plural(count: int, singular: str, plural_form: str) -> str:
    """``1 batch``, ``4 batches``."""
    return f"{count} {singular if count == 1 else plural_form}"


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end like every other failure: one line on stderr, exit status 2; a mistyped
    subcommand or flag gets the closest known one (argparse's own ``suggest_on_error`` is Python 3.14's)."""

    def error(self, message: str) -> NoReturn:
        choice = re.match(r"argument (\w+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            known = re.findall(r"'?([\w-]+)'?", choice.group(3))
            message += _did_you_mean(choice.group(2), known)
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """``parse_known_args``, then unknown flags refused with the closest flag of the subcommand."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._subcommand(parsed)
            options = [o for a in command._actions for o in a.option_strings] if command else []
            hint = "".join(_did_you_mean(e.split("=", 1)[0], options) for e in extras if e.startswith("-"))
            (command or self).error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _subcommand(self, parsed: argparse.Namespace) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, "command", None) or "")
                return chosen if isinstance(chosen, argparse.ArgumentParser) else None
        return None


def _did_you_mean(typed: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(typed, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="skrull", description="Skrull: data scheduling for long-context SFT (DP x CP).")
    parser.add_argument("--version", action="version", version=f"skrull {skrull.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="plan a request and print the plan JSON")
    _add_source(p)
    p.add_argument(
        "--solver", "-s", default=None, help=f"planner: {', '.join(planner_names())} (default: the request's)"
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write the plan here (default: stdout)")
    p.add_argument("--compact", action="store_true", help="one-line JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "compare",
        help="plan a request with several planners and print one table",
        description=(
            "Plan a request with several planners and print one table.\n"
            "Each planner gets the budget `skrull plan` gives it (1 s; 60 s for ilp and ilp-flex,\n"
            "which stop once proven optimal) unless the request or --time-budget-s names one;\n"
            "the exact planners start from the best heuristic plan of their layout."
        ),
        epilog=LEGEND,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_source(p)
    p.add_argument("--solvers", default=None, help="comma-separated planners (default: all)")
    p.add_argument("--json", action="store_true", help="rows as JSON")
    p.add_argument(
        "--plot", metavar="FILE", help="also draw the planners' first iterations, stacked one above another (.svg/.png)"
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write the table here (default: stdout)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("request", help="write a request sampled from a bundled length distribution")
    _add_source(p)
    p.add_argument(
        "--solver",
        "-s",
        default=None,
        help=f"planner the request names: {', '.join(planner_names())} (default {DEFAULT_SOLVER})",
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write the request here (default: stdout)")
    p.set_defaults(func=cmd_request)

    p = sub.add_parser("validate", help="check a plan against its request and docs/formats.md")
    p.add_argument("--request", "-r", required=True, metavar="FILE", help="the request the plan was made for")
    p.add_argument("--plan", "-p", required=True, metavar="FILE", help="the plan JSON (what skrull plan prints)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("profiles", help="list bundled profiles, or print one")
    p.add_argument("name", nargs="?", help="print this profile's JSON: a bundled name or a JSON file")
    p.add_argument("--long", action="store_true", help="a table: derived or measured, bucket, coefficients, check")
    p.set_defaults(func=cmd_profiles)

    derive_cli.add_parser(sub)
    layer_check.add_parser(sub)
    finetune_cli.add_parser(sub)
    profile_cli.add_parser(sub)
    serve.add_parser(sub)
    solver_worker.add_parser(sub)
    show_cli.add_parser(sub)
    lengths_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SkrullError as exc:
        print(f"skrull: error: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        return EXIT_USER_ERROR
    except PlannerBugError as exc:
        print(f"skrull: planner bug: {exc}", file=sys.stderr)
        return EXIT_PLANNER_BUG
    except BrokenPipeError:  # e.g. `skrull plan ... | head`
        return 0
    except KeyboardInterrupt:
        print("skrull: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # network, disk, anything else: still one line, never a traceback
        if os.environ.get("SKRULL_DEBUG"):
            raise
        print(f"skrull: error: {describe_failure(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR if _is_environment_error(exc) else EXIT_PLANNER_BUG


def _is_environment_error(exc: BaseException) -> bool:
    """A failure of the surroundings (a path, a disk, the service's address), answered like a user error;
    anything else is a fault of this program and gets the internal-error status."""
    return isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore"))


def describe_failure(exc: BaseException) -> str:
    """One line for an unexpected failure: its kind and message (``SKRULL_DEBUG=1`` shows the traceback)."""
    text = " ".join(str(exc).split()) or "no details"
    if _is_environment_error(exc):
        return f"{text} ({type(exc).__name__}; is the path or the service address right?)"
    return f"{type(exc).__name__}: {text} (set SKRULL_DEBUG=1 for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
