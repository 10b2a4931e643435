"""Run by tests/worker/hf/test_guards.py under ``torchrun`` (2 processes, gloo): each case builds what a
user's script would and prints ``refused: <message>`` or ``trained``; nothing may hang or train wrong."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from skrull.worker import grad_sync  # noqa: E402
from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.groups import IterationGroups  # noqa: E402
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.step import scheduled_step  # noqa: E402
from skrull.worker.kernels import select_kernel  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402

CONFIG = ROOT / "examples" / "models" / "llama-tiny.json"
ROWS = [[(7 * i + t) % 128 for t in range(4 + 6 * i)] for i in range(8)]


def loader(mesh: Any, **kw: Any) -> PlannedBatches:
    options: dict[str, Any] = {
        "global_batch_size": 4, "profile": "h100-80g/qwen2.5-0.5b", "bucket_tokens": 64, "solver": "skrull",
        "prefetch": 0, **kw,
    }  # fmt: skip
    return PlannedBatches(ROWS, [len(r) for r in ROWS], LoaderOptions(**options), mesh=mesh)


def report(fn: Any) -> None:
    """One line per case in this rank's own file (``report-<rank>.txt`` in the working directory): two
    ranks printing to torchrun's one pipe can interleave within a line on a loaded machine."""
    rank = dist.get_rank()
    try:
        said = fn()
    except ValueError as e:
        line = f"refused: {e}"
    else:
        line = said if isinstance(said, str) else "trained"
    with open(f"report-{rank}.txt", "a", encoding="utf-8") as f:
        f.write(line.replace("\n", " ") + "\n")
    print(f"{rank} {line}", flush=True)


def cp_mesh(mesh: Any, cp: int) -> Any:
    return mesh if cp == 1 else init_device_mesh("cpu", (2 // cp, cp), mesh_dim_names=("dp", "cp"))


def trainer(
    mesh: Any, *, use_cpu: bool, equal: bool, checkpointing: bool = False, cp: int = 1, args: Any = None
) -> None:
    from transformers import TrainingArguments

    from skrull.worker.hf.trainer import SkrullTrainer

    if args is None:
        args = TrainingArguments(
            output_dir="out", use_cpu=use_cpu, report_to=[], max_steps=1, per_device_train_batch_size=1
        )
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    if checkpointing:  # on the model, not in TrainingArguments
        model.gradient_checkpointing_enable()
    SkrullTrainer(model=model, args=args, planned=loader(cp_mesh(mesh, cp), equal_microbatches=equal)).train()


def loop(
    mesh: Any,
    *,
    stock_fsdp: bool,
    equal: bool,
    global_batch_size: int = 4,
    checkpointing: bool = False,
    cp: int = 1,
    from_elsewhere: bool = False,
) -> str | None:
    """``from_elsewhere``: the microbatches claim equal counts (as plans made outside the loader would), so
    only the step's count check can find that the ranks' counts differ. With ``checkpointing`` the CP
    collectives are counted: each layer's forward once and its recomputation once gather K/V, its backward
    reduce-scatters once, so all-gathers are twice the reduce-scatters exactly (more: a recomputation
    inside the attention's backward, which is what hung)."""
    from torch.distributed.fsdp import fully_shard

    model = build_model(read_model_config(str(CONFIG)), seed=0)
    if checkpointing:
        model.gradient_checkpointing_enable()
    mesh = cp_mesh(mesh, cp)
    if stock_fsdp:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = grad_sync.wrap(model, "fsdp")
    # at cp 2 a bucket of 24 tokens shards the rows longer than 24 (up to 46): groups communicate
    sizes = {"bucket_tokens": 24} if cp > 1 else {}
    planned = loader(mesh, equal_microbatches=equal, global_batch_size=global_batch_size, **sizes)
    groups = IterationGroups(planned)
    counts = {"all_gather_slots": 0, "reduce_scatter_slots": 0}
    if checkpointing:
        from skrull.worker import dacp

        def counting(name: str) -> Any:
            original = getattr(dacp, name)

            def counted(*a: Any, **kw: Any) -> Any:
                counts[name] += 1
                return original(*a, **kw)

            return counted

        for name in counts:
            setattr(dacp, name, counting(name))
    for ready in planned:
        microbatches = ready.microbatches
        if from_elsewhere:
            microbatches = tuple(dataclasses.replace(mb, equal_counts=True) for mb in microbatches)
        scheduled_step(
            model, microbatches, registry=groups(ready), kernel=select_kernel(torch.device("cpu"), torch.float32),
            device=torch.device("cpu"),
        )  # fmt: skip
    if checkpointing:
        return f"trained: {counts['all_gather_slots']} all-gathers, {counts['reduce_scatter_slots']} reduce-scatters"
    return None


def main() -> None:
    case = sys.argv[1]
    if case == "no-use-cpu":  # the user's script: the mesh initializes torch.distributed, use_cpu left unset
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "cp"))
        report(lambda: trainer(mesh, use_cpu=False, equal=True))
    elif case == "no-use-cpu-args-first":  # TrainingArguments(ddp_backend='gloo') first initializes the group
        from transformers import TrainingArguments

        args = TrainingArguments(output_dir="out", use_cpu=False, ddp_backend="gloo", report_to=[], max_steps=1)
        mesh = init_device_mesh(args.device.type, (2, 1), mesh_dim_names=("dp", "cp"))
        report(lambda: trainer(mesh, use_cpu=False, equal=True, args=args))
        report(lambda: loop(mesh, stock_fsdp=False, equal=True, checkpointing=True, cp=2))
    else:
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "cp"))
        report(lambda: trainer(mesh, use_cpu=True, equal=False))
        report(lambda: trainer(mesh, use_cpu=True, equal=True, checkpointing=True, cp=2))
        report(lambda: loop(mesh, stock_fsdp=True, equal=True))
        report(lambda: loop(mesh, stock_fsdp=False, equal=False))  # refused at the first step, counts equal or not
        report(lambda: loop(mesh, stock_fsdp=False, equal=False, global_batch_size=1, from_elsewhere=True))
        report(lambda: loop(mesh, stock_fsdp=False, equal=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
