"""The planner process beside training: one per node, plans shared by every rank (one node and two torchrun
"nodes" on 127.0.0.1), request budgets agreed over the job's store, and no planner left behind when a rank
or torchrun is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from examples.train_tiny import TINY_PROFILE, make_dataset
from skrull.corpus.order import global_batches
from skrull.solver.budget import smallest_budget_s
from skrull.solver.errors import RequestError
from skrull.solver.types import Parallel
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.planner.budget import PlanningBudget
from skrull.worker.planner.client import ProcessPlans
from tests.launch import run_torchrun, start_torchrun

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "torchrun_planner.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _check_every_token_once(results: list[dict[str, Any]], world: int) -> None:
    dataset = make_dataset(64, max_tokens=world * 64, seed=4)
    seen: dict[tuple[int, int], int] = {}
    for r in results:
        for g in r["got"]:
            for sample, pos in g["rows"]:
                seen[(sample, pos)] = seen.get((sample, pos), 0) + 1
    order = global_batches(64, global_batch_size=16, seed=4)[:4]
    assert seen == {(s, p): 1 for b in order for s in b for p in range(len(dataset[s]))}


def test_one_planner_process_per_node_serves_every_rank_of_a_torchrun_job(tmp_path: Path) -> None:
    done = run_torchrun(SCRIPT, [str(tmp_path), "run"], nproc=2, cwd=tmp_path, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len({r["planner"] for r in results}) == 1  # one planner process for the node
    assert all(r["planner"] not in (None, os.getpid()) for r in results)
    plans = {(g["iteration"], g["plan"]) for r in results for g in r["got"]}
    assert len(plans) == 4 == len({it for it, _ in plans})  # one plan per iteration, the same on both ranks
    _check_every_token_once(results, 2)
    assert "planning budget of request" in done.stderr  # the budget and why, in the log
    assert not _alive(results[0]["planner"])  # closed with the loader


def test_ranks_are_served_after_the_owners_loader_is_dropped_and_the_planner_exits_after_them(
    tmp_path: Path,
) -> None:
    """Local rank 0 drops its loader early (a rank refusing a configuration does): the node's other ranks
    still get every plan, not a lost socket, and the planner exits once they close."""
    done = run_torchrun(SCRIPT, [str(tmp_path), "owner-leaves"], nproc=2, cwd=tmp_path, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "rank1.json").read_text())
    assert len({g["iteration"] for g in result["got"]}) == 4
    assert result["planner_gone"], "the planner outlived every rank's loader"


def test_two_torchrun_nodes_plan_on_their_own_and_get_the_same_plans(tmp_path: Path) -> None:
    at = f"127.0.0.1:{_free_port()}"
    procs = [
        start_torchrun(SCRIPT, [str(tmp_path), "run"], nproc=2, cwd=tmp_path, nnodes=2, node_rank=n, rdzv_endpoint=at)
        for n in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    planners = {r["node"]: r["planner"] for r in results}
    assert len(planners) == 2 and len({r["planner"] for r in results}) == 2  # one planner per node
    plans = {(g["iteration"], g["plan"]) for r in results for g in r["got"]}
    assert len(plans) == 4 == len({it for it, _ in plans})  # both nodes planned the very same requests
    assert len({tuple(r["budgets"]) for r in results}) == 1  # budgets agreed over the job's store
    _check_every_token_once(results, 4)


def _hang(tmp_path: Path) -> tuple[subprocess.Popen[str], list[dict[str, int]]]:
    proc = start_torchrun(SCRIPT, [str(tmp_path), "hang"], nproc=2, cwd=tmp_path, capture=False)
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"pids{r}.json").exists() for r in range(2)):
        assert proc.poll() is None and time.monotonic() < deadline, "the job did not reach its first step"
        time.sleep(0.2)
    time.sleep(0.2)
    return proc, [json.loads((tmp_path / f"pids{r}.json").read_text()) for r in range(2)]


def _cleanup(proc: subprocess.Popen[str], pids: list[dict[str, int]]) -> None:
    for p in pids:  # the ranks this test started (through torchrun), if still there
        if _alive(p["pid"]):
            os.kill(p["pid"], signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


def test_the_planner_dies_when_its_rank_is_killed(tmp_path: Path) -> None:
    proc, pids = _hang(tmp_path)
    try:
        planner = pids[0]["planner"]
        assert planner == pids[1]["planner"] and _alive(planner)
        owner = next(p["pid"] for p in pids if p["rank"] == 0)  # local rank 0 of the only node
        os.kill(owner, signal.SIGKILL)
        assert _wait_gone(planner, 10.0), "planner process outlived the rank that started it"
    finally:
        _cleanup(proc, pids)


def test_the_planner_dies_when_torchrun_is_killed(tmp_path: Path) -> None:
    proc, pids = _hang(tmp_path)
    try:
        planner = pids[0]["planner"]
        assert _alive(planner)
        proc.send_signal(signal.SIGKILL)  # the launcher; its ranks run in sessions of their own and stay
        proc.wait(timeout=30)
        assert _wait_gone(planner, 10.0), "planner process outlived torchrun"
    finally:
        _cleanup(proc, pids)


def test_a_planner_process_refuses_a_bad_request_naming_the_field() -> None:
    plans = ProcessPlans()
    try:
        doc = {"batches": [[100, 5000]], "parallel": {"dp": 1, "cp": 1}, "profile": TINY_PROFILE, "solver": "skrull"}
        with pytest.raises(RequestError, match="batches"):
            plans.submit(doc)
        good = {**doc, "batches": [[10, 20, 30]]}
        key = plans.submit(good)
        view = plans.rank_view(key, 0, 0, timeout_s=60)
        assert view["plan_id"] == key and sum(v["max_seqlen"] > 0 for v in view["microbatches"]) >= 1
        assert plans.plan(key, timeout_s=60).parallel.num_gpus == 1
    finally:
        pid = plans.pid
        plans.close()
    assert pid is not None and _wait_gone(pid, 10.0)


def test_budget_follows_the_measured_step_and_the_first_proposal_is_agreed() -> None:
    class Store(dict):  # the compare_set of torch.distributed's stores
        def compare_set(self, key: str, expected: str, desired: str) -> bytes:
            if key not in self and expected == "":
                self[key] = desired
            return str(self.get(key, expected)).encode()

    store = Store()
    parallel = Parallel(dp=2, cp=2)
    a, b = PlanningBudget(share=0.5), PlanningBudget(share=0.5)
    assert a.decide("0/0", solver="auto", batch_sizes=[64], parallel=parallel) == a.initial_s
    for _ in range(5):
        a.record_step(0.1)
        b.record_step(0.3)
    first = a.decide("0/1", solver="auto", batch_sizes=[64], parallel=parallel, store=store, key="k")
    assert first == pytest.approx(0.05)  # half of a 100 ms step
    assert b.decide("0/1", solver="auto", batch_sizes=[64], parallel=parallel, store=store, key="k") == first
    for _ in range(4):
        a.record_solve({"budget_s": 0.05, "wall_s": 0.1})  # the planner takes twice its budget
    assert a.decide("0/2", solver="auto", batch_sizes=[64], parallel=parallel) == pytest.approx(0.025)
    resumed = PlanningBudget()
    resumed.load_state_dict(a.state_dict(epoch=0, from_chunk=2))
    assert resumed.decide("0/2", solver="auto", batch_sizes=[64], parallel=parallel) == pytest.approx(0.025)


def test_a_single_rank_loader_derives_its_budget_and_resumes_with_the_same_plans() -> None:
    dataset = make_dataset(48, max_tokens=64, seed=2)
    options = LoaderOptions(global_batch_size=8, profile=TINY_PROFILE, seed=2, rank=0, dp=1, cp=1, plan_ahead=2)
    loader = PlannedBatches(dataset, [len(s) for s in dataset], options)
    plan_ids = []
    for ready in loader:
        time.sleep(0.03)
        plan_ids.append(ready.plan_id)
        if len(plan_ids) == 3:
            break
    state = loader.state_dict()
    loader.close()
    assert state["budgets"] and all(b > 0 for b in state["budgets"].values())
    resumed = PlannedBatches(dataset, [len(s) for s in dataset], options)
    resumed.load_state_dict(state)
    again = PlannedBatches(dataset, [len(s) for s in dataset], options)
    again.load_state_dict(state)
    first = next(iter(resumed))
    assert first.iteration == 3 and first.plan_id == next(iter(again)).plan_id  # decided budgets kept
    resumed.close()
    again.close()


def test_the_planner_imports_the_loaders_skrull_not_one_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m`` puts the working directory first on the path: started from another checkout (or a folder
    named skrull), the planner process would run other code than the loader (another cost model, another
    calibration). It must import the package the loader imported."""
    decoy = tmp_path / "skrull"
    decoy.mkdir()
    (decoy / "__init__.py").write_text('raise ImportError("the skrull of the working directory")\n')
    monkeypatch.chdir(tmp_path)
    plans = ProcessPlans()
    try:
        doc = {"batches": [[10, 20, 30]], "parallel": {"dp": 1, "cp": 1}, "profile": TINY_PROFILE, "solver": "skrull"}
        key = plans.submit(doc)
        assert plans.rank_view(key, 0, 0, timeout_s=60)["plan_id"] == key
    finally:
        plans.close()


