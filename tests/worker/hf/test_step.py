"""What the chunked loss must do after the LM head, read from the model's config: Gemma 2's final softcap is
taken, a logit scale is refused naming the field (a chunked loss without it would train a wrong gradient)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from skrull.worker.hf.step import fused_head_softcap


def test_the_final_logit_softcap_is_read_and_none_means_none() -> None:
    assert fused_head_softcap(SimpleNamespace(final_logit_softcapping=30.0)) == 30.0
    assert fused_head_softcap(SimpleNamespace(final_logit_softcapping=None)) is None
    assert fused_head_softcap(SimpleNamespace()) is None


@pytest.mark.parametrize(("field", "value"), [("logit_scale", 0.0625), ("logits_scaling", 8.0)])
def test_a_logit_scale_is_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"loss_chunk_tokens: the model's {field}={value!r} scales its logits"):
        fused_head_softcap(SimpleNamespace(**{field: value}))
    assert fused_head_softcap(SimpleNamespace(**{field: 1.0})) is None  # a scale of one changes nothing
