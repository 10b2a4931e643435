"""TRL's ``SFTTrainer`` under plans: ``SkrullSFTTrainer`` (the ``trl`` extra).

A stock TRL script changes in two places: ``SFTTrainer`` becomes ``SkrullSFTTrainer`` and it is given
``planned``, how to build the planned loader (``skrull.worker.dataloader.PlannedBatches``) over the rows
TRL prepares, typically ``functools.partial(PlannedBatches, options=LoaderOptions(...), mesh=...)``.

What stays TRL's: the dataset preparation (a chat through the tokenizer's ``apply_chat_template``, the
``assistant_only_loss`` / ``completion_only_loss`` masks turned into ``labels``, truncation to
``max_length``), the loss (``compute_loss``: the fused LM head, ``loss_type``, its entropy and token
accuracy metrics) and everything of the Trainer (optimizer, scheduler, DDP, checkpoints, logs). What the
plan replaces is what TRL would do between the prepared rows and the model:

- TRL's ``packing`` packs rows offline into fixed ``max_length`` blocks, and refuses context parallelism
  (CP > 1) because the packed documents would attend across their boundaries; the plan packs each
  microbatch itself, balanced over DP ranks, and shards only the sequences it chooses over their CP group,
  with DACP attention keeping every sequence to itself;
- TRL's ``padding_free`` collator flattens a batch into one row, and refuses a custom collator; the
  planned loader delivers each microbatch already flattened, with positions restarting per sequence.

So ``packing=True``, ``padding_free=True`` and a ``data_collator`` are refused (ValueError), as are the
losses that read unshifted ``labels`` (``compute_loss_func``, ``label_smoothing_factor``): the loader's
targets are the next tokens already, passed as ``shift_labels``, which only TRL's fused LM head reads as
such. TRL turns activation checkpointing on by default: it runs with any CP (worker/dacp.py keeps the
DACP attention's collectives in one order on every rank under recomputation).

The loop is ``SkrullTrainerMixin``'s (worker/hf/trainer.py): one plan iteration per optimizer step,
``num_items_in_batch`` the global batch's target count over every rank, the loss times the process count.

A mixture of experts: TRL turns the router's auxiliary loss on (``router_aux_loss_coef`` None takes the
config's coefficient) and adds ``coef * aux / accumulation steps`` of each forward, not multiplied by the
process count, so DDP's average makes its weight ``1 / world`` of a rank's term. Under plans that term is
refused unless ``router_aux_loss="per_microbatch"`` asks for the own loop's semantics (worker/hf/router_loss.py,
worker/hf/trainer.py): each of the plan's microbatches adds ``coef * aux(m)`` over its own tokens (a CP
group's whole tokens where sequences are sharded), the same loss as ``SkrullTrainer`` and the own loop
train. TRL's own term is then left out (it would take each GPU's shard pieces alone), and the router
logits are read from the backbone's output, which TRL's fused LM head does not pass on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from datasets import Dataset
from trl import SFTTrainer

from skrull.worker import grad_sync
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.trainer import SkrullTrainerMixin
from skrull.worker.loss import IGNORE_INDEX

#: Builds the planned loader over the prepared rows and their lengths (``functools.partial(PlannedBatches, ...)``).
LoaderFactory = Callable[[Any, Sequence[int]], PlannedBatches]


class NextTokenRows:
    """TRL's prepared rows as the planned loader reads them.

    TRL's ``labels`` follow the Hugging Face convention: aligned with ``input_ids``, ``-100`` where no loss
    is taken (outside the assistant turns with ``assistant_only_loss``, in the prompt with
    ``completion_only_loss``), and shifted by the model. The loader's labels are the targets of each
    position, the next token's label (``-100`` after the last), so the packed rows need no shift and a
    shard piece holds its own targets. A row without ``labels`` trains on every token.
    """

    def __init__(self, dataset: Any, *, name: str = "train_dataset") -> None:
        columns = list(getattr(dataset, "column_names", None) or [])
        self.name = name
        if "input_ids" not in columns:
            raise ValueError(
                f"{name} columns {columns}: need 'input_ids' (a dataset SFTTrainer prepared, or one tokenized already)"
            )
        self.dataset = dataset
        #: tokens of each row: what the plans are made for
        self.lengths = [len(ids) for ids in dataset["input_ids"]]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        row = self.dataset[index]
        ids = [int(t) for t in row["input_ids"]]
        labels = [int(t) for t in row["labels"]] if row.get("labels") is not None else ids
        if len(labels) != len(ids):
            raise ValueError(f"{self.name}[{index}]: {len(labels)} labels for {len(ids)} input_ids")
        return {"input_ids": ids, "labels": [*labels[1:], IGNORE_INDEX]}


def _refuse_replaced_options(args: Any, kwargs: dict[str, Any]) -> None:
    """The options whose work the plan does, or that would read the loader's targets as unshifted labels."""
    if args is None:
        raise ValueError("args=None: give an SFTConfig (gradient_accumulation_steps=1, packing=False)")
    if getattr(args, "packing", False):
        raise ValueError(
            "packing=True: the plan packs each microbatch (and TRL's packing refuses CP > 1); set packing=False"
        )
    if getattr(args, "padding_free", False):
        raise ValueError(
            "padding_free=True: the planned loader delivers flattened microbatches already; set padding_free=False"
        )
    if kwargs.get("data_collator") is not None:
        raise ValueError(
            f"data_collator={type(kwargs['data_collator']).__name__}: the planned loader replaces the collator"
        )
    if kwargs.get("compute_loss_func") is not None:
        raise ValueError(
            "compute_loss_func is given: it would shift the loader's next-token targets again; subclass and "
            "override microbatch_loss instead"
        )
    if getattr(args, "label_smoothing_factor", 0.0) > 0:
        raise ValueError(
            f"label_smoothing_factor={args.label_smoothing_factor}: the label smoother shifts the loader's "
            "next-token targets again; set 0"
        )
    if not getattr(args, "average_tokens_across_devices", True):
        raise ValueError(
            "average_tokens_across_devices=False: the loss of a step is normalised by the global batch's target "
            "count over every rank (docs/finetune.md, the loss rule); set True"
        )


