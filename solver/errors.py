"""Errors for user mistakes (bad requests, impossible placements), and the one error that is not.

Every user-facing error is a ``ValueError`` subclass that names the offending field and value, so the
CLI can print one clear line (exit status 2) and the service can map it to one problem+json answer
(422). ``assert`` is kept for internal invariants only.

``PlannerBugError`` is the exception: a planner produced a plan that breaks the specification. That is a
defect of the project, not of the request, so it is no ``SkrullError``: the service answers 500 and the
CLI exits with its own status (3).
"""

from __future__ import annotations

from typing import Any


class SkrullError(ValueError):
    """Base of every user-facing error of the planning library."""


class RequestError(SkrullError):
    """A request, profile or plan document is malformed: names the field (a JSON path) and the value."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = None if value is MISSING else value
        self.reason = reason
        # a field that was not given has no value to quote; JSON's null is spelled as JSON spells it
        super().__init__(f"{field}: {reason}" if value is MISSING else f"{field}: {_short(value)}: {reason}")


class SequenceTooLongError(RequestError):
    """A sequence cannot be placed by any planner: longer than ``cp * bucket_tokens``."""

    def __init__(
        self, *, field: str, seq_id: int, num_tokens: int, limit_tokens: int, gathered_kv: bool = False
    ) -> None:
        self.seq_id = seq_id
        self.num_tokens = num_tokens
        self.limit_tokens = limit_tokens
        what = (
            f"more than {limit_tokens}, what one CP group holds in all-gather with the gathered K/V each GPU keeps "
            "(profile memory.kv_bytes_per_token); every planner needs each sequence to fit one CP group (allow "
            "ulysses in cp_modes, or raise cp or bucket_tokens)"
            if gathered_kv
            else f"more than cp * bucket_tokens = {limit_tokens}, what one CP group holds; every planner needs each "
            "sequence to fit one CP group (raise cp or bucket_tokens)"
        )
        super().__init__(field, num_tokens, f"sequence {seq_id} has {num_tokens} tokens, {what}")


class UnknownSolverError(RequestError):
    """The solver name is not in the registry."""


class UnknownProfileError(RequestError):
    """The profile name is not bundled."""


class BackendMissingError(RequestError):
    """A planner or backend the request names needs a Python package this environment cannot import."""


class InfeasibleError(SkrullError):
    """A planner could not place a request that passed validation (a planner limitation, not a user error)."""


class InvalidPlanError(SkrullError):
    """A plan given to the project (``skrull validate``) broke the specification; ``problems`` lists every
    violation found. A plan the project's own planner made is checked with ``PlannerBugError`` instead."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"invalid plan: {_summary(problems)}")


class PlannerBugError(RuntimeError):
    """A planner's plan failed the independent validator: a bug in the planner, never a user error.

    ``solver`` names the planner; ``problems`` lists every violation the validator found.
    """

    def __init__(self, solver: str, problems: list[str]) -> None:
        self.solver = solver
        self.problems = problems
        super().__init__(f"planner {solver!r} produced an invalid plan (a planner bug): {_summary(problems)}")

    def __reduce__(self) -> tuple[type[PlannerBugError], tuple[str, list[str]]]:
        # crosses process boundaries (solver and compare processes) with its fields intact
        return (PlannerBugError, (self.solver, self.problems))


#: Problems quoted in an invalid plan's message (one line); the others are counted, and listed in full
#: on the exception.
PROBLEMS_IN_MESSAGE = 5


def _summary(problems: list[str]) -> str:
    head = "; ".join(problems[:PROBLEMS_IN_MESSAGE])
    extra = len(problems) - PROBLEMS_IN_MESSAGE
    return head + (f" (and {extra} more)" if extra > 0 else "")


class _Missing:
    """The value of a field that was not given at all (``RequestError`` then quotes no value)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _short(value: Any, limit: int = 80) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
