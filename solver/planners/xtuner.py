"""``xtuner``: XTuner's sequence-parallel SFT (docs: "序列并行：训练极长序列大模型的系统优化", the project's
seed ``xtuner-sequence-parallel.txt``) on the reference cost model.

What it reproduces:

* packing to a fixed maximum length (XTuner's ``pack_to_max_length=True``): the global batch in loader
  order is concatenated into packs of at most ``max_tokens`` tokens, a new pack when the next sequence
  would overflow;
* the sampler: packs are dealt over the data-parallel ranks in turn (pack k to DP rank ``k % dp`` at step
  ``k // dp``), one pack per microbatch (XTuner's packed configs run ``batch_size = 1`` per device), the
  ``sequence_parallel_size`` GPUs of a DP rank reading the same pack (``SequenceParallelSampler``);
* every pack split over the whole sequence-parallel group (``split_for_sequence_parallel``) with its
  attention computed by Ulysses all-to-all over heads (``dispatch_modules``): ``mode = "ulysses"`` on
  every microbatch, so the group size ``cp`` must divide ``heads.attention`` (the seed: "packed length
  must divide by the SP size and heads by the SP size").

Defaults: ``max_tokens = cp * bucket_tokens`` (XTuner's ``max_length`` is set per config, 2048 in its
short-context ones and up to the context window in its sequence-parallel ones; here the longest pack the
group's memory holds, so no pack is cut for memory); ``sequence_parallel_size = cp``.

What it cannot reproduce: XTuner cuts sequences at pack boundaries (a sample continues in the next pack);
the plan format keeps every sequence whole in one microbatch, so a pack here ends before the sequence that
would overflow it (no sequence is cut, and a pack may be shorter than ``max_tokens``). Padding to a multiple
of the SP size (``pad_for_sequence_parallel``) and ZeRO-3's parameter gathers are outside the cost model.
It plans only ``ulysses`` (a request must allow it in ``cp_modes``; others are refused naming the field).
"""

from __future__ import annotations

from skrull.solver.cp_modes import ULYSSES
from skrull.solver.errors import RequestError
from skrull.solver.gathered import group_capacity_tokens
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import Cost, PlannerOutput, all_sharded, plan_each_iteration
from skrull.solver.planners.fixed_length import original_packing


def xtuner_batch(problem: Problem, _index: int, ids: tuple[int, ...]) -> list[MicrobatchSpec]:
    """One global batch: packed in loader order, packs dealt over DP ranks, each Ulysses-sharded over the
    rank's whole sequence-parallel group."""
    par = problem.parallel
    heads = problem.profile.heads
    if heads is None or problem.profile.comm_a2a is None:
        raise RequestError("profile.heads", None, "xtuner plans ulysses, which needs the profile's heads and comm_a2a")
    if par.cp > 1 and heads.attention % par.cp:
        raise RequestError(
            "parallel.cp", par.cp, f"xtuner's sequence parallel size must divide heads.attention = {heads.attention}"
        )
    lengths = [problem.lengths[i] for i in ids]
    # XTuner's packed dataset: loader order, a new pack when the next sequence would overflow
    packs = original_packing(lengths, group_capacity_tokens(problem))
    specs: list[MicrobatchSpec] = []
    for k, pack in enumerate(packs):
        spec = all_sharded(step=k // par.dp, ranks=par.cp_group(k % par.dp), ids=[ids[p] for p in pack])
        specs.append(spec if par.cp == 1 else _ulysses(spec))
    return specs


def _ulysses(spec: MicrobatchSpec) -> MicrobatchSpec:
    from dataclasses import replace

    return replace(spec, mode=ULYSSES)


class XtunerPlanner:
    """XTuner's sequence-parallel SFT (module docstring)."""

    name = "xtuner"
    #: each batch is packed and dealt from that batch alone
    streams_iterations = True
    #: packing as ``packed`` does
    budget = Cost(0.001, 2e-6)
    #: every pack runs Ulysses
    cp_modes = (ULYSSES,)

    def plan(self, problem: Problem) -> PlannerOutput:
        return plan_each_iteration(problem, xtuner_batch)
