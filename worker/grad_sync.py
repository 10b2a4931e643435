"""Gradient synchronisation through the framework: DDP or FSDP2, or the plain all-reduce.

A planned step accumulates gradients over this rank's microbatches, then sums them over the whole world
(worker/hf/step.py: a sum, not a mean; the loss is already divided by the global target count). Three
ways, one choice per run (``GRAD_SYNCS``):

- ``allreduce``: one ``all_reduce`` per parameter after the last microbatch (``worker.train.reduce_gradients``);
- ``ddp``: ``DistributedDataParallel`` with ``no_sync()`` on every microbatch but the last, and a comm
  hook that sums instead of averaging (DDP's own reducer: bucketed, overlapped with backward);
- ``fsdp``: FSDP2 ``fully_shard`` on every decoder layer and the root, gradient sync off
  (``set_requires_gradient_sync(False)``) on every microbatch but the last, and a gradient divide factor
  of 1 (a sum). Parameters are sharded, and every forward all-gathers them over all ranks, so every rank
  must run the same microbatches in the same aligned order: the plan must be made with
  ``equal_microbatches`` (solver/equalize.py), which ``skrull finetune --grad-sync fsdp`` asks for.

A rank with no microbatch in an iteration still takes part: under ``equal_microbatches`` it has empty ones,
each a forward and backward on one padding row (worker/hf/inputs.py) that adds nothing to any gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

GRAD_SYNCS = ("allreduce", "ddp", "fsdp")
#: Set on the DDP wrapper and on every FSDP2 unit ``wrap`` made: their reductions sum over the world.
SUM_MARKER = "_skrull_sums_gradients"
#: Modes whose every rank must run the same, aligned microbatches (or any microbatch at all).
NEED_EQUAL_MICROBATCHES = ("ddp", "fsdp")


def _sum_hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook (``bucket``: a ``GradBucket``): the bucket summed over the world (DDP's default
    divides by the world size)."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    assert work is not None
    future: torch.futures.Future[torch.Tensor] = work.get_future().then(lambda fut: fut.value()[0])
    return future


# DDP checks a comm hook's annotations against the real classes; this module's are postponed strings.
_sum_hook.__annotations__.update(bucket=dist.GradBucket, state=Any)  # type: ignore[attr-defined]
_sum_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP shards one by one: a Hugging Face causal LM's ``model.layers`` (inside a
    PEFT model, its base model's)."""
    unwrap: Any = getattr(model, "get_base_model", None)  # a PEFT model's
    base = unwrap() if callable(unwrap) else model
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def wrap(model: nn.Module, mode: str) -> nn.Module:
    """``model`` ready for ``mode``: wrapped in DDP, sharded with FSDP2, or as it is."""
    if mode not in GRAD_SYNCS:
        raise ValueError(f"grad_sync {mode!r} is not one of {', '.join(GRAD_SYNCS)}")
    if mode == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, _sum_hook)
        setattr(ddp, SUM_MARKER, True)
        return ddp
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        units: list[Any] = [*decoder_layers(model), model]
        for unit in units:  # each becomes an FSDPModule in place, with its own parameter group
            fully_shard(unit)
        for unit in units:  # each group's reduce-scatter: a sum over the world, not a mean
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
            setattr(unit, SUM_MARKER, True)
    return model


def begin(model: nn.Module, *, microbatches: int, equal_counts: bool = True) -> None:
    """Before an iteration's first forward (``scheduled_step``): refuse what would train a silently wrong
    gradient or hang, naming the fix.

    - A model wrapped in DDP or sharded with FSDP2 other than by ``wrap``: their reduction averages over the
      world, while a planned step's loss is already divided by the global target count, so every gradient
      would be 1/world of the true one (found: exactly 1/4 at 4 ranks, the printed loss right).
    - Under DDP/FSDP2, plans made without equal microbatch counts (``equal_counts`` False on any rank: the
      loader's ``equal_microbatches=False`` with DP > 1): refused at the first step, not at the iteration
      where the counts first differ, which may come hours into a run.
    - Under DDP/FSDP2, ranks whose microbatch counts differ in this iteration (plans from elsewhere): FSDP2's
      every forward all-gathers over the world and DDP syncs on the last backward only, so the ranks would
      wait on each other for ever (found: a hang at iteration 2).

    One all-reduce of three integers tells every rank, idle ones included, so all of them stop together,
    before any forward.
    """
    refuse_compiled_wrapper(model)
    wrapped = _wrapper_kind(model)
    if wrapped is None:
        return
    if wrapped == "unmarked":
        raise ValueError(
            f"model: {_describe_unmarked(model)} not by skrull.worker.grad_sync.wrap: its gradient reduction "
            "averages over the world, which makes every gradient of a planned step 1/world of the true one; build "
            "the model, then model = grad_sync.wrap(model, 'fsdp') (or 'ddp') instead of fully_shard / "
            "DistributedDataParallel"
        )
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    counts = torch.tensor(
        [microbatches, -microbatches, 0 if equal_counts else 1], dtype=torch.int64, device=_device_of(model)
    )
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest, unequal_plans = int(counts[0]), -int(counts[1]), bool(counts[2])
    sync = "FSDP2" if wrapped == "fsdp" else "DDP"
    if unequal_plans:
        raise ValueError(
            f"equal_microbatches=False: the loader plans DP ranks with different microbatch counts, which {sync} "
            "cannot run (it needs the same count on every rank, else it hangs); plan with "
            "LoaderOptions(equal_microbatches=True), or sync with grad_sync.wrap(model, 'allreduce')"
        )
    if most != fewest or fewest == 0:
        raise ValueError(
            f"equal_microbatches: ranks run {fewest} to {most} microbatches in this iteration under "
            f"{sync}, which needs the same count on every rank (else it hangs); "
            "plan with LoaderOptions(equal_microbatches=True)"
        )


