"""``skrull finetune``: N optimizer steps of a Hugging Face model under a plan on W processes, and the check.

``finetune_plan`` spawns one process per GPU rank (worker/launch.py). Each builds the same model from the
config and the seed (worker/hf/model.py), the process groups the plan uses, and for step ``s`` runs
iteration ``s mod len(plan.iterations)``: its microbatches packed from seeded random token ids
(``SyntheticData.lm_tokens``: the same ids in every process for a sequence id), forward and backward
with DACP attention, gradients summed over the world (worker/hf/step.py), one SGD step. Rank 0 records
the loss and, for ``--check``, every parameter's gradient of every step.

``check_steps`` replays the same steps in this process with the plain Hugging Face training step
(``plain_step``: the step's global batch right-padded, eager attention, no packing, no CP), the same
initial weights and the same optimizer, and compares. Errors are relative to the reference's magnitude:
``|loss - loss_ref| / |loss_ref|`` and, per parameter, ``max|g - g_ref| / max|g_ref|`` (an all-zero
reference gradient compares absolutely).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from skrull.solver.io import plan_from_dict, plan_to_dict
from skrull.solver.types import Plan
from skrull.worker import grad_sync
from skrull.worker.collectives import GroupRegistry
from skrull.worker.compiling import compile_count
from skrull.worker.dataloader import ready_microbatch
from skrull.worker.hf.fast import compile_model
from skrull.worker.hf.model import build_model
from skrull.worker.hf.router_loss import router_microbatches
from skrull.worker.hf.step import dacp_plans, plain_step, refuse_unrunnable_plan, relative_error, scheduled_step
from skrull.worker.inputs import SyntheticData
from skrull.worker.kernels import kernel_choice
from skrull.worker.launch import device_for, launch
from skrull.worker.layer_check import DTYPES
from skrull.worker.layout import rank_layouts
from skrull.worker.progress import progress_bar


@dataclass(frozen=True, slots=True, kw_only=True)
class FinetuneConfig:
    model_config: dict[str, Any]
    steps: int = 1
    seed: int = 0
    lr: float = 0.05
    kernel: str | None = None
    dtype: str = "float32"
    record_grads: bool = False
    loss_chunk_tokens: int | None = None
    #: Untimed steps first (their gradients are not applied; warm-up of allocator, kernels, sockets).
    warmup_steps: int = 0
    #: Rank 0's progress over the steps on stderr (worker/progress.py): None: a bar on a terminal, one line
    #: per step elsewhere; True: the bar always; False: nothing.
    progress: bool | None = None
    #: How gradients are summed over the world: "allreduce", "ddp" or "fsdp" (worker/grad_sync.py).
    grad_sync: str = "allreduce"
    #: Calibration from the run (worker/calibration.py): the request document the plan was made from. Each
    #: step's microbatches are timed on every rank and gathered; the profile is refitted after every step
    #: and each later step's iteration is re-planned with the latest fit (rank 0 plans, every rank gets it).
    calibrate_request: dict[str, Any] | None = None
    #: Decoder layers compiled: "on" (regional), "off", "auto" (regional on CUDA only), "fullgraph" (one graph
    #: per layer) or "stack" (the whole decoder one graph; not with grad_sync "fsdp"): worker/compiling.py.
    compile: str = "auto"
    #: A mixture of experts' router auxiliary loss (``output_router_logits``): None refuses it, and
    #: "per_microbatch" trains it per microbatch of the plan (worker/hf/router_loss.py).
    router_aux_loss: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    step: int
    iteration: int
    loss: float
    num_targets: int
    #: Slowest rank's wall time of the step (forward, backward, gradient all-reduce).
    seconds: float
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Graphs torch.compile compiled during the step on rank 0 (0 once warm: worker/compiling.py).
    compiles: int = 0
    #: The router auxiliary loss's semantics in ``loss`` and its part of it (None, 0: none).
    router_aux_loss: str | None = None
    router_loss: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FinetuneResult:
    steps: tuple[StepRecord, ...]
    kernel: str
    #: Per rank: (microbatches, tokens) summed over the steps.
    work: tuple[tuple[int, int], ...]
    #: With calibration: per step reports, the summary line and the calibrated profile (None when too few).
    calibration: dict[str, Any] | None = None
    #: The plan each step ran (with calibration: re-planned iterations), for ``check_steps``.
    step_plans: tuple[Plan, ...] = ()
    #: The attention kernel chosen and why (``KernelChoice.describe()``), rank 0's.
    kernel_line: str = ""
    #: Whether the decoder layers ran compiled.
    compiled: bool = False


def iteration_of(plan: Plan, step: int) -> int:
    return step % len(plan.iterations)


def step_sequences(plan: Plan, step: int) -> tuple[int, ...]:
    """The global batch of ``step``: the ids the plan puts in its iteration, in loader order."""
    it = plan.iterations[iteration_of(plan, step)]
    return tuple(sorted(i for mb in it.microbatches for i in mb.seq_ids))


def run_finetune_rank(
    plan: Plan, lengths: Sequence[int], *, config: FinetuneConfig, rank: int, device: torch.device
) -> dict[str, Any]:
    """GPU ``rank``'s part of every step (inside an initialized process group; collective over the world).

    Returns ``{"records": [StepRecord...], "kernel": name, "work": (microbatches, tokens)}``; gradients are
    recorded on rank 0 only (they are the world's sum, the same on every rank).
    """
    lengths = tuple(lengths)
    dtype = DTYPES[config.dtype]
    bar = progress_bar(
        total=config.warmup_steps + config.steps,
        desc="skrull finetune",
        unit="step",
        enabled=config.progress if rank == 0 else False,  # one bar: rank 0's
    )
    bar.set_postfix_str("building the model", refresh=True)
    base = build_model(
        config.model_config, seed=config.seed, device=device, dtype=dtype, router_aux_loss=config.router_aux_loss
    )
    refuse_unrunnable_plan(base, plan)  # every rank alike, before the first step
    compiled = compile_model(base, compile=config.compile, device=device)  # the fast step: layers compiled
    vocab = int(base.config.vocab_size)
    model: Any = grad_sync.wrap(base, config.grad_sync)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)  # after sharding: FSDP2's DTensors
    registry = GroupRegistry.for_plan(plan)
    choice = kernel_choice(device, dtype, config.kernel)
    kernel = choice.kernel
    data = SyntheticData(seed=config.seed, lengths=lengths)
    records = []
    microbatches = tokens = 0
    calibrating = _StepCalibration(plan, config.calibrate_request, registry) if config.calibrate_request else None
    for step in range(-config.warmup_steps, config.steps):
        # warm-up step w runs iteration w: warming up over every iteration compiles every shape range first
        iteration = iteration_of(plan, step if step >= 0 else step + config.warmup_steps)
        step_plan = calibrating.plan_for(iteration) if calibrating is not None and step >= 0 else plan
        # inputs and DACP index tensors are ready before the step starts (a loader builds them ahead)
        ready = [
            ready_microbatch(layout, lambda i: data.lm_tokens(i, vocab), loss_normalizer=0, device=device)
            for layout in rank_layouts(step_plan, lengths, iteration=iteration, rank=rank)
        ]
        plans = dacp_plans(ready, registry=registry, kernel=kernel, device=device)
        optimizer.zero_grad(set_to_none=False)
        timings: list[float] | None = [] if calibrating is not None and step >= 0 else None
        compiles_before = compile_count()
        result = scheduled_step(
            model,
            ready,
            registry=registry,
            kernel=kernel,
            device=device,
            loss_chunk_tokens=config.loss_chunk_tokens,
            plans=plans,
            microbatch_ms=timings,
            router_aux_loss=config.router_aux_loss,
        )
        if calibrating is not None and timings is not None:
            calibrating.record(iteration, ready, timings)
        slowest = torch.tensor([result.seconds], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        bar.set_postfix_str(f"{'warm-up' if step < 0 else 'step'} {step}: loss {result.loss:.4f}", refresh=False)
        bar.update()
        if step < 0:
            continue
        grads = {}
        if config.record_grads and (rank == 0 or config.grad_sync == "fsdp"):  # FSDP: a collective
            grads = grad_sync.full_gradients(model)
            if rank != 0:
                grads = {}
        records.append(
            StepRecord(
                step=step,
                iteration=iteration,
                loss=result.loss,
                num_targets=result.num_targets,
                seconds=float(slowest.item()),
                grads=grads,
                compiles=compile_count() - compiles_before,
                router_aux_loss=result.router_aux_loss,
                router_loss=result.router_loss,
            )
        )
        microbatches += result.microbatches
        tokens += result.tokens
        optimizer.step()
    bar.close()
    out: dict[str, Any] = {
        "records": records,
        "kernel": kernel.name,
        "work": (microbatches, tokens),
        "kernel_line": choice.describe(),
        "compiled": compiled,
    }
    if calibrating is not None:
        out["calibration"] = calibrating.result()
        out["step_plans"] = [plan_to_dict(p) for p in calibrating.step_plans]
    return out


class _StepCalibration:
    """``skrull finetune --calibrate`` inside every rank: gather each step's microbatch times, refit, and
    re-plan the next steps' iterations with the fit (worker/calibration.py). Every rank holds the same
    gathered timings; rank 0 fits and plans, and broadcasts the plan, so all ranks run one plan."""

    def __init__(self, plan: Plan, request_doc: dict[str, Any], registry: GroupRegistry) -> None:
        from skrull.solver.io import request_from_dict
        from skrull.worker.calibration import Calibration

        self.plan = plan
        self.request_doc = request_doc
        self.request = request_from_dict(dict(request_doc))
        self.start = request_doc.get("profile", self.request.profile.name)
        self.registry = registry
        self.calibration = Calibration(self.start, provenance={"by": "skrull finetune --calibrate"})
        self.measured: list[Any] = []
        self.reports: list[Any] = []
        self.step_plans: list[Plan] = []
        self._current: tuple[Plan, Any] = (plan, self.start)

    def plan_for(self, iteration: int) -> Plan:
        """This step's plan: ``iteration`` re-planned with the latest fit (the starting plan until one exists)."""
        import dataclasses as dc

        from skrull.solver.planning import solve_batch

        fitted = self.calibration.fitted
        if fitted is None:
            self._current = (self.plan, self.start)
        else:
            box: list[Any] = [None]
            if dist.get_rank() == 0:
                request = dc.replace(self.request, profile=_profile(fitted.profile))
                replanned = solve_batch(request, iteration).iteration
                iterations = list(self.plan.iterations)
                iterations[iteration] = replanned
                box[0] = plan_to_dict(dc.replace(self.plan, iterations=tuple(iterations)))
            dist.broadcast_object_list(box, src=0)
            plan = plan_from_dict(box[0])
            missing = [
                s for s in GroupRegistry.rank_sets_of(plan.iterations[iteration]) if s not in self.registry.groups
            ]
            if missing:  # every rank creates them, in one order
                self.registry.groups.update(GroupRegistry.create(missing).groups)
            self._current = (plan, fitted.profile)
        self.step_plans.append(self._current[0])
        return self._current[0]

    def record(self, iteration: int, ready: Sequence[Any], timings: Sequence[float]) -> None:
        from skrull.solver.cost import CostModel
        from skrull.worker.calibration import (
            RankTiming,
            iteration_report,
            measured_microbatches,
            rank_timings,
            starting_profile,
        )

        step = len(self.step_plans) - 1
        mine = [t.to_list() for t in rank_timings(step, ready, timings)]  # keyed by step: iterations repeat
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        rows = [RankTiming.from_list(r) for part in gathered for r in part]
        self.calibration.add(rows)
        self.calibration.refit()
        mbs = measured_microbatches(rows)
        profile = self._current[1]
        self.measured.extend((mb, profile) for mb in mbs)
        self.reports.append(iteration_report(step, mbs, profile, CostModel(starting_profile(profile))))

    def result(self) -> dict[str, Any]:
        from skrull.worker.calibration import noise_floor, summary_line

        fitted = self.calibration.fitted
        # one fit over the run (1.5 s at most): rank 0's, the part ``result_from_parts`` reads
        floor = noise_floor(self.start, [mb for mb, _ in self.measured]) if dist.get_rank() == 0 else None
        return {
            "reports": [dataclasses.asdict(r) for r in self.reports],
            "summary": summary_line(self.start, self.measured, self.reports, fitted.profile if fitted else None),
            "noise_floor": dataclasses.asdict(floor) if floor is not None else None,
            "noise_floor_line": floor.line() if floor is not None else None,
            "profile": fitted.profile if fitted else None,
            # every measured microbatch with the name of the profile its plan was made with: what the fit and
            # the summary line were computed from, for a reader who wants to see where the model is off
            "measured": [
                mb.to_record(profile if isinstance(profile, str) else str(profile.get("name")))
                for mb, profile in self.measured
            ],
        }


def _profile(doc: dict[str, Any]) -> Any:
    from skrull.solver.profile import profile_from_dict

    return profile_from_dict(doc)


def finetune_rank(
    rank: int,
    world_size: int,
    backend: str,
    plan_doc: dict[str, Any],
    lengths: tuple[int, ...],
    config: FinetuneConfig,
    out_dir: str,
) -> None:
    """One process of ``finetune_plan``: ``run_finetune_rank``, then ``rank{rank}.pt`` under ``out_dir``."""
    part = run_finetune_rank(
        plan_from_dict(plan_doc), lengths, config=config, rank=rank, device=device_for(backend, rank)
    )
    torch.save(part, Path(out_dir) / f"rank{rank}.pt")


def result_from_parts(parts: Sequence[dict[str, Any]]) -> FinetuneResult:
    return FinetuneResult(
        steps=tuple(parts[0]["records"]),
        kernel=parts[0]["kernel"],
        work=tuple(p["work"] for p in parts),
        calibration=parts[0].get("calibration"),
        step_plans=tuple(plan_from_dict(p) for p in parts[0].get("step_plans", ())),
        kernel_line=parts[0].get("kernel_line", ""),
        compiled=bool(parts[0].get("compiled", False)),
    )


def finetune_plan(
    plan: Plan, lengths: Sequence[int], *, world_size: int, backend: str = "gloo", config: FinetuneConfig
) -> FinetuneResult:
    """Spawn ``world_size`` processes and run ``config.steps`` steps under ``plan`` (module docstring)."""
    lengths = tuple(lengths)
    with tempfile.TemporaryDirectory(prefix="skrull-finetune-") as tmp:
        launch(finetune_rank, world_size=world_size, backend=backend, args=(plan_to_dict(plan), lengths, config, tmp))
        parts = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    return result_from_parts(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCheck:
    step: int
    loss: float
    reference_loss: float
    loss_rel_error: float
    #: (parameter name, relative error) of the worst gradient.
    worst_grad: tuple[str, float]
    grads_checked: int

    @property
    def max_rel_error(self) -> float:
        return max(self.loss_rel_error, self.worst_grad[1])


def check_steps(
    plan: Plan, lengths: Sequence[int], result: FinetuneResult, *, config: FinetuneConfig
) -> list[StepCheck]:
    """Replay the steps with ``plain_step`` in float32 and compare loss and every gradient; with
    ``router_aux_loss`` the plain step adds the router loss over each step's microbatches (the plan it ran)."""
    model = build_model(
        config.model_config, seed=config.seed, attn_implementation="eager", router_aux_loss=config.router_aux_loss
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    data = SyntheticData(seed=config.seed, lengths=tuple(lengths))
    vocab = int(model.config.vocab_size)
    checks = []
    for k, record in enumerate(result.steps):
        if not record.grads:
            raise ValueError("the run recorded no gradients (FinetuneConfig.record_grads)")
        optimizer.zero_grad(set_to_none=False)
        sequences = step_sequences(plan, record.step)
        units = None
        if config.router_aux_loss is not None:
            ran = result.step_plans[k] if k < len(result.step_plans) else plan
            position = {seq: n for n, seq in enumerate(sequences)}
            units = [tuple(position[i] for i in mb) for mb in router_microbatches(ran.iterations[record.iteration])]
        loss = plain_step(model, [data.lm_tokens(i, vocab)[0] for i in sequences], router_microbatches=units)
        worst = ("-", 0.0)
        count = 0
        for name, param in model.named_parameters():
            assert param.grad is not None, name
            err = relative_error(record.grads[name], param.grad)
            count += 1
            if err >= worst[1]:
                worst = (name, err)
        checks.append(
            StepCheck(
                step=record.step,
                loss=record.loss,
                reference_loss=loss,
                loss_rel_error=abs(record.loss - loss) / abs(loss) if loss else abs(record.loss),
                worst_grad=worst,
                grads_checked=count,
            )
        )
        optimizer.step()
    return checks
