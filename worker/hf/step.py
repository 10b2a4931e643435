"""One optimizer step's gradients under a plan, and the plain single-process step they must equal.

The loss of a step (docs/finetune.md; Skrull appendix A: scheduling must not change what is learned):

    loss = sum over every target token t of the global batch of CE(t) / num_targets

where ``num_targets`` counts the labels other than ``-100`` over the whole global batch, all ranks,
microbatches and shard pieces together. Each GPU adds, for each of its microbatches, the sum of CE over
its own rows divided by that global count (worker/loss.py); backward accumulates over its microbatches
(gradient accumulation: a sum, no 1/num_microbatches); then gradients are summed over the whole world,
DP and CP ranks alike (the data-parallel all-reduce: a sum, no 1/world_size). A sharded sequence's rows
are spread over its group and each member takes the loss of its own rows; the attention's collectives
carry the key/value gradients back to their owners. The result is the gradient of the mean over the
global batch, whatever the plan: how tokens are split over ranks, microbatches and groups changes only
the order of the additions. ``num_targets`` is one all-reduce of each rank's own count per step, so it
is exact for any labels (prompt masking included).

``plain_step`` is the yardstick: the global batch right-padded into one ``[B, S_max]`` batch, one
process, no packing, no context parallelism, ``labels=input_ids`` and Hugging Face's own shifted,
mean-reduced cross-entropy.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from skrull.solver.cp_modes import ALLGATHER, ULYSSES
from skrull.solver.types import Plan
from skrull.worker import grad_sync
from skrull.worker.collectives import GroupRegistry
from skrull.worker.dacp import DACPPlan, refuse_unrunnable_modes
from skrull.worker.dataloader import ReadyMicrobatch, refuse_other_heads
from skrull.worker.fused_ce import linear_cross_entropy_sum
from skrull.worker.hf.attention import refuse_unsupported_model
from skrull.worker.hf.inputs import model_inputs
from skrull.worker.hf.router_loss import RouterAux, check_router_aux_loss
from skrull.worker.kernels import AttentionKernel
from skrull.worker.loss import IGNORE_INDEX, own_supervised_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One rank's view of a step: the world's loss, the global target count, this rank's work and time."""

    loss: float
    num_targets: int
    microbatches: int
    tokens: int
    seconds: float
    #: the router auxiliary loss's semantics in ``loss`` (None: the model has none; worker/hf/router_loss.py)
    router_aux_loss: str | None = None
    #: of ``loss``, the router's part: ``coef * sum of aux(m)`` over the plan's microbatches (0 without one)
    router_loss: float = 0.0


def global_target_count(
    microbatches: Sequence[ReadyMicrobatch], *, device: torch.device, refusal: Exception | None = None
) -> int:
    """Labels other than ``-100`` over the global batch: this rank's rows, summed over the world.

    ``refusal``: this rank's reason not to run the step (``refuse_unrunnable_ulysses``), counted in the same
    all-reduce, so every rank, idle ones included, stops before the first forward when any rank refuses: the
    refusing rank raises its own error, the others say a rank refused (none waits in a later collective)."""
    own = own_supervised_tokens([mb.labels.to(device) for mb in microbatches])
    both = torch.tensor([own, 0 if refusal is None else 1], dtype=torch.long, device=device)
    if dist.is_initialized():
        dist.all_reduce(both)
    count, refusing = int(both[0].item()), int(both[1].item())
    if refusal is not None:
        raise refusal
    if refusing:
        raise ValueError(
            f"{refusing} other rank(s) refused this step before its first forward (their error names the setting): "
            "every rank stops with them"
        )
    if count < 1:
        raise ValueError("the global batch has no target token (every label is -100 or every sequence is 1 token)")
    return count


