"""DACP attention as a ``transformers`` attention implementation.

``register()`` adds ``"skrull_dacp"`` to ``transformers.AttentionInterface``; a model built with
``attn_implementation="skrull_dacp"`` (worker/hf/model.py) then calls ``dacp_attention_forward`` in every
layer with the layer's projected, rotated queries, keys and values. The microbatch's ``DACPPlan``
(worker/dacp.py: which rows are local sequences, which are shard pieces, the group and its collectives)
travels as the keyword argument ``skrull_dacp`` of the model's forward, which ``transformers`` hands
unchanged to the attention function of every layer (worker/hf/inputs.py builds it).

Shapes: ``transformers`` passes ``[batch, heads, tokens, head_dim]`` and expects ``[batch, tokens, heads,
head_dim]`` back; a planned microbatch is one packed row (batch 1), so the function works on ``[T, H, D]``
in flash-attention's varlen spelling, the kernels' convention (worker/kernels.py: flash-attn varlen on a
GPU, the float32 reference on a CPU). Rows past the layout's ``num_tokens`` are padding (a member of a
group that holds no token of the microbatch still runs one dummy row so the model can run, and joins the
group's collectives); their output is zero and, their labels being ``-100``, they add nothing to the loss.

Logit soft-capping (``softcap``, Gemma 2's ``attn_logit_softcapping``) and sliding windows
(``sliding_window``: Mistral, Phi-3, Gemma 2's local layers) arrive as the layer's keyword arguments and
are computed by the DACP attention on every path (worker/dacp.py, worker/kernels.py), exactly as the
model's eager attention does. Any other keyword the layer passes is ignored only if it changes nothing
(``attention_features_of`` in worker/hf/trainer.py refuses the config fields that would).

No attention mask is built: the implementation is not registered with ``transformers``' mask interface,
so the model passes ``attention_mask=None`` and the plan alone says which token sees which.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from skrull.worker import attention_op
from skrull.worker.compiling import attention_graph_break
from skrull.worker.dacp import DACPPlan, dacp_attention

#: The ``attn_implementation`` name models are built with.
ATTN_IMPLEMENTATION = "skrull_dacp"
#: The forward keyword argument carrying the microbatch's ``DACPPlan``.
PLAN_KWARG = "skrull_dacp"
#: What a layer compiled as one graph gets instead: the plan's token (worker/attention_op.py).
TOKEN_KWARG = "skrull_dacp_token"


def dacp_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal DACP attention over one packed microbatch (see the module docstring).

    With the plan's token (``TOKEN_KWARG``: a layer compiled as one graph, worker/compiling.py) the
    attention is the registered operator ``torch.ops.skrull.dacp_attention``, traced into the graph;
    with the plan itself (eager layers, or the regional compile) it is the eager DACP call, a graph break
    under ``torch.compile``."""
    token = kwargs.get(TOKEN_KWARG)
    if token is None:
        eager: tuple[torch.Tensor, None] = _eager_attention_forward(
            module, query, key, value, attention_mask, scaling, dropout, **kwargs
        )
        return eager
    q, k, v, softcap, window = _packed_inputs(module, query, key, value, attention_mask, scaling, dropout, kwargs)
    out = attention_op.attention(q, k, v, token, softcap=softcap, window=window)
    return out.unsqueeze(0), None


