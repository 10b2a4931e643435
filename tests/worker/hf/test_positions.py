"""Every token of a planned microbatch sits at its position within its own sequence: a stock Hugging Face
model running its own attention (sdpa, eager; no project code in the forward) on a planned microbatch of
whole sequences gives each sequence the loss it has alone, and a microbatch holding shard pieces is
refused before it reaches such a model."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel, Request
from skrull.worker.dataloader import ready_microbatch
from skrull.worker.hf.inputs import stock_model_inputs
from skrull.worker.hf.model import build_model
from skrull.worker.inputs import SyntheticData
from skrull.worker.layout import rank_layouts

MODELS = Path(__file__).resolve().parents[3] / "examples" / "models"
# bucket 64: the 100-token sequence is sharded over the CP group of 2, the others stay whole
LENGTHS = (7, 1, 12, 5, 30, 9, 100, 3, 17, 4, 6, 2)
VOCAB = 128


def planned_layouts() -> list[Any]:
    request = Request(
        batches=(LENGTHS,), parallel=Parallel(dp=1, cp=2), profile=load_profile("h100-80g/qwen2.5-0.5b"),
        solver="auto", bucket_tokens_override=64, deterministic=True,
    )  # fmt: skip
    plan = solve(request)
    return [mb for rank in (0, 1) for mb in rank_layouts(plan, LENGTHS, iteration=0, rank=rank)]


def sequence_loss_sums(logits: torch.Tensor, labels: torch.Tensor, cu: list[int]) -> list[float]:
    per_token = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="none")
    return [float(per_token[a:b].sum()) for a, b in itertools.pairwise(cu)]


@pytest.mark.parametrize("name", ["qwen2-tiny", "llama-tiny"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_stock_model_on_a_planned_microbatch_gives_each_sequence_its_own_loss(name: str, attention: str) -> None:
    config = json.loads((MODELS / f"{name}.json").read_text())
    model = build_model(config, seed=5, attn_implementation=attention)
    model.eval()
    data = SyntheticData(seed=3, lengths=LENGTHS)
    layouts = planned_layouts()
    whole = [layout for layout in layouts if not layout.pieces]
    sharded = {p.seq_id for layout in layouts for p in layout.pieces}
    assert 6 in sharded  # the 100-token sequence cannot stay whole in a 64-token bucket
    assert sorted(i for layout in layouts for i in layout.local_ids) == sorted(set(range(len(LENGTHS))) - sharded)
    assert any(len(layout.local_ids) > 1 for layout in whole)  # sequences really share a packed row
    with torch.no_grad():
        for layout in whole:
            mb = ready_microbatch(
                layout, lambda i: data.lm_tokens(i, VOCAB), loss_normalizer=0, device=torch.device("cpu")
            )
            kwargs, labels = stock_model_inputs(mb)
            assert "skrull_dacp" not in kwargs
            packed = sequence_loss_sums(model(**kwargs).logits[0], labels, list(layout.cu_seqlens))
            alone = []
            for seq_id in layout.local_ids:
                ids, seq_labels = data.lm_tokens(seq_id, VOCAB)
                logits = model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0]
                alone.append(float(F.cross_entropy(logits.float(), seq_labels, ignore_index=-100, reduction="sum")))
            assert packed == pytest.approx(alone, rel=1e-5, abs=1e-5)


def test_shard_pieces_never_reach_a_stock_attention() -> None:
    data = SyntheticData(seed=3, lengths=LENGTHS)
    sharded = [layout for layout in planned_layouts() if layout.pieces]
    assert 6 in {p.seq_id for layout in sharded for p in layout.pieces}
    for layout in sharded:
        mb = ready_microbatch(layout, lambda i: data.lm_tokens(i, VOCAB), loss_normalizer=0, device=torch.device("cpu"))
        with pytest.raises(ValueError, match=r"shard pieces of sequences \[.*\].*only the DACP attention"):
            stock_model_inputs(mb)
