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

A mixture of experts' router auxiliary loss (``output_router_logits=True``) is refused unless asked for by
name, ``router_aux_loss="per_microbatch"``: the own loop's semantics (worker/hf/router_loss.py), each of the
plan's microbatches adding ``coef * aux(m)`` over its own tokens (a CP group's whole tokens where its
sequences are sharded), so that the step's loss is

    loss = sum over targets CE / num_targets + coef * sum over the plan's microbatches m of aux(m)

as the plain Trainer weights the model's own term under gradient accumulation (the model adds
``coef * aux`` to each forward's loss and the Trainer, normalising by ``num_items_in_batch``, multiplies the
whole loss by the process count and does not divide by the accumulation steps). Each GPU's term is
multiplied by the process count as its cross-entropy is, since DDP averages gradients over the world. The
logs name it: ``router_aux_loss_per_microbatch``, the router's part of the logged ``loss``.

DACP needs a process group for every group of ranks a microbatch shares; they are created on first use,
on every rank in the same order (``worker.groups.IterationGroups``: every rank holds the same deterministic plan).

The machinery is ``SkrullTrainerMixin``, so that a trainer derived from ``Trainer`` (TRL's ``SFTTrainer``:
worker/hf/trl.py) trains under plans with the same loop; such a trainer only changes how one microbatch's
loss is taken (``microbatch_loss``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import EvalLoopOutput

from skrull.worker import grad_sync
from skrull.worker.dataloader import PlannedBatches, ReadyIteration
from skrull.worker.groups import IterationGroups
from skrull.worker.hf.attention import ATTN_IMPLEMENTATION, refuse_unsupported_model
from skrull.worker.hf.evaluation import plain_eval_loss, reduce_rows, row_losses
from skrull.worker.hf.fast import compile_model, compiled_how
from skrull.worker.hf.inputs import model_inputs
from skrull.worker.hf.router_loss import RouterAux, check_router_aux_loss
from skrull.worker.hf.step import MicrobatchTimer, causal_lm_loss, dacp_plans, global_target_count, model_heads
from skrull.worker.kernels import kernel_choice, select_kernel

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
        self.epoch = planned.epoch

    def __len__(self) -> int:
        return len(self.planned)

    def set_epoch(self, epoch: int) -> None:
        """The Trainer's epoch ``epoch`` is the loader's (reshuffled by seed and epoch)."""
        self.epoch = epoch
        self.planned.set_epoch(epoch)

    def __iter__(self) -> Iterator[ReadyIteration]:
        # a resumed run: the checkpoint's step within this epoch (the Trainer skips no batches itself)
        done = int(self.trainer.state.global_step) - self.epoch * len(self.planned)
        if 0 < done < len(self.planned) and self.planned.next_iteration < done:
            self.planned.next_iteration = done
        return iter(self.planned)


class _EpochFromSteps(TrainerCallback):
    """The logged ``epoch`` is ``global_step / iterations per epoch``: the Trainer counts it from the batches
    it iterated in this process, which restarts at 0 in a resumed run (that skipped no batch)."""

    def __init__(self, steps_per_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        state.epoch = state.global_step / self.steps_per_epoch


class _Steps(torch.utils.data.Dataset[int]):
    """A stand-in ``train_dataset`` (the Trainer requires one): the loader holds the data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


# ``TrainingArguments`` fields that change the loss or the gradient and that plans do not train exactly,
# with the value that does: refused before the first step (docs/integrations/hf-trainer.md has the table of
# every field that changes the loss or the gradient, with its status).
def _refusals(args: Any) -> list[tuple[str, Any, str]]:
    found: list[tuple[str, Any, str]] = []

    def arg(name: str, default: Any = None) -> Any:
        return getattr(args, name, default)

    if arg("label_smoothing_factor", 0.0):
        # the Trainer's LabelSmoother: (1 - eps) * NLL + eps * mean over the vocabulary of -log p, averaged over
        # each forward's own supervised tokens (not the global batch's count), on labels it shifts again
        found.append(
            (
                "label_smoothing_factor",
                arg("label_smoothing_factor"),
                "set 0 (the label smoother "
                "averages over each forward's tokens and shifts the loader's next-token targets again)",
            )
        )
    if arg("fp16", False):
        # float16 with loss scaling (accelerate's GradScaler) has run under plans on no device yet; bfloat16 has
        # (tests/worker/hf/test_trainer_arguments.py)
        found.append(
            (
                "fp16",
                True,
                "use bf16=True (checked under plans) or float32; float16 with loss scaling is "
                "not checked against the plain step under plans",
            )
        )
    if not arg("average_tokens_across_devices", True):
        found.append(
            (
                "average_tokens_across_devices",
                False,
                "set True (the loss of a step is normalised by "
                "the global batch's target count over every rank: docs/finetune.md, the loss rule)",
            )
        )
    if arg("neftune_noise_alpha") is not None:
        # NEFTune scales its embedding noise by alpha / sqrt(sequence length x hidden): a packed microbatch's
        # length is not the plain batch's padded width, so the noise would differ
        found.append(
            (
                "neftune_noise_alpha",
                arg("neftune_noise_alpha"),
                "leave it None (its noise scale depends on the batch's padded length, which packing changes)",
            )
        )
    if arg("use_liger_kernel", False):
        found.append(
            (
                "use_liger_kernel",
                True,
                "set False (its patched loss has not been checked against the plain step under plans)",
            )
        )
    if arg("auto_find_batch_size", False):
        found.append(
            (
                "auto_find_batch_size",
                True,
                "set False (the plan, not the Trainer, decides what a rank "
                "trains; lower bucket_tokens against memory errors)",
            )
        )
    if arg("deepspeed") is not None:
        found.append(
            (
                "deepspeed",
                arg("deepspeed"),
                "leave it None (DeepSpeed's engine has not been checked "
                "under plans; shard with FSDP2: fsdp_config={'version': 2} or grad_sync.wrap)",
            )
        )
    parallelism = arg("parallelism_config")
    sizes = {k: getattr(parallelism, k, 1) for k in ("cp_size", "sp_size", "tp_size", "dp_shard_size")}
    if parallelism is not None and any(isinstance(v, int) and v > 1 for k, v in sizes.items() if k != "dp_shard_size"):
        found.append(
            (
                "parallelism_config",
                parallelism,
                "leave it None (the plan's mesh decides the context and data parallel ranks)",
            )
        )
    if arg("dataloader_drop_last", False):
        found.append(
            (
                "dataloader_drop_last",
                True,
                "set False and pass LoaderOptions(drop_last=True) (the planned loader decides the batches)",
            )
        )
    if (
        str(getattr(arg("train_sampling_strategy", "random"), "value", arg("train_sampling_strategy", "random")))
        != "random"
    ):
        found.append(
            (
                "train_sampling_strategy",
                arg("train_sampling_strategy"),
                "leave it 'random' (the planned loader orders the rows: seed and shuffle of PlannedBatches)",
            )
        )
    return found


def refuse_loss_changing_arguments(args: Any) -> None:
    """A ``ValueError`` naming the first ``TrainingArguments`` field that would train a loss or gradient other
    than the plain Trainer's under plans, or that plans would silently ignore (``_refusals``)."""
    found = _refusals(args)
    if found:
        field, value, fix = found[0]
        raise ValueError(f"TrainingArguments({field}={value!r}): not trained exactly under plans; {fix}")


class SkrullTrainerMixin(_TrainerBase):
    """What makes a ``Trainer`` train one plan iteration of ``planned`` per optimizer step (module doc).

    Mixed in before the Trainer class (``class T(SkrullTrainerMixin, SomeTrainer)``); the class calls
    ``_use_plans`` once its Trainer is built.
    """

    planned: PlannedBatches
    groups: IterationGroups
    kernel: Any
    #: whether the decoder layers run compiled (worker/compiling.py)
    compiled: bool
    #: the world's loss of each step trained (the loss of the plain run)
    step_losses: list[float]
    #: the router auxiliary loss's semantics (None: refused when the model returns router logits)
    router_aux_loss: str | None
    #: of each step's loss, the router's part over the world (``router_aux_loss="per_microbatch"``; else empty)
    step_router_losses: list[float]
    #: what the router term needs of the model (None: no router term)
    router: RouterAux | None

    def _use_plans(
        self, planned: PlannedBatches, *, compile: str | bool | None = "auto", router_aux_loss: str | None = None
    ) -> None:
        self.router_aux_loss = check_router_aux_loss(router_aux_loss)
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError(
                f"gradient_accumulation_steps={self.args.gradient_accumulation_steps}: "
                f"{type(self).__name__} runs one plan iteration per step, give 1"
            )
        refuse_loss_changing_arguments(self.args)
        if getattr(self, "compute_loss_func", None) is not None:
            raise ValueError(
                "compute_loss_func is given: under plans each microbatch's loss is microbatch_loss (the loader's "
                "next-token targets over the global target count), which would ignore it; subclass and override "
                "microbatch_loss instead"
            )
        model: Any = self.model
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation != ATTN_IMPLEMENTATION:
            # shard pieces through a stock attention would train on truncated context, silently
            raise ValueError(
                f"attn_implementation={implementation!r}: a model trained under plans runs the DACP attention; "
                f"build it with attn_implementation={ATTN_IMPLEMENTATION!r} (skrull.worker.hf.attention.register())"
            )
        # activation checkpointing (TrainingArguments' activation_checkpointing / gradient_checkpointing, or
        # turned on on the model) runs with any CP: the DACP attention keeps its nested graph out of the
        # checkpoint's hooks, so every rank recomputes each layer once, at the same point (worker/dacp.py)
        # the architectures checked against the plain step; the router's auxiliary loss and attention features
        # the DACP attention does not compute (softcapping and sliding windows it does) refused
        refuse_unsupported_model(model.config, router_aux_loss=self.router_aux_loss)
        self.router = RouterAux.of(model.config) if self.router_aux_loss is not None else None
        self.step_router_losses = []
        self._router_logged = 0
        #: the microbatch ``microbatch_loss`` runs: its CP group (None: this GPU alone) and whether it is empty
        self._router_microbatch: tuple[Any, bool] = (None, False)
        self._router_terms: list[torch.Tensor] = []
        planned.check_model_heads(model_heads(model))  # with Ulysses allowed, the profile's heads are the model's
        if planned.vocab_size is None and isinstance(getattr(model.config, "vocab_size", None), int):
            # a token id out of the vocabulary is then refused naming its row, not an embedding IndexError
            planned.vocab_size = model.config.vocab_size
        self._refuse_batch_size(planned)
        self._refuse_other_world(planned)
        self._check_sharding()
        # a resumed run starts at the checkpoint's step (``_Iterations``), not by replaying batches
        self.args.ignore_data_skip = True
        self.add_callback(_EpochFromSteps(len(planned)))
        self.planned = planned
        self.groups = IterationGroups(planned)  # each iteration's process groups, on every rank in order
        dtype = next(model.parameters()).dtype  # the model's
        self.kernel = select_kernel(self.args.device, dtype)
        # the fast step (worker/hf/fast.py): decoder layers compiled, on CUDA by default; one line says how
        self.compiled = compile_model(model, compile=compile, device=torch.device(self.args.device))
        if self.args.process_index == 0:
            print(
                f"{kernel_choice(torch.device(self.args.device), dtype).describe()}; decoder layers "
                f"{compiled_how(model) if self.compiled else 'eager'}",
                file=sys.stderr,
            )
        self.step_losses = []
        self._prepare_evaluation(planned)

    def _refuse_other_world(self, planned: PlannedBatches) -> None:
        """The processes the Trainer syncs over, torch.distributed's world and the plan's mesh are one set:
        else gradients are never synchronised (found: ``use_cpu`` unset on a CPU under torchrun, where the
        Trainer sees one process and each rank trains alone; relative error 1.24), or a rank waits for ever."""
        mesh = planned.dp * planned.cp
        trainer_world = int(self.accelerator.num_processes)
        dist_world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        # the counts can agree while accelerate still syncs nothing: TrainingArguments(use_cpu=False,
        # ddp_backend='gloo') made first on a CPU initialises the process group, accelerate then counts its
        # processes but its state stays NO and it never wraps the model (found: relative error 3.2)
        synced = mesh == 1 or str(self.accelerator.distributed_type.value) != "NO"  # accelerate's DistributedType
        if trainer_world == dist_world == mesh and synced:
            if mesh > 1 and not planned.equal_microbatches:
                # DDP syncs on each rank's last microbatch: a rank with none never joins (found: a hang at
                # DP4 x CP1, global batch 2); TRL gathers metrics on every microbatch
                raise ValueError(
                    f"equal_microbatches=False with {mesh} processes: every rank must run the same number of "
                    "microbatches per step, or the gradient sync hangs; plan with LoaderOptions("
                    "equal_microbatches=True)"
                )
            return
        fix = "; launch dp x cp processes with torchrun"
        if self.args.device.type == "cpu" and not self.args.use_cpu and dist_world > 1:
            fix = (
                "; on CPUs set TrainingArguments(use_cpu=True, ddp_backend='gloo'): without use_cpu the Trainer "
                "sees one process on a machine without a GPU and never syncs gradients"
            )
        if trainer_world == dist_world == mesh:
            raise ValueError(
                f"the Trainer's accelerate state is {self.accelerator.distributed_type.value} with {mesh} processes "
                f"(TrainingArguments parallel_mode {self.args.parallel_mode.value}): it would never sync "
                f"gradients{fix}"
            )
        raise ValueError(
            f"the Trainer runs {trainer_world} process(es) (TrainingArguments parallel_mode "
            f"{self.args.parallel_mode.value}), torch.distributed {dist_world}, the plan's mesh dp x cp = "
            f"{planned.dp} x {planned.cp} = {mesh}: they must be equal{fix}"
        )

    def _check_sharding(self) -> None:
        """FSDP through the Trainer's own settings (``TrainingArguments(fsdp=..., fsdp_config=...)``, accelerate's
        FSDP plugin) trains under plans only where accelerate really applies FSDP2, whose reduce-scatter averages
        over the world as DDP does (``microbatch_loss`` multiplies by the process count), whose ``no_sync`` holds
        the reduction to the last microbatch (``set_requires_gradient_sync``), and whose per-forward all-gathers
        the equal microbatch counts keep in step. Refused, naming the setting:

        - FSDP asked for where accelerate does not apply it: on CPUs accelerate's state is MULTI_CPU, it drops
          the plugin and wraps the model in DDP, so nothing is sharded (found: ``fsdp='full_shard'`` on CPUs
          trained unsharded, without a word);
        - FSDP1 (``fsdp_config`` version 1): its flat-parameter wrapper has not been checked under plans."""
        asked = bool(self.args.fsdp) or self.args.fsdp_plugin_args is not None
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if asked and (not self.is_fsdp_enabled or plugin is None):
            raise ValueError(
                f"fsdp={self.args.fsdp!r}: accelerate applies FSDP only on accelerators; here its state is "
                f"{self.accelerator.distributed_type.value} and it would wrap the model in DDP, sharding nothing. "
                "Leave fsdp/fsdp_config unset on CPUs (DDP trains the same step), or shard with the own loop "
                "(skrull.worker.grad_sync.wrap)"
            )
        if plugin is not None and int(getattr(plugin, "fsdp_version", 1)) != 2:
            raise ValueError(
                f"fsdp_config version {plugin.fsdp_version}: under plans the Trainer's FSDP must be FSDP2; set "
                "fsdp_config={'version': 2}"
            )

    def _refuse_batch_size(self, planned: PlannedBatches) -> None:
        """``per_device_train_batch_size``: the plan, not the Trainer, decides what a rank trains, so a value
        is honoured only as what the loader already does (one global batch of ``global_batch_size`` rows over
        ``dp`` ranks), left at its default, or 1; anything else would be silently ignored."""
        size = self.args.per_device_train_batch_size
        default = TrainingArguments.__dataclass_fields__["per_device_train_batch_size"].default
        if size in (1, default) or size * planned.dp == planned.global_batch_size:
            return
        raise ValueError(
            f"per_device_train_batch_size={size}: the planned loader's global_batch_size={planned.global_batch_size} "
            f"over dp={planned.dp} decides each step's rows; set per_device_train_batch_size=1 (or "
            f"global_batch_size={size * planned.dp})"
        )

    def _prepare_evaluation(self, planned: PlannedBatches) -> None:
        """Evaluation runs under plans (worker/hf/evaluation.py): the eval sets' loaders are built now, so a
        row that no layout holds is refused before the first step, not at the first evaluation. What needs
        every row's logits (``compute_metrics``) is refused: the logits of a sharded row are spread over its
        CP group."""
        self._eval_loaders: dict[int, tuple[Any, PlannedBatches]] = {}
        if self.compute_metrics is not None:
            raise ValueError(
                "compute_metrics is given: under plans evaluation reports eval_loss only (a sharded row's logits "
                "are spread over its CP group); leave compute_metrics=None, or evaluate the saved model with the "
                "plain Trainer"
            )
        datasets = self.eval_dataset.values() if isinstance(self.eval_dataset, dict) else [self.eval_dataset]
        for dataset in datasets:
            if dataset is not None:
                self._eval_loader(dataset, planned)

    def _evaluation_rows(self, dataset: Any) -> tuple[Any, list[int], str | None]:
        """``(rows, lengths, label_convention)`` of an eval set for the planned loader: the rows as given, in
        the training loader's convention (None: the same)."""
        lengths = []
        for index in range(len(dataset)):
            item = dataset[index]
            ids = item["input_ids"] if isinstance(item, Mapping) else item
            lengths.append(len(ids))
        return dataset, lengths, None

    def _eval_loader(self, dataset: Any, planned: PlannedBatches | None = None) -> PlannedBatches:
        """The planned loader over ``dataset`` (built once per eval set). Refused with the router loss per
        microbatch: the plain Trainer's ``eval_loss`` adds ``coef * aux`` of each eval batch (the model's own
        term, its statistics over that padded batch), which the rows' cross-entropy under plans does not hold."""
        if getattr(self, "router", None) is not None:
            raise ValueError(
                f"eval_dataset with router_aux_loss={self.router_aux_loss!r}: the plain Trainer's eval_loss adds the "
                "router loss of each eval batch, which evaluation under plans does not compute; evaluate the saved "
                "model with the plain Trainer, or train with output_router_logits=False"
            )
        known = self._eval_loaders.get(id(dataset))
        if known is not None and known[0] is dataset:
            return known[1]
        rows, lengths, convention = self._evaluation_rows(dataset)
        loader = (planned or self.planned).for_evaluation(rows, lengths, label_convention=convention)
        self._eval_loaders[id(dataset)] = (dataset, loader)
        return loader

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        if isinstance(eval_dataset, str):
            assert isinstance(self.eval_dataset, dict)
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset (none was given to the trainer)")
        return self._eval_loader(dataset)

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        raise ValueError(
            "predict(): under plans a sharded row's logits are spread over its CP group; run predict with the "
            "plain Trainer on the saved model"
        )

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """Every row of the eval set forward under its plan; ``eval_loss`` as the plain single-process Trainer
        reports it at this ``per_device_eval_batch_size`` (worker/hf/evaluation.py)."""
        loader: PlannedBatches = dataloader
        model: Any = self.model
        was_training = model.training
        model.eval()
        device = self.args.device
        groups = IterationGroups(loader)
        groups.registry = self.groups.registry  # a group is created once, on every rank, whoever needs it
        n = len(loader.lengths)
        sums = torch.zeros(n, dtype=torch.float64, device=device)
        counts = torch.zeros(n, dtype=torch.int64, device=device)
        loader.set_epoch(0)
        loader.next_iteration = 0  # every evaluation is the whole set, from its first batch
        try:
            for ready in loader:
                plans = dacp_plans(ready.microbatches, registry=groups(ready), kernel=self.kernel, device=device)
                row_losses(model, ready, plans, sums=sums, counts=counts)
                self.control = self.callback_handler.on_prediction_step(self.args, self.state, self.control)
        finally:
            model.train(was_training)
        reduce_rows(sums, counts)
        loss = plain_eval_loss(sums.tolist(), counts.tolist(), batch_size=self.args.eval_batch_size)
        metrics = {f"{metric_key_prefix}_loss": loss}
        return EvalLoopOutput(predictions=None, label_ids=None, metrics=metrics, num_samples=n)  # type: ignore[arg-type]

    def _track_num_input_tokens(self, inputs: Any) -> None:
        """``include_num_input_tokens_seen``: the iteration's real tokens over the world (no padding rows; the
        Trainer's own count reads a padded batch's ``input_ids``)."""
        mode = self.args.include_num_input_tokens_seen
        if mode in (False, None, "no"):
            return
        ready: ReadyIteration = inputs
        mine = sum(mb.layout.num_tokens for mb in ready.microbatches)
        count = torch.tensor(mine, dtype=torch.int64, device=self.args.device)
        self.state.num_input_tokens_seen += int(self.accelerator.gather(count).sum().item())

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
        registry = self.groups(ready)
        plans = dacp_plans(ready.microbatches, registry=registry, kernel=self.kernel, device=device)
        world = self.accelerator.num_processes
        self._router_terms = []
        total = torch.zeros((), dtype=torch.float64, device=device)
        last = len(ready.microbatches) - 1
        # calibration from the run (LoaderOptions(calibrate=True)): each microbatch timed, gathered after
        timer = MicrobatchTimer(torch.device(device)) if self.planned.calibration is not None else None
        for k, (mb, plan) in enumerate(zip(ready.microbatches, plans, strict=True)):
            sync = contextlib.nullcontext() if k == last else self.accelerator.no_sync(model)
            if timer is not None:
                timer.start()
            with sync:
                grad_sync.fresh_autocast_casts()  # an autocast around the step: each forward casts afresh
                kwargs, labels = model_inputs(mb, plan)
                group = registry.get(mb.layout.ranks) if self.router is not None and mb.layout.communicates else None
                self._router_microbatch = (group, mb.num_tokens == 0)
                loss = self.microbatch_loss(model, kwargs, labels, num_items_in_batch)
                self.accelerator.backward(loss)
            if timer is not None:
                timer.stop()
            total += loss.detach().double()
        if timer is not None:
            self.planned.record_timings(ready, timer.read_ms())
        world_loss = total / world
        if self.router is not None:  # the router's part in the same all-reduce (every rank has a router)
            router_part = torch.zeros((), dtype=torch.float64, device=device)
            for term in self._router_terms:
                router_part += term.double().to(device)
            world_loss = torch.stack([world_loss, router_part])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(world_loss)
        if self.router is not None:
            self.step_router_losses.append(float(world_loss[1]))
            world_loss = world_loss[0]
        self.step_losses.append(float(world_loss))
        return total.float()

    def router_term(self, model: Any, router_logits: Any) -> torch.Tensor:
        """This GPU's part of the microbatch's router loss (``RouterAux.own_term`` over the router logits of its
        forward, the group's counts summed), times the process count as the cross-entropy is; 0 for an empty
        microbatch (its one padding token is no token of the batch). Recorded for the step's logged part."""
        assert self.router is not None
        group, empty = self._router_microbatch
        term = self.router.own_term(tuple(router_logits or ()), group=group)
        if empty:
            term = term * 0.0
        self._router_terms.append(term.detach())
        weighted: torch.Tensor = term * self.accelerator.num_processes
        return weighted

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's log line, with the router's part of ``loss`` named by its semantics
        (``router_aux_loss_per_microbatch``: the mean over the steps since the last log, as ``loss`` is)."""
        if getattr(self, "router", None) is not None and "loss" in logs:
            recent = self.step_router_losses[self._router_logged :]
            if recent:
                logs = {**logs, f"router_aux_loss_{self.router_aux_loss}": sum(recent) / len(recent)}
            self._router_logged = len(self.step_router_losses)
        super().log(logs, *args, **kwargs)

    def microbatch_loss(
        self, model: Any, kwargs: dict[str, Any], labels: torch.Tensor, num_items_in_batch: Any
    ) -> torch.Tensor:
        """The loss to run backward on for one microbatch: this rank's summed cross-entropy over the global
        target count ``num_items_in_batch``, times the number of processes (DDP averages gradients over the
        world; the loss is a sum over it). ``labels`` are the packed rows' next-token targets. With the router
        loss per microbatch the forward returns the router logits and takes no labels (the model would add its
        own term over this GPU's tokens only): the model's loss function on its logits, plus ``router_term``."""
        if self.router is not None:
            group, empty = self._router_microbatch
            terms: list[torch.Tensor] = []
            loss_with_router = causal_lm_loss(
                model, kwargs, labels, num_targets=int(num_items_in_batch), router=self.router, router_group=group,
                router_terms=terms, empty=empty,
            )  # fmt: skip
            self._router_terms.extend(terms)
            weighted: torch.Tensor = loss_with_router * self.accelerator.num_processes
            return weighted
        rows = labels.unsqueeze(0)
        # already the next tokens: ``shift_labels``, so that the model does not shift them again
        out = model(**kwargs, labels=rows, shift_labels=rows, num_items_in_batch=num_items_in_batch)
        loss: torch.Tensor = out.loss * self.accelerator.num_processes
        return loss


class SkrullTrainer(SkrullTrainerMixin, Trainer):
    """``Trainer`` whose every optimizer step is one plan iteration of ``planned`` (module doc)."""

    def __init__(
        self,
        *args: Any,
        planned: PlannedBatches,
        compile: str | bool | None = "auto",
        router_aux_loss: str | None = None,
        **kwargs: Any,
    ) -> None:
        """``compile``: the decoder layers compiled (``"on"``), eager (``"off"``), compiled on CUDA only
        (``"auto"``), or compiled one graph per layer (``"fullgraph"``); worker/compiling.py.
        ``router_aux_loss``: a mixture of experts' router auxiliary loss (``output_router_logits=True``) is
        refused by default; ``"per_microbatch"`` trains it per microbatch of the plan (module doc)."""
        kwargs.setdefault("train_dataset", _Steps(len(planned)))
        super().__init__(*args, **kwargs)
        self._use_plans(planned, compile=compile, router_aux_loss=router_aux_loss)
