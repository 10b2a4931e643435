"""Decoder layers compiled as one graph each (``compile="fullgraph"``: the attention is the registered
operator ``skrull::dacp_attention``, worker/attention_op.py) on 2 gloo processes: no graph break, loss and
every gradient equal the eager step's within float32 tolerance on planned microbatches with shard pieces
(both CP schemes, the collectives inside the operator; gradients summed by all-reduce and under FSDP2),
and nothing recompiles after the warm-up step although every step brings other token counts. The same for
the whole decoder as one graph (``compile="stack"``), which FSDP2 refuses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from skrull.worker.hf.fast import compile_model
from skrull.worker.hf.finetune import check_steps, result_from_parts, run_finetune_rank
from skrull.worker.hf.model import build_model
from skrull.worker.launch import launch
from tests.worker.hf.test_fast import TOLERANCE_VS_EAGER, TOLERANCE_VS_PLAIN, config, sharded_plan
from tests.worker.modes import run_in

WORLD = 2
CASES = (
    ("eager", "off", "allgather", "allreduce"),
    ("fullgraph", "fullgraph", "allgather", "allreduce"),
    ("fullgraph-ulysses", "fullgraph", "ulysses", "allreduce"),
    # FSDP2's per-layer hooks around the compiled forward, with the chunked loss through the root's forward
    ("fullgraph-fsdp", "fullgraph", "allgather", "fsdp"),
    ("stack", "stack", "allgather", "allreduce"),  # the whole decoder one graph
    ("stack-ulysses", "stack", "ulysses", "allreduce"),
)


def run_cases(rank: int, world_size: int, backend: str, out_dir: str) -> None:
    from torch._dynamo.utils import counters

    plan, lengths = sharded_plan()
    for name, compile, cp_mode, grad_sync in CASES:
        breaks = sum(counters["graph_break"].values())
        run = dataclasses.replace(config(compile), grad_sync=grad_sync)
        part = run_finetune_rank(run_in(plan, cp_mode), lengths, config=run, rank=rank, device=torch.device("cpu"))
        part["graph_breaks"] = sum(counters["graph_break"].values()) - breaks
        torch.save(part, Path(out_dir) / f"{name}-rank{rank}.pt")
    (Path(out_dir) / f"breaks-rank{rank}.json").write_text(json.dumps(dict(counters["graph_break"])))
    try:  # the whole stack under FSDP2 is refused at the first forward, before any step
        run = dataclasses.replace(config("stack"), grad_sync="fsdp", loss_chunk_tokens=None)
        run_finetune_rank(plan, lengths, config=run, rank=rank, device=torch.device("cpu"))
        refusal = "not refused"
    except ValueError as exc:
        refusal = str(exc)
    (Path(out_dir) / f"stack-fsdp-rank{rank}.txt").write_text(refusal)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one-graph")
    launch(run_cases, world_size=WORLD, args=(str(out),))
    return out


def parts(runs: Path, name: str) -> list[dict[str, Any]]:
    return [torch.load(runs / f"{name}-rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize("name", ["fullgraph", "fullgraph-ulysses", "fullgraph-fsdp", "stack", "stack-ulysses"])
def test_one_graph_layers_equal_the_eager_step_and_the_plain_step(runs: Path, name: str) -> None:
    eager = result_from_parts(parts(runs, "eager"))
    fast = result_from_parts(parts(runs, name))
    assert fast.compiled and not eager.compiled
    for a, b in zip(eager.steps, fast.steps, strict=True):
        assert abs(a.loss - b.loss) <= TOLERANCE_VS_EAGER * abs(a.loss)
        assert set(b.grads) == set(a.grads)
        for param, want in a.grads.items():
            err = float((b.grads[param] - want).abs().max()) / float(want.abs().max())
            assert err <= TOLERANCE_VS_EAGER, (param, err)
    plan, lengths = sharded_plan()
    for check in check_steps(plan, lengths, fast, config=config(name.split("-")[0])):
        assert check.max_rel_error <= TOLERANCE_VS_PLAIN, check


@pytest.mark.parametrize("name", ["fullgraph", "fullgraph-ulysses", "stack", "stack-ulysses"])
def test_one_graph_layers_have_no_graph_break_and_do_not_recompile_after_warm_up(runs: Path, name: str) -> None:
    for part in parts(runs, name):
        assert part["graph_breaks"] == 0, json.loads((runs / "breaks-rank0.json").read_text())
    fast = result_from_parts(parts(runs, name))
    assert [r.compiles for r in fast.steps] == [0, 0, 0]


def test_the_whole_stack_under_fsdp2_is_refused_naming_the_setting(runs: Path) -> None:
    for rank in range(WORLD):
        text = (runs / f"stack-fsdp-rank{rank}.txt").read_text()
        assert "compile='stack' with FSDP2" in text and "compile='fullgraph'" in text, text


@pytest.mark.slow  # compiles the model twice per style: minutes on 2 cores
@pytest.mark.parametrize("style", ["fullgraph", "stack"])
def test_one_graph_layers_under_activation_checkpointing_equal_the_eager_step(style: str) -> None:
    """Checkpointed layers run the attention operator again in backward: it keeps no state, so the
    recomputation is exact (one process, whole sequences: the trainer allows checkpointing without CP)."""
    from tests.worker.hf.test_padding import CONFIG, CPU, assert_same, inputs, loss_and_grads

    eager = build_model(CONFIG, seed=0, device=CPU)
    fast = build_model(CONFIG, seed=0, device=CPU)
    fast.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert compile_model(fast, compile=style, device=CPU)
    for lengths in ((7, 12), (20, 5, 9, 1)):
        kwargs, labels = inputs(lengths)
        assert_same(loss_and_grads(fast, kwargs, labels), loss_and_grads(eager, kwargs, labels))