class SkrullSFTTrainer(SkrullTrainerMixin, SFTTrainer):
    """``SFTTrainer`` whose every optimizer step is one plan iteration (module doc).

    ``planned(rows, lengths)`` builds the loader once TRL has prepared ``train_dataset``; it must plan with
    ``equal_microbatches=True``: TRL gathers its metrics over the world on every microbatch, so every rank
    needs the same number of them.
    """

    def __init__(
        self,
        model: Any,
        args: Any = None,
        *,
        planned: LoaderFactory,
        router_aux_loss: str | None = None,
        **kwargs: Any,
    ) -> None:
        """``router_aux_loss``: refuse a mixture of experts' router loss (None, the default) or train it
        ``"per_microbatch"`` (module doc)."""
        _refuse_replaced_options(args, kwargs)
        train_dataset = kwargs.get("train_dataset")
        if train_dataset is not None and not isinstance(train_dataset, Dataset):
            raise ValueError(
                f"train_dataset={type(train_dataset).__name__}: the planned loader reads rows by index; give a "
                "map-style datasets.Dataset"
            )
        super().__init__(model, args, **kwargs)
        rows = NextTokenRows(self.train_dataset)
        loader = planned(rows, rows.lengths)
        if not isinstance(loader, PlannedBatches):
            raise ValueError(f"planned(rows, lengths) returned {type(loader).__name__}: it must build PlannedBatches")
        if not loader.equal_microbatches:
            raise ValueError(
                "planned: equal_microbatches=False; TRL gathers metrics over the world on every microbatch, so "
                "every rank needs the same count: plan with equal_microbatches=True"
            )
        self._use_plans(loader, router_aux_loss=router_aux_loss)
        if self.router is not None:
            self.aux_loss_enabled = False  # TRL's own term is replaced by the plan's (microbatch_loss)

    def _evaluation_rows(self, dataset: Any) -> tuple[Any, list[int], str | None]:
        """An eval set as TRL prepared it (chat template, assistant/completion masks, truncation), read as the
        training rows are: next-token targets."""
        rows = NextTokenRows(dataset, name="eval_dataset")
        return rows, rows.lengths, "next_token"

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        with self.maybe_activation_offload_context:  # as SFTTrainer.training_step does
            return super().training_step(model, inputs, num_items_in_batch)

    def microbatch_loss(
        self, model: Any, kwargs: dict[str, Any], labels: torch.Tensor, num_items_in_batch: Any
    ) -> torch.Tensor:
        """TRL's own ``compute_loss`` on the packed microbatch: its fused LM head scores the pre-shifted
        targets as ``shift_labels``, divides by ``num_items_in_batch`` and multiplies by the process count
        (``average_tokens_across_devices``), and records its metrics. With the router loss per microbatch
        the backbone's router logits are caught on their way out (TRL's fused output has none) and the
        mixin's ``router_term`` is added."""
        inputs = {**kwargs, "shift_labels": labels.unsqueeze(0)}
        caught: list[Any] = []
        hook = None
        if self.router is not None:
            inputs["output_router_logits"] = True
            inner: Any = grad_sync.unwrapped(model)
            backbone = inner.get_decoder()
            hook = backbone.register_forward_hook(lambda _m, _a, out: caught.append(out.router_logits))
        try:
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        finally:
            if hook is not None:
                hook.remove()
        assert isinstance(loss, torch.Tensor)  # return_outputs=False: the loss alone
        if self.router is not None:
            if len(caught) != 1:
                raise ValueError(f"router_aux_loss: {len(caught)} backbone forwards in one microbatch, expected 1")
            loss = loss + self.router_term(model, caught[0])
        return loss
