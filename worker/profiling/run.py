"""``skrull profile``: measure a device and write a profile; ``--check``: predicted vs measured per rank.

Profile: one decoder layer of the model's shape is timed on packs of sequences from 128 tokens up to
``max_tokens`` (single sequences, and packs of 4 and 16 shorter ones so that the linear and quadratic
terms both vary), attention alone per query length, activation bytes at four token counts, and, with
more than one GPU, all-gathers of 1 MiB to 256 MiB. worker/profiling/document.py fits and lays out.

Check: requests synthesized from bundled length distributions are planned (skrull and deepspeed by
default); every rank's part of the first iteration (each microbatch part: local sequences and shard
pieces) is measured on this one device in turn and compared with the specification's prediction of the
same quantity (worker/profiling/check.py): its compute for a profiled or derived profile, the whole
microbatch, ``microbatch_ms`` included, for a calibrated one.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skrull.solver.cost import CostModel
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import Profile
from skrull.solver.profiles.derive import GPUS, ModelConfig, TrainingSetup, derive_profile
from skrull.solver.types import Parallel, Problem
from skrull.worker.compiling import resolve_compile
from skrull.worker.kernels import select_kernel
from skrull.worker.layout import rank_layouts
from skrull.worker.profiling.check import MEASURES, CheckStats, check_stats, rank_predicted_ms
from skrull.worker.profiling.comm import measure_comm
from skrull.worker.profiling.document import profile_document
from skrull.worker.profiling.measure import (
    HeadTimer,
    Part,
    Timer,
    build_layer,
    measure_attention,
    measure_compute,
    measure_memory,
    measure_microbatches,
    measure_parts,
)
from skrull.worker.progress import progress_bar

MIN_TOKENS = 128
COMM_SIZES = tuple(2**k for k in range(20, 29, 2))  # 1 MiB .. 256 MiB gathered


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOptions:
    model: ModelConfig
    device: torch.device
    dtype: torch.dtype
    max_tokens: int
    name: str | None = None
    kernel: str | None = None
    repeats: int = 3
    num_gpus: int = 1
    capacity_bytes: float | None = None
    setup: TrainingSetup = dataclasses.field(default_factory=TrainingSetup)
    #: a tqdm bar over the phases on stderr: None on a terminal only, True always, False never
    progress: bool | None = None
    #: time the layer compiled, as the fast step runs it: None on CUDA only (worker/compiling.py)
    compile: bool | None = None


def length_grid(max_tokens: int, *, min_tokens: int = MIN_TOKENS) -> list[int]:
    """Powers of two from ``min_tokens`` up to ``max_tokens``, with ``max_tokens`` itself last."""
    grid = []
    s = min_tokens
    while s < max_tokens:
        grid.append(s)
        s *= 2
    grid.append(max_tokens)
    return grid


def compute_packs(grid: Sequence[int]) -> list[list[int]]:
    """Whole sequences of each length, and the same token counts as 4 and 16 shorter sequences."""
    packs = [[s] for s in grid]
    packs += [[s // 4] * 4 for s in grid if s // 4 >= MIN_TOKENS // 2]
    packs += [[s // 16] * 16 for s in grid if s // 16 >= MIN_TOKENS // 2]
    return packs


def device_description(device: torch.device) -> tuple[str, float | None]:
    """(name, memory bytes) of the device; CPU memory is not a GPU's and is reported as unknown."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return str(props.name), float(props.total_memory)
    return f"cpu {platform.machine()} ({torch.get_num_threads()} threads)", None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def run_profile(opts: ProfileOptions) -> dict[str, Any]:
    """Measure everything (see module docstring) and return the profile document."""
    kernel = select_kernel(opts.device, opts.dtype, opts.kernel)
    timer = Timer(opts.device, warmup=1, repeats=opts.repeats)
    compiled = resolve_compile(opts.compile, opts.device)
    layer = build_layer(opts.model, device=opts.device, dtype=opts.dtype, compile=compiled)
    grid = length_grid(opts.max_tokens)
    head = HeadTimer(opts.model, timer=timer, dtype=opts.dtype)
    bar = progress_bar(total=4, desc="skrull profile", unit="phase", enabled=opts.progress)
    bar.set_postfix_str(f"compute of {len(compute_packs(grid))} packs", refresh=True)
    compute = measure_compute(
        opts.model, layer, compute_packs(grid), kernel=kernel, timer=timer, dtype=opts.dtype, head=head
    )
    bar.update()
    bar.set_postfix_str(f"attention at {len(grid)} lengths", refresh=True)
    attention = measure_attention(opts.model, grid, kernel=kernel, timer=timer, dtype=opts.dtype)
    bar.update()
    memory_tokens = sorted({max(MIN_TOKENS, opts.max_tokens * k // 4) for k in range(1, 5)})
    bar.set_postfix_str("activation memory", refresh=True)
    eager_layer = build_layer(opts.model, device=opts.device, dtype=opts.dtype)  # saved bytes: autograd's own
    memory = measure_memory(eager_layer, memory_tokens, kernel=kernel, device=opts.device, dtype=opts.dtype)
    bar.update()
    comm = []
    bar.set_postfix_str(f"communication over {opts.num_gpus} GPUs" if opts.num_gpus > 1 else "done", refresh=True)
    if opts.num_gpus > 1:
        backend = "nccl" if opts.device.type == "cuda" else "gloo"
        comm = measure_comm(num_gpus=opts.num_gpus, backend=backend, sizes=COMM_SIZES)
    bar.update()
    bar.close()
    device_name, device_memory = device_description(opts.device)
    capacity = opts.capacity_bytes if opts.capacity_bytes is not None else device_memory
    if capacity is None:
        raise ValueError("capacity_bytes is needed when the device does not report its memory")
    base_gpu = GPUS["h100-80g"]
    derived = derive_profile(opts.model, dataclasses.replace(base_gpu, memory_bytes=int(capacity)), opts.setup)
    measured = {
        "device": device_name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "kernel": kernel.name,
        "compiled": compiled,
        "dtype": str(opts.dtype).removeprefix("torch."),
        "num_gpus": opts.num_gpus,
        "max_tokens": opts.max_tokens,
        "repeats": opts.repeats,
        "memory_bytes": capacity,
    }
    name = opts.name or f"{slug(device_name)}/{opts.model.name}"
    return profile_document(
        name=name,
        model=opts.model,
        measured=measured,
        compute_samples=compute,
        attention_points=attention,
        memory_samples=memory,
        comm_samples=comm,
        capacity_bytes=capacity,
        setup=opts.setup,
        bytes_per_value=opts.dtype.itemsize,
        derived_comm={"ms_per_mib": derived.comm.ms_per_mib, "fixed_ms": derived.comm.fixed_ms},
        derived_microbatch_ms=derived.microbatch_ms,
        derived_a2a=None
        if derived.comm_a2a is None
        else {"ms_per_mib": derived.comm_a2a.ms_per_mib, "fixed_ms": derived.comm_a2a.fixed_ms},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRow:
    """One planned request: per-rank predicted and measured compute of its first iteration."""

    dataset: str
    solver: str
    predicted_ms: tuple[float, ...]
    measured_ms: tuple[float, ...]

    @property
    def stats(self) -> CheckStats:
        return check_stats(self.predicted_ms, self.measured_ms)


def run_check(
    profile: Profile,
    model: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    datasets: Sequence[str],
    solvers: Sequence[str],
    parallel: Parallel,
    sequences_per_rank: int,
    seed: int = 0,
    repeats: int = 3,
    kernel: str | None = None,
    bucket_tokens: int | None = None,
    progress: bool | None = None,
    compile: bool | None = None,
    measure: str = "layers",
) -> list[CheckRow]:
    """Plan each dataset's request with each solver and measure every rank's part of the first iteration
    (module docstring): ``measure="layers"`` its compute, one layer timed alone ``x num_layers`` plus the
    head; ``"microbatches"`` each part run as a whole microbatch, priced with ``microbatch_ms``
    (worker/profiling/check.py)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    measure_fn = measure_microbatches if measure == "microbatches" else measure_parts
    bar = progress_bar(
        total=len(datasets) * len(solvers) * parallel.num_gpus,
        desc="skrull profile --check",
        unit="rank",
        enabled=progress,
    )
    attention = select_kernel(device, dtype, kernel)
    timer = Timer(device, warmup=1, repeats=repeats)
    layer = build_layer(model, device=device, dtype=dtype, compile=resolve_compile(compile, device))
    head = HeadTimer(model, timer=timer, dtype=dtype)
    rows = []
    for k, dataset in enumerate(datasets):
        request = synthesize_request(
            dataset=dataset,
            parallel=parallel,
            profile=profile,
            sequences_per_rank=sequences_per_rank,
            seed=seed + k,
            bucket_tokens=bucket_tokens,
        )
        lengths = Problem.from_request(request).lengths
        cost = CostModel(profile, bucket_tokens=request.bucket_tokens)
        for solver in solvers:
            plan = solve(dataclasses.replace(request, solver=solver))
            predicted = rank_predicted_ms(plan, lengths, cost, iteration=0, measure=measure)
            measured = []
            for rank in range(parallel.num_gpus):
                parts = [Part.of(layout) for layout in rank_layouts(plan, lengths, iteration=0, rank=rank)]
                times = measure_fn(
                    layer, parts, num_layers=model.num_layers, kernel=attention, timer=timer, dtype=dtype, head=head
                )
                measured.append(sum(times))
                bar.set_postfix_str(f"{dataset}, {solver}", refresh=False)
                bar.update()
            rows.append(
                CheckRow(dataset=dataset, solver=solver, predicted_ms=tuple(predicted), measured_ms=tuple(measured))
            )
    bar.close()
    return rows
