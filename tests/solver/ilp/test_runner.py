"""The budget keeper: a late solve is killed at its deadline and its last incumbent is kept."""

from __future__ import annotations

import time
from typing import Any

from skrull.solver.ilp.runner import run_with_deadline, start_child


def _slow(report: Any, deadline: float) -> str:
    report("first")
    report("second")
    time.sleep(30)
    return "never"


def _quick(report: Any, deadline: float) -> str:
    report("draft")
    return "final"


def _broken(report: Any, deadline: float) -> str:
    report("partial")
    raise RuntimeError("solver crashed")


def test_kills_a_late_child_and_keeps_the_last_incumbent() -> None:
    start = time.monotonic()
    outcome = run_with_deadline(_slow, deadline=start + 0.5, grace_s=0.1)
    assert outcome.killed and outcome.payload == "second"
    assert time.monotonic() - start < 20.0  # killed, not waited out (it sleeps 30 s); any load passes this


def test_returns_the_final_answer_when_in_time() -> None:
    outcome = run_with_deadline(_quick, deadline=time.monotonic() + 5)
    assert not outcome.killed and outcome.payload == "final"


def test_reports_a_crash_with_the_last_incumbent() -> None:
    outcome = run_with_deadline(_broken, deadline=time.monotonic() + 5)
    assert outcome.payload == "partial" and outcome.error is not None and "solver crashed" in outcome.error


def test_a_started_child_runs_while_the_parent_works_and_streams_every_report() -> None:
    start = time.monotonic()
    child = start_child(_slow, deadline=start + 0.5)
    busy = sum(i * i for i in range(10_000))  # the parent's own work meanwhile
    seen: list[str] = []
    outcome = child.collect(deadline=start + 0.5, grace_s=0.0, on_report=seen.append)
    assert busy > 0 and seen == ["first", "second"]
    assert outcome.killed and outcome.payload == "second"
    assert time.monotonic() - start < 20.0  # killed, not waited out (it sleeps 30 s)