def refuse_compiled_wrapper(model: nn.Module) -> None:
    """Refuse ``torch.compile`` applied after ``wrap``: an ``OptimizedModule`` around the DDP wrapper or the
    FSDP2 root. Dynamo traces through DDP's and FSDP2's hooks, which are not meant to be traced from the
    outside: under DDP the loss came out right and every gradient about 150x too large (relative error
    2.4e+02, silently), under FSDP2 the step crashed before its first forward with a DTensor error naming no
    setting. Compiling the bare model first (``model.compile()`` or ``skrull.worker.hf.fast.compile_model``),
    then wrapping, trains exactly. Every rank sees the same model, so all refuse alike, before any collective."""
    inner = getattr(model, "_orig_mod", None)
    if not isinstance(model, torch._dynamo.eval_frame.OptimizedModule) or inner is None:
        return
    if isinstance(inner, nn.parallel.DistributedDataParallel) or _fsdp_units(inner):
        kind = (
            "wrapped in DistributedDataParallel"
            if isinstance(inner, nn.parallel.DistributedDataParallel)
            else ("sharded with FSDP2")
        )
        raise ValueError(
            f"model: torch.compile was applied after grad_sync.wrap (an OptimizedModule around a model {kind}), "
            "which trains wrong gradients or crashes; compile the bare model in place first, then wrap: "
            "model.compile() (or skrull.worker.hf.fast.compile_model(model)), then model = grad_sync.wrap(model, mode)"
        )


def _device_of(model: nn.Module) -> torch.device:
    param = next(iter(model.parameters()), None)
    if param is None or dist.get_backend() == "gloo":
        return torch.device("cpu")
    return param.device


def _fsdp_units(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in unwrapped(model).modules() if isinstance(m, FSDPModule)]


def _wrapper_kind(model: nn.Module) -> str | None:
    """``"ddp"`` / ``"fsdp"`` when ``wrap`` made it, ``"unmarked"`` when DDP or FSDP2 came from elsewhere,
    None when it is the bare model."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "ddp" if getattr(model, SUM_MARKER, False) else "unmarked"
    units = _fsdp_units(model)
    if not units:
        return None
    return "fsdp" if all(getattr(u, SUM_MARKER, False) for u in units) else "unmarked"


def _describe_unmarked(model: nn.Module) -> str:
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "wrapped in DistributedDataParallel"
    return "sharded with FSDP2 fully_shard"


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def unwrapped(model: nn.Module) -> nn.Module:
    """The model itself (``DistributedDataParallel`` holds it as ``module``; FSDP2 shards it in place)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def fresh_autocast_casts() -> None:
    """Drop autocast's cached low-precision copies of the weights before a microbatch's forward.

    Under one ``torch.autocast`` around several microbatches (a loop's ``with autocast(): scheduled_step(...)``),
    autocast casts each weight once and reuses that cast, with its autograd edge from the first microbatch's
    graph, in every later forward until the outermost autocast exits. Under FSDP2 the later microbatches'
    weight gradients then flow through a cast made in an earlier microbatch, outside the unit's
    current forward, and arrive after FSDP2's post-backward hook has taken the unit's gradient (found: relative
    error 0.56 to 0.87 against the plain bf16 step once a rank runs two microbatches or more, 7e-03 with the
    cache dropped; DDP was right). Each microbatch's forward casts afresh, as with one autocast per
    microbatch."""
    torch.clear_autocast_cache()  # an empty map outside autocast: nothing to drop


@contextlib.contextmanager
def microbatch(model: nn.Module, *, last: bool) -> Iterator[None]:
    """The backward of one microbatch: gradients only accumulate, unless it is the iteration's last. Any
    autocast's cached weight casts are dropped first (``fresh_autocast_casts``)."""
    fresh_autocast_casts()
    if isinstance(model, nn.parallel.DistributedDataParallel) and not last:
        with model.no_sync():
            yield
        return
    if _is_fsdp(model):
        sharded: Any = model
        sharded.set_requires_gradient_sync(last)
    yield


def finish(model: nn.Module, *, microbatches: int) -> None:
    """After the iteration's last backward: the plain all-reduce (DDP and FSDP have synced in it)."""
    if isinstance(model, nn.parallel.DistributedDataParallel) or _is_fsdp(model):
        if microbatches == 0:
            raise ValueError(
                "a rank ran no microbatch under DDP/FSDP, so its gradient sync never ran: plan with "
                "equal_microbatches (every rank a microbatch at every step)"
            )
        return
    from skrull.worker.train import reduce_gradients

    reduce_gradients(model)


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient by its name in the unwrapped model (a collective under FSDP:
    every rank calls it)."""
    out = {}
    for name, param in unwrapped(model).named_parameters():
        grad = param.grad
        if grad is None:
            out[name] = torch.zeros(param.shape)
            continue
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        out[name] = full.detach().float().cpu().clone()
    return out
