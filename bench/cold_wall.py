"""Solve wall time of every planner in a fresh process: the budget promise with cold imports included.

``bench/budget.py`` times planners in one long-lived process, where solver modules are imported once;
a CLI call, a new service worker or a training loader's first request pays the imports (CP-SAT pulls
in pandas: ~0.4 s) inside its budget. Each cell here is one new Python process that builds the request
(256 sequences sampled from a bundled distribution, fixed seed), then times ``planning.solve`` alone.
A cell shows the slowest wall time over the datasets in ms; ``!`` marks a wall over
``budget + max(20 ms, 5%)``; ``refused`` an early ``time_budget_s`` refusal.

Run: ``python bench/cold_wall.py [--budgets 0.1,0.3,1] [--datasets a,b] [--solvers a,b]``. Prints
Markdown with the commit, machine, date and load average; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import dataclasses, json, sys, time
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.errors import RequestError
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel
solver, budget, dataset, profile = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
dp, cp = int(sys.argv[5]), int(sys.argv[6])
par = Parallel(dp=dp, cp=cp)
req = synthesize_request(
    dataset=dataset, parallel=par, profile=load_profile(profile), sequences_per_rank=256 // dp, seed=0
)
req = dataclasses.replace(req, solver=solver, time_budget_s=budget)
t0 = time.monotonic()
try:
    solve(req)
except RequestError:
    print(json.dumps(None))
else:
    print(json.dumps((time.monotonic() - t0) * 1e3))
"""


def cold_wall_ms(solver: str, budget: float, dataset: str, profile: str, dp: int, cp: int) -> float | None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [solver, str(budget), dataset, profile, str(dp), str(cp)]
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, check=True)
    value: float | None = json.loads(out.stdout.strip().splitlines()[-1])
    return value


def main() -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from budget import SETUPS, allowed_ms  # the same shapes and the same promise as bench/budget.py

    from skrull.solver.planners.registry import planner_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="0.1,0.3,1")
    parser.add_argument("--datasets", default="mooncake,chatqa2-long-sft,github")
    parser.add_argument("--solvers", default=None, help="comma-separated (default: every planner)")
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    datasets = args.datasets.split(",")
    solvers = args.solvers.split(",") if args.solvers else list(planner_names())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    print(
        f"Cold solve wall (fresh process per cell), commit {commit.stdout.strip() or 'unknown'}, "
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}, load {os.getloadavg()[0]:.2f}; "
        f"slowest of {', '.join(datasets)} (ms)\n"
    )
    for profile, parallel in SETUPS:
        print(f"### {profile}, DP{parallel.dp} x CP{parallel.cp}, 256 sequences\n")
        print("| planner | " + " | ".join(f"{b:g} s (<= {allowed_ms(b):.0f})" for b in budgets) + " |")
        print("|---|" + "---|" * len(budgets))
        for solver in solvers:
            cells = []
            for budget in budgets:
                walls = [cold_wall_ms(solver, budget, d, profile, parallel.dp, parallel.cp) for d in datasets]
                if all(w is None for w in walls):
                    cells.append("refused")
                    continue
                worst = max(w for w in walls if w is not None)
                cells.append(f"{worst:.0f}{' !' if worst > allowed_ms(budget) else ''}")
            print(f"| {solver} | " + " | ".join(cells) + " |", flush=True)
        print()


if __name__ == "__main__":
    main()