def test_a_loader_that_defers_proposes_no_less_than_auto_needs_with_defer() -> None:
    """With ``defer`` ``auto`` plans batch by batch (solver/defer.py) and needs more than without: the
    budget a loader proposes follows the step but never drops below that (the request would be refused)."""
    sizes, parallel = [256] * 64, Parallel(dp=4, cp=8)
    budget = PlanningBudget(share=0.001)
    for _ in range(5):
        budget.record_step(0.1)
    plain = budget.decide("0/0", solver="auto", batch_sizes=sizes, parallel=parallel)
    deferring = budget.decide("0/1", solver="auto", batch_sizes=sizes, parallel=parallel, deferring=True)
    assert plain >= smallest_budget_s("auto", sizes, parallel)
    assert deferring >= smallest_budget_s("auto", sizes, parallel, deferring=True) > 2 * plain


def test_ranks_without_a_group_agree_on_step_derived_budgets_through_the_nodes_planner(tmp_path: Path) -> None:
    """Ranks given explicitly, no ``torch.distributed`` group, one torchrun node: every rank asks the node's
    one planner process, so each request's budget is derived from the step and agreed through it (the first
    proposal wins), not the planner's minimum; both ranks get the same plans."""
    done = run_torchrun(SCRIPT, [str(tmp_path), "no-group"], nproc=2, cwd=tmp_path, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len({r["planner"] for r in results}) == 1
    plans = {(g["iteration"], g["plan"]) for r in results for g in r["got"]}
    assert len(plans) == 4 == len({it for it, _ in plans})  # the same plan per iteration on both ranks
    _check_every_token_once(results, 2)
    decided = [r["decided"] for r in results]
    assert decided[0] and decided[0] == decided[1]  # every request's budget decided, the same on both ranks
    assert set(results[0]["budgets"]) == set(decided[0].values())  # and what the planner was asked for
    assert "planning budget of request" in done.stderr


def test_a_private_planner_keeps_the_first_proposal_and_serves_no_other_rank() -> None:
    plans = ProcessPlans(job_key="agree-test")
    try:
        assert plans.compare_set("k/0/1", "", "0.05") == b"0.05"
        assert plans.compare_set("k/0/1", "", "0.3") == b"0.05"  # the first proposal is every rank's
        assert plans.compare_set("k/0/2", "", "0.3") == b"0.3"
        # a launcher of one's own starts one private planner per rank: nothing shared to agree through
        assert not plans.serves_whole_job(1) and not plans.serves_whole_job(4)
    finally:
        plans.close()