def causal_lm_loss(
    model: Any,
    kwargs: dict[str, Any],
    labels: torch.Tensor,
    *,
    num_targets: int,
    loss_chunk_tokens: int | None = None,
    router: RouterAux | None = None,
    router_group: Any = None,
    router_terms: list[torch.Tensor] | None = None,
    empty: bool = False,
) -> torch.Tensor:
    """``sum CE(own rows) / num_targets``: the model's own loss function (``ForCausalLMLoss`` with
    ``shift_labels`` and ``num_items_in_batch``); with ``loss_chunk_tokens`` the LM head and the cross-entropy
    run fused, chunk by chunk (worker/fused_ce.py: each chunk's gradient taken while its logits exist), so
    ``[T, vocab]`` logits never exist at once.

    With ``router`` (``router_aux_loss="per_microbatch"``) this GPU's part of the microbatch's router loss
    is added (``RouterAux.own_term``, its group ``router_group``), and appended to ``router_terms``;
    ``empty``: a microbatch without tokens (another rank's count kept equal), whose forward runs one padding
    token (worker/hf/inputs.py) that is no token of the batch: its router term is 0."""
    if router is not None:
        return _with_router_term(
            model, kwargs, labels, num_targets=num_targets, loss_chunk_tokens=loss_chunk_tokens, router=router,
            group=router_group, terms=router_terms, empty=empty,
        )  # fmt: skip
    if loss_chunk_tokens is None:
        # Hugging Face's own causal-LM loss, called as its Trainer calls it: the targets are already the next
        # tokens, so they travel as ``shift_labels`` (the model must not shift them again), and
        # ``num_items_in_batch`` is the global batch's target count over every rank (a sum / that count)
        rows = labels.unsqueeze(0)
        loss: torch.Tensor = model(**kwargs, labels=rows, shift_labels=rows, num_items_in_batch=num_targets).loss
        return loss
    inner: Any = grad_sync.unwrapped(model)
    softcap = fused_head_softcap(inner.config)
    hidden = _final_hidden(model, inner, kwargs)
    head = inner.get_output_embeddings()
    total = linear_cross_entropy_sum(
        hidden, head.weight, labels.to(hidden.device), bias=head.bias, chunk_tokens=loss_chunk_tokens, softcap=softcap
    )
    return total / num_targets


def _with_router_term(
    model: Any,
    kwargs: dict[str, Any],
    labels: torch.Tensor,
    *,
    num_targets: int,
    loss_chunk_tokens: int | None,
    router: RouterAux,
    group: Any,
    terms: list[torch.Tensor] | None,
    empty: bool,
) -> torch.Tensor:
    """``causal_lm_loss`` plus this GPU's router term: one forward with the router logits returned and no
    labels (the model would add its own, whole-forward aux term), the model's own loss function on its
    logits as the model calls it, then ``RouterAux.own_term``."""
    inner: Any = grad_sync.unwrapped(model)
    rows = labels.unsqueeze(0)
    if loss_chunk_tokens is None:
        out = model(**kwargs, output_router_logits=True)
        ce: torch.Tensor = inner.loss_function(
            out.logits, None, inner.config.vocab_size, shift_labels=rows, num_items_in_batch=num_targets
        )
    else:
        softcap = fused_head_softcap(inner.config)
        hidden, out = _final_hidden(model, inner, {**kwargs, "output_router_logits": True}, with_output=True)
        head = inner.get_output_embeddings()
        total = linear_cross_entropy_sum(
            hidden, head.weight, labels.to(hidden.device), bias=head.bias, chunk_tokens=loss_chunk_tokens,
            softcap=softcap,
        )  # fmt: skip
        ce = total / num_targets
    term = router.own_term(tuple(out.router_logits or ()), group=group)
    if empty:  # the padding token's routing is no token of the batch (the gate still joins the backward)
        term = term * 0.0
    if terms is not None:
        terms.append(term.detach())
    return ce + term.to(ce.device)


