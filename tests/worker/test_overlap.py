"""The sharded sequences' collectives are issued asynchronously and the local attention runs under them.

The collectives are replaced by recorders (one process, no group) so the order of events is visible:
forward issues the all-gather (all-to-all) before the local attention and waits only after it;
backward issues the reduce-scatter (all-to-all) before the local backward and waits only after it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skrull.worker import dacp
from skrull.worker.dacp import DACPPlan, dacp_attention
from skrull.worker.kernels import AttentionKernel, select_kernel
from skrull.worker.layout import MicrobatchLayout, ShardedSequence, zigzag_ranges

CPU = torch.device("cpu")


class Work:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait(self) -> None:
        self.log.append(f"wait {self.name}")


def recording_plan(log: list[str], mode: str) -> DACPPlan:
    layout = MicrobatchLayout(
        step=0,
        ranks=(0, 1),
        position=0,
        local_ids=(7,),
        local_lengths=(5,),
        sharded=(ShardedSequence(seq_id=3, num_tokens=8, ranges=tuple(zigzag_ranges(8, 2, p) for p in range(2))),),
    )
    reference = select_kernel(CPU, torch.float32)

    def recording(q: torch.Tensor, *args: Any) -> torch.Tensor:
        log.append("local attention" if q.shape[0] == 5 else "sharded attention")
        return reference.fn(q, *args)

    fake_group: Any = object()
    return DACPPlan(
        layout=layout,
        group=fake_group,
        mode=mode,
        kernel=AttentionKernel(name="recording", fn=recording),
        local_cu_seqlens=torch.tensor(layout.local_cu_seqlens, dtype=torch.int32),
        local_max_seqlen=5,
        gather_index=torch.tensor(layout.gather_index),
        key_index=torch.tensor(layout.key_prefix_index),
        piece_cu_seqlens_q=torch.tensor(layout.piece_cu_seqlens_q, dtype=torch.int32),
        piece_cu_seqlens_k=torch.tensor(layout.piece_cu_seqlens_k, dtype=torch.int32),
        piece_max_q=2,
        piece_max_k=8,
        sharded_cu_seqlens=torch.tensor(layout.sharded_cu_seqlens, dtype=torch.int32),
        sharded_max_seqlen=8,
    )


@pytest.mark.parametrize(
    ("mode", "forward", "backward"),
    [
        (
            "allgather",
            ["issue all_gather async", "local attention", "wait all_gather", "sharded attention"],
            ["issue reduce_scatter async", "local backward", "wait reduce_scatter"],
        ),
        (
            "ulysses",
            ["issue all_to_all async", "local attention", "wait all_to_all", "sharded attention", "issue all_to_all"],
            ["issue all_to_all async", "local backward", "wait all_to_all", "issue all_to_all"],
        ),
    ],
)
def test_collectives_are_issued_before_local_attention_and_awaited_after(
    monkeypatch: pytest.MonkeyPatch, mode: str, forward: list[str], backward: list[str]
) -> None:
    log: list[str] = []

    def collective(name: str, size: int) -> Any:
        def run(send: torch.Tensor, *, group: Any, async_op: bool) -> tuple[torch.Tensor, Any]:
            log.append(f"issue {name}" + (" async" if async_op else ""))
            rows = {"all_gather": send.shape[0] * size, "reduce_scatter": send.shape[0] // size}.get(
                name, send.shape[0]
            )
            out = torch.zeros(rows, *send.shape[1:], dtype=send.dtype)
            return out, Work(log, name) if async_op else None

        return run

    monkeypatch.setattr(dacp, "all_gather_slots", collective("all_gather", 2))
    monkeypatch.setattr(dacp, "reduce_scatter_slots", collective("reduce_scatter", 2))
    monkeypatch.setattr(dacp, "all_to_all_slots", collective("all_to_all", 2))
    original_local_backward = dacp._local_backward

    def local_backward(*args: Any) -> Any:
        log.append("local backward")
        return original_local_backward(*args)

    monkeypatch.setattr(dacp, "_local_backward", local_backward)
    plan = recording_plan(log, mode)
    q = torch.randn(9, 4, 8, requires_grad=True)  # 5 local rows + 4 rows of pieces (tokens 0-1 and 6-7)
    k = torch.randn(9, 2, 8, requires_grad=True)
    v = torch.randn(9, 2, 8, requires_grad=True)
    out = dacp_attention(q, k, v, plan)
    assert log == forward
    log.clear()
    out.backward(torch.ones_like(out))
    assert log == backward
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_the_test_only_slow_collective_is_off_unless_asked_and_refuses_a_bad_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skrull.worker import collectives

    monkeypatch.delenv(collectives.DELAY_ENV, raising=False)
    assert collectives.injected_delay_ms_per_mib() == 0.0
    monkeypatch.setenv(collectives.DELAY_ENV, "12.5")
    assert collectives.injected_delay_ms_per_mib() == 12.5
    collectives.set_test_delay(3.0)
    try:
        assert collectives.injected_delay_ms_per_mib() == 3.0  # the process's own setting wins
    finally:
        collectives.set_test_delay(None)
    monkeypatch.setenv(collectives.DELAY_ENV, "fast")
    with pytest.raises(ValueError, match=collectives.DELAY_ENV):
        collectives.injected_delay_ms_per_mib()
    with pytest.raises(ValueError, match="ms_per_mib"):
        collectives.set_test_delay(-1.0)


def test_a_slowed_asynchronous_collective_overlaps_what_runs_before_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The delay counts from the issue: work done before ``wait`` hides it, as on a slow link (the clock is
    a fake one here, so the machine's load cannot decide it)."""
    from skrull.worker import collectives

    now = [100.0]
    slept: list[float] = []
    monkeypatch.setattr(collectives.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(collectives.time, "sleep", slept.append)
    log: list[str] = []
    hidden = collectives._DelayedWork(Work(log, "real"), issued=100.0, delay_s=0.05)
    now[0] = 100.08  # compute longer than the link's time ran before the wait
    hidden.wait()
    assert slept == [] and log == ["wait real"]
    exposed = collectives._DelayedWork(None, issued=100.08, delay_s=0.05)
    now[0] = 100.09  # 10 ms of compute under it
    exposed.wait()
    assert slept == [pytest.approx(0.04)]  # the rest of the link's time shows
