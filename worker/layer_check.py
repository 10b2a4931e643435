"""Run every GPU's part of a plan through one attention layer, and check it against each sequence alone.

``execute_plan`` spawns one process per GPU rank (worker/launch.py). Each builds the process groups the
plan uses, then for every iteration runs its microbatches in step order: packed inputs (synthetic,
seeded by sequence id), ``AttentionLayer`` forward with DACP attention, backward with a synthetic
upstream gradient; weight gradients are summed over the world at the end (data-parallel reduction).
Outputs, input gradients and timings are written per rank and collected by the parent.

``reference_run`` is the unscheduled yardstick: one process, float64, each sequence alone through the
same layer with plain causal SDPA and position ids ``0..S-1``. ``compare`` reports the max abs error per
tensor; weight gradients sum over every token of the request, so their tolerance is scaled by their
magnitude (``tolerance * max(1, max |reference|)``), the others are absolute.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from skrull.solver.io import plan_from_dict, plan_to_dict
from skrull.solver.types import Plan
from skrull.worker.collectives import GroupRegistry
from skrull.worker.dacp import DACPPlan, dacp_attention, refuse_unrunnable_modes
from skrull.worker.inputs import SyntheticData, pack, position_ids, unpack
from skrull.worker.kernels import select_kernel
from skrull.worker.launch import device_for, launch
from skrull.worker.layout import rank_layouts
from skrull.worker.model import AttentionLayer, sequence_attention
from skrull.worker.progress import progress_bar

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerConfig:
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteConfig:
    layer: LayerConfig = LayerConfig()
    seed: int = 0
    kernel: str | None = None
    sharding: str = "zigzag"
    dtype: str = "float32"
    #: Untimed passes over the whole plan before the timed one (warm-up: allocator, kernels, sockets).
    warmup_passes: int = 0
    #: Rank 0's progress over the passes on stderr (worker/progress.py): None: a bar on a terminal, one
    #: line per pass elsewhere; True: the bar always; False: nothing.
    progress: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTiming:
    rank: int
    microbatches: int
    local_tokens: int
    piece_tokens: int
    seconds: float

    @property
    def tokens(self) -> int:
        return self.local_tokens + self.piece_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteResult:
    """Per-sequence outputs and input gradients, world-summed weight gradients, per-rank timings."""

    outputs: dict[int, torch.Tensor]
    input_grads: dict[int, torch.Tensor]
    weight_grads: dict[str, torch.Tensor]
    timings: tuple[RankTiming, ...]
    kernel: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorRow:
    tensor: str
    max_abs_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_error <= self.tolerance


def make_layer(config: ExecuteConfig) -> AttentionLayer:
    """The layer every process builds: same seed, same weights."""
    torch.manual_seed(config.seed)
    c = config.layer
    return AttentionLayer(
        hidden_size=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOutput:
    """One process's results: ``(seq_id, first token, output rows, input-gradient rows)`` per part."""

    records: list[tuple[int, int, torch.Tensor, torch.Tensor]]
    weight_grads: dict[str, torch.Tensor]
    timing: RankTiming
    kernel: str


def run_rank(
    plan: Plan, lengths: Sequence[int], *, config: ExecuteConfig, rank: int, device: torch.device
) -> RankOutput:
    """Run GPU ``rank``'s part of every iteration of ``plan`` (inside an initialized process group).

    Collective: every process of the world must call it with the same plan (process groups are created
    and weight gradients summed over the world).
    """
    refuse_unrunnable_modes(plan, heads=config.layer.num_heads)  # every rank alike, before the first step
    lengths = tuple(lengths)
    dtype = DTYPES[config.dtype]
    registry = GroupRegistry.for_plan(plan)
    layer = make_layer(config).to(device=device, dtype=dtype)
    kernel = select_kernel(device, dtype, config.kernel)
    data = SyntheticData(seed=config.seed, lengths=lengths)
    hidden = config.layer.hidden_size
    records: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []
    microbatches = local_tokens = piece_tokens = 0
    seconds = 0.0
    passes = config.warmup_passes + 1
    bar = progress_bar(
        total=passes, desc="skrull execute", unit="pass", enabled=config.progress if rank == 0 else False
    )
    for done in range(passes):
        layer.zero_grad(set_to_none=True)
        records.clear()
        microbatches = local_tokens = piece_tokens = 0
        seconds = 0.0
        for iteration in range(len(plan.iterations)):
            for layout in rank_layouts(plan, lengths, iteration=iteration, rank=rank, sharding=config.sharding):
                group = registry.get(layout.ranks) if layout.communicates else None
                dplan = DACPPlan.build(layout, group=group, kernel=kernel, device=device)
                if layout.num_tokens:
                    x = pack(layout, lambda i: data.hidden(i, hidden)).to(device=device, dtype=dtype)
                    g_out = pack(layout, lambda i: data.grad_output(i, hidden)).to(device=device, dtype=dtype)
                else:  # a member of a group with nothing of its own still joins the collectives
                    x = torch.zeros(0, hidden, device=device, dtype=dtype)
                    g_out = torch.zeros(0, hidden, device=device, dtype=dtype)
                x.requires_grad_(True)
                pos = position_ids(layout, device)
                _sync(device)
                start = time.perf_counter()
                out = layer(x, pos, lambda q, k, v, p=dplan: dacp_attention(q, k, v, p))
                out.backward(g_out)
                _sync(device)
                seconds += time.perf_counter() - start
                microbatches += 1
                local_tokens += layout.num_local_tokens
                piece_tokens += layout.num_piece_tokens
                assert x.grad is not None
                outs = unpack(layout, out.detach().float().cpu())
                grads = unpack(layout, x.grad.float().cpu())
                for (seq_id, first, o), (_, _, gx) in zip(outs, grads, strict=True):
                    records.append((seq_id, first, o, gx))
        timed = done == passes - 1
        bar.set_postfix_str(
            f"{'timed' if timed else 'warm-up'} pass over {len(plan.iterations)} iteration(s)", refresh=False
        )
        bar.update()
    bar.close()
    weight_grads = {}
    for name, param in layer.named_parameters():
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        dist.all_reduce(grad)
        weight_grads[name] = grad.float().cpu()
    timing = RankTiming(
        rank=rank, microbatches=microbatches, local_tokens=local_tokens, piece_tokens=piece_tokens, seconds=seconds
    )
    return RankOutput(records=records, weight_grads=weight_grads, timing=timing, kernel=kernel.name)


