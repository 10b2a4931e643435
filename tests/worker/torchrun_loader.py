"""Run by tests/worker/test_loader_torchrun.py under ``torchrun``: for each mesh shape given, in turn in the
same process group, every process builds a DeviceMesh from the env:// rendezvous, iterates the planned loader
with in-process plans, and writes what it got to ``<name>-rank<rank>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.train_tiny import TINY_PROFILE, make_dataset  # noqa: E402
from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402


def run_shape(out_dir: Path, name: str, shape: dict[str, int]) -> None:
    mesh = init_device_mesh("cpu", tuple(shape.values()), mesh_dim_names=tuple(shape))
    dataset = make_dataset(64, max_tokens=shape["cp"] * 64, seed=4)
    loader = PlannedBatches(
        dataset,
        [len(s) for s in dataset],
        LoaderOptions(global_batch_size=16, profile=TINY_PROFILE, seed=4, num_iterations=3, time_budget_s=0.2),
        mesh=mesh,
    )  # fmt: skip
    got = []
    for ready in loader:
        for mb in ready.microbatches:
            rows = [[ready.sample_indices[s], p] for s, p in mb.layout.row_tokens]
            got.append(
                {"iteration": ready.iteration, "plan": ready.plan_id, "rows": rows, "ids": mb.input_ids.tolist()}
            )
    loader.close()
    (out_dir / f"{name}-rank{dist.get_rank()}.json").write_text(json.dumps({"rank": loader.rank, "got": got}))


def main() -> None:
    # {"name": {"dp": 2, "cp": 2}, "other": {"dp": 2, "cp": 1, "tp": 2}}: one launch for every shape
    out_dir, shapes = Path(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo")  # env:// from torchrun
    for name, shape in shapes.items():
        run_shape(out_dir, name, shape)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
