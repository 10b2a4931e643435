"""PlannedBatches against a real ``skrull serve``: every token of every global batch reaches exactly one
rank, packed where the view says; the example trains over real gloo processes and its first loss is the
unscheduled loss of the same batch; the varlen adapters spell one layout four ways."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from examples import train_tiny
from skrull.api.client import PlanningClient
from skrull.corpus.order import global_batches
from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.layout import MicrobatchLayout
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.loss import per_token_loss
from skrull.worker.model import TinyCausalLM, sequence_attention
from skrull.worker.varlen import flash_attn_kwargs, hf_packed_kwargs, torch_varlen_kwargs
from tests.api.conftest import LiveServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path_factory.mktemp("srv") / "skrull.db", solver_processes=1).start()
    yield srv
    srv.close()


def loader(
    server: LiveServer, client: PlanningClient, dataset: list[list[int]], rank: int, **kw: object
) -> PlannedBatches:
    options = LoaderOptions(rank=rank, dp=2, cp=2, global_batch_size=12, profile=train_tiny.TINY_PROFILE, seed=3)
    return PlannedBatches(dataset, [len(s) for s in dataset], dataclasses.replace(options, **kw), client=client)


def test_every_token_of_every_batch_reaches_exactly_one_rank(server: LiveServer) -> None:
    dataset = train_tiny.make_dataset(80, max_tokens=128, seed=1)
    seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
    counts: set[int] = set()
    with PlanningClient(server.url) as client:
        for rank in range(4):
            batches = loader(server, client, dataset, rank, num_iterations=4, batches_per_plan=2, prefetch=2)
            for ready in batches:
                counts.add(len(ready.microbatches))
                for mb in ready.microbatches:
                    assert mb.input_ids.shape == mb.labels.shape == mb.position_ids.shape
                    assert mb.cu_seqlens[-1].item() == mb.num_tokens and mb.loss_normalizer == sum(
                        len(dataset[i]) for i in ready.sample_indices
                    )
                    rows = mb.layout.row_tokens
                    for (seq_id, pos), token in zip(rows, mb.input_ids.tolist(), strict=True):
                        first = sum(len(b) for b in batches.batches[(ready.iteration // 2) * 2 : ready.iteration])
                        sample = ready.sample_indices[seq_id - first]
                        assert dataset[sample][pos] == token
                        seen.setdefault((ready.iteration, sample), []).append((pos, rank))
            batches.close()
    order = global_batches(80, global_batch_size=12, seed=3)[:4]
    expected = {(it, s) for it, b in enumerate(order) for s in b}
    assert set(seen) == expected
    for (_, sample), positions in seen.items():
        assert sorted(p for p, _ in positions) == list(range(len(dataset[sample])))  # each token once


def test_example_trains_over_gloo_and_first_loss_is_the_unscheduled_loss(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    argv = ["--url", server.url, "--iterations", "3", "--samples", "96", "--global-batch-size", "12", "--seed", "5"]
    train_tiny.main([*argv, "--out", str(out)])
    # it says what it is doing before the processes' imports and the first plan (seconds of silence otherwise)
    assert f"train_tiny: starting 4 processes (gloo) against {server.url}" in capsys.readouterr().err
    rows = json.loads(out.read_text())
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert all(math.isfinite(r["loss"]) and r["blocked_ms"] >= 0 for r in rows)
    # the same batch, every sequence alone in one process, per-token normalization over the batch
    torch.manual_seed(5)
    model = TinyCausalLM(vocab_size=train_tiny.VOCAB)
    dataset = train_tiny.make_dataset(96, max_tokens=2 * 64, seed=5)
    batch = global_batches(96, global_batch_size=12, seed=5)[0]
    total = sum(len(dataset[i]) for i in batch)
    reference = 0.0
    with torch.no_grad():
        for i in batch:
            ids = torch.tensor(dataset[i])
            labels = torch.cat([ids[1:], torch.tensor([-100])])
            logits = model(ids, torch.arange(len(ids)), sequence_attention)
            reference += float(per_token_loss(logits, labels, num_tokens_in_iteration=total))
    assert rows[0]["loss"] == pytest.approx(reference, rel=1e-4)


def test_rejects_a_sample_of_another_length(server: LiveServer) -> None:
    dataset = train_tiny.make_dataset(24, max_tokens=64, seed=2)
    lengths = [len(s) for s in dataset]
    lengths[0] -= 1
    with PlanningClient(server.url) as client:
        batches = PlannedBatches(
            dataset,
            lengths,
            LoaderOptions(rank=0, dp=1, cp=1, global_batch_size=24, profile=train_tiny.TINY_PROFILE, shuffle=False),
            client=client,
        )  # fmt: skip
        with pytest.raises(RequestError, match=r"dataset\[0\]"):
            next(iter(batches))
        batches.close()


def test_varlen_adapters_spell_one_layout_and_refuse_shard_pieces(server: LiveServer) -> None:
    dataset = [[1] * 100, [2] * 7, [3] * 5]  # 100 tokens > bucket 64: sharded over the CP group
    with PlanningClient(server.url) as client:
        batches = PlannedBatches(
            dataset,
            [100, 7, 5],
            LoaderOptions(rank=1, dp=1, cp=2, global_batch_size=3, profile=train_tiny.TINY_PROFILE, shuffle=False),
            client=client,
        )  # fmt: skip
        ready = next(iter(batches))
        batches.close()
    sharded = next(mb.layout for mb in ready.microbatches if mb.layout.sharded)
    for adapter in (flash_attn_kwargs, torch_varlen_kwargs, hf_packed_kwargs):
        with pytest.raises(ValueError, match=r"shard pieces of sequences \[0, 1, 2\].*DACP attention"):
            adapter(sharded)
    # the same sequences kept whole on one GPU
    layout = MicrobatchLayout(
        step=0, ranks=(1,), position=0, local_ids=(0, 1, 2), local_lengths=(100, 7, 5), sharded=()
    )
    cu = list(layout.cu_seqlens)
    fa, tv, hf = flash_attn_kwargs(layout), torch_varlen_kwargs(layout), hf_packed_kwargs(layout)
    for tensor in (fa["cu_seqlens_q"], fa["cu_seqlens_k"], tv["cu_seq_q"], hf["cu_seq_lens_k"]):
        assert tensor.dtype == torch.int32 and tensor.tolist() == cu
    assert fa["max_seqlen_q"] == tv["max_k"] == hf["max_length_q"] == layout.max_seqlen
    positions = hf["position_ids"][0].tolist()
    assert hf["position_ids"].shape == (1, layout.num_tokens)
    assert [k for k, p in enumerate(positions) if p == 0] == cu[:-1]  # restarts exactly at segment starts


def test_a_plan_that_defers_sequences_is_refused_not_trained_partially(server: LiveServer) -> None:
    # WLB-LLM defers these short-bucket outliers out of their global batch (its plan's ``pending``): the
    # loader trains each batch in its own iteration, so it must refuse rather than leave them untrained
    dataset = train_tiny.make_dataset(80, max_tokens=64, seed=3)
    with PlanningClient(server.url) as client:
        batches = loader(server, client, dataset, 0, num_iterations=4, batches_per_plan=2, solver="wlb")
        with pytest.raises(RequestError) as caught:
            for _ in batches:
                pass
    assert caught.value.field == "solver"
    assert "deferred" in str(caught.value)


def test_a_tokenized_chat_dataset_is_delivered_token_for_token(server: LiveServer, tmp_path: Path) -> None:
    # chats rendered by the tokenizer's own template (a `datasets` dataset on disk) are what ranks train on
    import datasets

    from skrull.corpus.source import load_token_rows
    from tests.corpus.test_source import chats
    from tests.corpus.tiny import build_chat_tokenizer_dir

    saved = tmp_path / "saved"
    datasets.Dataset.from_list(chats(40)).save_to_disk(str(saved))
    rows = load_token_rows(tokenizer=build_chat_tokenizer_dir(tmp_path / "tok"), dataset=str(saved), max_length=128)
    delivered: dict[tuple[int, int], int] = {}
    with PlanningClient(server.url) as client:
        for rank in range(4):
            batches = PlannedBatches(
                rows,
                rows.lengths,
                LoaderOptions(
                    rank=rank, dp=2, cp=2, global_batch_size=8, profile=train_tiny.TINY_PROFILE, seed=1,
                    num_iterations=3
                ),
                client=client,
            )  # fmt: skip
            for ready in batches:
                for mb in ready.microbatches:  # one batch per plan: sequence ids count from 0 in each
                    for (seq_id, pos), token in zip(mb.layout.row_tokens, mb.input_ids.tolist(), strict=True):
                        sample = ready.sample_indices[seq_id]
                        assert (sample, pos) not in delivered
                        delivered[(sample, pos)] = token
            batches.close()
    order = global_batches(40, global_batch_size=8, seed=1)[:3]
    expected = {(s, p): rows[s]["input_ids"][p] for b in order for s in b for p in range(rows.lengths[s])}
    assert delivered == expected


@pytest.mark.parametrize("equal", [False, True])
def test_equal_microbatches_gives_every_rank_the_same_count_and_every_token_once(
    server: LiveServer, equal: bool
) -> None:
    # what FSDP2 / ZeRO-3 need: every rank runs as many forwards as every other (empty ones where needed)
    dataset = train_tiny.make_dataset(80, max_tokens=128, seed=2)
    counts: dict[int, list[int]] = {}
    tokens: dict[tuple[int, int], int] = {}
    with PlanningClient(server.url) as client:
        for rank in range(4):
            batches = loader(server, client, dataset, rank, num_iterations=4, solver="skrull", equal_microbatches=equal)
            for ready in batches:
                counts.setdefault(ready.iteration, []).append(len(ready.microbatches))
                for mb in ready.microbatches:
                    assert mb.input_ids.shape[0] == mb.num_tokens == int(mb.cu_seqlens[-1])
                    for seq_id, pos in mb.layout.row_tokens:
                        key = (ready.sample_indices[seq_id], pos)
                        tokens[key] = tokens.get(key, 0) + 1
            batches.close()
    assert all(len(set(c)) == 1 for c in counts.values()) is equal  # unequal counts without it, here
    order = global_batches(80, global_batch_size=12, seed=3)[:4]
    assert tokens == {(s, p): 1 for b in order for s in b for p in range(len(dataset[s]))}