def execute_rank(
    rank: int,
    world_size: int,
    backend: str,
    plan_doc: dict[str, Any],
    lengths: tuple[int, ...],
    config: ExecuteConfig,
    out_dir: str,
) -> None:
    """One process of ``execute_plan``: ``run_rank``, then ``rank{rank}.pt`` under ``out_dir``."""
    output = run_rank(plan_from_dict(plan_doc), lengths, config=config, rank=rank, device=device_for(backend, rank))
    torch.save(output, Path(out_dir) / f"rank{rank}.pt")


def collect(plan: Plan, lengths: Sequence[int], parts: Sequence[RankOutput], *, hidden_size: int) -> ExecuteResult:
    """Reassemble per-sequence tensors from every rank's parts; every token must appear exactly once."""
    seq_ids = sorted({i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids})
    outputs = {i: torch.full((lengths[i], hidden_size), float("nan")) for i in seq_ids}
    input_grads = {i: torch.full((lengths[i], hidden_size), float("nan")) for i in seq_ids}
    seen = {i: torch.zeros(lengths[i], dtype=torch.long) for i in seq_ids}
    for part in parts:
        for seq_id, first, out, grad in part.records:
            rows = slice(first, first + out.shape[0])
            outputs[seq_id][rows] = out
            input_grads[seq_id][rows] = grad
            seen[seq_id][rows] += 1
    for seq_id, count in seen.items():
        assert bool((count == 1).all()), f"sequence {seq_id}: every token must be computed exactly once"
    return ExecuteResult(
        outputs=outputs,
        input_grads=input_grads,
        weight_grads=parts[0].weight_grads,
        timings=tuple(p.timing for p in parts),
        kernel=parts[0].kernel,
    )


def execute_plan(
    plan: Plan, lengths: Sequence[int], *, world_size: int, backend: str = "gloo", config: ExecuteConfig
) -> ExecuteResult:
    """Spawn ``world_size`` processes, run the plan, gather per-sequence results (see module docstring)."""
    lengths = tuple(lengths)
    with tempfile.TemporaryDirectory(prefix="skrull-execute-") as tmp:
        launch(execute_rank, world_size=world_size, backend=backend, args=(plan_to_dict(plan), lengths, config, tmp))
        parts = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    return collect(plan, lengths, parts, hidden_size=config.layer.hidden_size)


def reference_run(
    lengths: Sequence[int], seq_ids: Sequence[int], *, config: ExecuteConfig
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """Each sequence alone, in one process, float64: ``(outputs, input_grads, weight_grads)``."""
    layer = make_layer(config).to(torch.float64)
    data = SyntheticData(seed=config.seed, lengths=tuple(lengths))
    hidden = config.layer.hidden_size
    outputs, input_grads = {}, {}
    for seq_id in seq_ids:
        x = data.hidden(seq_id, hidden).double().requires_grad_(True)
        pos = torch.arange(lengths[seq_id])
        out = layer(x, pos, sequence_attention)
        out.backward(data.grad_output(seq_id, hidden).double())
        assert x.grad is not None
        outputs[seq_id] = out.detach()
        input_grads[seq_id] = x.grad
    weight_grads = {
        name: (p.grad if p.grad is not None else torch.zeros_like(p)) for name, p in layer.named_parameters()
    }
    return outputs, input_grads, weight_grads


def compare(
    result: ExecuteResult, lengths: Sequence[int], *, config: ExecuteConfig, tolerance: float
) -> list[ErrorRow]:
    """Max abs error of every tensor against ``reference_run``."""
    ref_out, ref_grad, ref_w = reference_run(lengths, sorted(result.outputs), config=config)

    def worst(got: dict[Any, torch.Tensor], want: dict[Any, torch.Tensor]) -> float:
        errors = [float((got[k].double() - want[k]).abs().max()) for k in want if want[k].numel()]
        return max(errors, default=0.0)

    rows = [
        ErrorRow(tensor="output", max_abs_error=worst(result.outputs, ref_out), tolerance=tolerance),
        ErrorRow(tensor="grad input", max_abs_error=worst(result.input_grads, ref_grad), tolerance=tolerance),
    ]
    for name, want in ref_w.items():
        scale = max(1.0, float(want.abs().max()))
        got = result.weight_grads[name].double()
        rows.append(
            ErrorRow(tensor=f"grad {name}", max_abs_error=float((got - want).abs().max()), tolerance=tolerance * scale)
        )
    return rows