def fused_head_softcap(config: Any) -> float | None:
    """What the model does to its logits after the LM head, which the fused loss must do too: Gemma 2's
    ``final_logit_softcapping`` (the fused loss takes it); a logit scale (Cohere's ``logit_scale``,
    Granite's ``logits_scaling``) it does not take, so that is refused rather than trained wrong."""
    for name in ("logit_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value is not None and value != 1:
            raise ValueError(
                f"loss_chunk_tokens: the model's {name}={value!r} scales its logits, which the fused loss does "
                "not; leave loss_chunk_tokens unset (the model's own loss)"
            )
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def _final_hidden(model: Any, inner: Any, kwargs: dict[str, Any], *, with_output: bool = False) -> Any:
    """The decoder's last hidden states ``[T, h]``, from a forward through ``model`` itself: a DDP or
    FSDP2 wrapper's hooks run as in any forward (FSDP2 unshards the root's parameters, the LM head's
    included, and reduces their gradients after backward; calling the inner decoder directly skipped that:
    "mixed torch.Tensor and DTensor"). The head projects no position (``logits_to_keep``: an empty index
    tensor), so no ``[T, vocab]`` logits are made; the fused loss does the head."""
    captured: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, output: Any) -> None:
        captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    handle = inner.base_model.register_forward_hook(keep)
    try:
        device = kwargs["input_ids"].device
        out = model(**kwargs, logits_to_keep=torch.zeros(0, dtype=torch.long, device=device))
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"the decoder ran {len(captured)} times in one forward; expected once")
    return (captured[0][0], out) if with_output else captured[0][0]