def _packed_inputs(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float | None, int | None]:
    """``q``, ``k``, ``v`` as ``[T, H, D]`` (queries rescaled to the kernels' 1/sqrt(D)), softcap, window;
    refuses what the DACP attention does not compute."""
    if query.shape[0] != 1:
        raise ValueError(f"a planned microbatch is one packed row; got a batch of {query.shape[0]}")
    if attention_mask is not None:
        raise ValueError("a planned microbatch takes no attention mask (the plan delimits the sequences)")
    if dropout:
        raise ValueError(f"attention dropout {dropout} is not supported under DACP (set attention_dropout to 0)")
    softcap = kwargs.get("softcap")  # Gemma 2's attn_logit_softcapping: tanh(s / cap) * cap on the scores
    window = kwargs.get("sliding_window")  # a query sees the `window` keys ending at itself (HF's meaning)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window={window!r}: must be an integer >= 1 (or None)")
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [T, H, D]
    # the layer's own head_dim where it has one: a plain int, where the shape is symbolic in a compiled graph
    head_dim = getattr(module, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim != query.shape[-1]:
        head_dim = q.shape[-1]
    if scaling is not None and abs(scaling - head_dim**-0.5) > 1e-12 * head_dim**-0.5:  # math.isclose, traceable
        q = q * (scaling * math.sqrt(head_dim))  # the kernels scale by 1/sqrt(D)
    return q, k, v, softcap, window


def _eager_dacp_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The eager DACP call with the microbatch's plan (``PLAN_KWARG``)."""
    plan = kwargs.get(PLAN_KWARG)
    if not isinstance(plan, DACPPlan):
        raise ValueError(
            f"attn_implementation {ATTN_IMPLEMENTATION!r} needs the microbatch's plan: call the model with "
            f"{PLAN_KWARG}=<DACPPlan> (skrull.worker.hf.inputs.model_inputs)"
        )
    q, k, v, softcap, window = _packed_inputs(module, query, key, value, attention_mask, scaling, dropout, kwargs)
    rows, num_tokens = q.shape[0], plan.layout.num_tokens
    if rows < num_tokens:
        raise ValueError(f"the buffer has {rows} rows, the microbatch layout {num_tokens}")
    out = dacp_attention(q[:num_tokens], k[:num_tokens], v[:num_tokens], plan, softcap=softcap, window=window)
    if rows > num_tokens:
        out = torch.cat([out, out.new_zeros(rows - num_tokens, *out.shape[1:])])
    return out.unsqueeze(0), None


# eager between the compiled halves of a regionally compiled layer (worker/compiling.py): the collectives and
# the kernel's control flow depend on the plan; a no-op wrapper in an eager model
_eager_attention_forward = attention_graph_break(_eager_dacp_attention_forward)


#: Config fields of attention features the DACP attention computes (worker/kernels.py), for the docs.
IMPLEMENTED_FIELDS = ("attn_logit_softcapping", "sliding_window", "use_sliding_window", "query_pre_attn_scalar")


def unsupported_attention_features(config: Any) -> list[tuple[str, Any]]:
    """``(field, value)`` for each attention feature of a model config (a ``PretrainedConfig`` or its dict)
    that the DACP attention does not compute; empty when the model trains exactly under DACP.

    Implemented (``IMPLEMENTED_FIELDS``): logit soft-capping, sliding windows, any score scaling. Refused:
    attention dropout (a random mask per layer that a CP group's members would draw differently), chunked
    attention (Llama 4's ``attention_chunk_size``) and attention sinks (learned per-head logits that join
    the softmax), which no DACP kernel here computes."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    found: list[tuple[str, Any]] = []
    for field in ("attention_dropout", "attention_chunk_size", "sinks", "use_attention_sinks", "attention_sinks"):
        value = get(field, None)
        if value:
            found.append((field, value))
    text = get("text_config", None)
    if text is not None and text is not config:
        found.extend((f"text_config.{f}", v) for f, v in unsupported_attention_features(text))
    return found


def refuse_unsupported_attention(config: Any) -> None:
    """A ``ValueError`` naming the first config field whose attention feature DACP does not compute."""
    unsupported = unsupported_attention_features(config)
    if unsupported:
        field, value = unsupported[0]
        raise ValueError(
            f"model config {field}={value!r}: an attention feature the DACP attention does not compute (it computes "
            f"{', '.join(IMPLEMENTED_FIELDS)}); training would differ from the plain model: set {field} to "
            "0/None or train this model without plans"
        )


#: ``model_type`` values that train exactly under plans, each a conformance cell against the plain step
#: (tests/conformance, docs/integrations/conformance.md): one list for ``build_model``, ``skrull finetune``,
#: ``SkrullTrainer`` / TRL and the own loop's ``scheduled_step`` (a model from ``from_pretrained(...,
#: attn_implementation=register())``). ``gemma3_text`` is Gemma 3's causal LM (the multimodal ``gemma3`` is
#: not); the mixtures of experts train with the router's auxiliary loss off, or per microbatch when asked by
#: name (``refuse_unsupported_model``, ``router_aux_loss``: worker/hf/router_loss.py).
SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "llama", "qwen2", "mistral", "qwen3", "phi3", "gemma2", "gemma3_text", "olmo2", "qwen2_moe", "mixtral", "qwen3_moe",
)  # fmt: skip


def unsupported_model_setting(config: Any, *, router_aux_loss: str | None = None) -> tuple[str, Any, str] | None:
    """``(field, value, why)`` for the first setting of a model config (a ``PretrainedConfig`` or its dict)
    that plans would train differently from the plain step; None when it trains exactly.

    - ``model_type`` outside ``SUPPORTED_MODEL_TYPES``: not checked against the plain step.
    - ``output_router_logits`` true (a mixture of experts' load-balancing loss, Switch Transformer eq. 4:
      ``coef * E * sum_e f_e * P_e`` with ``f_e`` the fraction of tokens routed to expert ``e`` and ``P_e``
      the mean router probability, both over the tokens of one forward): the model adds it to the loss of
      each forward. The plain step takes ``f_e`` and ``P_e`` over the whole global batch; under plans each
      microbatch's forward sees its own rows only, and the sum over microbatches and ranks counts the
      term once per microbatch (found: loss 9.68 against 6.51, the router gate's gradient 71x off). The
      global statistics are known only after every microbatch's forward, so no per-microbatch loss
      reproduces them; refused unless ``router_aux_loss="per_microbatch"`` asks for the per-microbatch
      form by name (worker/hf/router_loss.py).
    - an attention feature the DACP attention does not compute (``unsupported_attention_features``)."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    model_type = get("model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            "model_type",
            model_type,
            f"not one of the architectures checked under plans ({', '.join(SUPPORTED_MODEL_TYPES)})",
        )
    if get("output_router_logits", False) and router_aux_loss is None:
        return (
            "output_router_logits",
            get("output_router_logits", None),
            "the router's auxiliary loss is taken over the whole global batch by the plain step, per microbatch "
            'under plans: ask for that by name, router_aux_loss="per_microbatch" (scheduled_step, SkrullTrainer, '
            "SkrullSFTTrainer; the examples' --router-aux-loss per-microbatch; docs/worker.md), or set "
            "output_router_logits=False (TRL: SFTConfig(router_aux_loss_coef=0.0)); the expert layers themselves "
            "train exactly",
        )
    unsupported = unsupported_attention_features(config)
    if unsupported:
        field, value = unsupported[0]
        return (
            field,
            value,
            f"an attention feature the DACP attention does not compute (it computes {', '.join(IMPLEMENTED_FIELDS)})",
        )
    return None


def refuse_unsupported_model(config: Any, *, router_aux_loss: str | None = None) -> None:
    """A ``ValueError`` naming the first setting ``unsupported_model_setting`` finds, before any step."""
    found = unsupported_model_setting(config, router_aux_loss=router_aux_loss)
    if found is not None:
        field, value, why = found
        raise ValueError(
            f"model config {field}={value!r}: {why}; training under plans would differ from the plain model"
        )


def register() -> str:
    """Register the implementation with ``transformers`` (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, dacp_attention_forward)
    return ATTN_IMPLEMENTATION
