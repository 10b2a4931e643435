"""Skrull planning library: request/plan types, the reference cost model, planners and the validator.

Pure Python + numpy (and, for the exact model, pyscipopt / ortools); never imports the service or torch.
"""

from skrull.solver.errors import InfeasibleError, InvalidPlanError, RequestError, SequenceTooLongError, SkrullError
from skrull.solver.planning import solve
from skrull.solver.types import Iteration, Microbatch, MicrobatchSpec, Parallel, Plan, Problem, Request, SolveInfo
from skrull.solver.validate import validate_plan

__all__ = [
    "InfeasibleError",
    "InvalidPlanError",
    "Iteration",
    "Microbatch",
    "MicrobatchSpec",
    "Parallel",
    "Plan",
    "Problem",
    "Request",
    "RequestError",
    "SequenceTooLongError",
    "SkrullError",
    "SolveInfo",
    "solve",
    "validate_plan",
]