def model_heads(model: Any) -> tuple[int, int] | None:
    """``(num_attention_heads, num_key_value_heads)`` of a Hugging Face model (or its config), unwrapped
    from DDP / FSDP; a multimodal config's text model; None where the config does not say."""
    model = getattr(model, "module", model)
    config = getattr(model, "config", model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    if not isinstance(heads, int):
        return None
    kv = getattr(text, "num_key_value_heads", None)
    return heads, kv if isinstance(kv, int) else heads


def _refuse_ulysses_group(heads: int, group_size: int, *, where: str) -> None:
    if heads % group_size:
        raise ValueError(
            f"{where} runs ulysses over {group_size} GPUs, which do not divide the model's num_attention_heads = "
            f"{heads}: plan with a profile whose heads are the model's (skrull derive-profile --hf-config), or "
            f"allow {ALLGATHER} only (cp_modes)"
        )


def refuse_unrunnable_ulysses(model: Any, microbatches: Sequence[ReadyMicrobatch]) -> None:
    """Every microbatch this step runs in Ulysses shards over a group dividing the model's attention heads,
    checked before the step's first forward. Else its attention fails inside the step, after this rank's
    earlier microbatches ran (found: a model with other heads than its profile's, whose plans chose Ulysses
    groups by the profile's heads). This sees one rank's microbatches: ranks outside the group go on into
    the step's collectives, so runs that hold the whole plan check it first (``refuse_unrunnable_plan``) and
    the trainers compare the model with the profile at setup (``PlannedBatches.check_model_heads``), and
    every rank compares them here when its microbatches say which heads the plan was made for
    (``ReadyMicrobatch.plan_heads``: the same on every rank, so all stop alike, in a loop that never called
    ``check_model_heads``)."""
    heads = model_heads(model)
    if heads is None:
        return
    for mb in microbatches[:1]:  # an idle rank has none: scheduled_step tells it that another rank refused
        if mb.plan_heads is not None:
            refuse_other_heads(heads, mb.plan_heads)
    for mb in microbatches:
        layout = mb.layout
        if layout.mode == ULYSSES and layout.communicates:
            _refuse_ulysses_group(heads[0], layout.group_size, where=f"microbatch {layout.step}")


def refuse_unrunnable_plan(model: Any, plan: Plan) -> None:
    """``refuse_unrunnable_ulysses`` over every microbatch of the whole plan, on every rank alike (so all of
    them stop before the first step, none waits in a collective for a rank that stopped): the plan's
    ``mode`` is what runs (``worker.dacp.refuse_unrunnable_modes``)."""
    heads = model_heads(model)
    if heads is not None:
        refuse_unrunnable_modes(plan, heads=heads[0])


def refuse_untrained_model(model: Any, *, router_aux_loss: str | None = None) -> None:
    """The model's architecture and settings are ones plans train exactly (``refuse_unsupported_model``: one
    list for every path, ``from_pretrained(..., attn_implementation=register())`` included), and it is in
    training mode where dropout would act (``warn_eval_mode_dropout``). A model without a Hugging Face
    config (a module of one's own) is not checked."""
    config = getattr(grad_sync.unwrapped(model), "config", None)
    if config is None or getattr(config, "model_type", None) is None:
        return
    refuse_unsupported_model(config, router_aux_loss=router_aux_loss)
    warn_eval_mode_dropout(model)


_WARNED_EVAL_MODE: set[int] = set()


def warn_eval_mode_dropout(model: Any) -> None:
    """Warn once per model when it trains in eval mode with a dropout probability above 0: ``from_pretrained``
    returns a model in eval mode, and a loop that never calls ``model.train()`` trains with dropout silently
    off (the loss and gradients of a model without dropout, not of the model configured)."""
    inner = grad_sync.unwrapped(model)
    if inner.training or id(inner) in _WARNED_EVAL_MODE:
        return
    rates = [float(m.p) for m in inner.modules() if isinstance(m, torch.nn.Dropout) and float(m.p) > 0]
    config = getattr(inner, "config", None)
    for name in ("hidden_dropout", "hidden_dropout_prob", "resid_pdrop", "embd_pdrop", "dropout"):
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            rates.append(float(value))
    if rates:
        _WARNED_EVAL_MODE.add(id(inner))
        warnings.warn(
            f"the model trains in eval mode with dropout {max(rates)}: dropout is off, unlike the model "
            "configured; call model.train() before the loop (from_pretrained returns a model in eval mode)",
            stacklevel=3,
        )


def dacp_plans(
    microbatches: Sequence[ReadyMicrobatch],
    *,
    registry: GroupRegistry,
    kernel: AttentionKernel,
    device: torch.device,
) -> list[DACPPlan]:
    """Each microbatch's DACP plan (index tensors on ``device``; needs no communication)."""
    return [
        DACPPlan.build(
            mb.layout,
            group=registry.get(mb.layout.ranks) if mb.layout.communicates else None,
            kernel=kernel,
            device=device,
        )
        for mb in microbatches
    ]


def scheduled_step(
    model: Any,
    microbatches: Sequence[ReadyMicrobatch],
    *,
    registry: GroupRegistry,
    kernel: AttentionKernel,
    device: torch.device,
    loss_chunk_tokens: int | None = None,
    plans: Sequence[DACPPlan] | None = None,
    microbatch_ms: list[float] | None = None,
    router_aux_loss: str | None = None,
) -> StepResult:
    """This rank's microbatches in step order, then gradients and loss summed over the world (through
    DDP or FSDP2 when ``model`` is wrapped so, else one all-reduce per parameter: worker/grad_sync.py).

    Collective over the whole world (every rank calls it once per step, idle or not). Gradients
    accumulate into ``.grad``: zero them before, step the optimizer after. ``plans`` are the
    microbatches' ``DACPPlan`` when built ahead (``dacp_plans``, e.g. while the previous step runs). With
    ``microbatch_ms`` each microbatch's forward and backward time is appended to it (``MicrobatchTimer``:
    CUDA events on a GPU, read once after the step; the host clock on a CPU), for calibration
    (worker/calibration.py).

    ``router_aux_loss``: a mixture of experts' router auxiliary loss (``output_router_logits=True``) is
    refused by default; ``"per_microbatch"`` trains it per microbatch of the plan (worker/hf/router_loss.py:
    what it computes, and why the plain step's global-batch form is not offered), and the result says so.
    """
    router: RouterAux | None = None
    try:  # raised after every rank has said whether it refuses (global_target_count): all stop alike
        check_router_aux_loss(router_aux_loss)
        refuse_unrunnable_ulysses(model, microbatches)
        refuse_untrained_model(model, router_aux_loss=router_aux_loss)
        if router_aux_loss is not None:
            router = RouterAux.of(getattr(grad_sync.unwrapped(model), "config", None))
        refusal: Exception | None = None
    except ValueError as exc:
        refusal = exc
    if device.type == "cuda":  # the step's time starts when the previous work on the device is done
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    if plans is None and refusal is None:
        plans = dacp_plans(microbatches, registry=registry, kernel=kernel, device=device)
    if plans is not None and len(plans) != len(microbatches):
        raise ValueError(f"{len(plans)} DACP plans for {len(microbatches)} microbatches")
    # refuses a stock wrapper, or plans with unequal counts under DDP / FSDP2
    grad_sync.begin(model, microbatches=len(microbatches), equal_counts=all(mb.equal_counts for mb in microbatches))
    num_targets = global_target_count(microbatches, device=device, refusal=refusal)
    assert plans is not None  # built above unless this rank refused, which global_target_count raised
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    router_terms: list[torch.Tensor] = []
    tokens = 0
    last = len(microbatches) - 1
    timer = MicrobatchTimer(device) if microbatch_ms is not None else None
    for k, (mb, plan) in enumerate(zip(microbatches, plans, strict=True)):
        if timer is not None:
            timer.start()
        with grad_sync.microbatch(model, last=k == last):  # DDP / FSDP2 sync with the last backward only
            kwargs, labels = model_inputs(mb, plan)
            loss = causal_lm_loss(
                model, kwargs, labels, num_targets=num_targets, loss_chunk_tokens=loss_chunk_tokens, router=router,
                router_group=registry.get(mb.layout.ranks) if router is not None and mb.layout.communicates else None,
                router_terms=router_terms, empty=mb.num_tokens == 0,
            )  # fmt: skip
            loss.backward()  # type: ignore[no-untyped-call]
        if timer is not None:
            timer.stop()
        loss_sum += loss.detach().double()
        tokens += mb.num_tokens
    if timer is not None and microbatch_ms is not None:
        microbatch_ms.extend(timer.read_ms())
    grad_sync.finish(model, microbatches=len(microbatches))
    router_sum = torch.zeros((), dtype=torch.float64, device=device)
    for term in router_terms:
        router_sum += term.double()
    if router is not None:  # every rank alike (the same config): the router's part in the same all-reduce
        loss_sum = torch.stack([loss_sum, router_sum])
    dist.all_reduce(loss_sum)
    router_loss = 0.0
    if router is not None:
        loss_sum, router_loss = loss_sum[0], float(loss_sum[1].item())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return StepResult(
        loss=float(loss_sum.item()),
        num_targets=num_targets,
        microbatches=len(microbatches),
        tokens=tokens,
        seconds=time.perf_counter() - start,
        router_aux_loss=router_aux_loss if router is not None else None,
        router_loss=router_loss,
    )


class MicrobatchTimer:
    """Each microbatch's milliseconds on ``device``: CUDA events recorded on the stream (no synchronisation
    between microbatches; read after the step), or the host clock on a CPU, where work is synchronous."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._events: list[tuple[Any, Any]] = []
        self._open: Any = None

    def start(self) -> None:
        if self.device.type == "cuda":
            self._open = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._open.record()
        else:
            self._open = time.perf_counter()

    def stop(self) -> None:
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
            self._events.append((self._open, end))
        else:
            self._events.append((self._open, time.perf_counter()))

    def read_ms(self) -> list[float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return [float(a.elapsed_time(b)) for a, b in self._events]
        return [(b - a) * 1e3 for a, b in self._events]


def _right_padded(
    sequences: Sequence[torch.Tensor], labels: Sequence[torch.Tensor] | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(int(s.shape[0]) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    targets = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, : seq.shape[0]] = seq.to(device)
        mask[row, : seq.shape[0]] = 1
        targets[row, : seq.shape[0]] = (seq if labels is None else labels[row]).to(device)
    return ids, mask, targets


def plain_step(
    model: Any,
    sequences: Sequence[torch.Tensor],
    *,
    labels: Sequence[torch.Tensor] | None = None,
    router_microbatches: Sequence[Sequence[int]] | None = None,
) -> float:
    """Hugging Face's own training forward and backward over the right-padded global batch: the loss.

    ``labels`` in Hugging Face's convention (one per sequence, its length, ``-100`` where no loss is taken;
    the model shifts them); by default every next token is a target.

    ``router_microbatches`` (indices into ``sequences``, one tuple per microbatch): the reference of
    ``router_aux_loss="per_microbatch"`` (worker/hf/router_loss.py). The global batch's loss is taken with
    the router loss off, and Hugging Face's own ``aux_loss`` of a right-padded forward over each microbatch's
    sequences (padding masked) is added with the model's ``router_aux_loss_coef``, as the plain Trainer adds
    it to each microbatch under gradient accumulation.
    """
    if not sequences:
        raise ValueError("the global batch is empty")
    if labels is not None and [int(x.shape[0]) for x in labels] != [int(s.shape[0]) for s in sequences]:
        raise ValueError("labels: one per sequence, each of its sequence's length")
    device = next(model.parameters()).device
    ids, mask, targets = _right_padded(sequences, labels, device)
    if router_microbatches is None:
        out = model(input_ids=ids, attention_mask=mask, labels=targets, use_cache=False)
        out.loss.backward()
        return float(out.loss.detach())
    if sorted(i for mb in router_microbatches for i in mb) != list(range(len(sequences))):
        raise ValueError("router_microbatches: every sequence in exactly one microbatch")
    inner: Any = grad_sync.unwrapped(model)
    coef = float(inner.config.router_aux_loss_coef)
    loss = model(input_ids=ids, attention_mask=mask, labels=targets, use_cache=False, output_router_logits=False).loss
    for members in router_microbatches:
        mb_ids, mb_mask, _ = _right_padded([sequences[i] for i in members], None, device)
        out = model(input_ids=mb_ids, attention_mask=mb_mask, use_cache=False, output_router_logits=True)
        loss = loss + coef * out.aux_loss
    loss.backward()
    return float(loss.detach())


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max|got - want| / max|want|`` (absolute when ``want`` is all zero)."""
    diff = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    scale = float(want.double().abs().max()) if want.numel() else 0.0
    return diff / scale if scale > 0 else diff


