"""Run by tests/worker/hf/test_trainer_fsdp.py under ``torchrun`` (2 gloo processes): ``SkrullTrainer`` with
the Trainer's own FSDP settings (``TrainingArguments(fsdp=True, fsdp_config={'version': N})``).

On CPUs accelerate never applies FSDP (its state is MULTI_CPU; it wraps the model in DDP), so the case
``cpu`` must be refused. The cases ``forced-2`` and ``forced-1`` take accelerate's FSDP path on CPUs, as it
runs on GPUs: after the Trainer built its Accelerator, the shared accelerate state is set to what it holds
on GPUs with the plugin (distributed type FSDP, the plugin from the same arguments), so ``prepare`` shards
the model with accelerate's own ``fsdp2_prepare_model`` (``fully_shard``) and the step runs through its
``no_sync`` and reduce-scatter. FSDP2 must train the plain step; FSDP1 must be refused (its plugin cannot be
built without an accelerator: ``forced-1`` is the FSDP2 plugin saying version 1, all that the guard reads).

Each rank writes ``refused: <message>`` or ``trained <wrapper> <largest relative error>`` to its own file,
``report-<rank>.txt`` in the working directory (two ranks printing to torchrun's one pipe can interleave
within a line on a loaded machine), and prints it after its rank."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import TrainerCallback, TrainingArguments

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.step import plain_step, relative_error  # noqa: E402
from skrull.worker.hf.trainer import SkrullTrainer  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402
from tests.worker.hf.eval_rows import CONFIG, train_rows  # noqa: E402
from tests.worker.hf.process_group import run_and_destroy_group  # noqa: E402


class AccelerateFSDPOnCPU(SkrullTrainer):
    """``SkrullTrainer`` whose accelerate state is what a GPU run with the FSDP plugin holds (module doc)."""

    version = 2

    def create_accelerator_and_postprocess(self) -> None:
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        super().create_accelerator_and_postprocess()
        state = self.accelerator.state
        state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
        # FSDP1's plugin needs an accelerator to be built at all: the version is what the guard reads
        state.fsdp_plugin.fsdp_version = self.version
        self.is_fsdp_enabled = True


def full(grad: Any) -> torch.Tensor:
    return (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()


def main() -> int:
    case = sys.argv[1]
    version = 1 if case.endswith("-1") else 2
    args = TrainingArguments(
        output_dir="out", use_cpu=True, ddp_backend="gloo", report_to=[], max_steps=1, save_strategy="no",
        per_device_train_batch_size=1, optim="sgd", learning_rate=0.05, max_grad_norm=0.0,
        fsdp=True, fsdp_config={"version": 2},
    )  # fmt: skip
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "cp"))
    rows = train_rows()
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            global_batch_size=4, profile="h100-80g/qwen2.5-0.5b", bucket_tokens=64, solver="skrull",
            equal_microbatches=True, label_convention="hf", num_iterations=1
        ),
        mesh=mesh,
    )  # fmt: skip
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    grads: dict[str, torch.Tensor] = {}

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, *a: Any, **kw: Any) -> None:
            grads.update({n: full(p.grad) for n, p in model.named_parameters()})  # a collective under FSDP2

    kind = SkrullTrainer if case == "cpu" else AccelerateFSDPOnCPU
    AccelerateFSDPOnCPU.version = version
    rank = dist.get_rank()
    try:
        trainer = kind(model=model, args=args, planned=planned, callbacks=[Gradients()])
    except ValueError as e:
        _report(rank, f"refused: {e}")
        return 0
    trainer.train()
    reference = build_model(read_model_config(str(CONFIG)), seed=0, attn_implementation="eager")
    batch = planned.batches[0]
    ids = [torch.tensor(rows[i]["input_ids"]) for i in batch]
    plain_step(reference, ids, labels=[torch.tensor(rows[i]["labels"]) for i in batch])
    errors = [relative_error(grads[n], p.grad) for n, p in reference.named_parameters()]
    wrapper = type(trainer.model_wrapped).__name__
    _report(rank, f"trained {wrapper} {max(errors):.3e} of {len(errors)} gradients")
    return 0


def _report(rank: int, line: str) -> None:
    with open(f"report-{rank}.txt", "w", encoding="utf-8") as f:
        f.write(line.replace("\n", " ") + "\n")
    print(f"{rank} {line}", flush=True)


if __name__ == "__main__":
    raise SystemExit(run_and_destroy_group(main))
