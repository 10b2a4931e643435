"""Run by tests/worker/test_planner_process.py under ``torchrun`` (one node or two): every process iterates
the planned loader with its defaults (the node's planner process, budgets from the step time), and writes
what it got, which planner process answered it, and its pids.

``argv``: output folder, then ``run`` (iterate, write, exit), ``hang`` (write the pids after the first
iteration, then wait to be killed) or ``owner-leaves`` (local rank 0 drops its loader after the first
iteration without closing it, as a rank that raises does; the others iterate on after it has) or
``no-group`` (no ``torch.distributed`` group: each rank given explicitly, from torchrun's environment, as a
launcher of one's own would give it)."""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.train_tiny import TINY_PROFILE, make_dataset  # noqa: E402
from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited planner stays one until its parent, rank 0, reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    logging.basicConfig(level=logging.INFO)  # the planner's budget and why
    grouped = mode != "no-group"
    if grouped:
        dist.init_process_group("gloo")  # env:// from torchrun
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    dataset = make_dataset(64, max_tokens=world * 64, seed=4)
    ranks = {} if grouped else {"rank": rank, "dp": 1}
    options = LoaderOptions(cp=world, global_batch_size=16, profile=TINY_PROFILE, seed=4, num_iterations=4, **ranks)
    loader = PlannedBatches(dataset, [len(s) for s in dataset], options)
    got = []
    if mode == "owner-leaves":
        if dist.get_rank() == 0:
            next(iter(loader))
            del loader
            gc.collect()
            dist.barrier()
            dist.barrier()  # alive until rank 1 is done: the planner outlives the loader, not the process
            dist.destroy_process_group()
            return
        dist.barrier()  # rank 0's loader, which started the node's planner, is gone
    for ready in loader:
        time.sleep(0.02)  # a step
        for mb in ready.microbatches:
            rows = [[ready.sample_indices[s], p] for s, p in mb.layout.row_tokens]
            got.append({"iteration": ready.iteration, "plan": ready.plan_id, "rows": rows})
        if mode == "hang":
            stats = loader.plans.stats()  # type: ignore[attr-defined]
            pids = {"rank": rank, "pid": os.getpid(), "planner": stats["pid"]}
            (out_dir / f"pids{rank}.json").write_text(json.dumps(pids))
            while True:
                time.sleep(1)
    stats = loader.plans.stats()  # type: ignore[attr-defined]
    budgets = sorted({p["budget_s"] for p in stats["plans"]})
    if grouped and mode != "owner-leaves":
        dist.barrier()
    loader.close()
    result = {
        "rank": loader.rank,
        "got": got,
        "planner": stats["pid"],
        "budgets": budgets,
        "decided": loader.budget.decided,
        "node": os.environ["GROUP_RANK"],
    }
    if mode == "owner-leaves":  # every rank of the node came and went: the planner exits, rank 0 still alive
        deadline = time.monotonic() + 10.0
        while _running(stats["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        result["planner_gone"] = not _running(stats["pid"])
        dist.barrier()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    if grouped:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
