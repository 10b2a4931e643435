"""What XTuner itself runs on a request's sequences, priced on the reference cost model: its ``Packer``,
its sampler and its Ulysses attention dispatch. Not a plan of the request (a plan keeps every sequence
whole; XTuner cuts them), so it is priced here rather than registered as a planner; the registered
``xtuner`` planner (``planners.xtuner``) keeps XTuner's sampler and Ulysses dispatch on whole sequences,
packed in loader order, which is what this project's worker can run.

XTuner's data path (facts from its public code, xtuner/dataset/utils.py ``Packer`` and
xtuner/dataset/huggingface.py; no code of it here):

* ``shuffle_before_pack``: the samples are shuffled, then packed;
* the ``Packer`` concatenates the samples of each ``map`` batch (``MAP_BATCH_SAMPLES``, the ``datasets``
  default of 1,000) after the residual of the previous one, cuts the stream into packs of exactly
  ``max_length`` tokens and carries the remainder into the next batch: a sample may be split over two or
  more packs. A batch whose stream is shorter than ``max_length`` is emitted whole as one short pack;
  XTuner drops the residual after the last batch, which is kept here as a last short pack so that both
  sides run the same tokens;
* each pack records ``cumulative_len``, so the attention stays inside each *piece* (the part of a sample
  inside one pack): a split sample's second piece does not attend to its first. **This is a different
  training semantics** from a plan's: a sequence longer than what is left of a pack loses the context
  before its cut, and its loss is computed over pieces;
* packs are dealt to the data-parallel ranks in turn, one pack per microbatch, and every pack is split
  over the whole sequence-parallel group of ``cp`` GPUs (``split_for_sequence_parallel``);
* the attention dispatch (xtuner/model/modules/dispatch/, e.g. llama.py, qwen2.py) repeats the K/V heads
  to the query heads before the all-to-all and sends Q, K and V in separate all-to-alls, the output back
  in a fourth: per token ``4 * q_hidden`` values out and back instead of ``2*q + 2*kv``, and 8 all-to-alls
  a layer with the backward pass instead of the 4 ``comm_a2a.fixed_ms`` counts (solver/profiles/derive.py
  ``A2A_COLLECTIVES_PER_LAYER``). ``xtuner_profile`` charges both: ``bytes_per_token +
  kv_bytes_per_token * (heads.attention / heads.kv - 1)`` and twice the fixed cost.

The packs of the whole request are split over its iterations in order, as evenly as their count allows
(the same number of global batches), and each iteration is priced as eq. 8 prices one: the slowest GPU's
sum over its microbatches.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import ULYSSES
from skrull.solver.errors import RequestError
from skrull.solver.planners.base import all_sharded
from skrull.solver.profile import CommCoeffs, Profile
from skrull.solver.types import Request

#: Samples per ``datasets.map`` batch, the unit the ``Packer`` concatenates (the library's default).
MAP_BATCH_SAMPLES = 1000
#: All-to-alls per layer XTuner runs (Q, K, V and the output, forward and backward) over those the
#: reference model's ``comm_a2a.fixed_ms`` counts (4: solver/profiles/derive.py).
COLLECTIVES_RATIO = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedRun:
    """XTuner's run of a request: its packs (piece lengths each) and every iteration's modelled time."""

    packs: tuple[tuple[int, ...], ...]
    iterations_ms: tuple[float, ...]
    #: samples cut over two packs or more
    samples_split: int

    @property
    def total_ms(self) -> float:
        return sum(self.iterations_ms)

    @property
    def num_pieces(self) -> int:
        return sum(len(p) for p in self.packs)


def packer_packs(
    lengths: Sequence[int], max_length: int, *, seed: int = 0, map_batch: int = MAP_BATCH_SAMPLES
) -> tuple[list[list[int]], int]:
    """The ``Packer``'s packs of ``lengths`` (module docstring): shuffled with ``seed``, concatenated per
    ``map_batch`` samples after the residual, cut every ``max_length`` tokens. Returns the packs as piece
    lengths and how many samples were split. Each sample is first truncated to ``max_length`` (its
    ``encode_fn``)."""
    if max_length < 1:
        raise RequestError("max_length", max_length, "must be at least 1 token")
    order = [min(s, max_length) for s in lengths]
    random.Random(seed).shuffle(order)
    packs: list[list[int]] = []
    residual: list[int] = []  # pieces carried into the next map batch
    split = 0
    for start in range(0, len(order), map_batch):
        stream = residual + order[start : start + map_batch]
        total = sum(stream)
        if total < max_length:  # a short stream is one pack, and nothing is carried
            packs.append(stream)
            residual = []
            continue
        cut, room, current, rest_pieces = total // max_length, max_length, [], []
        emitted = 0
        for s in stream:
            left = s
            pieces = 0
            while left > 0:
                if emitted == cut:  # past the last full pack: the remainder is carried
                    rest_pieces.append(left)
                    pieces += 1
                    break
                piece = min(left, room)
                current.append(piece)
                left -= piece
                room -= piece
                pieces += 1
                if room == 0:
                    packs.append(current)
                    current, room = [], max_length
                    emitted += 1
            split += pieces > 1
        residual = rest_pieces
    if residual:  # XTuner drops it; kept so both sides run the same tokens (module docstring)
        packs.append(residual)
    return packs, split


def xtuner_profile(profile: Profile) -> Profile:
    """``profile`` with XTuner's all-to-all: the K/V heads repeated to the query heads before it, and twice
    the collectives (module docstring). Refused without ``heads`` and ``comm_a2a`` (Ulysses needs both)."""
    heads, a2a = profile.heads, profile.comm_a2a
    if heads is None or a2a is None:
        raise RequestError("profile.heads", None, "XTuner runs Ulysses, which needs the profile's heads and comm_a2a")
    repeat = heads.attention / heads.kv - 1
    comm = CommCoeffs(
        bytes_per_token=a2a.bytes_per_token + a2a.kv_bytes_per_token * repeat,
        ms_per_mib=a2a.ms_per_mib,
        fixed_ms=a2a.fixed_ms * COLLECTIVES_RATIO,
        kv_bytes_per_token=0.0,  # every GPU already has every head: no further copies on any group
    )
    return dataclasses.replace(profile, name=f"{profile.name}+xtuner-a2a", comm_a2a=comm)


def xtuner_packed_run(
    request: Request, *, seed: int = 0, max_length: int | None = None, repeat_kv: bool = True
) -> PackedRun:
    """Price what XTuner runs on ``request``'s sequences (module docstring). ``max_length`` defaults to
    ``cp * bucket_tokens``, the longest pack the group's memory holds (as the ``xtuner`` planner packs).
    ``repeat_kv=False`` prices the packs with this project's all-to-all instead (what the repeat costs)."""
    par = request.parallel
    heads = request.profile.heads
    if heads is not None and par.cp > 1 and heads.attention % par.cp:
        raise RequestError(
            "parallel.cp", par.cp, f"XTuner's sequence parallel size must divide heads.attention = {heads.attention}"
        )
    profile = xtuner_profile(request.profile) if repeat_kv else request.profile
    model = CostModel(profile, bucket_tokens=request.bucket_tokens)  # each microbatch priced in its own mode
    length = max_length if max_length is not None else par.cp * request.bucket_tokens
    lengths = [s for batch in request.batches for s in batch]
    packs, split = packer_packs(lengths, length, seed=seed)
    num_iterations = max(1, len(request.batches))
    bounds = [round(k * len(packs) / num_iterations) for k in range(num_iterations + 1)]
    iterations = []
    for k in range(num_iterations):
        per_rank = [0.0] * par.dp
        for j, pack in enumerate(packs[bounds[k] : bounds[k + 1]]):
            spec = all_sharded(step=j // par.dp, ranks=par.cp_group(j % par.dp), ids=list(range(len(pack))))
            if par.cp > 1:
                spec = dataclasses.replace(spec, mode=ULYSSES)
            per_rank[j % par.dp] += model.spec_time_ms(spec, pack)
        iterations.append(max(per_rank))
    return PackedRun(packs=tuple(tuple(p) for p in packs), iterations_ms=tuple(iterations), samples_split=split)