def step_errors(
    *,
    loss: float,
    reference_loss: float,
    grads: Mapping[str, torch.Tensor],
    reference_grads: Mapping[str, torch.Tensor],
) -> dict[str, float]:
    """What a ``--check`` compares: the loss's relative error (``"loss"``), then every reference gradient's
    (``relative_error``), by parameter name; a gradient the run did not record counts as infinitely wrong."""
    errors = {"loss": abs(loss - reference_loss) / abs(reference_loss)}
    for name, want in reference_grads.items():
        errors[name] = relative_error(grads[name], want) if name in grads else float("inf")
    return errors


def model_gradients(model: Any) -> dict[str, torch.Tensor]:
    """Every trained parameter's gradient by name (after ``plain_step``'s backward); frozen ones (a LoRA
    model's base weights) have none."""
    out = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        assert param.grad is not None, name
        out[name] = param.grad
    return out


def print_check(errors: Mapping[str, float], *, tolerance: float, what: str) -> int:
    """The examples' ``--check`` report: what was compared, the largest relative error, then ``check passed``
    (returns 0) or ``check failed`` (returns 1)."""
    worst = max(errors, key=lambda k: errors[k])
    print(f"{what}, {len(errors) - 1} gradients and the loss")
    print(f"largest relative error: {errors[worst]:.3e} ({worst}; tolerance {tolerance:.0e})")
    if not errors[worst] <= tolerance:
        print("check failed")
        return 1
    print("check passed")
    return 0
