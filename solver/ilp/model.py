"""A backend-neutral integer linear model: integer variables, linear constraints, a minimised objective.

The joint GDS/DACP builder writes one of these; ``cpsat`` and ``scip`` translate it. All coefficients
are integers (times are scaled by ``TIME_SCALE`` units per millisecond), so both backends solve the
same model and CP-SAT, which needs integers, loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Integer time units per millisecond (0.1 microsecond). Every time coefficient is floored to a
#: multiple of 1/TIME_SCALE ms, so the model never over-estimates a plan and its dual bound is a valid
#: lower bound of the exact optimum; the found plan is re-evaluated with the exact reference model.
TIME_SCALE = 10_000


@dataclass(slots=True)
class Constraint:
    coeffs: dict[int, int]
    lower: int | None
    upper: int | None
    family: str


@dataclass(slots=True)
class LinearModel:
    """Variables are integers in ``[lower, upper]`` (binaries: 0..1); ``objective`` is minimised."""

    names: list[str] = field(default_factory=list)
    lower: list[int] = field(default_factory=list)
    upper: list[int] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    objective: dict[int, int] = field(default_factory=dict)
    hint: dict[int, int] = field(default_factory=dict)

    def var(self, name: str, lower: int, upper: int) -> int:
        self.names.append(name)
        self.lower.append(lower)
        self.upper.append(upper)
        return len(self.names) - 1

    def binary(self, name: str) -> int:
        return self.var(name, 0, 1)

    def add(self, coeffs: dict[int, int], *, family: str, lower: int | None = None, upper: int | None = None) -> None:
        """``lower <= sum(coeffs[v] * v) <= upper``; ``family`` names the constraint family."""
        assert lower is not None or upper is not None
        self.constraints.append(Constraint({v: c for v, c in coeffs.items() if c != 0}, lower, upper, family))

    @property
    def num_vars(self) -> int:
        return len(self.names)

    def families(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.constraints:
            out[c.family] = out.get(c.family, 0) + 1
        return out

    def violated(self, values: list[int]) -> list[str]:
        """Names of constraint families ``values`` violates (for checking hints and decodes)."""
        bad = []
        for c in self.constraints:
            total = sum(coef * values[v] for v, coef in c.coeffs.items())
            if (c.lower is not None and total < c.lower) or (c.upper is not None and total > c.upper):
                bad.append(c.family)
        for v, value in enumerate(values):
            if not self.lower[v] <= value <= self.upper[v]:
                bad.append(f"bounds of {self.names[v]}")
        return bad

    def objective_value(self, values: list[int]) -> int:
        return sum(c * values[v] for v, c in self.objective.items())
