"""worker/megatron.py against megatron-core's real classes (the optional extra ``megatron``), on CPU.

The rule every sharded item must follow is written here independently, from Transformer Engine's documented
THD + CP partitioning (``thd_get_partitioned_indices``, used by megatron-core's
``get_thd_batch_on_this_cp_rank``): pad each sequence at its end to a multiple of 2N, cut it into 2N equal
chunks, CP rank r (the rank in the process group: ascending global rank) holds chunk r, then chunk 2N-1-r.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

with warnings.catch_warnings():  # megatron-core warns at import that Transformer Engine and Apex are absent
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rope_utils import _get_thd_freqs_on_this_cp_rank
    from megatron.core.packed_seq_params import PackedSeqParams

from skrull.solver.errors import RequestError
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planning import assemble_plan
from skrull.solver.types import MicrobatchSpec, Plan, Problem
from skrull.solver.validate import validate_plan
from skrull.worker.layout import MicrobatchLayout, ShardedSequence, rank_layouts
from skrull.worker.loss import IGNORE_INDEX
from skrull.worker.megatron import (
    LOCAL,
    SHARDED,
    MegatronMicrobatch,
    megatron_cp_ranges,
    megatron_iteration,
    megatron_microbatches,
    padded_num_tokens,
)
from tests.conftest import make_request
from tests.launch import run_torchrun

ROOT = Path(__file__).resolve().parents[2]
PAD = -7  # a pad id no real token has, so padding rows are told apart in comparisons
PROMPT_TOKENS = 2  # the first labels of every sequence are masked, as a chat prompt's are


def token(seq_id: int, position: int) -> int:
    return 1000 * (seq_id + 1) + position


def sequence(seq_id: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([token(seq_id, t) for t in range(num_tokens)])
    labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
    labels[:PROMPT_TOKENS] = IGNORE_INDEX
    return ids, labels


def plan_of(batches: list[list[int]], specs: tuple[MicrobatchSpec, ...], *, cp: int) -> tuple[Plan, tuple[int, ...]]:
    request = make_request(batches, dp=1, cp=cp, bucket=40)
    problem = Problem.from_request(request)
    plan = assemble_plan(problem, PlannerOutput(iterations=(specs,)), solver="skrull", wall_ms=0.0)
    validate_plan(plan, request)
    return plan, problem.lengths


#: Mixed local + sharded over 4 GPUs (23 and 31 tokens: not multiples of 8), a group listed out of order
#: (3, 1) sharding 17 tokens, and 40 tokens over (0, 2), a multiple of 2N.
PLAN, LENGTHS = plan_of(
    [[23, 9, 31, 6, 17, 2, 40, 8]],
    (
        MicrobatchSpec(step=0, ranks=(0, 1, 2, 3), local=((1,), (), (3,), ()), sharded=(0, 2)),
        MicrobatchSpec(step=1, ranks=(3, 1), local=((5,), ()), sharded=(4,)),
        MicrobatchSpec(step=1, ranks=(0, 2), local=((7,), ()), sharded=(6,)),
    ),
    cp=4,
)
#: Stand-ins for process groups (the two-process test below uses a real one): the adapter passes the
#: caller's group through, so identity shows which group an item got.
GROUPS = {ranks: object() for ranks in [(0, 1, 2, 3), (1, 3), (0, 2)]}


def fetch(seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    return sequence(seq_id, LENGTHS[seq_id])


def items_of(rank: int) -> tuple[MegatronMicrobatch, ...]:
    layouts = rank_layouts(PLAN, LENGTHS, iteration=0, rank=rank)
    return megatron_iteration(layouts, fetch, cp_groups=GROUPS, pad_token_id=PAD)  # type: ignore[arg-type]


def megatron_rule(seqs: list[tuple[int, int]], cp_size: int, cp_rank: int) -> list[tuple[int, int]]:
    """``(seq_id, padded position)`` of every row CP rank ``cp_rank`` holds, from the documented rule."""
    rows = []
    for seq_id, num_tokens in seqs:
        padded = math.ceil(num_tokens / (2 * cp_size)) * 2 * cp_size
        chunk = padded // (2 * cp_size)
        for k in (cp_rank, 2 * cp_size - 1 - cp_rank):
            rows.extend((seq_id, t) for t in range(k * chunk, (k + 1) * chunk))
    return rows


def expected_tensors(rows: list[tuple[int, int]], lengths: tuple[int, ...] = LENGTHS) -> dict[str, list[Any]]:
    tokens, labels, mask = [], [], []
    for seq_id, t in rows:
        ids, seq_labels = sequence(seq_id, lengths[seq_id])
        real = t < lengths[seq_id]
        label = int(seq_labels[t]) if real else IGNORE_INDEX
        tokens.append(int(ids[t]) if real else PAD)
        labels.append(0 if label == IGNORE_INDEX else label)
        mask.append(0.0 if label == IGNORE_INDEX else 1.0)
    return {"tokens": tokens, "labels": labels, "position_ids": [t for _, t in rows], "loss_mask": mask}


def tensors(item: MegatronMicrobatch) -> dict[str, list[Any]]:
    for t in (item.tokens, item.labels, item.position_ids, item.loss_mask):
        assert t.shape == (1, item.num_tokens)
    return {
        "tokens": item.tokens[0].tolist(),
        "labels": item.labels[0].tolist(),
        "position_ids": item.position_ids[0].tolist(),
        "loss_mask": item.loss_mask[0].tolist(),
    }


def test_every_cp_rank_holds_exactly_the_rows_megatrons_rule_assigns() -> None:
    for spec in PLAN.iterations[0].microbatches:
        if not spec.sharded:
            continue
        members = sorted(spec.ranks)
        seqs = [(i, LENGTHS[i]) for i in spec.sharded]
        for rank in spec.ranks:
            item = next(it for it in items_of(rank) if it.kind == SHARDED and it.step == spec.step)
            cp_rank = members.index(rank)
            assert tensors(item) == expected_tensors(megatron_rule(seqs, len(members), cp_rank)), (spec.step, rank)
            assert item.seq_ids == spec.sharded
            assert item.packed_seq_params.cp_group is GROUPS[tuple(members)]


def test_over_the_group_every_real_token_of_the_batch_appears_exactly_once() -> None:
    seen: dict[tuple[int, int], int] = {}
    padding = 0
    for rank in range(4):
        for item in items_of(rank):
            for i, t in zip(item.tokens[0].tolist(), item.position_ids[0].tolist(), strict=True):
                if i == PAD:
                    padding += 1
                    continue
                seq_id, position = divmod(i, 1000)
                assert position == t and t < LENGTHS[seq_id - 1]
                seen[(seq_id - 1, t)] = seen.get((seq_id - 1, t), 0) + 1
            # every rank holds 1/N of the group's padded sequences
            assert item.num_tokens * item.cp_size == item.packed_seq_params.cu_seqlens_q_padded.tolist()[-1]
    assert seen == {(s, t): 1 for s, n in enumerate(LENGTHS) for t in range(n)}
    # 23 -> 24 and 31 -> 32 over 4 GPUs, 17 -> 20 over 2; 40 over 2 needs none
    assert padding == 1 + 1 + 3


def test_packed_seq_params_are_megatrons_class_with_global_offsets() -> None:
    local, sharded = (it for it in items_of(0) if it.step == 0)
    assert type(sharded.packed_seq_params) is PackedSeqParams and type(local.packed_seq_params) is PackedSeqParams
    p = sharded.packed_seq_params
    assert (sharded.kind, sharded.cp_size, p.qkv_format, p.local_cp_size) == (SHARDED, 4, "thd", 4)
    assert p.cu_seqlens_q.tolist() == p.cu_seqlens_kv.tolist() == [0, 23, 54]
    assert p.cu_seqlens_q_padded.tolist() == p.cu_seqlens_kv_padded.tolist() == [0, 24, 56]
    assert p.cu_seqlens_q.dtype == p.cu_seqlens_q_padded.dtype == torch.int32
    assert (p.max_seqlen_q, p.max_seqlen_kv) == (32, 32)
    assert sharded.num_tokens == (24 + 32) // 4
    q = local.packed_seq_params
    assert (local.kind, local.seq_ids, local.cp_size, q.qkv_format, q.cp_group) == (LOCAL, (1,), 1, "thd", None)
    assert q.cu_seqlens_q.tolist() == q.cu_seqlens_kv_padded.tolist() == [0, 9]
    assert (q.max_seqlen_q, q.max_seqlen_kv) == (9, 9)
    assert tensors(local) == expected_tensors([(1, t) for t in range(9)])


def test_megatrons_rope_slicing_gives_each_row_its_position_id() -> None:
    # megatron-core's own THD RoPE (rope_utils): each sequence's rows on this CP rank are padded // N long,
    # and the frequencies it picks for them are those of the positions position_ids must hold.
    for spec in PLAN.iterations[0].microbatches:
        for rank in spec.ranks if spec.sharded else ():
            item = next(it for it in items_of(rank) if it.kind == SHARDED and it.step == spec.step)
            p = item.packed_seq_params
            freqs = torch.arange(p.max_seqlen_q, dtype=torch.float32).view(-1, 1, 1, 1)
            seqlens = ((p.cu_seqlens_q_padded[1:] - p.cu_seqlens_q_padded[:-1]) // item.cp_size).tolist()
            pieces = torch.split(torch.zeros(item.num_tokens, 1, 1), seqlens)
            cp_rank = sorted(spec.ranks).index(rank)
            positions = [_get_thd_freqs_on_this_cp_rank(cp_rank, item.cp_size, x, freqs) for x in pieces]
            assert torch.cat(positions).view(-1).long().tolist() == item.position_ids[0].tolist()


def test_a_multiple_of_2n_is_split_as_the_plan_splits_and_other_lengths_are_not() -> None:
    # over the whole group: 40 tokens over 2 GPUs (a multiple of 4) is cut alike; 23, 31 over 4 and 17 over 2
    # are not (the plan deals remainders round-robin, Megatron pads; a middle rank may still match)
    alike = {}
    for spec in PLAN.iterations[0].microbatches:
        layout = next(
            lay
            for lay in rank_layouts(PLAN, LENGTHS, iteration=0, rank=spec.ranks[0])
            if lay.step == spec.step and lay.ranks == spec.ranks
        )
        for s in layout.sharded:
            plans = [tuple(t for a, b in s.ranges[spec.ranks.index(r)] for t in range(a, b)) for r in layout.slot_ranks]
            megatrons = [
                tuple(
                    t
                    for a, b in megatron_cp_ranges(s.num_tokens, layout.group_size, k)
                    for t in range(a, min(b, s.num_tokens))
                )
                for k in range(layout.group_size)
            ]
            alike[s.seq_id] = plans == megatrons
    assert alike == {0: False, 2: False, 4: False, 6: True}


def test_ranks_listed_out_of_order_take_their_process_group_rank() -> None:
    # ranks (3, 1): rank 1 is CP rank 0 of the group (1, 3) though it is the plan's position 1
    seqs = [(4, 17)]
    (sharded,) = (it for it in items_of(1) if it.step == 1 and it.kind == SHARDED)
    assert tensors(sharded) == expected_tensors(megatron_rule(seqs, 2, 0))
    (sharded3,) = (it for it in items_of(3) if it.step == 1 and it.kind == SHARDED)
    assert tensors(sharded3) == expected_tensors(megatron_rule(seqs, 2, 1))
    assert megatron_cp_ranges(17, 2, 0) == ((0, 5), (15, 20)) and padded_num_tokens(17, 2) == 20


def test_a_group_of_one_and_an_empty_microbatch() -> None:
    alone = MicrobatchLayout(
        step=3, ranks=(5,), position=0, local_ids=(1,), local_lengths=(9,),
        sharded=(ShardedSequence(seq_id=0, num_tokens=23, ranges=(((0, 23),),)),),
    )  # fmt: skip
    (item,) = megatron_microbatches(alone, fetch)
    assert (item.kind, item.seq_ids, item.cp_size, item.packed_seq_params.cp_group) == (LOCAL, (1, 0), 1, None)
    assert item.packed_seq_params.cu_seqlens_q.tolist() == [0, 9, 32]
    assert tensors(item) == expected_tensors([(1, t) for t in range(9)] + [(0, t) for t in range(23)])
    empty = MicrobatchLayout(step=0, ranks=(0, 1), position=1, local_ids=(), local_lengths=(), sharded=())
    assert megatron_microbatches(empty, fetch) == ()


def test_user_mistakes_are_named() -> None:
    layout = next(lay for lay in rank_layouts(PLAN, LENGTHS, iteration=0, rank=2) if lay.step == 0)
    with pytest.raises(RequestError, match=r"cp_groups: null: microbatch step 0 shards sequences over ranks"):
        megatron_microbatches(layout, fetch)
    with pytest.raises(RequestError, match=r"cp_groups: \[0, 1, 2, 3\]: has no process group"):
        megatron_microbatches(layout, fetch, cp_groups={})
    wrong_length = r"fetch\(3\): \[\[5\], \[5\]\]: must give input_ids and labels of 6 tokens each"
    with pytest.raises(RequestError, match=wrong_length):
        megatron_microbatches(layout, lambda i: sequence(i, 5), cp_groups=GROUPS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cp_rank 2 outside a CP group of 2"):
        megatron_cp_ranges(10, 2, 2)


def test_ulysses_microbatches_are_refused_naming_the_mode() -> None:
    import dataclasses

    layout = next(lay for lay in rank_layouts(PLAN, LENGTHS, iteration=0, rank=2) if lay.step == 0)
    with pytest.raises(RequestError, match=r"microbatches\[step=0\]\.mode: 'ulysses': Megatron-Core's context"):
        megatron_microbatches(dataclasses.replace(layout, mode="ulysses"), fetch, cp_groups=GROUPS)  # type: ignore[arg-type]


def test_without_megatron_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "megatron.core.packed_seq_params", None)
    layout = next(lay for lay in rank_layouts(PLAN, LENGTHS, iteration=0, rank=3) if lay.step == 0)
    with pytest.raises(ImportError, match=r"pip install 'skrull\[megatron\]'"):
        megatron_microbatches(layout, fetch, cp_groups=GROUPS)  # type: ignore[arg-type]


# -- real gloo process groups ------------------------------------------------------------------------------


def test_local_only_microbatch_in_a_world_of_one(tmp_path: Path) -> None:
    plan, lengths = plan_of([[5, 3]], (MicrobatchSpec(step=0, ranks=(0,), local=((0, 1),), sharded=()),), cp=1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        world = dist.group.WORLD
        assert world is not None
        layouts = rank_layouts(plan, lengths, iteration=0, rank=0)
        (item,) = megatron_iteration(layouts, lambda i: sequence(i, lengths[i]), cp_groups={(0,): world})
        p = item.packed_seq_params
        assert (item.kind, p.local_cp_size, p.cp_group, p.qkv_format) == (LOCAL, 1, None, "thd")
        assert p.cu_seqlens_q.tolist() == p.cu_seqlens_q_padded.tolist() == [0, 5, 8]
        assert item.tokens[0].tolist() == [token(0, t) for t in range(5)] + [token(1, t) for t in range(3)]
        assert item.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
        # a group whose members are not the microbatch's ranks is refused
        two = MicrobatchLayout(
            step=0, ranks=(0, 1), position=0, local_ids=(), local_lengths=(),
            sharded=(ShardedSequence(seq_id=0, num_tokens=5, ranges=(((0, 2), (4, 5)), ((2, 4),))),),
        )  # fmt: skip
        with pytest.raises(RequestError, match=r"cp_groups\[\(0, 1\)\]: \[0\]: must be the process group of exactly"):
            megatron_microbatches(two, lambda i: sequence(i, lengths[i]), cp_groups={(0, 1): world})
    finally:
        dist.destroy_process_group()


TWO_RANK_PLAN = ([[13, 4, 6]], (MicrobatchSpec(step=0, ranks=(1, 0), local=((1,), (2,)), sharded=(0,)),))
TWO_RANK_LENGTHS = (13, 4, 6)


def _two_rank_worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1])  # created once, up front, by every rank
        plan, lengths = plan_of(*TWO_RANK_PLAN, cp=2)
        layouts = rank_layouts(plan, lengths, iteration=0, rank=rank)
        items = megatron_iteration(
            layouts, lambda i: sequence(i, lengths[i]), cp_groups=lambda ranks: group, pad_token_id=PAD
        )
        local, sharded = items
        assert sharded.packed_seq_params.cp_group is group and sharded.cp_size == 2
        gathered = [torch.zeros_like(sharded.tokens) for _ in range(2)]
        dist.all_gather(gathered, sharded.tokens, group=group)  # the item's group is a working group
        result = {
            "group_rank": group.rank(),
            "local": tensors(local),
            "sharded": tensors(sharded),
            "gathered": [g[0].tolist() for g in gathered],
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_two_processes_shard_over_a_real_gloo_group(tmp_path: Path) -> None:
    mp.spawn(_two_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["group_rank"] for g in got] == [0, 1]
    for r in range(2):
        # plan position r of ranks (1, 0) is global rank 1 - r; the CP rank is the global rank's group rank
        assert got[r]["sharded"] == expected_tensors(megatron_rule([(0, 13)], 2, r), TWO_RANK_LENGTHS)
        assert got[r]["gathered"] == [got[0]["sharded"]["tokens"], got[1]["sharded"]["tokens"]]
    assert got[0]["local"] == expected_tensors([(2, t) for t in range(6)], TWO_RANK_LENGTHS)
    assert got[1]["local"] == expected_tensors([(1, t) for t in range(4)], TWO_RANK_LENGTHS)
    real = sorted(t for g in got for t in g["sharded"]["tokens"] if t != PAD)
    assert real == [token(0, t) for t in range(13)]


# -- the GPU example ------------------------------------------------------------------------------------------


def test_the_gpu_example_imports_and_answers_help_on_cpu() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "megatron_step.py"), "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage: megatron_step.py") and "torchrun" in out.stdout


def test_the_gpu_example_on_a_cpu_machine_refuses_in_one_line_under_torchrun() -> None:
    # every rank meets the refusal; rank 0 says it once, before megatron-core's import warnings, and no rank
    # fails, so torchrun adds no failure report of its own
    if torch.cuda.is_available():
        pytest.skip("the refusal of a machine without CUDA; this one has a GPU")
    out = run_torchrun(ROOT / "examples" / "megatron_step.py", ["--cp", "2"], nproc=2, cwd=ROOT, timeout_s=300)
    printed = out.stdout + out.stderr
    assert out.returncode == 0, printed[-3000:]
    refusal = "megatron_step.py: needs CUDA GPUs (NCCL and Transformer Engine); this machine has none, nothing was run"
    assert printed.splitlines() == [refusal], printed[-3000:]
    alone = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "megatron_step.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert alone.returncode == 2 and alone.stdout == "" and alone.stderr == refusal + "\n"
