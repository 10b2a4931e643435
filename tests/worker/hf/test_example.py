"""examples/finetune_hf.py against a real ``skrull serve``: 4 gloo processes train a Qwen2 model on
plans fetched ahead, and the first step's loss is the plain Hugging Face loss of the same global batch."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from examples import finetune_hf
from skrull.corpus.order import global_batches
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.step import plain_step
from tests.api.conftest import LiveServer
from tests.cli.piped import ROOT, run_piped


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path_factory.mktemp("srv") / "skrull.db", solver_processes=1).start()
    yield srv
    srv.close()


def test_example_trains_and_its_first_loss_is_the_plain_hf_loss(server: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    argv = ["--url", server.url, "--steps", "2", "--samples", "48", "--global-batch-size", "8", "--seed", "3"]
    argv += ["--solver", "skrull", "--length-scale", "0.05", "--out", str(out)]
    # as a user runs it, its output a pipe: each phase says itself as it starts
    run = run_piped([sys.executable, str(ROOT / "examples" / "finetune_hf.py"), *argv])
    assert run.returncode == 0, run.lines
    assert run.running_after_first_line, run.lines
    said = [x for x in run.lines if x.startswith("finetune_hf: ")]
    steps = [re.sub(r"\d+(\.\d+)?", "<N>", x) for x in said[3:-1]]
    assert said[:3] == [
        "finetune_hf: starting 4 processes (gloo), DP2 x CP2, solver skrull",
        "finetune_hf: building the model (qwen2, 2 layers) on every rank",
        f"finetune_hf: 48 sequences (llama3-sft-mix); submitting 2 global batch(es) to {server.url}",
    ], run.lines
    assert (
        steps
        == [
            "finetune_hf: step <N>: loss <N> over <N> target tokens, <N> ms, blocked on the planner <N> ms, "
            "<N> microbatch(es) on rank <N>"
        ]
        * 2
    ), run.lines
    assert said[-1] == f"finetune_hf: done: 2 step(s), rows in {out}"
    rows = json.loads(out.read_text())
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(math.isfinite(r["loss"]) and r["blocked_ms"] >= 0 for r in rows)
    args = finetune_hf.parse_args(argv)
    config = read_model_config(args.model_config)
    dataset = finetune_hf.make_dataset(args, vocab_size=config["vocab_size"], max_tokens=2 * 64)
    assert max(len(s) for s in dataset) > 64  # some sequences need context parallelism
    batch = global_batches(len(dataset), global_batch_size=8, seed=3)[0]
    model = build_model(config, seed=3, attn_implementation="eager")
    loss = plain_step(model, [torch.tensor(dataset[i]) for i in batch])
    assert rows[0]["loss"] == pytest.approx(loss, rel=1e-5)
    assert rows[0]["target_tokens"] == sum(len(dataset[i]) - 1 for i in batch)
