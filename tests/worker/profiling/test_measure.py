"""Measurements on the CPU: the same code paths a GPU profile takes, on a small layer."""

from __future__ import annotations

import pytest
import torch

from skrull.worker.kernels import select_kernel
from skrull.worker.profiling.comm import measure_comm
from skrull.worker.profiling.measure import (
    TINY,
    HeadTimer,
    Part,
    Timer,
    build_layer,
    measure_attention,
    measure_microbatches,
    measure_parts,
    part_step,
    saved_activation_bytes,
    sequence_flops,
)

CPU = torch.device("cpu")
KERNEL = select_kernel(CPU, torch.float32)


def test_part_step_runs_forward_and_backward_over_local_sequences_and_pieces() -> None:
    layer = build_layer(TINY, device=CPU, dtype=torch.float32)
    step = part_step(layer, Part(local_lengths=(5, 9), pieces=((10, 14), (30, 33))), kernel=KERNEL, device=CPU,
                     dtype=torch.float32)  # fmt: skip
    step()
    # gradients are cleared after every step so repeats do not accumulate
    assert all(p.grad is None for p in layer.parameters())


def test_equal_parts_are_timed_once_and_empty_parts_cost_nothing() -> None:
    layer = build_layer(TINY, device=CPU, dtype=torch.float32)
    calls = []

    class CountingTimer(Timer):
        def ms(self, fn):  # type: ignore[no-untyped-def]
            calls.append(fn)
            return 2.5

    parts = [Part(local_lengths=(8,)), Part(local_lengths=()), Part(local_lengths=(8,)), Part(local_lengths=(3, 5))]
    times = measure_parts(layer, parts, num_layers=4, kernel=KERNEL, timer=CountingTimer(CPU), dtype=torch.float32)
    assert times == [10.0, 0.0, 10.0, 10.0] and len(calls) == 2


def test_a_whole_microbatch_runs_every_layer_then_the_head_with_one_backward() -> None:
    layer = build_layer(TINY, device=CPU, dtype=torch.float32)
    head = HeadTimer(TINY, timer=Timer(CPU), dtype=torch.float32)
    forwards: list[int] = []
    layer.register_forward_hook(lambda *_: forwards.append(1))
    backwards: list[int] = []
    head.weight.register_hook(lambda g: backwards.append(1))  # type: ignore[no-untyped-call]
    step = part_step(layer, Part(local_lengths=(5, 9), pieces=((10, 14),)), kernel=KERNEL, device=CPU,
                     dtype=torch.float32, depth=3, head_weight=head.weight)  # fmt: skip
    step()
    assert len(forwards) == 3 and len(backwards) == 1
    assert all(p.grad is None for p in layer.parameters()) and head.weight.grad is None
    with pytest.raises(ValueError, match="depth"):
        part_step(layer, Part(local_lengths=(5,)), kernel=KERNEL, device=CPU, dtype=torch.float32, depth=0)


def test_whole_microbatches_are_timed_once_each_not_layer_times_depth() -> None:
    layer = build_layer(TINY, device=CPU, dtype=torch.float32)
    calls = []

    class CountingTimer(Timer):
        def ms(self, fn):  # type: ignore[no-untyped-def]
            calls.append(fn)
            return 2.5

    parts = [Part(local_lengths=(8,)), Part(local_lengths=()), Part(local_lengths=(8,)), Part(local_lengths=(3, 5))]
    timer = CountingTimer(CPU)
    head = HeadTimer(TINY, timer=timer, dtype=torch.float32)
    times = measure_microbatches(layer, parts, num_layers=4, kernel=KERNEL, timer=timer, dtype=torch.float32, head=head)
    assert times == [2.5, 0.0, 2.5, 2.5] and len(calls) == 2


def test_saved_activations_grow_with_tokens_and_exclude_weights() -> None:
    layer = build_layer(TINY, device=CPU, dtype=torch.float32)
    small = saved_activation_bytes(layer, 64, kernel=KERNEL, device=CPU, dtype=torch.float32)
    large = saved_activation_bytes(layer, 128, kernel=KERNEL, device=CPU, dtype=torch.float32)
    weights = sum(p.numel() * 4 for p in layer.parameters())
    assert small.peak_bytes is None
    # at least the MLP's gate/up activations (2 * intermediate floats per token) are kept
    assert small.saved_bytes >= 64 * 2 * TINY.intermediate_size * 4
    assert large.saved_bytes > 1.9 * small.saved_bytes
    assert small.saved_bytes < weights + 64 * 1_000_000


def test_attention_points_count_eq13_flops() -> None:
    timer = Timer(CPU, warmup=0, repeats=1)
    (point,) = measure_attention(TINY, [64], kernel=KERNEL, timer=timer, dtype=torch.float32)
    assert point.flops == 3 * 4 * TINY.hidden_size * 64 * 64 and point.ms > 0
    assert sequence_flops(TINY, [10, 20]) > sequence_flops(TINY, [30]) * 0  # both terms positive
    assert sequence_flops(TINY, [30]) > sequence_flops(TINY, [10, 20])  # the quadratic term


def test_comm_is_timed_between_real_processes() -> None:
    samples = measure_comm(num_gpus=2, backend="gloo", sizes=(2**12, 2**16), repeats=2)
    # all-gathers of that many gathered bytes, then all-to-alls of that many bytes sent by each member
    assert [(s.collective, s.num_bytes) for s in samples] == [
        ("all_gather", 2**12), ("all_gather", 2**16), ("all_to_all", 2**12), ("all_to_all", 2**16),
    ]  # fmt: skip
    assert all(s.ms > 0 and s.group_size == 2 for s in samples)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_peak_memory_is_measured() -> None:
    device = torch.device("cuda")
    kernel = select_kernel(device, torch.bfloat16)
    layer = build_layer(TINY, device=device, dtype=torch.bfloat16)
    sample = saved_activation_bytes(layer, 1024, kernel=kernel, device=device, dtype=torch.bfloat16)
    assert sample.peak_bytes is not None and sample.peak_bytes > 0


@pytest.mark.slow  # compiles a layer: seconds on 2 cores
def test_a_compiled_layer_matches_the_eager_one_and_times_every_part_shape_with_one_compile() -> None:
    from skrull.worker.compiling import compile_count, is_compiled
    from skrull.worker.profiling.measure import _PartAttention

    eager = build_layer(TINY, device=CPU, dtype=torch.float32, seed=3)
    fast = build_layer(TINY, device=CPU, dtype=torch.float32, seed=3, compile=True)
    assert is_compiled(fast) and not is_compiled(eager)
    cu = torch.tensor([0, 12, 20], dtype=torch.int32)
    empty = torch.zeros(0, TINY.num_kv_heads, TINY.head_dim)
    attend = _PartAttention(KERNEL, n_local=20, local=(cu, 12), pieces=None, prefix=(empty, empty))
    x = torch.randn(20, TINY.hidden_size, generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(12), torch.arange(8)])
    outs, grads = [], []
    for layer in (eager, fast):
        xi = x.clone().requires_grad_(True)
        out = layer(xi, pos, attend)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append(xi.grad)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)
    parts = [Part(local_lengths=(5, 9), pieces=((10, 14),)), Part(local_lengths=(33,)), Part(local_lengths=(4, 4, 7),
             pieces=((40, 57), (3, 6)))]  # fmt: skip
    part_step(fast, parts[0], kernel=KERNEL, device=CPU, dtype=torch.float32)()
    warm = compile_count()
    for part in parts[1:]:
        part_step(fast, part, kernel=KERNEL, device=CPU, dtype=torch.float32)()
    assert compile_count() == warm
