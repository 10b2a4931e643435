"""The Hugging Face ``Trainer`` under plans: ``SkrullTrainer`` trains one plan iteration per optimizer step.

A stock Trainer script changes in two places: ``Trainer`` becomes ``SkrullTrainer`` and it is given the
planned loader (``skrull.worker.dataloader.PlannedBatches``) instead of a collator. Everything else is
the Trainer's own: its optimizer and scheduler, its DDP wrapping through accelerate, checkpoints, logging.

How it fits the Trainer's loop (transformers 5): the Trainer pulls ``gradient_accumulation_steps``
batches per optimizer step and syncs gradients on the last one. A plan's iteration has a varying number
of microbatches, so here one Trainer "batch" is one whole iteration (run with
``gradient_accumulation_steps=1``): ``get_batch_samples`` returns it with ``num_items_in_batch``, the
global batch's target count over every rank, and ``training_step`` runs this rank's microbatches,
forward and backward each, under ``accelerator.no_sync`` but for the last. Each microbatch's loss is the
model's own loss function as the Trainer calls it (``shift_labels`` for the pre-shifted targets,
``num_items_in_batch``), times the number of processes, as the Trainer does with
``average_tokens_across_devices``: DDP averages gradients over the world, the loss is a sum over it.
The loader should plan with ``equal_microbatches=True``, so that every rank has a microbatch to sync on.

DACP needs a process group for every group of ranks a microbatch shares; they are created on first use,
on every rank in the same order (``worker.groups.IterationGroups``: every rank holds the same deterministic plan).

The machinery is ``SkrullTrainerMixin``, so that a trainer derived from ``Trainer`` (TRL's ``SFTTrainer``:
worker/hf/trl.py) trains under plans with the same loop; such a trainer only changes how one microbatch's
loss is taken (``microbatch_loss``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from transformers import Trainer

from skrull.worker.dataloader import PlannedBatches, ReadyIteration
from skrull.worker.groups import IterationGroups
from skrull.worker.hf.attention import ATTN_IMPLEMENTATION
from skrull.worker.hf.inputs import model_inputs
from skrull.worker.hf.step import MicrobatchTimer, dacp_plans, global_target_count
from skrull.worker.kernels import select_kernel

if TYPE_CHECKING:  # the mixin is typed as the Trainer it is mixed into
    _TrainerBase = Trainer
else:
    _TrainerBase = object


class _Iterations:
    """What the Trainer iterates: one ``ReadyIteration`` per optimizer step. An iteration starts where the
    Trainer's state says (a resumed run: its checkpoint's ``global_step``), read when iteration begins,
    after the Trainer has loaded that state."""

    def __init__(self, planned: PlannedBatches, trainer: Trainer) -> None:
        self.planned = planned
        self.trainer = trainer

    def __len__(self) -> int:
        return len(self.planned)

    def __iter__(self) -> Iterator[ReadyIteration]:
        self.planned.next_iteration = max(self.planned.next_iteration, int(self.trainer.state.global_step))
        return iter(self.planned)


class _Steps(torch.utils.data.Dataset[int]):
    """A stand-in ``train_dataset`` (the Trainer requires one): the loader holds the data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class SkrullTrainerMixin(_TrainerBase):
    """What makes a ``Trainer`` train one plan iteration of ``planned`` per optimizer step (module doc).

    Mixed in before the Trainer class (``class T(SkrullTrainerMixin, SomeTrainer)``); the class calls
    ``_use_plans`` once its Trainer is built.
    """

    planned: PlannedBatches
    groups: IterationGroups
    kernel: Any
    #: the world's loss of each step trained (the loss of the plain run)
    step_losses: list[float]

    def _use_plans(self, planned: PlannedBatches) -> None:
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError(
                f"gradient_accumulation_steps={self.args.gradient_accumulation_steps}: "
                f"{type(self).__name__} runs one plan iteration per step, give 1"
            )
        model: Any = self.model
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation != ATTN_IMPLEMENTATION:
            # shard pieces through a stock attention would train on truncated context, silently
            raise ValueError(
                f"attn_implementation={implementation!r}: a model trained under plans runs the DACP attention; "
                f"build it with attn_implementation={ATTN_IMPLEMENTATION!r} (skrull.worker.hf.attention.register())"
            )
        # transformers 5 calls it activation_checkpointing (gradient_checkpointing, deprecated; TRL's default: on)
        if (
            getattr(self.args, "activation_checkpointing", None) or self.args.gradient_checkpointing
        ) and planned.cp > 1:
            raise ValueError(
                f"activation_checkpointing=True (or gradient_checkpointing) with cp={planned.cp}: recomputing the "
                "DACP attention in backward can order a CP group's collectives differently on its ranks, which "
                "hangs; set activation_checkpointing=False, or plan with cp=1"
            )
        # a resumed run starts at the checkpoint's step (``_Iterations``), not by replaying batches
        self.args.ignore_data_skip = True
        self.planned = planned
        self.groups = IterationGroups(planned)  # each iteration's process groups, on every rank in order
        self.kernel = select_kernel(self.args.device, next(model.parameters()).dtype)  # the model's dtype
        self.step_losses = []

    def get_train_dataloader(self) -> Any:
        return _Iterations(self.planned, self)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list[Any], Any]:
        ready = next(epoch_iterator, None)
        if ready is None:
            return [], None
        # counted where the collective runs: nccl reduces only GPU tensors
        return [ready], global_target_count(ready.microbatches, device=torch.device(device))

    def floating_point_ops(self, inputs: Any) -> int:
        return 0

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        model.train()
        ready: ReadyIteration = inputs
        device = self.args.device
        plans = dacp_plans(ready.microbatches, registry=self.groups(ready), kernel=self.kernel, device=device)
        world = self.accelerator.num_processes
        total = torch.zeros((), dtype=torch.float64, device=device)
        last = len(ready.microbatches) - 1
        # calibration from the run (PlannedBatches(calibrate=True)): each microbatch timed, gathered after
        timer = MicrobatchTimer(torch.device(device)) if self.planned.calibration is not None else None
        for k, (mb, plan) in enumerate(zip(ready.microbatches, plans, strict=True)):
            sync = contextlib.nullcontext() if k == last else self.accelerator.no_sync(model)
            if timer is not None:
                timer.start()
            with sync:
                kwargs, labels = model_inputs(mb, plan)
                loss = self.microbatch_loss(model, kwargs, labels, num_items_in_batch)
                self.accelerator.backward(loss)
            if timer is not None:
                timer.stop()
            total += loss.detach().double()
        if timer is not None:
            self.planned.record_timings(ready, timer.read_ms())
        world_loss = total / world
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(world_loss)
        self.step_losses.append(float(world_loss))
        return total.float()

    def microbatch_loss(
        self, model: Any, kwargs: dict[str, Any], labels: torch.Tensor, num_items_in_batch: Any
    ) -> torch.Tensor:
        """The loss to run backward on for one microbatch: this rank's summed cross-entropy over the global
        target count ``num_items_in_batch``, times the number of processes (DDP averages gradients over the
        world; the loss is a sum over it). ``labels`` are the packed rows' next-token targets."""
        rows = labels.unsqueeze(0)
        # already the next tokens: ``shift_labels``, so that the model does not shift them again
        out = model(**kwargs, labels=rows, shift_labels=rows, num_items_in_batch=num_items_in_batch)
        loss: torch.Tensor = out.loss * self.accelerator.num_processes
        return loss


class SkrullTrainer(SkrullTrainerMixin, Trainer):
    """``Trainer`` whose every optimizer step is one plan iteration of ``planned`` (module doc)."""

    def __init__(self, *args: Any, planned: PlannedBatches, **kwargs: Any) -> None:
        kwargs.setdefault("train_dataset", _Steps(len(planned)))
        super().__init__(*args, **kwargs)
        self._use_plans(planned)
